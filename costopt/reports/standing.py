"""On-demand prices as standing prices for the reports' on-demand baseline (docs/ledger.md, "Reports").

An on-demand list price is a standing price: it holds until the cloud changes it. The store dates a
list price by the snapshot it was read from (the curated 2020 AWS and Azure list prices are dated
2020-05-06, the GCP 2020 composition 2020-03-31), so a job run on the replayed Dec 2019 - Mar 2020 spot
history would have no on-demand price "in effect". The reports therefore price an on-demand offer
before its earliest point in the store at that earliest price (data/catalog/SOURCES.md, "The 2020 study
window", gives the evidence that the 2020 list prices held then: the spot records reach exactly the list
price and never exceed it). Only the on-demand market is extended, only backwards, and only in the
reports' baselines; the ledger bills what ran at the prices in effect, unchanged.

:class:`StandingOnDemand` wraps a :class:`~costopt.ledger.prices.PriceView`; :func:`earliest_on_demand`
finds when a cloud region's on-demand prices start, so a baseline chosen at a job's submission before
then is chosen at that date's prices.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta

import pandas as pd

from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.prices import PriceHistorySource, PriceStep, PriceView, WrappedView

__all__ = ["LOOKAHEAD", "StandingOnDemand", "earliest_on_demand"]

LOOKAHEAD = timedelta(days=366 * 100)
"""How far after a time the earliest on-demand point is looked for (a century: any price in the store)."""


class StandingOnDemand(WrappedView):
    """``view`` with each on-demand offer's earliest price also in effect before it (module docstring).
    Spot and other markets pass through unchanged."""

    def __init__(self, view: PriceView) -> None:
        super().__init__(view)
        self._first: dict[OfferKey, PriceStep | None] = {}
        self._lock = threading.Lock()

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        got = list(self.view.steps(key, start, end))
        if key.market is not Market.ON_DEMAND or (got and got[0].valid_from <= start):
            return got
        first = got[0] if got else self._earliest(key, start)
        if first is None:
            return got
        return [PriceStep(start, first.usd_per_hour), *got]

    def _earliest(self, key: OfferKey, start: datetime) -> PriceStep | None:
        """The offer's earliest step when it starts after ``start`` (None: none, or one is in effect then)."""
        with self._lock:
            known = key in self._first
            hit = self._first.get(key)
        if not known:
            later = list(self.view.steps(key, start, start + LOOKAHEAD))
            hit = later[0] if later else None
            if hit is not None and hit.valid_from <= start:
                return None  # a price in effect at start (an empty range before it asked): not the earliest
            with self._lock:
                self._first[key] = hit
        return hit if hit is None or hit.valid_from > start else None


def earliest_on_demand(
    store: PriceHistorySource, cloud: Cloud, region: str, after: datetime, instance_type: str | None = None
) -> datetime | None:
    """The earliest on-demand price point of ``cloud`` ``region`` (one ``instance_type``, or any) after
    ``after``, None when there is none within :data:`LOOKAHEAD`."""
    frame = store.history(
        after, after + LOOKAHEAD, cloud=cloud, region=region, instance_type=instance_type, market=Market.ON_DEMAND
    )
    if frame.empty:
        return None
    vf = pd.to_datetime(frame["valid_from"], utc=True)
    later = vf[vf > pd.Timestamp(after)]
    return None if later.empty else later.min().to_pydatetime()
