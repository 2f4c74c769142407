"""A report folded a batch of jobs at a time (``ReportFold``, ``iter_report_data``) is the report of every job
at once, and its page of jobs is that report's jobs in the page's order: in memory over drawn fleets of
jobs, and over the database's scenario on both backends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from costopt.domain import OfferKey
from costopt.jobs.model import JobState
from costopt.jobs.records import JobEvent, JobRecord
from costopt.ledger import IntervalRecord, MemoryLedger
from costopt.ledger.model import ChargeKind, ChargeRecord
from costopt.reports.data import ReportData, ReportScope, iter_report_data, load_report_data, report_scope
from costopt.reports.model import JOB_SORTS, BaselineRun, JobFigures, JobPage, ReportError, ReportQuery, SavingsReport
from costopt.reports.savings import build_report, ordered_jobs
from tests.reports.prices import steps
from tests.reports.scenario import NOW, OD, PRICES, A, B, FixedBaselines, Scenario, build, h, quote

QUERY = ReportQuery(h(-1), h(30), group_by=("team", "day"), top=3)
FOLD_PRICES = steps(
    {A: [(h(-2), 1.0), (h(5), 2.5), (h(9), 0.7)], B: [(h(-2), 1.2), (h(7), 0.9)], OD: [(h(-2), 3.06), (h(12), 2.9)]}
)
FOLD_NOW = h(30)

job_st = st.tuples(
    st.sampled_from(["t1", "t2", "t3"]),
    st.booleans(),  # managed (a record to take baselines from)
    st.lists(  # intervals: offer, start hour, hours, still open
        st.tuples(st.sampled_from([A, B]), st.integers(-1, 24), st.integers(1, 6), st.booleans()),
        min_size=0,
        max_size=3,
    ),
    st.integers(0, 3),  # egress charges
    st.integers(0, 2),  # preemption events
)


def _data(jobs: Sequence[tuple[str, bool, list[tuple[OfferKey, int, int, bool]], int, int]]) -> ReportData:
    ledger = MemoryLedger(FOLD_PRICES)
    records: dict[str, JobRecord] = {}
    events: dict[str, list[JobEvent]] = {}
    for n, (team, managed, intervals, egress, preemptions) in enumerate(jobs):
        job_id = f"job-{n:03d}"
        for i, (offer, start, hours, still_open) in enumerate(intervals):
            end = None if still_open and i == len(intervals) - 1 else h(start + hours)
            ledger.record_interval(
                IntervalRecord(f"sim:{job_id}:e{i}", job_id, f"i-{n}-{i}", offer, h(start), end, team=team)
            )
        for c in range(egress if intervals else 0):
            ledger.record_charge(
                ChargeRecord(
                    f"{job_id}:egress:{c}",
                    job_id,
                    ChargeKind.EGRESS,
                    h(c * 7 % 26),
                    team=team,
                    quantity=Decimal(3 + c),
                    unit="GB",
                    rate_usd=Decimal("0.02"),
                )
            )
        events[job_id] = [
            JobEvent(
                id=n * 10 + e,
                job_id=job_id,
                at=h(2 + 5 * e),
                kind="preemption",
                from_state=None,
                to_state=None,
                reason="spot reclaimed",
                cost_usd=Decimal("0.25") * (e + 1),
                detail=None,
            )
            for e in range(preemptions)
        ]
        if managed:
            done = 36_000 * (n % 4 + 1)
            records[job_id] = JobRecord(
                id=job_id,
                team_id=team,
                batch_id=None,
                name=f"model {n % 5}",
                state=JobState.SUCCEEDED,
                reason="",
                spec={"gpus": 1},
                quote=quote(),
                provider="sim",
                offer=A,
                usd_per_hour=None,
                steps_total=done,
                steps_done=done,
                exit_code=0,
                idempotency_key=None,
                version=1,
                created_at=h(-1),
                updated_at=h(9),
                started_at=h(0),
                finished_at=h(9),
                cancel_requested_at=None,
            )
    return ReportData(ledger.intervals(), ledger.charges(), records, events)


def _batches(data: ReportData, size: int) -> list[ReportData]:
    ids = sorted({ln.record.job_id for ln in data.intervals} | {c.record.job_id for c in data.charges})
    out = []
    for lo in range(0, len(ids), size):
        chunk = set(ids[lo : lo + size])
        out.append(
            ReportData(
                [ln for ln in data.intervals if ln.record.job_id in chunk],
                [c for c in data.charges if c.record.job_id in chunk],
                {j: r for j, r in data.jobs.items() if j in chunk},
                {j: e for j, e in data.events.items() if j in chunk},
            )
        )
    return out


def _report(
    data: ReportData | list[ReportData],
    *,
    window: tuple[datetime, datetime] | None = None,
    keep_rows: bool = True,
    page: JobPage | None = None,
) -> SavingsReport:
    return build_report(
        data,
        QUERY,
        prices=FOLD_PRICES,
        baselines=FixedBaselines(),
        now=FOLD_NOW,
        window=window,
        keep_rows=keep_rows,
        page=page,
    )


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(job_st, min_size=1, max_size=14),
    size=st.integers(1, 5),
    sort=st.sampled_from(JOB_SORTS),
    descending=st.booleans(),
    offset=st.integers(0, 6),
    limit=st.integers(1, 6),
)
def test_folding_in_batches_gives_the_report_of_every_job_at_once_and_the_page_is_its_jobs_in_order(
    jobs: list[tuple[str, bool, list[tuple[OfferKey, int, int, bool]], int, int]],
    size: int,
    sort: str,
    descending: bool,
    offset: int,
    limit: int,
) -> None:
    data = _data(jobs)
    whole = _report(data)
    assert _report(_batches(data, size)) == whole  # rows, sums, jobs, savers, over, activity: all equal
    window = (h(-1), h(24))
    assert _report(_batches(data, size), window=window) == whole  # the price memo's window changes nothing
    page = JobPage(sort, descending, offset, limit)
    paged = _report(_batches(data, size), keep_rows=False, page=page)
    assert paged.rows is None and paged.job_count == len(whole.jobs)
    assert paged.jobs == tuple(ordered_jobs(whole.jobs, page)[offset : offset + limit])
    assert replace(paged, rows=whole.rows, jobs=whole.jobs, page=None) == whole  # everything else is the same
    if whole.jobs:  # the drawn fleets reach the assertions that matter (not only empty reports)
        assert whole.totals.actual_micro > 0 and len(whole.rows or ()) > 0
    assert [s.job_id for s in whole.top_savers] == _top(whole.jobs, QUERY.top)


def _top(jobs: Sequence[JobFigures], n: int) -> list[str]:
    """The top savers by hand: jobs with an on-demand baseline, most saved first, ties by id."""
    savers = [j for j in jobs if isinstance(j.on_demand, BaselineRun)]
    return [j.job_id for j in sorted(savers, key=lambda j: (-j.period.savings_on_demand_micro, j.job_id))][:n]


def test_the_drawn_fleets_reach_savers_over_baseline_jobs_and_activity() -> None:
    """The property above on one fixed fleet, so the test cannot pass on empty reports only."""
    fleet = [
        ("t1", True, [(A, 0, 4, False), (B, 4, 3, False)], 2, 1),
        ("t2", True, [(A, 4, 6, False)], 0, 2),
        ("t3", False, [(B, 1, 2, True)], 1, 0),
        ("t1", True, [(B, 20, 5, True)], 0, 0),
        ("t2", True, [(A, 8, 1, False)], 3, 1),
    ]
    data = _data(fleet)
    whole = _report(data)
    assert whole.job_count == 5 and len(whole.top_savers) == 3 and whole.over_baseline and whole.activity
    assert [s.job_id for s in whole.top_savers] == _top(whole.jobs, 3)
    over = sorted((j for j in whole.jobs if j.over), key=lambda j: (-max(o.excess_micro for o in j.over), j.job_id))
    assert [o.job_id for o in whole.over_baseline] == [j.job_id for j in over]
    for size in (1, 2, 3, 5):
        assert _report(_batches(data, size)) == whole
    page = JobPage("savings", True, 1, 2)
    paged = _report(_batches(data, 2), keep_rows=False, page=page)
    assert [j.job_id for j in paged.jobs] == [j.job_id for j in ordered_jobs(whole.jobs, page)][1:3]


def _job(job_id: str, moves: int) -> JobFigures:
    base = _report(_data([("t1", False, [(A, 0, 1, False)], 0, 0)])).jobs[0]
    return replace(base, job_id=job_id, moves=moves)


def test_the_order_puts_jobs_without_a_value_last_both_ways_and_breaks_ties_by_id() -> None:
    jobs = [_job("b", 2), _job("a", 2), _job("c", 5), _job("d", 0)]

    def by(page: JobPage) -> list[str]:
        return [j.job_id for j in ordered_jobs(jobs, page)]

    assert by(JobPage("moves")) == ["d", "a", "b", "c"]
    assert by(JobPage("moves", descending=True)) == ["c", "a", "b", "d"]
    # unmanaged jobs have no baseline: no savings value, last either way
    assert by(JobPage("savings")) == by(JobPage("savings", descending=True)) == ["a", "b", "c", "d"]


def test_a_page_is_checked_and_parsed_as_the_api_gives_it() -> None:
    assert JobPage.parse("-savings", offset=5, limit=20) == JobPage("savings", True, 5, 20)
    assert JobPage.parse("name").label == "name" and JobPage.parse("-moves").label == "-moves"
    with pytest.raises(ReportError, match="cannot sort jobs by 'cost'; choose from job_id, name"):
        JobPage.parse("cost")
    with pytest.raises(ReportError, match="limit must be >= 1"):
        JobPage(limit=0)
    with pytest.raises(ReportError, match="offset must be >= 0"):
        JobPage(offset=-1)


@pytest.fixture
def sc(engine: Engine) -> Scenario:
    return build(engine)


@pytest.mark.parametrize("batch", [1, 2, 200])
def test_the_database_is_read_a_batch_of_jobs_at_a_time_with_the_same_report(sc: Scenario, batch: int) -> None:
    query = ReportQuery(h(-1), h(24), group_by=("team",))
    whole = build_report(
        load_report_data(sc.engine, sc.ledger, team=None), query, prices=PRICES, baselines=FixedBaselines(), now=NOW
    )
    scope = report_scope(sc.ledger, team=None)
    assert scope.job_ids == tuple(sorted([sc.j, sc.k, sc.l]))
    assert scope.first_start == h(0) and scope.last_start is not None and scope.last_start > scope.first_start
    batches = list(iter_report_data(sc.engine, sc.ledger, scope, team=None, batch=batch))
    assert len(batches) == -(-3 // batch)
    assert [sorted(b.jobs) for b in batches] == [sorted(scope.job_ids[i : i + batch]) for i in range(0, 3, batch)]
    window = (scope.first_start, scope.last_start)
    folded = build_report(batches, query, prices=PRICES, baselines=FixedBaselines(), now=NOW, window=window)
    assert folded == whole and whole.job_count == 3
    nlp = report_scope(sc.ledger, team=sc.nlp)
    assert nlp.job_ids == (sc.k,) and nlp.first_start == h(1)
    assert report_scope(sc.ledger, team="nobody") == ReportScope((), None, None)
