"""Apportioning micro-dollars: exact sums, largest remainders, UTC day cuts and report rates, against
exact rational references (written for mutation testing: each assertion pins a rounding or a tie rule)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import NotRequired, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costopt.domain import Cloud, Market, OfferKey
from costopt.reports.apportion import day_cuts, largest_remainder, split_by_days
from costopt.reports.errors import ReportError
from costopt.reports.model import DIMENSIONS, Figures, ReportQuery, Row, rate, usd

T0 = datetime(2020, 3, 1, tzinfo=UTC)


def test_largest_remainder_gives_the_leftover_to_the_largest_remainders_then_the_earlier() -> None:
    assert largest_remainder(10, [1, 1, 1]) == [4, 3, 3]  # equal remainders: the earliest first
    assert largest_remainder(11, [1, 1, 1]) == [4, 4, 3]
    assert largest_remainder(100, [1, 2, 3, 4]) == [10, 20, 30, 40]
    assert largest_remainder(7, [5, 3]) == [4, 3]  # 4.375 / 2.625: the .625 takes the leftover
    assert largest_remainder(7, [3, 5]) == [3, 4]
    assert largest_remainder(1, [1, 1_000_000]) == [0, 1]
    assert largest_remainder(5, [0, 0, 0]) == [5, 0, 0]  # no weight: all to the first piece
    assert largest_remainder(0, [1, 2]) == [0, 0]
    assert largest_remainder(-10, [1, 1, 1]) == [-4, -3, -3]  # a refund mirrors a charge
    assert largest_remainder(0, []) == []
    with pytest.raises(ValueError, match="no pieces"):
        largest_remainder(1, [])
    with pytest.raises(ValueError, match=">= 0"):
        largest_remainder(1, [1, -1])


@settings(max_examples=150, deadline=None)
@given(
    total=st.integers(-(10**12), 10**12),
    weights=st.lists(st.integers(0, 10**9), min_size=1, max_size=8).filter(lambda w: sum(w) > 0),
)
def test_largest_remainder_sums_exactly_and_stays_within_one_of_the_exact_share(total: int, weights: list[int]) -> None:
    parts = largest_remainder(total, weights)
    assert sum(parts) == total and len(parts) == len(weights)
    for part, w in zip(parts, weights, strict=True):
        share = Fraction(total * w, sum(weights))
        assert abs(part - share) < 1
        if w == 0:
            assert part == 0


def test_day_cuts_split_at_each_utc_midnight() -> None:
    start, end = T0 + timedelta(hours=20), T0 + timedelta(days=2, hours=3)
    assert day_cuts(start, end) == [
        (start, T0 + timedelta(days=1)),
        (T0 + timedelta(days=1), T0 + timedelta(days=2)),
        (T0 + timedelta(days=2), end),
    ]
    assert day_cuts(T0, T0 + timedelta(days=1)) == [(T0, T0 + timedelta(days=1))]  # midnight to midnight: one
    assert day_cuts(T0, T0) == [(T0, T0)]
    assert day_cuts(T0 + timedelta(hours=1), T0) == []


def test_split_by_days_apportions_by_time() -> None:
    start = T0 + timedelta(hours=18)  # 6 h on day one, 18 h on day two
    pieces = split_by_days(start, start + timedelta(days=1), 1_000_001)
    assert [p for _, _, p in pieces] == [250_000, 750_001]
    assert pieces[0][:2] == (start, T0 + timedelta(days=1))
    assert split_by_days(T0, T0 + timedelta(hours=5), 7) == [(T0, T0 + timedelta(hours=5), 7)]


@settings(max_examples=100, deadline=None)
@given(
    start_s=st.integers(0, 10 * 86_400),
    length_s=st.integers(1, 5 * 86_400),
    amount=st.integers(0, 10**10),
)
def test_split_by_days_covers_the_interval_and_sums_exactly(start_s: int, length_s: int, amount: int) -> None:
    start = T0 + timedelta(seconds=start_s)
    end = start + timedelta(seconds=length_s)
    pieces = split_by_days(start, end, amount)
    assert sum(p for _, _, p in pieces) == amount
    assert pieces[0][0] == start and pieces[-1][1] == end
    for (_, b, _), (c, _, _) in itertools.pairwise(pieces):
        assert b == c and b.hour == b.minute == b.second == 0
    for a, b, p in pieces:
        assert a.date() == (b - timedelta(microseconds=1)).date()  # each piece within one UTC day
        assert abs(p - Fraction(amount) * Fraction((b - a).total_seconds()) / length_s) < 1


def test_report_money_and_rates() -> None:
    assert usd(1_500_000) == Decimal("1.500000")
    assert rate(1, 3) == Decimal("0.3333")
    assert rate(2, 3) == Decimal("0.6667")
    assert rate(-1, 4) == Decimal("-0.2500")
    assert rate(1, 20_000) == Decimal("0.0000")  # 0.00005: half to even
    assert rate(3, 20_000) == Decimal("0.0002")  # 0.00015: half to even
    assert rate(5, 0) is None
    assert rate(0, 5) == Decimal("0.0000")


def _row(amount: int, od: int | None, st: int | None, **kw: object) -> Row:
    fields: dict[str, object] = {
        "kind": "instance",
        "job_id": "j",
        "team": "t",
        "ref": "r",
        "instance_id": None,
        "provider": None,
        "offer": None,
        "accelerator": None,
        "starts_at": T0,
        "ends_at": T0 + timedelta(hours=1),
        "usd_per_hour": None,
        "share": Decimal(1),
        "amount_micro": amount,
        "baseline_on_demand_micro": od,
        "baseline_static_spot_micro": st,
    }
    fields.update(kw)
    return Row(**fields)  # type: ignore[arg-type]


def test_figures_count_savings_only_over_rows_that_have_the_baseline() -> None:
    f = Figures()
    for row in (_row(100, 400, 150), _row(50, None, 80), _row(30, 90, None), _row(7, None, None)):
        f = f.add(row)
    assert (f.actual_micro, f.rows) == (187, 4)
    assert (f.baseline_on_demand_micro, f.covered_on_demand_actual_micro) == (490, 130)
    assert (f.baseline_static_spot_micro, f.covered_static_spot_actual_micro) == (230, 150)
    assert f.savings_on_demand_micro == 360 and f.savings_static_spot_micro == 80
    assert f.uncovered_actual_micro == 57
    assert f.savings_rate == Decimal("0.7347") and f.savings_rate_static_spot == Decimal("0.3478")
    assert Figures().savings_rate is None


def test_a_row_answers_each_dimension() -> None:
    key = OfferKey(Cloud.GCP, "us-east1", "us-east1-b", "n1+v100x1", Market.SPOT)
    row = _row(1, None, None, offer=key, accelerator="v100", starts_at=datetime(2020, 3, 9, 23, tzinfo=UTC))
    assert [row.value(d) for d in DIMENSIONS] == ["t", "j", "gcp", "us-east1", "v100", "spot", "2020-03-09", "2020-03"]
    bare = _row(1, None, None)
    assert [bare.value(d) for d in ("cloud", "region", "market", "accelerator")] == ["", "", "", ""]
    with pytest.raises(ReportError, match="unknown dimension 'zone'"):
        row.value("zone")


class _QueryChange(TypedDict, total=False):
    """Some of a ReportQuery's fields, to change in a valid query."""

    start: datetime
    end: datetime
    group_by: tuple[str, ...]
    top: int


