"""Where a job goes when its copy is lost: the candidate offers the interruption watcher recovers on.

Until jobs are submitted with a type and an objective (the team service), a recovery keeps the job on
what it ran on: the same accelerator and GPU count on the job's cloud, in any region or zone, the same
instance type first, spot before on-demand, cheapest first (USD per hour, prices in effect now). The
offer just lost goes last (the watcher also drops it while it is marked unavailable). An offer without a
price in the store (the local provider's, a simulated one without prices) is recovered in place.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from api.planning import offers_at
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.records import JobRecord
from costopt.settings import Settings
from pricing.store import PriceStore

DEFAULT_LIMIT = 8


def recovery_offers(
    store: PriceStore, settings: Settings, job: JobRecord, *, limit: int = DEFAULT_LIMIT
) -> list[OfferKey]:
    """At most ``limit`` offers to recover ``job`` on, best first (see the module's docstring); empty when
    the job has no offer recorded."""
    lost = job.offer
    if lost is None:
        return []
    _, frame = offers_at(store, settings, None, [lost.cloud])
    mine = frame[
        (frame["region"] == lost.region) & (frame["zone"] == lost.zone) & (frame["instance_type"] == lost.instance_type)
    ]
    if mine.empty:
        return [lost]
    accel, gpus = mine.iloc[0]["accelerator"], mine.iloc[0]["gpu_count"]
    same = frame[(frame["accelerator"] == accel) & (frame["gpu_count"] == gpus)] if pd.notna(accel) else mine
    ranked = same.assign(
        _type=(same["instance_type"] != lost.instance_type).astype(int),
        _market=(same["market"] != Market.SPOT.value).astype(int),
    ).sort_values(["_type", "_market", "usd_per_hour", "region", "zone", "instance_type"], kind="stable")
    out: list[OfferKey] = []
    for row in ranked[["cloud", "region", "zone", "instance_type", "market"]].astype(str).to_dict("records"):
        key = OfferKey(Cloud(row["cloud"]), row["region"], row["zone"], row["instance_type"], Market(row["market"]))
        if key != lost and key not in out:
            out.append(key)
        if len(out) >= limit - 1:
            break
    return [*out, lost]


def recovery_offers_for(store: PriceStore, settings: Settings) -> Callable[[JobRecord], list[OfferKey]]:
    """:func:`recovery_offers` bound to a store: the ``offers_for`` of the interruption watcher."""
    return lambda job: recovery_offers(store, settings, job)
