"""The job engine over the simulated cloud (its simulated agents, its clock; the migrator sleeps on it), on
both backends, offline and in milliseconds: a job given by throughput runs from queued to succeeded with
exactly its steps and its ledger cost; a spot preemption (forced: ``SimCloud.preempt``) is recovered
through the watcher on the job's own placements; cancel checkpoints first; a move records its cost."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from costopt.agent import control
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.costs import job_cost
from costopt.jobs.engine import JobEngine
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord, JobRepository, NewJob
from costopt.ledger import StepPrices
from costopt.ledger.model import micro_to_usd, usd_to_micro
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import InterruptionWatcher, MemoryWatermark
from costopt.risk.hazard import HazardModel
from costopt.simulated import WorkloadTiming
from providers.sim import SimCloud, SimConfig
from tests.price_support import step_prices

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

START = datetime(2020, 3, 1, tzinfo=UTC)
OD_A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
OD_B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2b", "p3.2xlarge", Market.ON_DEMAND)
SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
PRICE = {OD_A: 3.06, OD_B: 2.5, SPOT: 0.92}
RATE = 2.0  # steps/s on every offer
TIMING = WorkloadTiming(checkpoint_interval=timedelta(minutes=30))


def _prices() -> StepPrices:
    return step_prices((k, START - timedelta(days=1), p) for k, p in PRICE.items())


class SimPlacements:
    def __init__(self, offers: Sequence[OfferKey]) -> None:
        self.offers = list(offers)

    def _one(self, offer: OfferKey, steps: float) -> Placement:
        hours = steps / RATE / 3600
        return Placement(offer, PRICE[offer], RATE, hours, Decimal(repr(round(hours * PRICE[offer], 6))))

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        return [self._one(o, remaining_steps) for o in self.offers if o not in exclude][:top]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        return self._one(offer, remaining_steps) if offer in PRICE else None


class Sim:
    def __init__(self, db: Engine, tmp: Path, offers: Sequence[OfferKey], *, spot_hazard: float = 0.0, seed: int = 0):
        prices = _prices()
        hazards = HazardModel(defaults={**dict.fromkeys(Cloud, 0.0), Cloud.AWS: spot_hazard})
        self.cloud = SimCloud(prices, hazards, start=START, seed=seed, config=SimConfig(timing=TIMING))
        self.repo = JobRepository(db, now=self.cloud.now)
        self.unavailable = UnavailableOffers(db, clock=self.cloud.now)
        self.migrator = Migrator(
            db,
            self.cloud,
            sleep=self.cloud.sleeper(),
            now=self.cloud.now,
            poll_seconds=2.0,
            hook=lambda point: None,
            ledger=SqlLedger(db, prices),
            unavailable=self.unavailable,
            **self.cloud.migrator_timeouts(),  # type: ignore[arg-type]
        )
        self.placements = SimPlacements(offers)
        self.engine = JobEngine(
            self.repo, {"sim": self.migrator}, self.placements, self.cloud.now, tmp / "ckpt", workers=0, retry_base=0
        )

    def submit(self, steps: int, **extra: object) -> JobRecord:
        spec = {"command": ["python", "train.py"], "throughput": {"v100": RATE}, "checkpoint_gb": 10, **extra}
        job, _ = self.repo.create(NewJob(team_id="t", spec=spec, steps_total=steps, provider="sim"))
        return job

    def run(
        self,
        job_id: str,
        until: Callable[[JobRecord], bool],
        *,
        step: timedelta = timedelta(minutes=10),
        also: Callable[[], object] = lambda: None,
        limit: int = 500,
    ) -> JobRecord:
        for _ in range(limit):
            self.engine.tick()
            job = self.repo.get(job_id)
            if until(job):
                return job
            self.cloud.run_to(self.cloud.now() + step)
            also()
        raise AssertionError(f"{job_id} is {self.repo.get(job_id).state.value}: {self.repo.events(job_id)}")

    def bill(self, job_id: str) -> Decimal:
        micro = 0
        for c in self.migrator.copies(job_id):
            assert c.ended_at is not None
            us = (c.ended_at - c.started_at) // timedelta(microseconds=1)
            micro += usd_to_micro(Decimal(us).scaleb(-6) * Decimal(repr(PRICE[c.offer])) / 3600)
        return micro_to_usd(micro)

    def states(self, job_id: str) -> list[str]:
        return [e.to_state for e in self.repo.events(job_id) if e.kind == "state" and e.to_state]


def test_a_throughput_job_runs_to_succeeded_on_simulated_time_with_its_steps_and_its_bill(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A, OD_B])
    job = sim.submit(20_000)  # 10 000 s of training at 2 steps/s
    done = sim.run(job.id, lambda j: j.state.terminal)

    assert done.state is JobState.SUCCEEDED, done.reason
    assert sim.states(job.id) == ["queued", "launching", "running", "succeeded"]
    assert sim.migrator.job(job.id).env["COSTOPT_STEPS_PER_SECOND"] == "2.0"
    audit = control.audit_job(sim.engine.checkpoint_uri(done), 20_000)
    assert audit.ok and audit.steps_done == 20_000, audit.problems
    (copy,) = sim.migrator.copies(job.id)
    assert copy.end_reason == "finished" and copy.ledger_closed
    hours = (copy.ended_at - copy.started_at).total_seconds() / 3600  # type: ignore[operator]
    assert 20_000 / RATE / 3600 < hours < 20_000 / RATE / 3600 + 0.5  # training, boot, checkpoints
    assert job_cost(sim.engine, job.id, sim.cloud.now()) == sim.bill(job.id) > 0
    view = sim.engine.view(job.id)
    assert view.cost_so_far_usd == sim.bill(job.id) and view.eta is None


def test_a_running_job_has_an_eta_from_its_throughput(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A])
    job = sim.submit(20_000)
    running = sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done > 0)
    view = sim.engine.view(running)
    left = 20_000 - running.steps_done
    assert view.eta == sim.cloud.now() + timedelta(seconds=left / RATE)
    assert view.cost_so_far_usd is not None and view.cost_so_far_usd > 0  # the open interval, priced to now


def test_a_spot_preemption_is_recovered_through_the_watcher_on_the_jobs_placements(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [SPOT, OD_A])  # no hazard: the spot copy is preempted when the test says so
    watcher = InterruptionWatcher(
        sim.migrator,
        lambda mj: sim.engine.recovery_offers(sim.repo.get(mj.job_id), mj),
        unavailable=sim.unavailable,
        watermark=MemoryWatermark(),
        clock=sim.cloud.now,
        retry_base=0.0,
    )
    job = sim.submit(20_000)
    sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 2_000)
    sim.cloud.preempt(sim.migrator.job(job.id).instance_id or "")  # AWS: 2 min of notice
    done = sim.run(job.id, lambda j: j.state.terminal, also=watcher.poll)

    assert done.state is JobState.SUCCEEDED, done.reason
    events = sim.repo.events(job.id)
    kinds = [e.kind for e in events]
    assert kinds.count("preemption") == 1 and kinds.count("recovery") == 1
    # the watcher's recovery runs within its pass on simulated time: the engine may only see its outcome
    assert sim.states(job.id)[:3] == ["queued", "launching", "running"]
    first = next(e for e in events if e.kind == "preemption")
    assert first.detail is not None
    assert first.detail["from"] == SPOT.to_doc() and first.detail["lost_steps"] is not None
    rec = next(e for e in events if e.kind == "recovery")
    assert rec.detail is not None
    assert rec.detail["to"] == OD_A.to_doc()  # the preempted spot offer is marked unavailable: tried last
    assert rec.cost_usd is not None and rec.cost_usd > 0  # the new copy's boot and restore
    assert done.offer == OD_A and done.usd_per_hour == Decimal("3.06")
    audit = control.audit_job(sim.engine.checkpoint_uri(done), 20_000)
    assert audit.ok and audit.lost_steps == 0 and audit.repeated_steps == 0, audit.problems
    assert job_cost(sim.engine, job.id, sim.cloud.now()) == sim.bill(job.id)


def test_cancel_on_the_simulated_cloud_waits_for_the_checkpoint_then_terminates(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A])
    job = sim.submit(50_000)
    sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 1_000)
    sim.repo.request_cancel(job.id)
    done = sim.run(job.id, lambda j: j.state.terminal, step=timedelta(seconds=20))

    assert done.state is JobState.CANCELLED and "checkpointed at step" in done.reason
    info = control.latest(sim.engine.checkpoint_uri(done))
    assert info is not None and info.request_id is not None and info.request_id.startswith("cancel-")
    (copy,) = sim.migrator.copies(job.id)
    assert copy.ended_at is not None and copy.ledger_closed
    assert job_cost(sim.engine, job.id, sim.cloud.now()) == sim.bill(job.id)


def test_a_move_on_the_simulated_cloud_records_its_egress_overlap_and_restart(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A, OD_B])
    job = sim.submit(20_000)
    sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 2_000)
    moved = sim.engine.move(
        job.id, [sim.placements._one(OD_B, 10_000)], reason="cheaper in us-west-2", expected_saving_usd=Decimal("1.2")
    )
    assert moved.state is JobState.RUNNING and moved.offer == OD_B
    (ev,) = [e for e in sim.repo.events(job.id) if e.kind == "move"]
    assert ev.detail is not None
    assert Decimal(ev.detail["egress_usd"]) == Decimal("0.2")  # 10 GB x 0.02 USD/GB between AWS regions
    parts = sum(Decimal(ev.detail[k]) for k in ("egress_usd", "overlap_usd", "restart_usd"))
    assert ev.cost_usd == parts and Decimal(ev.detail["restart_usd"]) > 0
    done = sim.run(job.id, lambda j: j.state.terminal)
    assert done.state is JobState.SUCCEEDED
    assert control.audit_job(sim.engine.checkpoint_uri(done), 20_000).ok
    # the egress is money on top of the instance-hours
    assert job_cost(sim.engine, job.id, sim.cloud.now()) == sim.bill(job.id) + Decimal("0.2")


def test_every_copy_launches_the_jobs_own_image(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A, OD_B])
    sim.migrator.image = "provider-default:1"  # what a job without an image gets
    job = sim.submit(20_000, image="ghcr.io/team/train:2.1")
    plain = sim.submit(20_000)
    sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 2_000)
    first = sim.migrator.job(job.id).instance_id or ""
    assert sim.cloud.launch_spec(first).image == "ghcr.io/team/train:2.1"
    moved = sim.engine.move(
        job.id, [sim.placements._one(OD_B, 10_000)], reason="cheaper", expected_saving_usd=Decimal(1)
    )
    assert moved.state is JobState.RUNNING and moved.offer == OD_B
    second = sim.migrator.job(job.id).instance_id or ""
    assert second != first and sim.cloud.launch_spec(second).image == "ghcr.io/team/train:2.1"
    assert sim.migrator.job(job.id).image == "ghcr.io/team/train:2.1"
    other = sim.migrator.job(plain.id).instance_id or ""
    assert sim.cloud.launch_spec(other).image == "provider-default:1"


@pytest.mark.parametrize("steps", [0, -1])
def test_an_invalid_step_count_never_reaches_the_cloud(engine, tmp_path, steps: int) -> None:
    sim = Sim(engine, tmp_path, [OD_A])
    job = sim.submit(steps)
    sim.engine.tick()
    failed = sim.repo.get(job.id)
    assert failed.state is JobState.FAILED and "steps must be a positive integer" in failed.reason
    assert sim.cloud.list({}) == []


def test_a_move_that_fails_midway_is_resumed_by_the_next_tick(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A, OD_B])
    job = sim.submit(20_000)
    sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 2_000)

    def fail(point: str) -> None:
        if point == "enter:launched":
            raise RuntimeError("lost the database connection")

    sim.migrator.hook = fail
    with pytest.raises(RuntimeError):
        sim.engine.move(job.id, [sim.placements._one(OD_B, 10_000)], reason="cheaper", expected_saving_usd=Decimal(1))
    assert sim.repo.get(job.id).state is JobState.MIGRATING
    sim.migrator.hook = lambda point: None
    done = sim.run(job.id, lambda j: j.state.terminal)

    assert done.state is JobState.SUCCEEDED and done.offer == OD_B
    assert [c.epoch for c in sim.migrator.copies(job.id)] == [1, 2]  # one copy per epoch: no second launch
    assert [e.kind for e in sim.repo.events(job.id)].count("move") == 1
    assert control.audit_job(sim.engine.checkpoint_uri(done), 20_000).ok