class _QueryFields(TypedDict):
    """A ReportQuery's fields as keyword arguments."""

    start: datetime
    end: datetime
    group_by: NotRequired[tuple[str, ...]]
    top: NotRequired[int]


def test_a_report_query_refuses_a_bad_period_grouping_or_top() -> None:
    ok = ReportQuery(T0, T0 + timedelta(days=1), group_by=("team", "month"), top=1)
    assert ok.group_by == ("team", "month")
    naive = datetime(2020, 3, 1)
    cases: list[tuple[_QueryChange, str]] = [
        ({"start": naive}, "from must be"),
        ({"start": T0.astimezone(timezone(timedelta(hours=1)))}, "from must be a tz-aware UTC time"),
        ({"end": naive}, "to must be"),
        ({"end": T0}, "before or when it starts"),
        ({"group_by": ()}, "cannot group by nothing; choose from team, job"),
        ({"group_by": ("team", "zone")}, "cannot group by zone; choose from"),
        ({"group_by": ("team", "team")}, "group_by repeats a dimension: team, team"),
        ({"top": 0}, "top must be >= 1, got 0"),
    ]
    for bad, message in cases:
        args: _QueryFields = {"start": T0, "end": T0 + timedelta(days=1), **bad}
        with pytest.raises(ReportError, match=message):
            ReportQuery(**args)
