"""The simulated cloud: clock, idempotent launch, boot delay, preemptions and notices, capacity, progress
accounting (checkpoints, restore, lost work), determinism per seed."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from costopt.cloud import CapacityError, CloudProvider, InstanceState, LaunchSpec, NotFoundError, QuotaError
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import StepPrices
from costopt.risk.availability import LaunchStats
from costopt.risk.hazard import HazardModel
from costopt.simulated import SimEventKind, SimulatedCloud, WorkloadTiming
from providers.sim import ClockError, SimClock, SimCloud, SimConfig, SimError, sim_factory

T = datetime(2020, 3, 2, tzinfo=UTC)
AWS = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
AWS_OD = OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND)
AZURE = OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT)
LATE = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)  # priced from T + 1 day
SHAPES = {("aws", "p3.2xlarge"): ("v100", 1.0), ("azure", "Standard_NC6s_v3"): ("v100", 1.0)}
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))
HIGH_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 2.0))  # a preemption every 30 min on average


def m(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def _prices() -> StepPrices:
    rows = [
        (AWS, T - timedelta(days=1), 0.918),
        (AWS, T + timedelta(hours=5), 1.10),
        (AWS_OD, T - timedelta(days=1), 3.06),
        (AZURE, T - timedelta(days=1), 0.60),
        (LATE, T + timedelta(days=1), 0.95),
    ]
    frame = pd.DataFrame(
        [
            {
                "cloud": k.cloud.value,
                "region": k.region,
                "zone": k.zone,
                "instance_type": k.instance_type,
                "market": k.market.value,
                "valid_from": t,
                "usd_per_hour": p,
            }
            for k, t, p in rows
        ]
    )
    return StepPrices.from_history(frame, SHAPES)


PRICES = _prices()


def sim(hazards: HazardModel = NO_HAZARD, *, seed: int = 0, **config: object) -> SimCloud:
    return SimCloud(PRICES, hazards, start=T, seed=seed, config=SimConfig(**config))  # type: ignore[arg-type]


def spec(key: OfferKey = AWS, job: str = "job-1") -> LaunchSpec:
    return LaunchSpec(offer=key, tags={"costopt:job": job})


def test_it_is_a_cloud_provider_and_a_simulated_cloud() -> None:
    cloud: CloudProvider = sim()
    simulated: SimulatedCloud = sim()
    assert cloud.name == "sim" == simulated.name
    built = sim_factory(SimConfig())(PRICES, NO_HAZARD, start=T, seed=3)
    assert built.now() == T


def test_the_clock_moves_only_forward_and_only_when_asked() -> None:
    clock = SimClock(T)
    assert clock.now() == T
    assert clock.advance(timedelta(hours=2)) == m(120)
    assert clock.advance_to(m(180)) == m(180)
    with pytest.raises(ClockError):
        clock.advance_to(m(60))
    with pytest.raises(ClockError):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(ClockError):
        SimClock(datetime(2020, 3, 2))
    cloud = SimCloud(PRICES, NO_HAZARD, clock=clock)
    cloud.run_until(m(240))
    assert clock.now() == m(240)  # a shared clock
    with pytest.raises(ClockError):
        cloud.run_until(m(200))


def test_a_launch_is_idempotent_by_token() -> None:
    cloud = sim()
    first = cloud.launch(spec(), "job-1:1")
    cloud.run_until(m(10))
    again = cloud.launch(spec(AZURE), "job-1:1")  # same token: the same instance, whatever the spec
    assert again.instance_id == first.instance_id
    assert again.offer == AWS
    assert [i.instance_id for i in cloud.list({"costopt:job": "job-1"})] == [first.instance_id]
    assert sim(seed=9).launch(spec(), "job-1:1").instance_id == first.instance_id  # ids derive from tokens
    other = cloud.launch(spec(), "job-1:2")
    assert other.instance_id != first.instance_id
    assert len(cloud.list({"costopt:job": "job-1"})) == 2
    assert cloud.list({"costopt:job": "nobody"}) == []


def test_ended_instances_are_forgotten_after_forget_ended_after() -> None:
    cloud = sim(forget_ended_after=timedelta(hours=2))
    old = cloud.launch(spec(AWS_OD), "old")
    kept = cloud.launch(spec(AWS_OD), "kept")  # never ends: never forgotten
    cloud.run_until(m(30))
    cloud.terminate(old.instance_id)
    cloud.run_until(m(30 + 119))
    cloud.launch(spec(AWS_OD), "a")  # a launch sweeps: 1 h 59 min after its end, still known
    assert cloud.describe(old.instance_id).state is InstanceState.TERMINATED
    cloud.run_until(m(30 + 119 + 12))  # the next sweep: a tenth of the 2 h after the last one
    cloud.launch(spec(AWS_OD), "b")
    with pytest.raises(NotFoundError):  # as GCP and Azure answer for a deleted instance
        cloud.describe(old.instance_id)
    assert cloud.describe(kept.instance_id).state is InstanceState.RUNNING
    again = cloud.launch(spec(AWS_OD), "old")  # its token is forgotten too: a new instance
    assert again.state is InstanceState.PENDING and again.launched_at == m(161)
    with pytest.raises(SimError, match="forget_ended_after must be >= "):
        SimConfig(forget_ended_after=timedelta(minutes=59))


def test_a_long_running_cloud_holds_only_the_instances_of_its_recent_past() -> None:
    cloud = sim(forget_ended_after=timedelta(hours=2))
    for i in range(300):  # one instance an hour, each ended after 30 min: 300 ever launched
        inst = cloud.launch(spec(AWS_OD), f"t{i}")
        cloud.run_until(m(60 * i + 30))
        cloud.terminate(inst.instance_id)
        cloud.run_until(m(60 * i + 60))
    assert len(cloud._instances) <= 4 and len(cloud._tokens) <= 4  # those ended within ~2 h (one sweep late)
    assert len(sim()._instances) == 0  # the default keeps every instance (backtests, tests)


def test_the_boot_delay_keeps_an_instance_pending() -> None:
    cloud = sim(timing=WorkloadTiming(boot=timedelta(minutes=3)))
    inst = cloud.launch(spec(), "t")
    assert inst.state is InstanceState.PENDING
    assert inst.launched_at == T
    events = cloud.run_until(m(2.9))
    assert events == []
    assert cloud.describe(inst.instance_id).state is InstanceState.PENDING
    events = cloud.run_until(m(10))
    assert [(e.kind, e.at) for e in events] == [(SimEventKind.READY, m(3))]
    assert cloud.describe(inst.instance_id).state is InstanceState.RUNNING
    assert cloud.run_until(m(20)) == []  # reported once


def test_terminate_is_idempotent() -> None:
    cloud = sim()
    inst = cloud.launch(spec(), "t")
    cloud.run_until(m(30))
    cloud.terminate(inst.instance_id)
    cloud.run_until(m(40))
    cloud.terminate(inst.instance_id)
    gone = cloud.describe(inst.instance_id)
    assert gone.state is InstanceState.TERMINATED
    assert gone.terminated_at == m(30)
    cloud.terminate("sim-nope")  # an unknown id: nothing to do, as on a real cloud
    with pytest.raises(NotFoundError):
        cloud.describe("sim-nope")


def test_an_offer_without_a_price_now_cannot_be_launched() -> None:
    cloud = sim()
    with pytest.raises(CapacityError, match="no price"):
        cloud.launch(spec(LATE), "t")
    cloud.run_until(T + timedelta(days=1))
    assert cloud.launch(spec(LATE), "t").state is InstanceState.PENDING


def test_capacity_failures_are_drawn_per_offer_and_deterministic() -> None:
    always = sim(launch_failure={("aws", "v100", 1): 1.0})
    with pytest.raises(CapacityError, match="no capacity"):
        always.launch(spec(), "t")
    assert always.launch(spec(AZURE), "u").offer == AZURE  # another shape is not affected

    def outcomes(seed: int) -> list[bool]:
        cloud = sim(seed=seed, launch_failure={("aws", "v100", 1): 0.5})
        out = []
        for i in range(40):
            try:
                cloud.launch(spec(), f"t{i}")
                out.append(True)
            except CapacityError:
                out.append(False)
        return out

    assert outcomes(1) == outcomes(1)
    assert outcomes(1) != outcomes(2)
    assert 5 < sum(outcomes(1)) < 35


def test_launch_failures_can_come_from_the_availability_logs() -> None:
    stats = [LaunchStats(Cloud.AWS, "k80", 8, attempts=250, failures=240), LaunchStats(Cloud.AWS, "v100", 1, 2, 0)]
    config = SimConfig.from_launch_stats(stats)
    assert config.failure_probability(Cloud.AWS, "k80", 8.0) == pytest.approx(0.96)
    assert config.failure_probability(Cloud.AWS, "v100", 1.0) == 0.0
    assert config.failure_probability(Cloud.AZURE, "k80", 1.0) == 0.0  # never tried: the default


def test_a_quota_caps_the_instances_alive() -> None:
    cloud = sim(max_instances=1)
    first = cloud.launch(spec(), "a")
    with pytest.raises(QuotaError):
        cloud.launch(spec(), "b")
    cloud.terminate(first.instance_id)
    cloud.launch(spec(), "b")


def test_preemptions_come_with_a_notice_of_the_cloud_s_lead_time() -> None:
    cloud = sim(HIGH_HAZARD, seed=7)
    aws = cloud.launch(spec(AWS), "aws")
    azure = cloud.launch(spec(AZURE), "azure")
    od = cloud.launch(spec(AWS_OD), "od")
    cloud.run_until(T + timedelta(days=2), watch=())  # watching nothing: no early stop
    seen = cloud.interruptions(T)
    by = {(i.instance_id, i.kind): i for i in seen}
    for inst, lead in ((aws, timedelta(minutes=2)), (azure, timedelta(seconds=30))):
        notice, gone = by[(inst.instance_id, "notice")], by[(inst.instance_id, "preempted")]
        assert notice.deadline == gone.noticed_at
        assert gone.noticed_at - notice.noticed_at == min(lead, gone.noticed_at - T)
        assert cloud.describe(inst.instance_id).state is InstanceState.PREEMPTED
        assert cloud.describe(inst.instance_id).terminated_at == gone.noticed_at
    assert all(i.instance_id != od.instance_id for i in seen)  # on-demand is never preempted
    assert cloud.describe(od.instance_id).state is InstanceState.RUNNING
    assert [i.noticed_at for i in seen] == sorted(i.noticed_at for i in seen)
    later = max(i.noticed_at for i in seen)
    assert cloud.interruptions(later + timedelta(seconds=1)) == []


def test_run_until_stops_at_a_watched_preemption() -> None:
    cloud = sim(HIGH_HAZARD, seed=3)
    a = cloud.launch(spec(AWS), "a")
    events = cloud.run_until(T + timedelta(days=5), watch={a.instance_id})
    assert events[-1].kind is SimEventKind.PREEMPTED
    assert events[-1].instance_id == a.instance_id
    assert cloud.now() == events[-1].at < T + timedelta(days=5)
    kinds = [e.kind for e in events]
    assert kinds.count(SimEventKind.NOTICE) == 1


def test_preemptions_are_deterministic_per_seed() -> None:
    def lifetimes(seed: int) -> list[datetime | None]:
        cloud = sim(HIGH_HAZARD, seed=seed)
        out = []
        for i in range(8):
            inst = cloud.launch(spec(AWS if i % 2 else AZURE), f"t{i}")
            cloud.run_until(cloud.now() + timedelta(hours=3), watch=())
            out.append(cloud.describe(inst.instance_id).terminated_at)
        return out

    assert lifetimes(11) == lifetimes(11)
    assert lifetimes(11) != lifetimes(12)


def test_the_services_simulated_cloud_is_seeded_by_its_setting() -> None:
    from costopt.settings import Settings

    def lifetime(settings: Settings) -> datetime | None:
        cloud = SimCloud.from_settings(settings, prices=PRICES, hazards=HIGH_HAZARD, start=T)
        inst = cloud.launch(spec(), "t")
        cloud.run_until(T + timedelta(hours=12), watch=())
        return cloud.describe(inst.instance_id).terminated_at

    seeded = lifetime(Settings(sim_seed=12))
    assert seeded is not None and seeded == lifetime(Settings(sim_seed=12))  # COSTOPT_SIM_SEED: the draws' seed
    assert lifetime(Settings(sim_seed=13)) != seeded
    direct = sim(HIGH_HAZARD, seed=12)
    inst = direct.launch(spec(), "t")
    direct.run_until(T + timedelta(hours=12), watch=())
    assert direct.describe(inst.instance_id).terminated_at == seeded


def test_one_offer_meets_the_same_reclaims_whoever_launches_on_it() -> None:
    # common random numbers: an offer's reclaim times do not depend on what else the sim did
    a = sim(HIGH_HAZARD, seed=5)
    b = sim(HIGH_HAZARD, seed=5)
    b.launch(spec(AZURE), "noise")
    b.run_until(m(1))
    a.run_until(m(1))
    ia, ib = a.launch(spec(AWS), "x"), b.launch(spec(AWS), "x")
    a.run_until(T + timedelta(days=2), watch=())
    b.run_until(T + timedelta(days=2), watch=())
    assert a.describe(ia.instance_id).terminated_at == b.describe(ib.instance_id).terminated_at


def test_untouched_says_whether_a_seed_draws_anything_near_a_run_s_copies() -> None:
    # where the seed's cloud reclaims AWS: an instance launched at T meets its notice then
    probe = sim(HIGH_HAZARD, seed=4)
    inst = probe.launch(spec(AWS), "probe")
    probe.run_until(T + timedelta(days=2), watch=())
    gone = probe.describe(inst.instance_id).terminated_at
    assert gone is not None
    notice = gone - timedelta(minutes=2)
    hour = timedelta(hours=1)
    cloud = sim(HIGH_HAZARD, seed=4)
    assert not cloud.untouched([(AWS, T, gone)])  # the copy would be preempted
    assert not cloud.untouched([(AWS, T, notice - hour / 2)])  # ended within the slack before the notice
    assert cloud.untouched([(AWS, T, notice - hour / 2)], slack=timedelta(0))
    assert cloud.untouched([(AWS_OD, T, T + timedelta(days=30))])  # on-demand: never reclaimed
    assert sim(NO_HAZARD, seed=4).untouched([(AWS, T, T + timedelta(days=30))])  # no hazard: nothing drawn
    assert not sim(NO_HAZARD, default_launch_failure=0.1).untouched([])  # a launch may fail by a draw
    # asking draws nothing a later launch would meet differently
    asked = sim(HIGH_HAZARD, seed=4)
    asked.untouched([(AWS, T, T + timedelta(days=3)), (AZURE, T, T + timedelta(days=3))])
    again = asked.launch(spec(AWS), "probe")
    asked.run_until(T + timedelta(days=2), watch=())
    assert asked.describe(again.instance_id).terminated_at == gone


def test_progress_counts_boot_training_and_periodic_checkpoints() -> None:
    # boot 3 min; 10 steps/s; a checkpoint (1 min pause) after every hour of training
    cloud = sim()
    inst = cloud.launch(spec(), "t").instance_id
    p = cloud.start_workload(inst, steps_per_s=10.0, target_steps=72_000)
    assert p.training_from == m(3)  # a fresh start restores nothing
    cloud.run_until(m(63))
    p = cloud.progress(inst)
    assert (p.steps_done, p.durable_steps, p.durable_at) == (36_000, 0, None)
    cloud.run_until(m(64))
    p = cloud.progress(inst)
    assert (p.steps_done, p.durable_steps, p.durable_at) == (36_000, 36_000, m(64))
    cloud.run_until(m(90))
    p = cloud.progress(inst)
    assert (p.steps_done, p.durable_steps, p.lost_steps) == (36_000 + 26 * 600, 36_000, 26 * 600)
    # 2 h of training and 2 checkpoints (the last one final) after the boot: done at 2:05
    assert p.done_at == m(125)
    events = cloud.run_until(m(600), watch={inst})
    assert events[-1].kind is SimEventKind.DONE and events[-1].at == m(125)
    p = cloud.progress(inst)
    assert (p.steps_done, p.durable_steps) == (72_000, 72_000)


def test_a_restore_takes_its_time_and_resumes_from_the_checkpoint() -> None:
    cloud = sim(timing=WorkloadTiming(boot=timedelta(minutes=3), restore=timedelta(minutes=2)))
    inst = cloud.launch(spec(), "t").instance_id
    p = cloud.start_workload(inst, steps_per_s=10.0, target_steps=100_000, start_step=50_000)
    assert p.training_from == m(5)
    assert (p.steps_done, p.durable_steps) == (50_000, 50_000)
    cloud.run_until(m(15))
    assert cloud.progress(inst).steps_done == 50_000 + 6_000


def test_a_preemption_loses_the_work_since_the_last_checkpoint() -> None:
    cloud = sim(HIGH_HAZARD, seed=21, timing=WorkloadTiming(checkpoint_interval=timedelta(minutes=10)))
    inst = cloud.launch(spec(AZURE), "t").instance_id
    cloud.start_workload(inst, steps_per_s=10.0, target_steps=10**9)
    events = cloud.run_until(T + timedelta(days=1), watch={inst})
    gone = events[-1].at
    assert events[-1].kind is SimEventKind.PREEMPTED
    p = cloud.progress(inst)
    assert p.stopped_at == gone
    assert p.steps_done > p.durable_steps or gone - m(3) < timedelta(minutes=11)
    # the durable steps are those of the last checkpoint completed before the preemption
    cycles = (gone - m(3)) // timedelta(minutes=11)
    assert p.durable_steps == cycles * 6_000
    cloud.run_until(cloud.now() + timedelta(hours=1))
    assert cloud.progress(inst).steps_done == p.steps_done  # frozen


def test_a_requested_checkpoint_saves_the_work_and_can_stop_the_workload() -> None:
    cloud = sim()
    inst = cloud.launch(spec(), "t").instance_id
    cloud.start_workload(inst, steps_per_s=10.0, target_steps=10**9)
    cloud.run_until(m(33))
    durable_at = cloud.request_checkpoint(inst, then_stop=True)
    assert durable_at == m(34)
    cloud.run_until(m(34))
    p = cloud.progress(inst)
    assert (p.steps_done, p.durable_steps, p.durable_at, p.stopped_at) == (18_000, 18_000, m(34), m(34))
    cloud.run_until(m(50))
    assert cloud.progress(inst).steps_done == 18_000
    # asked while a periodic checkpoint is written: that one completes, at the end of its window
    other = cloud.launch(spec(), "u").instance_id
    cloud.start_workload(other, steps_per_s=10.0, target_steps=10**9)  # trains from 0:53
    cloud.run_until(m(53 + 60.5))
    assert cloud.request_checkpoint(other) == m(53 + 61)
    cloud.run_until(m(53 + 62))
    p = cloud.progress(other)
    assert (p.steps_done, p.durable_steps) == (36_000 + 600, 36_000)


def test_a_checkpoint_on_notice_saves_the_work_when_the_lead_time_allows() -> None:
    def lost(key: OfferKey) -> tuple[float, float]:
        cloud = sim(HIGH_HAZARD, seed=4, checkpoint_on_notice=True)
        inst = cloud.launch(spec(key), "t").instance_id
        cloud.start_workload(inst, steps_per_s=10.0, target_steps=10**9)
        cloud.run_until(T + timedelta(days=1), watch={inst})
        p = cloud.progress(inst)
        return p.lost_steps, p.steps_done

    aws_lost, aws_done = lost(AWS)  # 2 min notice > 1 min checkpoint: nothing lost
    assert aws_lost == 0 and aws_done > 0
    azure_lost, _ = lost(AZURE)  # 30 s notice < 1 min checkpoint: the work since the last one is lost
    assert azure_lost > 0


def test_a_forced_preemption_takes_the_drawn_path_notice_then_preempted() -> None:
    cloud = sim(checkpoint_on_notice=True)  # no hazard: only the forced preemption
    inst = cloud.launch(spec(AWS), "t").instance_id
    cloud.start_workload(inst, steps_per_s=10.0, target_steps=10**9)
    cloud.run_until(m(50))
    notice = cloud.preempt(inst)
    assert (notice.kind, notice.noticed_at, notice.deadline) == ("notice", m(50), m(52))  # AWS: 2 min
    assert cloud.describe(inst).state is InstanceState.RUNNING  # until its deadline
    events = cloud.run_until(m(90), watch={inst})
    assert [(e.kind, e.at) for e in events] == [(SimEventKind.NOTICE, m(50)), (SimEventKind.PREEMPTED, m(52))]
    gone = cloud.describe(inst)
    assert gone.state is InstanceState.PREEMPTED and gone.terminated_at == m(52)
    assert [(i.kind, i.noticed_at, i.deadline) for i in cloud.interruptions(m(40))] == [
        ("notice", m(50), m(52)),
        ("preempted", m(52), None),
    ]
    assert cloud.progress(inst).lost_steps == 0  # checkpoint_on_notice: written within the 2 min
    with pytest.raises(SimError, match="has ended"):
        cloud.preempt(inst)
    with pytest.raises(NotFoundError):
        cloud.preempt("sim-nope")


def test_a_forced_preemption_without_notice_takes_the_instance_at_once_even_on_demand() -> None:
    cloud = sim()
    od = cloud.launch(spec(AWS_OD), "od").instance_id
    cloud.run_until(m(10))
    taken = cloud.preempt(od, notice=timedelta(0))
    assert (taken.kind, taken.noticed_at, taken.deadline) == ("preempted", m(10), None)
    assert cloud.describe(od).state is InstanceState.PREEMPTED and cloud.describe(od).terminated_at == m(10)
    assert [e.kind for e in cloud.run_until(m(20))] == [SimEventKind.NOTICE, SimEventKind.PREEMPTED]
    assert [i.kind for i in cloud.interruptions(m(10))] == ["notice", "preempted"]
    with pytest.raises(ValueError, match=">= 0"):
        cloud.preempt(cloud.launch(spec(AWS_OD), "od2").instance_id, notice=timedelta(seconds=-1))


def test_a_drawn_preemption_that_comes_first_stays() -> None:
    drawn = sim(HIGH_HAZARD, seed=3)
    inst = drawn.launch(spec(AWS), "a").instance_id
    drawn.run_until(T + timedelta(days=5), watch=())
    taken = drawn.describe(inst).terminated_at
    assert taken is not None
    forced = sim(HIGH_HAZARD, seed=3)  # the same draws
    forced.launch(spec(AWS), "a")
    late = forced.preempt(inst, notice=taken - T + timedelta(hours=1))  # asked for after the drawn one
    assert late.deadline == taken
    forced.run_until(T + timedelta(days=5), watch=())
    assert forced.describe(inst).terminated_at == taken


def test_workloads_are_refused_on_gone_instances() -> None:
    cloud = sim()
    inst = cloud.launch(spec(), "t").instance_id
    cloud.terminate(inst)
    with pytest.raises(SimError):
        cloud.start_workload(inst, steps_per_s=1.0, target_steps=10)
    with pytest.raises(SimError):
        cloud.request_checkpoint(inst)
    live = cloud.launch(spec(), "u").instance_id
    with pytest.raises(SimError):
        cloud.start_workload(live, steps_per_s=0.0, target_steps=10)


def test_a_month_simulates_in_a_second_or_so() -> None:
    cloud = sim(HIGH_HAZARD, seed=1)
    t0 = time.perf_counter()
    end = T + timedelta(days=30)
    n = 0
    while cloud.now() < end:
        inst = cloud.launch(spec(AWS if n % 2 else AZURE), f"t{n}").instance_id
        cloud.start_workload(inst, steps_per_s=5.0, target_steps=10**9)
        cloud.run_until(end, watch={inst})
        n += 1
    assert n > 100  # ~2 preemptions an hour for 720 hours
    assert time.perf_counter() - t0 < 2.0  # ~0.3 s here; slack for a loaded CI machine
