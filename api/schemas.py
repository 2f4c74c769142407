"""Pydantic models at the API edge (the core stays on frozen dataclasses)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class OfferPublic(BaseModel):
    """One offer's price in effect. ``usd_per_hour`` is USD per instance-hour."""

    cloud: str
    region: str
    zone: str = Field(description="'' for a regional price")
    instance_type: str
    market: Literal["spot", "on_demand"]
    accelerator: str | None = Field(description="None when the instance type is not in the catalog")
    gpu_count: float | None
    usd_per_hour: float
    usd_per_gpu_hour: float | None
    valid_from: datetime
    last_confirmed_at: datetime | None
    stale: bool
    source: str


class OffersPublic(BaseModel):
    """Offers, cheapest first, as of ``as_of`` (UTC). ``clock``: how "now" was chosen."""

    as_of: datetime
    clock: Literal["live", "replay", "explicit"]
    count: int
    items: list[OfferPublic]


class PricePointPublic(BaseModel):
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    valid_from: datetime
    usd_per_hour: float
    source: str


class HistoryPublic(BaseModel):
    start: datetime
    end: datetime
    count: int
    items: list[PricePointPublic]


class SourcePublic(BaseModel):
    name: str
    last_attempt_at: datetime | None
    last_success_at: datetime | None
    stale: bool
    consecutive_failures: int
    last_points: int
    last_bad_records: int
    last_skipped: int
    last_partial: bool
    last_error: str | None
    total_points: int
    total_bad_records: int = 0
    last_refused_pages: int = 0
    total_refused_pages: int = 0
    last_rejection: str | None = None
    last_rejection_at: datetime | None = None


class SourcesPublic(BaseModel):
    count: int
    items: list[SourcePublic]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str | None = None
