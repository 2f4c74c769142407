"""A job's cost from the ledger (costopt/jobs/costs.py) and its view (costopt/jobs/view.py), on the SQL
ledger of both backends: closed intervals, an open one priced up to the time asked, egress added, memo
lines not added, nothing after the time asked; a migration's egress, overlap and restart; the ETA."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from costopt.jobs.costs import CopyKeys, job_charges, job_cost, migration_cost, page_costs
from costopt.jobs.records import JobRepository, NewJob
from costopt.jobs.view import eta, job_view
from costopt.ledger.model import ChargeKind, ChargeRecord, IntervalRecord, NoPriceInEffect
from costopt.ledger.sql import SqlLedger
from tests.jobs.engine_support import LOCAL_A, LOCAL_B, FixedPlacements, FlatPrices

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
JOB = "job-0123456789abcdef"


def _hours(h: float) -> datetime:
    return T0 + timedelta(hours=h)


@pytest.fixture
def ledger(engine) -> SqlLedger:
    led = SqlLedger(engine, FlatPrices())
    # epoch 1 on A (3.6 USD/h) for 2 h, moved to B (7.2 USD/h) which still runs; 10 GB of egress at 0.02
    led.record_interval(IntervalRecord("k1", JOB, "i-1", LOCAL_A, _hours(0), _hours(2), provider="local"))
    led.record_interval(IntervalRecord("k2", JOB, "i-2", LOCAL_B, _hours(1.75), provider="local"))
    led.record_charge(
        ChargeRecord(
            f"{JOB}:m2:egress", JOB, ChargeKind.EGRESS, _hours(1.75), quantity=Decimal(10), rate_usd=Decimal("0.02")
        )
    )
    led.record_charge(
        ChargeRecord("k1:overlap", JOB, ChargeKind.OVERLAP, _hours(2), offer=LOCAL_A, span=(_hours(1.75), _hours(2)))
    )
    led.record_charge(
        ChargeRecord("k2:restart", JOB, ChargeKind.RESTART, _hours(2), offer=LOCAL_B, span=(_hours(1.75), _hours(2)))
    )
    # another job's interval is never counted
    led.record_interval(IntervalRecord("o1", "job-other", "i-9", LOCAL_B, _hours(0), _hours(5), provider="local"))
    return led


def test_the_cost_so_far_counts_closed_and_open_intervals_and_egress_up_to_the_time_asked(ledger) -> None:
    # 2 h x 3.6 + 1.25 h x 7.2 + 10 GB x 0.02; the memo lines (overlap 0.9, restart 1.8) are not added
    assert job_cost(ledger, JOB, _hours(3)) == Decimal("7.2") + Decimal("9") + Decimal("0.2")
    # at 1.5 h: A's first 1.5 h only; B and the egress had not started
    assert job_cost(ledger, JOB, _hours(1.5)) == Decimal("5.4")
    assert job_cost(ledger, JOB, _hours(3)).as_tuple().exponent == -6  # exact micro-dollars
    with pytest.raises(ValueError, match="tz-aware"):
        job_cost(ledger, JOB, datetime(2026, 3, 2, 13, 0))


def test_an_open_interval_without_a_price_is_an_error_not_a_guess(engine) -> None:
    led = SqlLedger(engine, FlatPrices())
    unknown = LOCAL_A.__class__(LOCAL_A.cloud, "nowhere", "", "x", LOCAL_A.market)
    led.record_interval(IntervalRecord("u1", JOB, "i-1", unknown, _hours(0), provider="local"))
    with pytest.raises(NoPriceInEffect):
        job_cost(led, JOB, _hours(1))


def test_a_migrations_cost_is_its_egress_overlap_and_restart(ledger) -> None:
    charges = job_charges(ledger, JOB)
    cost = migration_cost(charges, JOB, 2, CopyKeys("k1", "k2"))
    assert (cost.egress, cost.overlap, cost.restart) == (Decimal("0.2"), Decimal("0.9"), Decimal("1.8"))
    assert cost.total == Decimal("2.9") and cost.known
    none = migration_cost(charges, JOB, 7, CopyKeys(None, None))
    assert none.total == 0 and not none.known


def test_the_view_has_the_eta_at_the_current_offers_throughput_the_cost_and_the_moves(engine, ledger) -> None:
    repo = JobRepository(engine, now=lambda: T0)
    job, _ = repo.create(NewJob(team_id="t", spec={"command": ["x"]}, steps_total=10_000, provider="local", job_id=JOB))
    placements = FixedPlacements([LOCAL_A, LOCAL_B])
    assert eta(job, placements, _hours(1)) is None  # queued: no ETA
    repo.transition(job.id, job.state.LAUNCHING, "test")
    job = repo.transition(job.id, job.state.RUNNING, "test", offer=LOCAL_B)
    repo.set_progress(job.id, 2_000)
    repo.add_event(
        job.id,
        "move",
        "cheaper",
        cost_usd=Decimal("2.9"),
        detail={"migration_id": 2, "from": LOCAL_A.to_doc(), "to": LOCAL_B.to_doc()},
    )
    job = repo.get(job.id)
    view = job_view(job, repo.events(job.id), ledger=ledger, placements=placements, at=_hours(3))
    assert view.steps_done == 2_000
    assert view.eta == _hours(3) + timedelta(seconds=8_000 / 80.0)  # B runs 80 steps/s
    assert view.cost_so_far_usd == Decimal("16.4")
    (move,) = view.moves
    assert (move.kind, move.cost_usd, move.from_offer, move.to_offer) == ("move", Decimal("2.9"), LOCAL_A, LOCAL_B)
    assert job_view(job, [], ledger=None, placements=placements, at=_hours(3)).cost_so_far_usd is None


def test_a_pages_costs_read_at_once_are_each_jobs_own(ledger, engine) -> None:
    # the listing's one read: each job's figure is job_cost's; a job without lines is absent (0)
    at = _hours(3)
    costs = page_costs(ledger, [JOB, "job-other", "job-none"], at)
    assert costs == {JOB: job_cost(ledger, JOB, at), "job-other": job_cost(ledger, "job-other", at)}
    with engine.connect() as conn:
        assert page_costs(ledger, [JOB], at, conn=conn) == {JOB: job_cost(ledger, JOB, at)}
    # one job's open interval without a price: None (the caller prices each alone), not a wrong total
    unknown = LOCAL_A.__class__(LOCAL_A.cloud, "nowhere", "", "x", LOCAL_A.market)
    ledger.record_interval(IntervalRecord("u1", "job-unpriced", "i-5", unknown, _hours(0), provider="local"))
    assert page_costs(ledger, [JOB, "job-unpriced"], at) is None
    assert page_costs(ledger, [JOB], at) == {JOB: job_cost(ledger, JOB, at)}
