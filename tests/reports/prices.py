"""Price paths for the report tests: change points per offer, in memory (a ``PriceView``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import numpy as np

from costopt.domain import OfferKey
from costopt.ledger.prices import StepPrices

SHAPES = {
    ("aws", "p3.2xlarge"): ("V100", 1.0),
    ("aws", "p3.8xlarge"): ("V100", 4.0),
    ("aws", "p2.xlarge"): ("K80", 1.0),
    ("gcp", "n1-standard-8-v100x1"): ("V100", 1.0),
}


def steps(path: Mapping[OfferKey, Sequence[tuple[datetime, float]]]) -> StepPrices:
    """Each offer's ``(valid_from, usd_per_hour)`` change points (in time order)."""
    keys = list(path)
    return StepPrices(
        keys,
        [np.array([int(t.timestamp() * 1_000_000) * 1000 for t, _ in path[k]], dtype=np.int64) for k in keys],
        [np.array([p for _, p in path[k]], dtype=np.float64) for k in keys],
        SHAPES,
    )
