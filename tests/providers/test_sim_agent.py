"""Simulated agents: a job launched on the simulated cloud with the job contract runs a real agent on the
simulated clock, and the service's own engine (the Migrator, the InterruptionWatcher) drives it through its
checkpoint location, as it would a real job: progress, moves, preemptions, fencing, exit codes, output.

Everything runs offline: the Migrator's ``sleep`` advances the simulated clock (``SimCloud.sleeper``), so a
move of a job that trains for hours takes milliseconds of wall time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from costopt.agent import control, job_env
from costopt.agent.contract import contract_env
from costopt.clock import ServiceClock
from costopt.cloud import InstanceState, LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import StepPrices
from costopt.migration.machine import Migrator
from costopt.migration.records import JobStatus, State
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import InterruptionWatcher, MemoryWatermark, RecoveryStarted
from costopt.risk.hazard import HazardModel
from costopt.simulated import SimEvent, SimEventKind, WorkloadTiming
from providers.sim import SimCloud, SimConfig
from providers.sim_agent import AgentEnvError
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
OD_A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
OD_B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2b", "p3.2xlarge", Market.ON_DEMAND)
SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
RATE = 2.0  # steps/s
TIMING = WorkloadTiming(checkpoint_interval=timedelta(minutes=30))


def _prices() -> StepPrices:
    day_before = START - timedelta(days=1)
    return step_prices([(k, day_before, 3.06 if k.market is Market.ON_DEMAND else 0.92) for k in (OD_A, OD_B, SPOT)])


def make_cloud(spot_hazard: float = 0.0, seed: int = 0, **config: object) -> SimCloud:
    hazards = HazardModel(defaults={**dict.fromkeys(Cloud, 0.0), Cloud.AWS: spot_hazard})
    cfg = SimConfig(timing=TIMING, **config)  # type: ignore[arg-type]
    return SimCloud(_prices(), hazards, start=START, seed=seed, config=cfg)


def spec(uri: str, epoch: int = 1, steps: int = 20_000, offer: OfferKey = OD_A, **extra: str) -> LaunchSpec:
    env = {**contract_env("job-1", uri, epoch), **job_env(steps, steps_per_second=RATE), **extra}
    return LaunchSpec(offer=offer, env=env, tags={"costopt-job": "job-1", "costopt-epoch": str(epoch)})


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return str(tmp_path / "ckpt")


def migrator(engine: Engine, cloud: SimCloud, **kw: object) -> Migrator:
    return Migrator(
        engine,
        cloud,
        sleep=cloud.sleeper(),
        now=cloud.now,
        poll_seconds=2.0,
        hook=lambda point: None,
        **cloud.migrator_timeouts(),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


# -- one copy -------------------------------------------------------------------------------------------


def test_a_job_launched_with_the_contract_progresses_checkpoints_and_finishes(uri: str) -> None:
    cloud = make_cloud()
    inst = cloud.launch(spec(uri, steps=10_000), "t1")
    assert inst.exit_code is None
    cloud.run_to(START + timedelta(minutes=2))
    assert not control.progress(uri, 1).started  # still booting: nothing runs
    cloud.run_to(START + timedelta(minutes=3, seconds=1))
    prog = control.progress(uri, 1)
    assert prog.started and prog.restored_step == 0 and prog.progressing  # first step reported at once
    cloud.run_to(START + timedelta(minutes=3 + 40))  # 30 min of training, then a 1-min checkpoint
    prog = control.progress(uri, 1)
    assert prog.checkpoints == (30 * 60 * 2,)
    assert control.latest(uri) is not None and control.latest(uri).step == 3600  # type: ignore[union-attr]
    assert cloud.describe(inst.instance_id).state is InstanceState.RUNNING
    events = cloud.run_to(START + timedelta(hours=3))
    done = [e for e in events if e.kind is SimEventKind.DONE]
    assert [e.instance_id for e in done] == [inst.instance_id]
    # 10 000 steps at 2/s = 5000 s of training, two 1-min periodic checkpoints and the final one.
    assert done[0].at == START + timedelta(minutes=3, seconds=5000 + 3 * 60)
    final = cloud.describe(inst.instance_id)
    assert final.state is InstanceState.TERMINATED and final.exit_code == 0
    assert final.terminated_at == done[0].at
    audit = control.audit_job(uri, 10_000)
    assert audit.ok, audit.problems
    assert (audit.steps_done, audit.wasted_steps, audit.runs) == (10_000, 0, 1)


def test_progress_records_are_coarse(uri: str) -> None:
    cloud = make_cloud(report_every=timedelta(minutes=10))
    cloud.launch(spec(uri, steps=2 * 3600 * 10), "t1")  # ten hours of training
    cloud.run_to(START + timedelta(hours=12))
    records = control.records(uri)
    steps = [r for r in records if r["event"] == "step"]
    # one record per 10 minutes of training at most, plus one before each checkpoint and the first step
    assert len(steps) <= 10 * 6 + 20 + 1
    assert sum(r["step"] - r.get("first", r["step"]) + 1 for r in steps) == 72_000
    assert control.audit_job(uri, 72_000).ok


def test_output_shows_one_line_per_record(uri: str) -> None:
    cloud = make_cloud()
    inst = cloud.launch(spec(uri, steps=5000), "t1")
    assert "boot: job job-1 epoch 1" in cloud.output(inst.instance_id)
    cloud.run_to(START + timedelta(hours=2))
    text = cloud.output(inst.instance_id)
    lines = text.splitlines()
    assert len(lines) == 2 + len(control.records(uri))  # boot and exit lines around the records
    assert lines[1] == "2020-03-01T00:03:00Z start: epoch 1, from scratch"
    assert lines[2].endswith("step 1")
    assert any(line.endswith("checkpoint: step 3600 published") for line in lines)
    assert lines[-2].endswith("done: step 5000") and "exit 0: finished" in lines[-1]
    assert cloud.output(inst.instance_id, tail=1) == lines[-1] + "\n"
    assert cloud.output(inst.instance_id, tail=0) == ""


def test_a_spec_without_the_contract_or_the_steps_runs_no_agent(uri: str) -> None:
    cloud = make_cloud()
    bare = cloud.launch(LaunchSpec(offer=OD_A), "t1")
    no_steps = cloud.launch(LaunchSpec(offer=OD_A, env=contract_env("job-1", uri, 1)), "t2")
    cloud.run_to(START + timedelta(hours=1))
    assert cloud.output(bare.instance_id) == "" and cloud.output(no_steps.instance_id) == ""
    assert control.records(uri) == []
    assert cloud.describe(no_steps.instance_id).state is InstanceState.RUNNING


def test_bad_job_variables_are_refused_with_the_variable_named(uri: str) -> None:
    cloud = make_cloud()
    with pytest.raises(AgentEnvError, match="COSTOPT_JOB_STEPS"):
        cloud.launch(spec(uri, COSTOPT_JOB_STEPS="many"), "t1")
    with pytest.raises(AgentEnvError, match="COSTOPT_STEPS_PER_SECOND"):
        cloud.launch(spec(uri, COSTOPT_STEPS_PER_SECOND="-1"), "t1")
    env = {**contract_env("job-1", uri, 1), **job_env(100, job_type="ResNet-50 (batch size 128)")}
    with pytest.raises(AgentEnvError, match="no throughput for job type"):
        cloud.launch(LaunchSpec(offer=OD_A, env=env), "t1")  # no rate function given
    assert cloud.list({}) == []  # nothing was launched


def test_the_rate_function_gives_the_throughput_by_job_type_gpus_and_offer(uri: str) -> None:
    asked = []

    def rate(job_type: str, gpus: int, offer: OfferKey, precision: str) -> float | None:
        asked.append((job_type, gpus, offer, precision))
        return 4.0 if precision == "fp32" else 8.0

    cloud = SimCloud(_prices(), HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START, rate=rate)
    env = {**contract_env("job-1", uri, 1), **job_env(4000, job_type="ResNet-50 (batch size 128)")}
    inst = cloud.launch(LaunchSpec(offer=OD_A, env=env), "t1")
    assert asked == [("ResNet-50 (batch size 128)", 1, OD_A, "fp32")]  # no COSTOPT_PRECISION: PyTorch's default
    cloud.run_to(START + timedelta(minutes=3 + 10))
    assert control.progress(uri, 1).last_step == 600 * 4  # ten minutes at 4 steps/s, reported then
    cloud.run_to(START + timedelta(hours=1))
    assert cloud.describe(inst.instance_id).exit_code == 0


def test_a_job_runs_at_the_rate_of_its_precision(uri: str) -> None:
    asked = []

    def rate(job_type: str, gpus: int, offer: OfferKey, precision: str) -> float | None:
        asked.append(precision)
        return {"fp32": 4.0, "amp": 8.0}.get(precision)

    cloud = SimCloud(_prices(), HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START, rate=rate)
    env = {**contract_env("job-1", uri, 1), **job_env(40_000, job_type="ResNet-50 (batch size 128)", precision="amp")}
    assert env["COSTOPT_PRECISION"] == "amp"
    cloud.launch(LaunchSpec(offer=OD_A, env=env), "t1")
    assert asked == ["amp"]
    cloud.run_to(START + timedelta(minutes=3 + 10))
    assert control.progress(uri, 1).last_step == 600 * 8  # ten minutes at the amp rate
    with pytest.raises(AgentEnvError, match="COSTOPT_PRECISION must be one of"):
        cloud.launch(LaunchSpec(offer=OD_A, env={**env, "COSTOPT_PRECISION": "fp16"}), "t2")
    with pytest.raises(AgentEnvError, match="at tf32"):  # the rate knows no tf32 figure: the launch says so
        cloud.launch(LaunchSpec(offer=OD_A, env={**env, "COSTOPT_PRECISION": "tf32"}), "t3")
    with pytest.raises(ValueError, match="precision must be one of"):
        job_env(1, precision="fp16")


def test_termination_loses_the_work_since_the_last_checkpoint(uri: str) -> None:
    cloud = make_cloud()
    inst = cloud.launch(spec(uri), "t1")
    cloud.run_to(START + timedelta(minutes=3 + 31 + 20))  # checkpoint of step 3600 published, 20 min more
    cloud.terminate(inst.instance_id)
    gone = cloud.describe(inst.instance_id)
    assert gone.state is InstanceState.TERMINATED and gone.exit_code is None
    assert control.latest(uri).step == 3600  # type: ignore[union-attr]
    assert control.progress(uri, 1).last_step > 3600  # what ran after it is logged, and lost
    n = len(control.records(uri))
    cloud.run_to(START + timedelta(hours=5))
    assert len(control.records(uri)) == n  # a killed agent writes nothing more


# -- the migrator's side of the contract ----------------------------------------------------------------


def test_a_checkpoint_request_is_served_and_a_newer_epoch_fences_the_old_copy(uri: str) -> None:
    cloud = make_cloud()
    old = cloud.launch(spec(uri), "t1")
    cloud.run_to(START + timedelta(minutes=13))  # ten minutes of training
    rid = control.request_checkpoint(uri, epoch=1, request_id="req-1")
    cloud.run_to(START + timedelta(minutes=13, seconds=59))
    assert not control.request_served(uri, rid)  # the checkpoint takes a minute
    cloud.run_to(START + timedelta(minutes=14))
    assert control.request_served(uri, rid)
    assert control.latest(uri).step == 1200  # type: ignore[union-attr]
    control.claim_epoch(uri, 2)
    cloud.run_to(START + timedelta(minutes=14, seconds=1))
    fenced = cloud.describe(old.instance_id)
    assert fenced.state is InstanceState.TERMINATED and fenced.exit_code == 75
    assert "fenced out" in cloud.output(old.instance_id)
    assert any(r["event"] == "stale" for r in control.records(uri))
    assert control.latest(uri).step == 1200  # type: ignore[union-attr]


def test_a_move_over_the_simulated_cloud_ends_done_and_the_audit_is_exact(engine: Engine, uri: str) -> None:
    cloud = make_cloud()
    mig = migrator(engine, cloud)
    mig.register_job("job-1", (), uri, env=job_env(20_000, steps_per_second=RATE))
    started = mig.start("job-1", [OD_A])
    assert started.state is State.DONE, started.reason
    cloud.run_to(cloud.now() + timedelta(minutes=45))
    moved = mig.move("job-1", [OD_B])
    assert moved.state is State.DONE, moved.reason
    job = mig.job("job-1")
    assert job.epoch == 2 and job.offer == OD_B and job.status is JobStatus.RUNNING
    old = cloud.describe(started.new_instance_id or "")
    assert old.state is InstanceState.TERMINATED
    events = cloud.run_to(cloud.now() + timedelta(hours=4))
    assert [e.kind for e in events if e.instance_id == job.instance_id][-1] is SimEventKind.DONE
    assert cloud.describe(job.instance_id or "").exit_code == 0
    audit = control.audit_job(uri, 20_000)
    assert audit.ok, audit.problems
    assert audit.steps_done == 20_000 and audit.lost_steps == 0 and audit.repeated_steps == 0
    assert len(audit.lineage) == 2


def test_a_recovery_after_a_preemption_seen_by_the_watcher_keeps_the_audit_exact(engine: Engine, uri: str) -> None:
    cloud = make_cloud()  # no hazard: the spot copy is preempted when the test says so
    mig = migrator(engine, cloud)
    unavailable = UnavailableOffers(engine)
    mig.unavailable = unavailable
    mig.register_job("job-1", (), uri, env=job_env(40_000, steps_per_second=RATE))  # ~5.6 h of training
    assert mig.start("job-1", [SPOT]).state is State.DONE
    watcher = InterruptionWatcher(
        mig,
        lambda job: [OD_A, OD_B],
        unavailable=unavailable,
        watermark=MemoryWatermark(),
        clock=cloud.now,
    )
    cloud.run_to(START + timedelta(hours=2, minutes=10))  # mid-way between two periodic checkpoints
    first = mig.job("job-1").instance_id or ""
    notice = cloud.preempt(first)  # AWS: 2 min of notice, room for the agent's 1-min checkpoint
    preempted: list[SimEvent] = []
    recoveries: list[RecoveryStarted] = []
    while not recoveries and cloud.now() < START + timedelta(hours=3):
        events = cloud.run_to(cloud.now() + timedelta(seconds=20))
        preempted += [e for e in events if e.kind is SimEventKind.PREEMPTED]
        report = watcher.poll()
        recoveries += [r for r in report.recoveries if r.recovered]
    assert [(e.instance_id, e.at) for e in preempted] == [(first, notice.deadline)]
    assert recoveries, "the watcher recovers the job"
    final = mig.job("job-1")
    assert final.offer in (OD_A, OD_B) and final.instance_id != first
    events = cloud.run_to(START + timedelta(hours=12))
    assert [e.kind for e in events if e.instance_id == final.instance_id][-1] is SimEventKind.DONE
    audit = control.audit_job(uri, 40_000)
    assert audit.ok, audit.problems
    assert audit.lost_steps == 0 and audit.repeated_steps == 0 and audit.steps_done == 40_000
    assert cloud.describe(final.instance_id or "").exit_code == 0


def test_a_forced_notice_is_served_like_a_drawn_one(uri: str) -> None:
    cloud = make_cloud()
    inst = cloud.launch(spec(uri, offer=OD_A, steps=200_000), "t1").instance_id  # on-demand: no drawn preemption
    cloud.run_to(START + timedelta(hours=1, minutes=40))
    notice = cloud.preempt(inst)
    events = cloud.run_to(START + timedelta(hours=3))
    assert [(e.kind, e.at) for e in events if e.kind in (SimEventKind.NOTICE, SimEventKind.PREEMPTED)] == [
        (SimEventKind.NOTICE, notice.noticed_at),
        (SimEventKind.PREEMPTED, notice.deadline),
    ]
    assert any(r["event"] == "notice" for r in control.records(uri))
    last = control.latest(uri)
    trained = (notice.noticed_at - START - timedelta(minutes=3)).total_seconds()  # after the 3-min boot
    # the notice's checkpoint: every step trained to the notice (three 1-min periodic checkpoints paused it);
    # the last periodic one (after 90 min of training) holds 10 800
    assert last is not None and last.step == int((trained - 3 * 60) * RATE) == 11_280
    described = cloud.describe(inst)
    assert described.state is InstanceState.PREEMPTED and described.exit_code == 75
    assert "stopped after its checkpoint" in cloud.output(inst)


def test_a_notice_long_enough_for_a_checkpoint_saves_the_work(uri: str) -> None:
    cloud = make_cloud(spot_hazard=0.5, seed=3)
    inst = cloud.launch(spec(uri, offer=SPOT, steps=200_000), "t1")
    events = cloud.run_to(START + timedelta(days=1))
    notice = next(e for e in events if e.kind is SimEventKind.NOTICE)
    taken = next(e for e in events if e.kind is SimEventKind.PREEMPTED)
    assert taken.at - notice.at == timedelta(minutes=2)  # AWS: room for the 1-min checkpoint
    records = control.records(uri)
    assert any(r["event"] == "notice" for r in records)
    last = control.latest(uri)
    assert last is not None
    trained = (notice.at - START - timedelta(minutes=3)).total_seconds()
    assert last.step > (trained - 30 * 60 - 5 * 60) * RATE  # the notice's checkpoint, not an older one
    described = cloud.describe(inst.instance_id)
    assert described.state is InstanceState.PREEMPTED and described.exit_code == 75
    assert "stopped after its checkpoint" in cloud.output(inst.instance_id)


def test_a_notice_too_short_for_a_checkpoint_loses_the_work_since_the_last_one(uri: str) -> None:
    gcp = OfferKey(Cloud.GCP, "us-central1", "us-central1-a", "a2-highgpu-1g", Market.SPOT)
    prices = step_prices([(gcp, START - timedelta(days=1), 1.1)], {("gcp", "a2-highgpu-1g"): ("a100", 1.0)})
    hazards = HazardModel(defaults={**dict.fromkeys(Cloud, 0.0), Cloud.GCP: 0.5})
    cloud = SimCloud(prices, hazards, start=START, seed=3, config=SimConfig(timing=TIMING))
    inst = cloud.launch(spec(uri, offer=gcp, steps=200_000), "t1")
    events = cloud.run_to(START + timedelta(days=1))
    notice = next(e for e in events if e.kind is SimEventKind.NOTICE)
    taken = next(e for e in events if e.kind is SimEventKind.PREEMPTED)
    assert taken.at - notice.at == timedelta(seconds=30)
    last = control.latest(uri)
    # the checkpoint started at the notice never got published: the latest is a periodic one
    assert last is None or last.step % (30 * 60 * int(RATE)) == 0
    assert cloud.describe(inst.instance_id).exit_code is None  # killed mid-checkpoint


# -- clocks ---------------------------------------------------------------------------------------------


def test_the_sleeper_and_the_service_clock_move_the_simulated_time() -> None:
    cloud = make_cloud()
    clock = cloud.service_clock()
    assert isinstance(clock, ServiceClock)
    cloud.sleeper()(90.5)
    assert clock.now() == START + timedelta(seconds=90.5)
    clock.sleep(30)
    assert cloud.now() == START + timedelta(seconds=120.5)
    with pytest.raises(ValueError):
        clock.sleep(-1)
