"""The reports' on-demand prices as standing prices (costopt/reports/standing.py): an on-demand offer's
earliest price holds before it, spot is left as stored, and a price already in effect is not touched."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pandas as pd

from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.prices import PriceStep
from costopt.reports.standing import StandingOnDemand

T = datetime(2020, 1, 10, tzinfo=UTC)
LIST_DAY = datetime(2020, 5, 6, tzinfo=UTC)
OD = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)
SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)


class _View:
    """Steps as the store gives them: the one in effect at ``start``, then those before ``end``."""

    def __init__(self, points: dict[OfferKey, list[PriceStep]]) -> None:
        self.points = points

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        pts = self.points.get(key, [])
        prior = [p for p in pts if p.valid_from <= start][-1:]
        return prior + [p for p in pts if start < p.valid_from < end]

    def offers_at(self, at: datetime) -> pd.DataFrame:
        return pd.DataFrame()

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        return ("v100", 1.0)


def test_the_earliest_on_demand_price_holds_before_it_and_spot_is_unchanged() -> None:
    view = _View(
        {
            OD: [PriceStep(LIST_DAY, 3.06), PriceStep(LIST_DAY + timedelta(days=400), 2.5)],
            SPOT: [PriceStep(T + timedelta(hours=1), 0.9)],
        }
    )
    standing = StandingOnDemand(view)
    # wholly before the list price: the list price from the start
    assert list(standing.steps(OD, T, T + timedelta(hours=3))) == [PriceStep(T, 3.06)]
    # a run across the first point: the same price from the start, then the stored points
    long = list(standing.steps(OD, LIST_DAY - timedelta(days=1), LIST_DAY + timedelta(days=500)))
    assert long == [PriceStep(LIST_DAY - timedelta(days=1), 3.06), *view.points[OD]]
    # in effect already: as stored
    after = LIST_DAY + timedelta(days=1)
    assert list(standing.steps(OD, after, after + timedelta(hours=1))) == [PriceStep(LIST_DAY, 3.06)]
    # spot is never extended: no price in effect stays so
    assert list(standing.steps(SPOT, T, T + timedelta(hours=3))) == [PriceStep(T + timedelta(hours=1), 0.9)]
    assert list(standing.steps(SPOT, T - timedelta(days=1), T)) == []
    # an offer without any on-demand price: nothing
    other = OfferKey(Cloud.AWS, "us-west-2", "", "p3.2xlarge", Market.ON_DEMAND)
    assert list(standing.steps(other, T, T + timedelta(hours=1))) == []
    assert standing.shape(OD) == ("v100", 1.0)
