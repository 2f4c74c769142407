"""costopt/reports/price_memo.py: one report's price reads memoized, answering every range as the
wrapped view does (the ``PriceSteps`` contract), with one read per offer inside the window."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.prices import PriceStep, StepPrices, price_segments
from costopt.reports.price_memo import MemoSteps
from costopt.reports.standing import StandingOnDemand
from tests.reports.prices import steps

T0 = datetime(2020, 1, 1, tzinfo=UTC)
SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
ON_DEMAND = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)


class Counting:
    """A view counting its ``steps`` calls."""

    def __init__(self, view: StepPrices | StandingOnDemand) -> None:
        self.view, self.calls = view, 0

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        self.calls += 1
        return self.view.steps(key, start, end)

    def offers_at(self, at: datetime) -> pd.DataFrame:
        return self.view.offers_at(at)

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        return self.view.shape(key)


hours = st.integers(min_value=0, max_value=200)


@settings(max_examples=200, deadline=None)
@given(
    changes=st.lists(st.tuples(hours, st.floats(min_value=0.1, max_value=30)), min_size=1, max_size=12),
    od_from=st.integers(min_value=0, max_value=150),
    ranges=st.lists(st.tuples(hours, st.integers(min_value=0, max_value=80)), min_size=1, max_size=20),
    lo=st.integers(min_value=0, max_value=60),
)
def test_every_range_is_answered_as_the_view_answers_it_and_each_offer_is_read_once_inside_the_window(
    changes: list[tuple[int, float]], od_from: int, ranges: list[tuple[int, int]], lo: int
) -> None:
    spot = sorted({h: p for h, p in changes}.items())
    view = StandingOnDemand(
        steps(
            {
                SPOT: [(T0 + timedelta(hours=h), p) for h, p in spot],
                ON_DEMAND: [(T0 + timedelta(hours=od_from), 3.06)],  # standing back in time (reports)
            }
        )
    )
    counting = Counting(view)
    start, end = T0 + timedelta(hours=lo), T0 + timedelta(hours=300)
    memo = MemoSteps(counting, start, end)
    inside = 0
    for key in (SPOT, ON_DEMAND):
        for h, length in ranges:
            a, b = T0 + timedelta(hours=h), T0 + timedelta(hours=h + length)
            got, want = list(memo.steps(key, a, b)), list(view.steps(key, a, b))
            inside += a >= start
            if a >= start:  # the memo's first step may be dated earlier (the window's start): same prices
                assert _segments(got, key, a, b) == _segments(want, key, a, b)
                assert [s for s in got if s.valid_from > a] == [s for s in want if s.valid_from > a]
            else:  # outside the window: the view's own answer
                assert got == want
    # per offer: one read of the window if any range fell inside it, and one read per range outside it
    per_offer = len(ranges) - inside // 2 + (1 if inside else 0)
    assert counting.calls == 2 * per_offer


def _segments(got: Sequence[PriceStep], key: OfferKey, a: datetime, b: datetime) -> object:
    class Fixed:
        def steps(self, k: OfferKey, s: datetime, e: datetime) -> Sequence[PriceStep]:
            return got

    try:
        return price_segments(Fixed(), key, a, b)
    except Exception as exc:  # NoPriceInEffect: the same refusal on both sides
        return type(exc).__name__


def test_steps_out_of_time_order_are_passed_through_not_answered_from_memory() -> None:
    """A view whose answer is not one time-ordered series (several offers) is asked every time."""

    class Mixed:
        calls = 0

        def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
            Mixed.calls += 1
            return [PriceStep(T0, 1.0), PriceStep(T0 + timedelta(hours=5), 2.0), PriceStep(T0, 1.5)]

        def offers_at(self, at: datetime) -> pd.DataFrame:
            return pd.DataFrame()

        def shape(self, key: OfferKey) -> tuple[str, float] | None:
            return None

    memo = MemoSteps(Mixed(), T0, T0 + timedelta(days=1))
    for _ in range(3):
        assert len(memo.steps(ON_DEMAND, T0 + timedelta(hours=1), T0 + timedelta(hours=2))) == 3
    assert Mixed.calls == 4  # the window's read, then each range read from the view
