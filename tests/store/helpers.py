"""Builders shared by the price-store contract tests: keys, points, frames and a reset between examples."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine, text

from costopt.domain import Cloud, Market, OfferKey, PricePoint
from pricing.store import Offer, PriceStore, points_frame

T0 = datetime(2025, 3, 1, tzinfo=UTC)
"""A fixed origin far in the past of the wall clock: data written around it is stale 'now'."""

KEY = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.SPOT)
ZONAL = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)

REMOVAL_DIVERGENCE = (
    "CONTRACT DIVERGENCE (lead to decide): the brief says an out-of-order older point with the price of its "
    "successor removes the redundant successor (and no two consecutive equal prices are stored); since commit "
    "bcb3563 pricing/ingest.py Ingestor.write (L304-310) deliberately never deletes a stored point, so the "
    "redundant successor stays"
)
SQLITE_SQL_SNAPSHOT_BUG = (
    "store.py PriceStore._snapshot_sql L458/L467: on SQLite a text() query returns timestamps as str, and "
    "dt_to_ns(str) raises TypeError, so the SQL reference snapshot (use_mirror=False, or any as-of snapshot "
    "once the store holds more than mirror_max_points) crashes on every non-empty SQLite store"
)


def h(hours: float) -> datetime:
    """``T0`` plus some hours."""
    return T0 + timedelta(hours=hours)


def key(
    cloud: Cloud = Cloud.AWS,
    region: str = "us-east-1",
    zone: str = "",
    instance_type: str = "p3.2xlarge",
    market: Market = Market.SPOT,
) -> OfferKey:
    return OfferKey(cloud, region, zone, instance_type, market)


def pt(
    valid_from: datetime | float,
    price: float,
    *,
    k: OfferKey = KEY,
    source: str = "src",
    observed_at: datetime | float | None = None,
) -> PricePoint:
    """A price point; plain numbers are hours after ``T0``."""
    vf = h(valid_from) if isinstance(valid_from, (int, float)) else valid_from
    obs = h(observed_at) if isinstance(observed_at, (int, float)) else observed_at
    return PricePoint(k, vf, price, source, obs)


def frame(points: Iterable[PricePoint]) -> pd.DataFrame:
    return points_frame(list(points))


def steps(store: PriceStore, k: OfferKey = KEY) -> list[tuple[datetime, float]]:
    """The stored change points of ``k`` as (valid_from, price), read through ``history``."""
    hist = store.history(datetime(1990, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC), **key_filter(k))
    return [(ts.to_pydatetime(), float(p)) for ts, p in zip(hist["valid_from"], hist["usd_per_hour"], strict=True)]


def key_filter(k: OfferKey) -> dict[str, Any]:
    return {
        "cloud": k.cloud,
        "region": k.region,
        "zone": k.zone,
        "instance_type": k.instance_type,
        "market": k.market,
    }


def price_of(store: PriceStore, at: datetime, k: OfferKey = KEY) -> float | None:
    offer = store.price_at(k, at)
    return None if offer is None else offer.usd_per_hour


def offer_tuple(o: Offer) -> tuple[Any, ...]:
    """Everything an Offer says, as a comparable tuple."""
    return (
        o.key,
        o.usd_per_hour,
        o.valid_from,
        o.source,
        o.last_confirmed_at,
        o.stale,
        o.accelerator,
        o.gpu_count,
    )


def comparable(frame_: pd.DataFrame) -> list[tuple[Any, ...]]:
    """A snapshot frame as a list of plain tuples (NaN/NaT as None) for equality checks."""
    out = []
    for row in frame_.itertuples(index=False):
        out.append(tuple(None if _isna(v) else v for v in row))
    return out


def _isna(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def reset(engine: Engine) -> None:
    """Empty every store table and bump the price version (so any mirror reloads)."""
    with engine.begin() as conn:
        for table in ("price_points", "price_repeats", "offers", "instance_types", "source_status"):
            conn.execute(text(f"DELETE FROM {table}"))
        conn.execute(text("UPDATE store_meta SET value = value + 1 WHERE name = 'price_version'"))


def xfail_on(request: pytest.FixtureRequest, engine: Engine, dialect: str, reason: str) -> None:
    """Mark the running test as a strict expected failure on one backend only."""
    if engine.dialect.name == dialect:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
