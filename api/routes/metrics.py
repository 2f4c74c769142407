"""``GET /metrics``: the Prometheus text format (metrics are declared in :mod:`api.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.metrics import CONTENT_TYPE, render

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
def metrics(request: Request) -> Response:
    """Process metrics, the price collectors scheduled per cloud, and each price source's health."""
    return Response(content=render(getattr(request.app.state, "store", None)), media_type=CONTENT_TYPE)
