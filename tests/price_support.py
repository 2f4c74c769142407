"""Step prices for tests, from ``(offer, valid_from, usd_per_hour)`` rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import pandas as pd

from costopt.domain import OfferKey
from costopt.ledger import StepPrices

V100 = {("aws", "p3.2xlarge"): ("v100", 1.0)}
"""The shape of ``p3.2xlarge`` (one V100), the usual test instance."""


def price_history(rows: Iterable[tuple[OfferKey, datetime, float]]) -> pd.DataFrame:
    """A price-history frame (the columns of :meth:`StepPrices.from_history`): one row per change point."""
    return pd.DataFrame(
        [
            {
                "cloud": k.cloud.value,
                "region": k.region,
                "zone": k.zone,
                "instance_type": k.instance_type,
                "market": k.market.value,
                "valid_from": t,
                "usd_per_hour": p,
            }
            for k, t, p in rows
        ]
    )


def step_prices(
    rows: Iterable[tuple[OfferKey, datetime, float]], shapes: Mapping[tuple[str, str], tuple[str, float]] = V100
) -> StepPrices:
    """The step prices of ``rows`` (tz-aware UTC times, USD per instance-hour) with the instance
    ``shapes`` ((cloud, instance type) -> (GPU, count))."""
    return StepPrices.from_history(price_history(rows), dict(shapes))
