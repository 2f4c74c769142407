"""Fleets on the simulated cloud: the round executor launches its instances on ``sim``, each runs a simulated
worker (:mod:`providers.sim_worker`: the real worker's protocol, a :class:`SimAgent` per copy) that syncs
with the service's :class:`WorkerSync` through the sync route's own models; everything on the simulated
clock, offline (both backends).

Checked: every job finishes with exactly its steps (the agents' own logs, audited: nothing lost or
repeated), its progress seen by the executor from those logs; a spot instance preempted at once (no notice)
is lost, its GPUs leave the fleet, a replacement is launched, and its job resumes on another instance under
a new epoch from its last checkpoint; the ledger lines of the fleet's jobs and of its idle time sum exactly
to the bill of its instances' intervals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.fleet_service import in_process_transport
from costopt.agent import control
from costopt.cloud import InstanceState as CloudState
from costopt.cloud import LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.fleets.billing import FleetBilling
from costopt.fleets.executor import FleetExecutor
from costopt.fleets.model import FLEET_PROVIDER, FleetJobStatus, InstanceState, NewFleet, NewInstance
from costopt.fleets.store import FleetRepository, NewFleetJob
from costopt.fleets.sync import WorkerSync
from costopt.jobs.model import JobState
from costopt.jobs.records import JobRepository, NewJob
from costopt.ledger import StepPrices
from costopt.ledger.model import micro_to_usd
from costopt.ledger.prices import price_segments
from costopt.ledger.sql import SqlLedger
from costopt.risk.hazard import HazardModel
from costopt.simulated import WorkloadTiming
from providers.sim import SimCloud, SimConfig, SimError
from providers.sim_worker import SimWorker
from tests.price_support import step_prices

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

START = datetime(2020, 3, 1, tzinfo=UTC)
V100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
K80 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p2.xlarge", Market.SPOT)
PRICES = {V100: 0.9180, K80: 0.2700}
RATES = {"v100": 4.0, "k80": 1.5}  # steps/s: the job's catalog throughput on each accelerator
TIMING = WorkloadTiming(
    boot=timedelta(minutes=3),
    restore=timedelta(seconds=30),
    checkpoint=timedelta(seconds=20),
    checkpoint_interval=timedelta(minutes=5),
)
POLL = timedelta(seconds=300)  # the simulated workers' heartbeat
ROUND_S = 360.0  # Gavel's six minutes
TICK = timedelta(seconds=360)  # the executor's passes (rounds start on them)
STEPS = {"a": 3600, "b": 2400, "c": 3000, "d": 1800}
CONFIG = SimConfig(timing=TIMING, worker_poll=POLL)
NO_HAZARDS = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))  # preemptions are forced by the tests


def _prices() -> StepPrices:
    rows = [(k, START - timedelta(days=1), p) for k, p in PRICES.items()]
    rows.append((V100, START + timedelta(minutes=47, seconds=13), 1.0317))  # a change inside a round
    return step_prices(rows, {("aws", "p3.2xlarge"): ("v100", 1.0), ("aws", "p2.xlarge"): ("k80", 1.0)})


@dataclass
class SimFleet:
    cloud: SimCloud
    repo: FleetRepository
    jobs: JobRepository
    executor: FleetExecutor
    ledger: SqlLedger
    prices: StepPrices
    fleet_id: str
    tmp: Path

    def submit(self, name: str, steps: int) -> str:
        job_id = f"job-{name}"
        spec = {
            "command": ["python", "train.py"],
            "checkpoint_uri": f"file://{self.tmp}/{job_id}",
            "fleet_id": self.fleet_id,
            "gpus": 1,
            "job_type": "ResNet-18 (batch size 64)",
        }
        job, _ = self.jobs.insert(NewJob("team-a", spec, steps, FLEET_PROVIDER, job_id=job_id))
        self.repo.add_job(NewFleetJob(job_id, self.fleet_id, "team-a", 1, dict(RATES), steps, job.created_at))
        return job_id

    def run(self, until: datetime) -> None:
        """The service's two loops on one simulated clock: the cloud (its workers and agents) runs to each
        executor pass, then the pass."""
        while self.cloud.now() < until:
            self.cloud.run_to(min(until, self.cloud.now() + TICK))
            report = self.executor.tick()
            assert report.errors == [], report.errors

    def worker(self, fleet_instance: str) -> SimWorker:
        inst = self.repo.instance(fleet_instance)
        assert inst is not None and inst.instance_id is not None
        agent = self.cloud._instances[inst.instance_id].agent
        assert isinstance(agent, SimWorker)
        return agent


def _service(
    engine: Engine, cloud: SimCloud, prices: StepPrices
) -> tuple[FleetRepository, JobRepository, FleetExecutor, SqlLedger]:
    """The service's fleet side over ``engine`` on ``cloud``'s clock: its repositories, the workers'
    in-process transport attached to the cloud, the round executor and its ledger."""
    repo = FleetRepository(engine, now=cloud.now)
    jobs = JobRepository(engine, now=cloud.now)
    cloud.attach_fleet(in_process_transport(WorkerSync(repo, jobs)))
    ledger = SqlLedger(engine, prices)
    executor = FleetExecutor(
        repo,
        jobs,
        {"sim": cloud},
        worker_command=lambda p: ["python3", "-m", "costopt.agent.worker"],
        service_url="http://127.0.0.1:8000",
        dead_after_s=3 * POLL.total_seconds(),
        boot_timeout_s=600,
        billing=FleetBilling(repo, ledger, prices),
        full_every_s=0.0,
    )
    return repo, jobs, executor, ledger


@pytest.fixture
def sim_fleet(engine: Engine, tmp_path: Path) -> SimFleet:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARDS, start=START, config=CONFIG)
    repo, jobs, executor, ledger = _service(engine, cloud, prices)
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy="max_min_fairness_perf",
            instances=(
                NewInstance(V100, "v100", 1, "sim", Decimal("0.918")),
                NewInstance(V100, "v100", 1, "sim", Decimal("0.918")),
                NewInstance(K80, "k80", 1, "sim", Decimal("0.27")),
            ),
            round_s=ROUND_S,
            resolve_rounds=10,
        )
    )
    return SimFleet(cloud, repo, jobs, executor, ledger, prices, fleet.id, tmp_path)


def test_a_sim_fleet_runs_its_jobs_to_their_exact_steps_survives_a_preemption_and_bills_exactly(
    sim_fleet: SimFleet,
) -> None:
    f = sim_fleet
    f.run(START + timedelta(seconds=90))  # launched, booting (3 simulated minutes)
    assert all(i.state is InstanceState.LAUNCHING for i in f.repo.instances(f.fleet_id))
    f.run(START + 2 * TICK)
    assert {i.state for i in f.repo.instances(f.fleet_id)} == {InstanceState.RUNNING}  # their workers synced
    ids = {name: f.submit(name, steps) for name, steps in STEPS.items()}
    f.run(f.cloud.now() + 3 * TICK)
    # the executor sees live progress from the agents' logs, relayed by the workers
    fleet = f.repo.get(f.fleet_id)
    assert fleet.round >= 1 and fleet.allocation is not None
    progress = {j.job_id: j.steps_done for j in f.repo.jobs(f.fleet_id)}
    assert sum(1 for v in progress.values() if v > 0) >= 3
    for job_id, done in progress.items():
        if done:
            audit = control.audit_job(str(f.jobs.get(job_id).spec["checkpoint_uri"]))
            assert audit.steps_done >= done  # what the service holds is what the agent logged (or older)
    # a spot instance running a job is reclaimed at once (no notice): its copy dies unheard
    victim_job = next(j for j in f.repo.jobs(f.fleet_id) if j.holder is not None and j.steps_done > 0)
    holder = victim_job.holder
    assert holder is not None
    inst = f.repo.instance(holder)
    assert inst is not None and inst.instance_id is not None
    f.cloud.preempt(inst.instance_id, notice=timedelta(0))
    assert f.cloud.describe(inst.instance_id).state is CloudState.PREEMPTED
    f.run(f.cloud.now() + 2 * TICK)
    lost = f.repo.instance(holder)
    assert lost is not None and lost.state is InstanceState.LOST and "preempted" in (lost.end_reason or "")
    (replacement,) = [i for i in f.repo.instances(f.fleet_id) if i.replaces == holder]
    # the lost GPU left the fleet until its replacement's worker syncs
    rounds_without = [r for r in f.repo.rounds(f.fleet_id) if r.started_at > f.cloud.now() - 2 * TICK]
    assert all(holder not in {a.instance for a in r.assignment} for r in rounds_without)
    deadline = f.cloud.now() + timedelta(hours=6)
    while any(not j.status.finished for j in f.repo.jobs(f.fleet_id)):
        assert f.cloud.now() < deadline, [(j.job_id, j.status, j.steps_done) for j in f.repo.jobs(f.fleet_id)]
        f.run(f.cloud.now() + 4 * TICK)
    assert f.repo.instance(replacement.id).state is InstanceState.RUNNING  # type: ignore[union-attr]
    moved = f.repo.job(victim_job.job_id)
    assert moved is not None and moved.epoch > victim_job.epoch  # resumed elsewhere under a new epoch
    victim_leases = {a.instance for r in f.repo.rounds(f.fleet_id) for a in r.assignment if a.job_id == moved.job_id}
    assert victim_leases - {holder}
    for name, job_id in ids.items():
        fj = f.repo.job(job_id)
        assert fj is not None and fj.status is FleetJobStatus.DONE and fj.steps_done == STEPS[name]
        rec = f.jobs.get(job_id)
        assert rec.state is JobState.SUCCEEDED and rec.steps_done == STEPS[name]
        audit = control.audit_job(str(rec.spec["checkpoint_uri"]), STEPS[name])
        assert audit.finished and audit.steps_done == STEPS[name], audit
        assert audit.lost_steps == 0 and audit.repeated_steps == 0, audit
        assert fj.finished_at is not None and fj.finished_at <= f.cloud.now()
    # the preempted copy's steps past its last checkpoint were run again: wasted, never counted twice
    victim_audit = control.audit_job(str(f.jobs.get(victim_job.job_id).spec["checkpoint_uri"]))
    assert victim_audit.wasted_steps <= RATES["v100"] * TIMING.checkpoint_interval.total_seconds() + 1
    # each job ran on both accelerators at some point or kept one: rounds really moved leases
    assert len({(a.job_id, a.instance) for r in f.repo.rounds(f.fleet_id) for a in r.assignment}) > len(ids)

    f.repo.release(f.fleet_id)
    for _ in range(5):
        f.run(f.cloud.now() + TICK)
        if all(i.state in (InstanceState.RELEASED, InstanceState.LOST) for i in f.repo.instances(f.fleet_id)):
            break
    insts = f.repo.instances(f.fleet_id)
    assert all(i.state in (InstanceState.RELEASED, InstanceState.LOST) and i.ended_at for i in insts)
    assert all(r.billed for r in f.repo.rounds(f.fleet_id))
    for i in insts:  # the simulated instances are gone too
        assert i.instance_id is not None
        assert f.cloud.describe(i.instance_id).state in (CloudState.TERMINATED, CloudState.PREEMPTED)
    # billing: the fleet's jobs and idle lines sum exactly to its instances' intervals, round by round
    report = f.ledger.costs(team="team-a")
    by_job = report.by("job_id")
    rounds = f.repo.rounds(f.fleet_id)
    bill = 0
    for i in insts:
        assert i.launched_at is not None and i.ended_at is not None
        cuts = {i.launched_at, i.ended_at}
        cuts |= {t for r in rounds for t in (r.started_at, r.ended_at) if t and i.launched_at < t < i.ended_at}
        whole = sum(
            s.amount_micro_usd
            for a, b in itertools.pairwise(sorted(cuts))
            for s in price_segments(f.prices, i.offer, a, b)
        )
        assert sum(ln.amount_micro_usd for ln in report.lines if ln.record.instance_id == i.instance_id) == whole
        bill += whole
    assert report.total_micro_usd == bill and sum(by_job.values()) == micro_to_usd(bill)
    assert set(by_job) == {*ids.values(), f.fleet_id} and all(v > 0 for v in by_job.values())


def test_a_cloud_without_a_fleet_service_refuses_a_worker_and_the_instance_waits_saying_why(
    sim_fleet: SimFleet,
) -> None:
    sim_fleet.cloud.attach_fleet(None)
    report = sim_fleet.executor.tick()
    assert len(report.errors) == 3 and all("no fleet service attached" in e for e in report.errors)
    assert {i.state for i in sim_fleet.repo.instances(sim_fleet.fleet_id)} == {InstanceState.PENDING}
    with pytest.raises(SimError, match="no fleet service attached"):
        sim_fleet.cloud.launch(
            LaunchSpec(offer=V100, env={"COSTOPT_WORKER_ID": "fi-x", "COSTOPT_WORKER_TOKEN": "t"}), "tok"
        )


def test_a_noticed_preemption_checkpoints_the_copies_in_time_and_the_worker_takes_no_new_lease(
    sim_fleet: SimFleet,
) -> None:
    f = sim_fleet
    f.run(START + 2 * TICK)
    ids = {name: f.submit(name, steps) for name, steps in (("a", 2400), ("b", 2000))}
    f.run(f.cloud.now() + 2 * TICK)
    victim = next(j for j in f.repo.jobs(f.fleet_id) if j.holder is not None and j.steps_done > 0)
    assert victim.holder is not None
    inst = f.repo.instance(victim.holder)
    assert inst is not None and inst.instance_id is not None
    notice = f.repo.now()
    # the cloud's notice (AWS: 2 minutes): the copy's 20 s checkpoint fits, then it exits
    interruption = f.cloud.preempt(inst.instance_id)
    assert interruption.deadline == notice + timedelta(minutes=2)
    f.run(notice + timedelta(minutes=1))
    fj = f.repo.job(victim.job_id)
    assert fj is not None
    assert fj.holder is None and fj.status is FleetJobStatus.WAITING  # freed before the end
    assert fj.checkpoint_step == fj.steps_done >= victim.steps_done > 0  # its last step is durable
    f.run(notice + 3 * TICK)
    lost = f.repo.instance(inst.id)
    assert lost is not None and lost.state is InstanceState.LOST
    while any(not j.status.finished for j in f.repo.jobs(f.fleet_id)):
        assert f.cloud.now() < notice + timedelta(hours=3)
        f.run(f.cloud.now() + 2 * TICK)
    for name, job_id in ids.items():
        audit = control.audit_job(str(f.jobs.get(job_id).spec["checkpoint_uri"]), dict(a=2400, b=2000)[name])
        assert audit.finished and audit.lost_steps == 0 and audit.repeated_steps == 0, audit
        if job_id == victim.job_id:
            assert audit.wasted_steps == 0  # nothing trained past its notice checkpoint was lost
    # the doomed worker started no copy after the notice (its console, as the cloud shows it)
    console = f.cloud.output(inst.instance_id).splitlines()
    starts = [line.split()[0] for line in console if "started on GPUs" in line]
    assert starts and all(datetime.fromisoformat(s.replace("Z", "+00:00")) < notice for s in starts)
    assert any("preemption notice" in line for line in console)


def _restarted(f: SimFleet, state: Path) -> SimFleet:
    """A service restarted after kill -9: its simulated cloud read back from its state file, its fleet
    objects built anew over the same database, the workers' transport attached again."""
    cloud = SimCloud.restore(state, f.prices, NO_HAZARDS, config=CONFIG)
    repo, jobs, executor, ledger = _service(f.repo.engine, cloud, f.prices)
    return SimFleet(cloud, repo, jobs, executor, ledger, f.prices, f.fleet_id, f.tmp)


