"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.schemas import Health
from costopt.db.engine import current_revision, head_revision
from costopt.errors import StoreError

router = APIRouter(tags=["health"])


@router.get("/livez", response_model=Health)
def livez() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> Health | JSONResponse:
    """The database is reachable and migrated to this code's newest schema."""
    store = getattr(request.app.state, "store", None)
    if store is None:
        return JSONResponse(status_code=503, content=Health(status="unavailable", detail="starting").model_dump())
    try:
        rev = current_revision(store.engine)
    except StoreError as exc:
        return JSONResponse(status_code=503, content=Health(status="unavailable", detail=str(exc)).model_dump())
    if rev != head_revision():
        detail = f"database at revision {rev}, code expects {head_revision()}: run `costopt db migrate`"
        return JSONResponse(status_code=503, content=Health(status="unavailable", detail=detail).model_dump())
    return Health(status="ok")
