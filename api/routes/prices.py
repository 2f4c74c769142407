"""``/v1/prices``: offers in effect, history, source health."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from api.deps import SettingsDep, StoreDep
from api.queries import latest_prices, offer_record
from api.schemas import (
    HistoryPublic,
    OfferPublic,
    OffersPublic,
    PricePointPublic,
    SourcePublic,
    SourcesPublic,
)
from costopt.domain import Cloud, Market

router = APIRouter(prefix="/v1/prices", tags=["prices"])


def _utc(dt: datetime | None, name: str) -> datetime | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        raise HTTPException(status_code=422, detail=f"{name} must carry a UTC offset, e.g. 2020-03-01T00:00:00Z")
    return dt.astimezone(UTC)


@router.get("/latest", response_model=OffersPublic)
def get_latest(
    store: StoreDep,
    settings: SettingsDep,
    cloud: Cloud | None = None,
    region: str | None = None,
    gpu: Annotated[str | None, Query(description="accelerator, e.g. v100")] = None,
    market: Market | None = None,
    at: Annotated[datetime | None, Query(description="ISO 8601 with offset; default: now")] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    include_stale: bool = False,
) -> OffersPublic:
    """Offers in effect now (or at ``at``), cheapest first, USD per instance-hour."""
    result = latest_prices(
        store,
        settings,
        cloud=cloud,
        region=region,
        gpu=gpu,
        market=market,
        at=_utc(at, "at"),
        include_stale=include_stale,
        limit=limit,
    )
    items = [OfferPublic.model_validate(offer_record(o)) for o in result.offers]
    return OffersPublic(
        as_of=result.now.at, clock="explicit" if result.explicit else result.now.mode, count=len(items), items=items
    )


@router.get("/history", response_model=HistoryPublic)
def get_history(
    store: StoreDep,
    cloud: Cloud | None = None,
    region: str | None = None,
    zone: str | None = None,
    instance_type: str | None = None,
    market: Market | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000,
) -> HistoryPublic:
    """Change points in [start, end] (default: the last 30 days), each holding until the next."""
    end_t = _utc(end, "end") or datetime.now(UTC)
    start_t = _utc(start, "start") or end_t - timedelta(days=30)
    if start_t > end_t:
        raise HTTPException(status_code=422, detail="start is after end")
    points = store.history_points(
        start_t, end_t, cloud=cloud, region=region, zone=zone, instance_type=instance_type, market=market
    )[:limit]
    items = [
        PricePointPublic(
            cloud=p.key.cloud.value,
            region=p.key.region,
            zone=p.key.zone,
            instance_type=p.key.instance_type,
            market=p.key.market.value,
            valid_from=p.valid_from,
            usd_per_hour=p.usd_per_hour,
            source=p.source,
        )
        for p in points
    ]
    return HistoryPublic(start=start_t, end=end_t, count=len(items), items=items)


@router.get("/sources", response_model=SourcesPublic)
def get_sources(store: StoreDep) -> SourcesPublic:
    """Health of each price source."""
    items = [
        SourcePublic(
            name=s.name,
            last_attempt_at=s.last_attempt_at,
            last_success_at=s.last_success_at,
            stale=s.stale,
            consecutive_failures=s.consecutive_failures,
            last_points=s.last_points,
            last_bad_records=s.last_bad_records,
            last_skipped=s.last_skipped,
            last_partial=s.last_partial,
            last_error=s.last_error,
            total_points=s.total_points,
            total_bad_records=s.total_bad_records,
            last_refused_pages=s.last_refused_pages,
            total_refused_pages=s.total_refused_pages,
            last_rejection=s.last_rejection,
            last_rejection_at=s.last_rejection_at,
        )
        for s in store.sources()
    ]
    return SourcesPublic(count=len(items), items=items)
