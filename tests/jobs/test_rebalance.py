"""The rebalancer on both backends with a fake Placements and a fake engine move: a job moves when a
cheaper offer beats the margin, stays within the dwell time or below the margin (with the rule's
reason), and one job's failure never stops the pass."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placement
from costopt.jobs.rebalance import Outcome, Rebalancer
from costopt.jobs.records import JobRecord, JobRepository, NewJob
from costopt.migration.decision import MigrationRule, Reason
from costopt.migration.records import JobFinished

T0 = datetime(2020, 3, 1, 12, tzinfo=UTC)

HERE = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
CHEAP = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)
ALMOST = OfferKey(Cloud.AWS, "us-east-1", "us-east-1c", "p3.2xlarge", Market.SPOT)
FAR = OfferKey(Cloud.GCP, "us-central1", "us-central1-a", "n1-standard-8+v100x1", Market.SPOT)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> datetime:
        return self.t


@dataclass
class FakePlacements:
    """Offers -> (USD/h, steps/s); ``rank`` orders by the cost of the remaining steps."""

    prices: dict[OfferKey, tuple[float, float]]
    broken: set[str] = field(default_factory=set)
    calls: list[tuple[str, datetime]] = field(default_factory=list)

    def _placement(self, key: OfferKey, remaining: float) -> Placement:
        usd, sps = self.prices[key]
        hours = remaining / sps / 3600.0
        return Placement(key, usd, sps, hours, Decimal(repr(round(hours * usd, 6))))

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        self.calls.append((job.id, at))
        if job.id in self.broken:
            raise RuntimeError("the planner is down for this job")
        out = [self._placement(k, remaining_steps) for k in self.prices if k not in exclude]
        return sorted(out, key=lambda p: p.expected_cost_usd)[:top]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        return self._placement(offer, remaining_steps) if offer in self.prices else None


@dataclass
class FakeMove:
    """The engine's move as the contract states it: running -> migrating -> running on the first
    placement, with a ``move`` event (or a rollback / an error when told)."""

    repo: JobRepository
    calls: list[tuple[str, list[OfferKey], str, Decimal]] = field(default_factory=list)
    roll_back: set[str] = field(default_factory=set)
    explode: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)

    def __call__(
        self, job_id: str, placements: Sequence[Placement], *, reason: str, expected_saving_usd: Decimal
    ) -> JobRecord:
        self.calls.append((job_id, [p.offer for p in placements], reason, expected_saving_usd))
        if job_id in self.explode:
            raise RuntimeError("provider unreachable")
        if job_id in self.finished:  # the job's last step landed between the decision and the move
            raise JobFinished(f"job {job_id!r} has finished")
        self.repo.transition(job_id, JobState.MIGRATING, "moving", expect=JobState.RUNNING)
        if job_id in self.roll_back:
            return self.repo.transition(job_id, JobState.RUNNING, "every launch failed: rolled back")
        target = placements[0]
        self.repo.add_event(job_id, "move", reason, detail={"expected_saving_usd": str(expected_saving_usd)})
        return self.repo.transition(
            job_id,
            JobState.RUNNING,
            "moved",
            offer=target.offer,
            usd_per_hour=Decimal(repr(target.usd_per_hour)),
        )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def repo(engine, clock) -> JobRepository:
    return JobRepository(engine, now=clock)


def _running(repo: JobRepository, *, offer: OfferKey = HERE, steps_total: int = 1_000_000, name: str = "") -> str:
    job, _ = repo.create(
        NewJob(team_id="team-a", spec={"checkpoint_gb": 2.0}, steps_total=steps_total, provider="sim", name=name)
    )
    repo.transition(job.id, JobState.LAUNCHING, "launching")
    repo.transition(job.id, JobState.RUNNING, "running", offer=offer, usd_per_hour=Decimal("3"))
    return job.id


def _rebalancer(repo, placements, move, clock) -> Rebalancer:
    return Rebalancer(repo, placements, move, MigrationRule(), clock)


def test_a_cheaper_offer_beating_the_margin_is_proposed_in_a_dry_run_then_moved(repo, clock):
    job_id = _running(repo)
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0), ALMOST: (2.9, 10.0)})
    move = FakeMove(repo)
    rebalancer = _rebalancer(repo, placements, move, clock)

    dry = rebalancer.run_once(dry_run=True)
    assert [i.outcome for i in dry.items] == [Outcome.PROPOSED]
    item = dry.items[0]
    assert (item.from_offer, item.to_offer) == (HERE, CHEAP)
    # 1e6 steps at $3/h vs $1/h, 10 steps/s: saving = 1e6 * 2 / 36000; move = 10 min at $1 + 5 min at $3
    # (same region: no egress); margin = max(5% of $83.33, $1).
    assert item.saving_usd == pytest.approx(Decimal("55.5556"), abs=Decimal("0.001"))
    assert item.move_cost_usd == pytest.approx(Decimal(1 / 6 + 3 / 12), abs=Decimal("0.001"))
    assert item.margin_usd == pytest.approx(Decimal("4.16667"), abs=Decimal("0.001"))
    assert Reason.SAVES_ENOUGH.text in item.reason
    assert move.calls == []
    assert repo.get(job_id).offer == HERE
    assert placements.calls == [(job_id, T0)]  # the service clock's now

    made = rebalancer.run_once(dry_run=False)
    assert [i.outcome for i in made.items] == [Outcome.MOVED]
    assert repo.get(job_id).offer == CHEAP
    [(called_id, offers, reason, saving)] = move.calls
    assert called_id == job_id
    # The target first; the almost-as-expensive offer does not clear the margin, so it is no fallback.
    assert offers == [CHEAP]
    assert reason == item.reason
    assert saving == made.items[0].net_saving_usd == item.saving_usd - item.move_cost_usd
    assert made.expected_saving_usd == saving


def test_every_offer_that_pays_is_a_fallback_best_net_saving_first(repo, clock):
    _running(repo)
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0), ALMOST: (1.5, 10.0), FAR: (1.2, 10.0)})
    move = FakeMove(repo)
    _rebalancer(repo, placements, move, clock).run_once(dry_run=False)
    [(_, offers, _, _)] = move.calls
    # FAR saves more per step than ALMOST but ships 2 GB across clouds: still ahead of ALMOST.
    assert offers == [CHEAP, FAR, ALMOST]


def test_a_job_stays_below_the_margin_with_the_rules_reason(repo, clock):
    job_id = _running(repo)
    placements = FakePlacements({HERE: (3.0, 10.0), ALMOST: (2.9, 10.0)})
    move = FakeMove(repo)
    report = _rebalancer(repo, placements, move, clock).run_once(dry_run=False)
    [item] = report.items
    assert item.outcome is Outcome.STAYED
    assert Reason.BELOW_MARGIN.text in item.reason
    assert item.to_offer is None
    assert move.calls == []
    assert repo.get(job_id).offer == HERE


def test_a_job_that_moved_within_the_dwell_time_stays_then_moves_after_it(repo, clock):
    job_id = _running(repo)
    repo.add_event(job_id, "move", "moved by the rebalancer", at=T0 - timedelta(hours=2))
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)})
    move = FakeMove(repo)
    rebalancer = _rebalancer(repo, placements, move, clock)
    [item] = rebalancer.run_once(dry_run=False).items
    assert item.outcome is Outcome.STAYED
    assert Reason.DWELL.text in item.reason
    assert move.calls == []

    clock.t = T0 + timedelta(hours=23)  # 25 h after the move: past the 24 h dwell
    [item] = rebalancer.run_once(dry_run=False).items
    assert item.outcome is Outcome.MOVED
    assert repo.get(job_id).offer == CHEAP


def test_only_running_jobs_not_cancel_requested_are_weighed(repo, clock):
    running = _running(repo, name="runs")
    cancelling = _running(repo, name="cancelling")
    repo.request_cancel(cancelling)
    queued, _ = repo.create(NewJob(team_id="team-a", spec={}, steps_total=10, provider="sim"))
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)})
    move = FakeMove(repo)
    report = _rebalancer(repo, placements, move, clock).run_once(dry_run=False)
    by_id = {i.job_id: i for i in report.items}
    assert set(by_id) == {running, cancelling}
    assert by_id[running].outcome is Outcome.MOVED
    assert by_id[cancelling].outcome is Outcome.STAYED and "cancel" in by_id[cancelling].reason
    assert [c[0] for c in move.calls] == [running]
    assert repo.get(queued.id).state is JobState.QUEUED


def test_one_jobs_failure_never_stops_the_pass(repo, clock, caplog: pytest.LogCaptureFixture):
    planner_down = _running(repo, name="planner down")
    explodes = _running(repo, name="move explodes")
    rolls_back = _running(repo, name="move rolls back")
    fine = _running(repo, name="fine")
    no_price = _running(repo, offer=FAR, name="no price here")
    raced = _running(repo, name="finished meanwhile")
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)}, broken={planner_down})
    move = FakeMove(repo, explode={explodes}, roll_back={rolls_back}, finished={raced})
    with caplog.at_level(logging.WARNING, logger="costopt.jobs.rebalance"):
        report = _rebalancer(repo, placements, move, clock).run_once(dry_run=False)
    by_id = {i.job_id: i for i in report.items}
    # a race with the job's end is a handled outcome: one line, no traceback; a real fault keeps its traceback
    assert by_id[raced].outcome is Outcome.FAILED and "JobFinished" in by_id[raced].reason
    race_logs = [r for r in caplog.records if raced in r.getMessage()]
    fault_logs = [r for r in caplog.records if explodes in r.getMessage()]
    assert len(race_logs) == 1 and race_logs[0].exc_info is None and race_logs[0].levelno == logging.WARNING
    assert len(fault_logs) == 1 and fault_logs[0].exc_info is not None
    assert by_id[planner_down].outcome is Outcome.FAILED and "the planner is down" in by_id[planner_down].reason
    assert by_id[explodes].outcome is Outcome.FAILED and "provider unreachable" in by_id[explodes].reason
    assert by_id[rolls_back].outcome is Outcome.FAILED and "rolled back" in by_id[rolls_back].reason
    assert by_id[fine].outcome is Outcome.MOVED
    assert by_id[no_price].outcome is Outcome.STAYED and "no price" in by_id[no_price].reason
    assert len(report.failed) == 4
    assert repo.get(fine).offer == CHEAP
    assert repo.get(rolls_back).offer == HERE


def test_an_empty_database_is_an_empty_pass(repo, clock):
    report = _rebalancer(repo, FakePlacements({}), FakeMove(repo), clock).run_once(dry_run=False)
    assert report.items == () and report.at == T0 and report.expected_saving_usd == 0


def _done_move(engine, job_id: str, at: datetime, *, from_epoch: int = 1) -> None:
    import json

    from sqlalchemy import insert

    from costopt.db.migration_schema import migrations

    with engine.begin() as conn:
        conn.execute(
            insert(migrations).values(
                job_id=job_id,
                kind="move",
                state="done",
                from_epoch=from_epoch,
                to_epoch=from_epoch + 1,
                offers=json.dumps([HERE.to_doc()]),
                created_at=at,
                updated_at=at,
            )
        )


def test_without_move_events_a_finished_migration_counts_unless_it_is_on_another_clock(engine, repo, clock):
    placements = FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)})
    first_launch = _running(repo, name="first launch only")
    _done_move(engine, first_launch, T0 - timedelta(hours=1), from_epoch=0)  # its start: not a move
    moved_lately = _running(repo, name="moved an hour ago")
    _done_move(engine, moved_lately, T0 - timedelta(hours=1))
    wall_clock = _running(repo, name="moved on the wall clock")
    _done_move(engine, wall_clock, datetime(2026, 12, 1, tzinfo=UTC))  # after the (simulated) now: ignored
    report = _rebalancer(repo, placements, FakeMove(repo), clock).run_once(dry_run=True)
    by_id = {i.job_id: i for i in report.items}
    assert by_id[first_launch].outcome is Outcome.PROPOSED
    assert by_id[moved_lately].outcome is Outcome.STAYED and Reason.DWELL.text in by_id[moved_lately].reason
    assert by_id[wall_clock].outcome is Outcome.PROPOSED


def test_after_a_move_the_next_job_is_decided_as_it_is_then_at_the_prices_then(repo, clock):
    # A move blocks for its checkpoint, launch and verification: here 40 minutes of the service clock, in
    # which the cheap offer's price rises and one of the other jobs finishes. The one left is priced at
    # T0 + 40 min (it stays: nothing beats its offer any more); the finished one is not weighed.
    jobs = {_running(repo, name=n) for n in ("a", "b", "c")}
    prices = {HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)}
    placements = FakePlacements(prices)
    left: list[str] = []

    class SlowMove(FakeMove):
        def __call__(
            self, job_id: str, placements_: Sequence[Placement], *, reason: str, expected_saving_usd: Decimal
        ) -> JobRecord:
            done = super().__call__(job_id, placements_, reason=reason, expected_saving_usd=expected_saving_usd)
            clock.t += timedelta(minutes=40)
            prices[CHEAP] = (3.5, 10.0)
            finished, stays = sorted(jobs - {job_id})
            repo.transition(finished, JobState.SUCCEEDED, "finished")
            left.append(stays)
            return done

    move = SlowMove(repo)
    report = _rebalancer(repo, placements, move, clock).run_once(dry_run=False)
    [(moved, *_)] = move.calls
    assert placements.calls == [(moved, T0), (left[0], T0 + timedelta(minutes=40))]
    assert [(i.job_id, i.outcome) for i in report.items] == [(moved, Outcome.MOVED), (left[0], Outcome.STAYED)]
    assert report.at == T0
