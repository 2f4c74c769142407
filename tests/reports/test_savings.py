"""The savings report on a known price path (tests/reports/scenario.py has every figure by hand):
actual cost from the ledger, both baselines from the price history over the job's run, savings net of
the moves' and preemptions' costs, the reasons a job cost more than a baseline, exact agreement of every
view with the ledger, and scoping. Both backends."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from sqlalchemy import Engine

from costopt.ledger.model import micro_to_usd
from costopt.reports import BaselineRun, ReportQuery, SavingsReport, build_report, load_report_data, report_doc
from costopt.reports.model import BaselineKind, OverJob, ReportError, Saver
from tests.reports.scenario import NOW, OD, PRICES, A, FixedBaselines, Scenario, build, h, m

D = Decimal
START, END = h(-1), h(24)


@pytest.fixture
def sc(engine: Engine) -> Scenario:
    return build(engine)


def _report(
    sc: Scenario,
    *,
    team: str | None = None,
    start: datetime = START,
    end: datetime = END,
    group_by: tuple[str, ...] = ("team",),
    job_ids: tuple[str, ...] | None = None,
) -> SavingsReport:
    query = ReportQuery(start=start, end=end, team=team, group_by=group_by, job_ids=job_ids)
    data = load_report_data(sc.engine, sc.ledger, team=team)
    return build_report(data, query, prices=PRICES, baselines=FixedBaselines(), now=NOW)


def test_a_job_with_a_move_and_a_preemption_gets_its_hand_computed_cost_and_baselines(sc: Scenario) -> None:
    j = _report(sc).job(sc.j)
    assert micro_to_usd(j.run_actual_micro) == D("4.27")
    od, st = j.on_demand, j.static_spot
    assert isinstance(od, BaselineRun) and isinstance(st, BaselineRun)
    assert (od.offer, od.starts_at, od.ends_at, od.work_steps, od.boot_seconds) == (OD, h(0), m(210), 122_400, 360)
    assert micro_to_usd(od.amount_micro) == D("10.71")
    assert st.offer == A and [(s.usd_per_hour, micro_to_usd(s.amount_micro_usd)) for s in st.segments] == [
        (D("1.0"), D("2")),
        (D("3.0"), D("4.5")),
    ]  # the price change at T+2h inside the baseline's run
    assert micro_to_usd(st.amount_micro) == D("6.50")
    assert micro_to_usd(j.period.savings_on_demand_micro) == D("6.44")
    assert j.period.savings_rate == D("0.6013")
    assert micro_to_usd(j.period.savings_static_spot_micro) == D("2.23")
    assert j.period.savings_rate_static_spot == D("0.3431")
    assert (j.moves, j.preemptions) == (1, 1)
    assert micro_to_usd(j.move_cost_micro) == D("0.38")  # egress 0.04 + overlap 0.25 + restart 0.09
    assert micro_to_usd(j.preemption_cost_micro) == D("0.54")  # lost work 0.45 + restart 0.09
    assert micro_to_usd(j.lost_work_micro) == D("0.45")
    assert micro_to_usd(j.boot_micro) == D("0.10")
    assert micro_to_usd(j.run_egress_micro) == D("0.04")
    [check] = j.move_checks
    assert (
        check.paid is True
        and micro_to_usd(check.stay_micro or 0) == D("3")
        and micro_to_usd(check.moved_micro) == D("1.28")
    )
    assert j.over == ()


def test_a_preempted_job_that_cost_more_than_static_spot_says_why(sc: Scenario) -> None:
    report = _report(sc)
    k = report.job(sc.k)
    assert micro_to_usd(k.run_actual_micro) == D("5.50")
    assert isinstance(k.static_spot, BaselineRun) and micro_to_usd(k.static_spot.amount_micro) == D("4.20")
    assert isinstance(k.on_demand, BaselineRun) and micro_to_usd(k.on_demand.amount_micro) == D("6.324")
    [over] = k.over
    assert over.kind is BaselineKind.STATIC_SPOT and micro_to_usd(over.excess_micro) == D("1.30")
    [reason] = over.reasons
    assert reason.kind == "preemptions" and micro_to_usd(reason.amount_micro) == D("1.30")
    assert "work lost since the last checkpoint 1.000000 USD" in reason.detail
    assert report.over_baseline == (OverJob(sc.k, (BaselineKind.STATIC_SPOT,), 1_300_000, "preemptions"),)
    assert [s.job_id for s in report.top_savers] == [sc.j, sc.k, sc.l]
    assert report.top_savers[1] == Saver(sc.k, k.name, k.period)


def test_a_running_job_is_priced_up_to_now_and_its_baselines_cover_the_work_done(sc: Scenario) -> None:
    lj = _report(sc).job(sc.l)
    assert micro_to_usd(lj.run_actual_micro) == D("0.90")
    assert lj.last_end is None and any(r.open for r in _report(sc).rows or () if r.job_id == sc.l)
    assert isinstance(lj.on_demand, BaselineRun) and micro_to_usd(lj.on_demand.amount_micro) == D("1.53")
    assert isinstance(lj.static_spot, BaselineRun) and micro_to_usd(lj.static_spot.amount_micro) == D("1.50")


def test_totals_days_and_groups_add_up_to_the_ledger_exactly(sc: Scenario) -> None:
    report = _report(sc, group_by=("team", "cloud", "region", "accelerator", "market", "day", "month", "job"))
    total = report.totals
    assert micro_to_usd(total.actual_micro) == D("10.67")  # 4.27 + 5.50 + 0.90
    assert micro_to_usd(total.baseline_on_demand_micro) == D("18.564")  # 10.71 + 6.324 + 1.53
    assert micro_to_usd(total.baseline_static_spot_micro) == D("12.20")  # 6.50 + 4.20 + 1.50
    assert total.actual_micro == sc.ledger.costs(start=h(-1), end=h(24), as_of=NOW).total_micro_usd
    for series in (report.groups, report.days):
        assert sum(g.figures.actual_micro for g in series) == total.actual_micro
        assert sum(g.figures.baseline_on_demand_micro for g in series) == total.baseline_on_demand_micro
        assert sum(g.figures.baseline_static_spot_micro for g in series) == total.baseline_static_spot_micro
    assert [g.key[0] for g in report.days] == ["2020-03-01", "2020-03-02"]
    day1 = report.days[0].figures  # T to midnight: J's first hour on A at 1.00
    assert micro_to_usd(day1.actual_micro) == D("1")
    doc = report_doc(report)
    assert doc["totals"]["actual_cost"] == "10.670000" and doc["totals"]["savings"] == "7.894000"
    assert doc["totals"]["savings_rate"] == "0.4252"  # 7.894 / 18.564
    assert doc["totals"]["move_cost"] == "0.380000" and doc["totals"]["preemption_cost"] == "1.840000"  # 0.54 + 1.30


def test_a_period_cuts_the_ledger_as_the_ledger_does_and_spreads_each_baseline_by_its_share(sc: Scenario) -> None:
    start, end = h(1), h(3)
    report = _report(sc, start=start, end=end, group_by=("job",))
    assert report.totals.actual_micro == sc.ledger.costs(start=start, end=end, as_of=NOW).total_micro_usd
    j = report.job(sc.j)
    # J in [T+1h, T+3h): e1 1h x 1.00 + 5 min x 3.00, e2 1h x 0.90, the egress: 2.19 of its 4.27
    assert micro_to_usd(j.period.actual_micro) == D("2.19")
    share = (D("10.71") * D("2.19") / D("4.27")).quantize(D("0.000001"), ROUND_HALF_EVEN)
    assert micro_to_usd(j.period.baseline_on_demand_micro) == share == D("5.492951")
    assert sc.l not in {x.job_id for x in report.jobs}  # starts at T+3h: not in the period


def test_a_team_sees_only_its_own_jobs(sc: Scenario) -> None:
    nlp = _report(sc, team=sc.nlp)
    assert [j.job_id for j in nlp.jobs] == [sc.k]
    assert micro_to_usd(nlp.totals.actual_micro) == D("5.50")
    vision = _report(sc, team=sc.vision, job_ids=(sc.k,))  # another team's job: nothing of it
    assert vision.jobs == () and vision.totals.actual_micro == 0


def test_bad_queries_say_what_to_fix() -> None:
    with pytest.raises(ReportError, match="give to > from"):
        ReportQuery(start=h(1), end=h(1))
    with pytest.raises(ReportError, match="cannot group by colour"):
        ReportQuery(start=h(0), end=h(1), group_by=("colour",))
    with pytest.raises(ReportError, match="tz-aware UTC"):
        ReportQuery(start=h(0).replace(tzinfo=None), end=h(1))
    assert ReportQuery(start=h(0), end=h(0) + timedelta(microseconds=1)).top == 10


def test_a_report_reads_only_the_events_it_counts_and_all_of_them(sc: Scenario) -> None:
    """Every event of every job in scope was read (a report's memory grew with all of them: soak X3), and only
    each job's first 500: a preemption after 500 other events was left out of the lost work."""
    from costopt.jobs.records import MAX_PAGE, JobRepository
    from costopt.reports.data import EVENT_KINDS
    from costopt.reports.savings import ACTIVITY_EVENTS, LOSS_EVENTS

    assert set(LOSS_EVENTS) | set(ACTIVITY_EVENTS) == set(EVENT_KINDS)
    repo = JobRepository(sc.engine, now=lambda: m(199))
    for k in range(MAX_PAGE + 100):
        repo.add_event(sc.j, "checkpoint", f"checkpoint {k}", at=m(199))
    repo.add_event(sc.j, "preemption", "6 min lost", cost_usd=Decimal("0.10"), at=m(200))
    data = load_report_data(sc.engine, sc.ledger, team=None)
    assert {e.kind for evs in data.events.values() for e in evs} <= set(EVENT_KINDS)
    assert [e.kind for e in data.events[sc.j]] == ["move", "preemption", "preemption"]
    j = _report(sc).job(sc.j)
    assert micro_to_usd(j.lost_work_micro) == D("0.55")  # 0.45 + the late 0.10
