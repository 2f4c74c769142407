"""FastAPI dependencies: the application's store and settings, set at startup."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from costopt.settings import Settings
from pricing.store import PriceStore


def get_store(request: Request) -> PriceStore:
    store: PriceStore | None = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(status_code=503, detail="the price store is not ready yet; retry shortly")
    return store


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[PriceStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
