"""Exact splits (no micro-dollar made or lost by a grouping) and the price-spike reason, in memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from costopt.jobs.model import JobState
from costopt.jobs.records import JobRecord
from costopt.ledger import IntervalRecord, MemoryLedger
from costopt.ledger.model import micro_to_usd
from costopt.reports import BaselineRun, ReportData, ReportQuery, build_report
from costopt.reports.apportion import day_cuts, largest_remainder, split_by_days
from tests.reports.prices import steps
from tests.reports.scenario import A, FixedBaselines, h, quote

C = A.__class__(A.cloud, "us-east-1", "us-east-1b", "p3.2xlarge", A.market)


@given(st.integers(-(10**12), 10**12), st.lists(st.integers(0, 10**9), min_size=1, max_size=30))
def test_largest_remainder_splits_exactly_and_proportionally(total: int, weights: list[int]) -> None:
    parts = largest_remainder(total, weights)
    assert sum(parts) == total and len(parts) == len(weights)
    weight = sum(weights)
    if weight:
        for p, w in zip(parts, weights, strict=True):
            assert abs(p * weight - total * w) < weight  # within one micro-dollar of the exact share


def test_a_segment_over_midnight_is_split_by_its_microseconds() -> None:
    start = datetime(2020, 3, 1, 23, 30, tzinfo=UTC)
    end = datetime(2020, 3, 3, 0, 30, tzinfo=UTC)
    assert [b - a for a, b in day_cuts(start, end)] == [timedelta(minutes=30), timedelta(days=1), timedelta(minutes=30)]
    assert [p for _, _, p in split_by_days(start, end, 1_000_001)] == [20_000, 960_001, 20_000]


def test_a_job_that_paid_a_price_spike_says_so() -> None:
    prices = steps({A: [(h(-1), 1.0)], C: [(h(-1), 1.0), (h(1), 2.5)]})
    ledger = MemoryLedger(prices)
    ledger.record_interval(IntervalRecord("sim:p:e1", "job-p", "i-p", C, h(0), h(2), team="t", end_reason="finished"))
    job = JobRecord(
        id="job-p", team_id="t", batch_id=None, name="p", state=JobState.SUCCEEDED, reason="", spec={"gpus": 1},
        quote=quote(), provider="sim", offer=C, usd_per_hour=None, steps_total=72_000, steps_done=72_000,
        exit_code=0, idempotency_key=None, version=1, created_at=h(0), updated_at=h(2), started_at=h(0),
        finished_at=h(2), cancel_requested_at=None,
    )  # fmt: skip
    data = ReportData(ledger.intervals(), ledger.charges(), {"job-p": job})
    report = build_report(data, ReportQuery(h(0), h(3)), prices=prices, baselines=FixedBaselines(), now=h(3))
    p = report.job("job-p")
    assert micro_to_usd(p.run_actual_micro) == Decimal("3.5")  # 1 h x 1.00 + 1 h x 2.50
    assert isinstance(p.static_spot, BaselineRun) and micro_to_usd(p.static_spot.amount_micro) == Decimal("2")
    [over] = [o for o in p.over if o.kind.value == "static_spot"]
    [reason] = over.reasons
    assert reason.kind == "prices" and micro_to_usd(reason.amount_micro) == Decimal("1.5")
    assert reason.detail.startswith("a price spike:") and "2.5 USD/h" in reason.detail
