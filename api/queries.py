"""Read-side queries shared by the CLI and the REST API (one behaviour, two faces)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from costopt.domain import Cloud, Market, normalize_accelerator
from costopt.settings import Settings
from pricing.store import Now, Offer, PriceStore


@dataclass(frozen=True, slots=True)
class LatestPrices:
    """Offers in effect at ``now.at`` (``now.mode``: live wall clock, replay at the data's time, or
    an explicit time the caller asked for)."""

    now: Now
    explicit: bool
    offers: list[Offer]


def latest_prices(
    store: PriceStore,
    settings: Settings,
    *,
    cloud: Cloud | None = None,
    region: str | None = None,
    gpu: str | None = None,
    market: Market | None = None,
    at: datetime | None = None,
    include_stale: bool = False,
    limit: int | None = None,
) -> LatestPrices:
    """Cheapest-first offers. ``at`` None: "now" as the settings' clock defines it (live, or replay
    at the data's own time when no live price is fresh)."""
    accelerator = normalize_accelerator(gpu) if gpu else None
    if at is not None:
        now = Now(at, "replay")
        offers = store.snapshot(
            at,
            cloud=cloud,
            region=region,
            accelerator=accelerator,
            market=market,
            include_stale=include_stale,
            limit=limit,
        )
        return LatestPrices(now, True, offers)
    now = store.resolve_now(settings.clock)
    snap_at = None if now.mode == "live" else now.at
    offers = store.snapshot(
        snap_at,
        cloud=cloud,
        region=region,
        accelerator=accelerator,
        market=market,
        include_stale=include_stale,
        limit=limit,
    )
    return LatestPrices(now, False, offers)


def offer_record(o: Offer) -> dict[str, object]:
    """An offer as plain JSON-able values (floats, ISO 8601 UTC strings)."""
    return {
        "cloud": o.key.cloud.value,
        "region": o.key.region,
        "zone": o.key.zone,
        "instance_type": o.key.instance_type,
        "market": o.key.market.value,
        "accelerator": o.accelerator,
        "gpu_count": o.gpu_count,
        "usd_per_hour": float(o.usd_per_hour),
        "usd_per_gpu_hour": None if o.usd_per_gpu_hour is None else float(o.usd_per_gpu_hour),
        "valid_from": o.valid_from.isoformat().replace("+00:00", "Z"),
        "last_confirmed_at": None
        if o.last_confirmed_at is None
        else o.last_confirmed_at.isoformat().replace("+00:00", "Z"),
        "stale": o.stale,
        "source": o.source,
    }