def test_a_sim_fleet_survives_a_restart_of_the_service_with_its_durable_simulated_cloud(
    sim_fleet: SimFleet, tmp_path: Path
) -> None:
    f = sim_fleet
    state = tmp_path / "sim-state.pickle"
    f.cloud.persist_to(state)  # COSTOPT_SIM_STATE_FILE: saved at every change, fleet workers included
    f.run(START + 2 * TICK)
    ids = {name: f.submit(name, steps) for name, steps in (("a", 2400), ("b", 2000), ("c", 1600))}
    f.run(f.cloud.now() + 3 * TICK)
    before = {j.job_id: j.steps_done for j in f.repo.jobs(f.fleet_id)}
    assert sum(1 for v in before.values() if v > 0) >= 2
    at = f.cloud.now()
    g = _restarted(f, state)  # kill -9: the old cloud and its workers are never used again
    assert g.cloud.now() == at and len(g.cloud.list({"costopt:fleet": f.fleet_id})) == 3
    while any(not j.status.finished for j in g.repo.jobs(g.fleet_id)):
        assert g.cloud.now() < at + timedelta(hours=3)
        g.run(g.cloud.now() + 2 * TICK)
    assert all(i.state is InstanceState.RUNNING for i in g.repo.instances(g.fleet_id))  # none lost
    for name, job_id in ids.items():
        steps = dict(a=2400, b=2000, c=1600)[name]
        assert g.jobs.get(job_id).state is JobState.SUCCEEDED and g.repo.job(job_id).steps_done == steps  # type: ignore[union-attr]
        audit = control.audit_job(str(g.jobs.get(job_id).spec["checkpoint_uri"]), steps)
        assert audit.finished and audit.lost_steps == 0 and audit.repeated_steps == 0, audit
