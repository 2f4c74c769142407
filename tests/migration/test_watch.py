"""The interruption watcher: notices -> checkpoint requests, preemptions -> unavailable offer + recovery
through the real migrator; stale copies ignored; idempotent; restart-safe; backoff; and with real
processes on the local provider."""

from __future__ import annotations

import builtins
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from costopt.agent import Agent, control
from costopt.agent.contract import ENV_CHECKPOINT_URI, ENV_EPOCH, ENV_JOB_ID
from costopt.cloud import CapacityError, Instance, InstanceState, Interruption, LaunchSpec, NotFoundError
from costopt.db.migration_schema import migration_jobs, migrations
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.machine import Migrator
from costopt.migration.reconcile import reconcile
from costopt.migration.records import ALIVE_STATES, JobRecord, JobStatus, Kind, State
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import (
    DbWatermark,
    InterruptionWatcher,
    MemoryWatermark,
    RecoveryStarted,
    notice_request_id,
)
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.GCP, "us-central1", "us-central1-a", "n1-standard-8", Market.SPOT)
C = OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT)
OFFERS = (A, B, C)


class Clock:
    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def tick(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at


class InProcessCloud:
    """A cloud whose copies 'run' in this process: a launch restores the latest checkpoint and reports
    one step with an :class:`Agent` of the launched epoch (so the migrator's verification passes at
    once). Interruptions and instance states are set by the test."""

    name = "fake"

    def __init__(self, clock: Clock, prefix: str = "i-") -> None:
        self.clock = clock
        self.prefix = prefix
        self.instances: dict[str, Instance] = {}
        self.tokens: dict[str, str] = {}
        self.events: list[Interruption] = []
        self.failing: set[OfferKey] = set()
        self.launches: list[OfferKey] = []
        self.reads: list[datetime] = []
        self.acknowledged: list[Interruption] = []

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if idempotency_token in self.tokens:
            return self.instances[self.tokens[idempotency_token]]
        self.launches.append(spec.offer)
        if spec.offer in self.failing:
            raise CapacityError(f"no capacity for {spec.offer.zone}")
        iid = f"{self.prefix}{len(self.instances) + 1}"
        agent = Agent(spec.env[ENV_JOB_ID], spec.env[ENV_CHECKPOINT_URI], int(spec.env[ENV_EPOCH]))
        ckpt = agent.restore()
        step = (ckpt.step if ckpt else 0) + 1
        agent.report(step)
        agent.checkpoint(step, {"step": step})
        agent.close()
        inst = Instance(iid, spec.offer, InstanceState.RUNNING, dict(spec.tags), launched_at=self.clock())
        self.instances[iid] = inst
        self.tokens[idempotency_token] = iid
        return inst

    def set_state(self, instance_id: str, state: InstanceState) -> None:
        inst = self.instances[instance_id]
        self.instances[instance_id] = Instance(inst.instance_id, inst.offer, state, inst.tags, inst.launched_at)

    def terminate(self, instance_id: str) -> None:
        if instance_id in self.instances and self.instances[instance_id].state in ALIVE_STATES:
            self.set_state(instance_id, InstanceState.TERMINATED)

    def describe(self, instance_id: str) -> Instance:
        if instance_id not in self.instances:
            raise NotFoundError(instance_id)
        return self.instances[instance_id]

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        return [i for i in self.instances.values() if all(i.tags.get(k) == v for k, v in tags.items())]

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        self.reads.append(since)
        return [e for e in self.events if e.noticed_at >= since]

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.acknowledged.extend(interruptions)

    # what a cloud does to an instance
    def notice(self, instance_id: str, lead: float = 30.0) -> Interruption:
        ev = Interruption(instance_id, self.clock(), self.clock() + timedelta(seconds=lead), "notice")
        self.events.append(ev)
        return ev

    def preempt(self, instance_id: str, at: datetime | None = None) -> Interruption:
        self.set_state(instance_id, InstanceState.PREEMPTED)
        ev = Interruption(instance_id, at or self.clock(), None, "preempted")
        self.events.append(ev)
        return ev


class Setup:
    def __init__(self, engine: Engine, tmp_path: Path) -> None:
        self.engine = engine
        self.clock = Clock()
        self.cloud = InProcessCloud(self.clock)
        self.migrator = Migrator(engine, self.cloud, backoff_base=0.001, now=self.clock)  # type: ignore[arg-type]
        self.unavailable = UnavailableOffers(engine, clock=self.clock)
        self.uri = str(tmp_path / "ckpt" / "job-1")
        self.offers_asked: list[str] = []

    def offers_for(self, job: JobRecord) -> tuple[OfferKey, ...]:
        self.offers_asked.append(job.job_id)
        return OFFERS

    def watcher(self, **kw: object) -> InterruptionWatcher:
        kw.setdefault("overlap", timedelta(seconds=60))
        return InterruptionWatcher(
            self.migrator,
            self.offers_for,
            unavailable=self.unavailable,
            clock=self.clock,
            retry_base=10.0,
            **kw,  # type: ignore[arg-type]
        )

    def start(self) -> JobRecord:
        self.migrator.register_job("job-1", ["train"], self.uri)
        rec = self.migrator.start("job-1", OFFERS)
        assert rec.state is State.DONE, rec.reason
        return self.migrator.job("job-1")


@pytest.fixture
def s(engine: Engine, tmp_path: Path) -> Setup:
    return Setup(engine, tmp_path)


def test_a_notice_on_the_current_copy_asks_it_to_checkpoint_now(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    ev = s.cloud.notice(job.instance_id, lead=30.0)
    report = s.watcher().poll()
    assert [(n.job_id, n.instance_id, n.epoch, n.deadline) for n in report.notices] == [
        ("job-1", job.instance_id, 1, T0 + timedelta(seconds=30))
    ]
    request = control.pending_request(s.uri)
    assert request is not None
    assert request["id"] == report.notices[0].request_id == notice_request_id(job.instance_id, ev.noticed_at)
    assert request["epoch"] == 1  # addressed to the noticed copy only: a later epoch ignores it
    assert report.recoveries == () and s.migrator.job("job-1").instance_id == job.instance_id


def test_a_preemption_marks_the_offer_unavailable_and_recovers_on_the_next_offer(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None and job.offer == A
    s.clock.tick(10)
    s.cloud.preempt(job.instance_id)
    report = s.watcher().poll()
    assert [(r.job_id, r.instance_id, r.cause, r.state) for r in report.recoveries] == [
        ("job-1", job.instance_id, "preempted", "done")
    ]
    after = s.migrator.job("job-1")
    assert (after.epoch, after.status, after.offer) == (2, JobStatus.RUNNING, B)  # A was filtered out
    assert s.unavailable.is_unavailable(A) and not s.unavailable.is_unavailable(B)
    assert [e.reason for e in s.unavailable.active()] == ["preempted"]
    assert s.migrator.history("job-1")[-1].kind is Kind.RECOVER


def test_polling_the_same_events_again_does_nothing(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    s.cloud.notice(job.instance_id)
    s.clock.tick(30)
    s.cloud.preempt(job.instance_id)
    watcher = s.watcher()
    first = watcher.poll()
    assert len(first.notices) == 0 and len(first.recoveries) == 1  # the notice came with its preemption
    launches = list(s.cloud.launches)
    second = watcher.poll()
    assert second.duplicates == 2 and second.idle and second.ignored == ()
    assert s.cloud.launches == launches and s.migrator.job("job-1").epoch == 2


def test_a_restarted_watcher_misses_no_preemption_and_repeats_no_recovery(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    first = s.watcher()
    assert first.poll().idle  # the watermark is now T0
    # The watcher dies. A preemption just before its last pass is reported late, and one comes later.
    s.cloud.preempt(job.instance_id, at=T0 - timedelta(seconds=5))
    s.clock.tick(20)
    restarted = s.watcher()  # a new process: nothing in memory, the watermark from the database
    report = restarted.poll()
    assert report.since == T0 - timedelta(seconds=60)  # last pass's start minus the overlap
    assert [r.instance_id for r in report.recoveries] == [job.instance_id]
    second = s.migrator.job("job-1")
    assert second.instance_id is not None
    s.clock.tick(5)
    s.cloud.preempt(second.instance_id)
    again = s.watcher()  # restarted once more: re-reads both events
    report = again.poll()
    assert [r.instance_id for r in report.recoveries] == [second.instance_id]
    assert [(i.instance_id, i.kind) for i in report.ignored] == [(job.instance_id, "preempted")]
    assert "not the current copy" in report.ignored[0].why
    assert s.migrator.job("job-1").epoch == 3 and len(s.cloud.launches) == 3


def test_events_on_stale_copies_are_ignored_and_logged(s: Setup, caplog: pytest.LogCaptureFixture) -> None:
    job = s.start()
    assert job.instance_id is not None
    old = job.instance_id
    s.cloud.preempt(old)
    watcher = s.watcher()
    watcher.poll()
    s.clock.tick(10)
    s.cloud.events.append(Interruption(old, s.clock(), None, "preempted"))  # the old copy again, later
    s.cloud.events.append(Interruption("i-not-ours", s.clock(), None, "notice"))
    with caplog.at_level(logging.INFO, logger="costopt.migration.watch"):
        report = watcher.poll()
    assert report.idle
    assert sorted(i.instance_id for i in report.ignored) == sorted(["i-not-ours", old])
    assert f"ignoring preempted of {old}" in caplog.text


def test_a_job_with_a_migration_in_flight_is_left_to_it_until_it_ends(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    mig = s.migrator.plan("job-1", OFFERS, Kind.MOVE)  # a move in flight (in another process, say)
    s.cloud.notice(job.instance_id)
    watcher = s.watcher()
    report = watcher.poll()
    assert [n.request_id for n in report.notices] == [None]  # the move owns the request file
    s.clock.tick(30)
    s.cloud.preempt(job.instance_id)
    assert watcher.poll().recoveries == ()
    # The move gives up and leaves the job running on its (dead) copy: now the watcher recovers it.
    with s.engine.begin() as conn:
        conn.execute(update(migrations).where(migrations.c.id == mig.id).values(state=State.ROLLED_BACK.value))
        conn.execute(update(migration_jobs).values(status=JobStatus.RUNNING.value))
    report = watcher.poll()
    assert [(r.instance_id, r.cause, r.state) for r in report.recoveries] == [(job.instance_id, "preempted", "done")]


def test_a_copy_gone_after_its_notice_is_recovered_before_the_preemption_is_reported(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    s.cloud.notice(job.instance_id, lead=120.0)
    watcher = s.watcher()
    assert watcher.poll().recoveries == ()  # still running: it has two minutes
    s.clock.tick(5)
    s.cloud.set_state(job.instance_id, InstanceState.TERMINATED)  # checkpointed and exited
    report = watcher.poll()
    assert [(r.instance_id, r.state) for r in report.recoveries] == [(job.instance_id, "done")]
    assert s.unavailable.is_unavailable(A)


def test_when_every_candidate_is_unavailable_they_are_tried_anyway_as_a_last_resort(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    for offer in (B, C):
        s.unavailable.mark(offer, "capacity")
    s.cloud.preempt(job.instance_id)
    report = s.watcher().poll()
    assert [(r.state, r.cause) for r in report.recoveries] == [
        ("done", "preempted; every candidate marked unavailable, tried anyway")
    ]
    assert s.migrator.job("job-1").offer == A  # the candidates' own order


def test_a_job_without_candidate_offers_waits_and_says_why(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    s.cloud.preempt(job.instance_id)
    report = InterruptionWatcher(s.migrator, lambda job: (), unavailable=s.unavailable, clock=s.clock).poll()
    assert report.recoveries == () and "no candidate offer" in report.waiting[0].why


def test_a_failed_recovery_backs_off_before_the_next_attempt(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    s.cloud.failing = {B, C}
    s.cloud.preempt(job.instance_id)
    watcher = s.watcher()
    report = watcher.poll()
    assert [r.state for r in report.recoveries] == ["rolled_back"]
    assert s.migrator.job("job-1").status is JobStatus.RECOVERING
    launches = len(s.cloud.launches)
    report = watcher.poll()  # marked for recovery, but backing off (10 s after the first failure)
    assert report.recoveries == () and "backing off" in report.waiting[0].why
    assert len(s.cloud.launches) == launches
    s.cloud.failing = set()
    s.clock.tick(11)
    report = watcher.poll()
    assert [(r.cause, r.state) for r in report.recoveries] == [("marked for recovery", "done")]


def test_a_job_the_reconciler_marked_for_recovery_is_recovered(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    del s.cloud.instances[job.instance_id]  # vanished without any event
    assert reconcile(s.engine, s.cloud).marked_for_recovery == ("job-1",)  # type: ignore[arg-type]
    report = s.watcher().poll()
    assert [(r.cause, r.state) for r in report.recoveries] == [("marked for recovery", "done")]
    assert s.migrator.job("job-1").epoch == 2


def test_a_job_that_finished_before_its_copy_was_taken_is_not_recovered(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    agent = Agent("job-1", s.uri, job.epoch)
    agent.restore()
    agent.finish(1)
    agent.close()
    s.cloud.preempt(job.instance_id)
    report = s.watcher().poll()
    assert report.recoveries == () and s.cloud.launches == [A]


def test_jobs_of_other_providers_are_not_watched(s: Setup) -> None:
    job = s.start()
    assert job.instance_id is not None
    with s.engine.begin() as conn:
        conn.execute(update(migration_jobs).values(provider="aws"))
    s.cloud.preempt(job.instance_id)
    report = s.watcher().poll()
    assert report.recoveries == () and report.ignored[0].instance_id == job.instance_id


def test_the_watermark_lives_in_the_database_and_one_from_another_clock_is_ignored(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    mark = DbWatermark(s.engine, "watch:fake")
    assert mark.load() is None
    mark.save(T0 + timedelta(microseconds=7))
    mark.save(T0 + timedelta(seconds=1, microseconds=7))
    assert DbWatermark(s.engine, "watch:fake").load() == T0 + timedelta(seconds=1, microseconds=7)
    DbWatermark(s.engine, "watch:fake").save(T0 + timedelta(days=365))  # written on a clock far ahead
    with caplog.at_level(logging.WARNING, logger="costopt.migration.watch"):
        report = s.watcher().poll()
    assert report.since == T0 - timedelta(seconds=60) and "after now" in caplog.text
    assert s.cloud.reads == [T0 - timedelta(seconds=60)]
    memory = s.watcher(watermark=MemoryWatermark())
    memory.poll()
    s.clock.tick(3)
    assert memory.poll().since == T0 - timedelta(seconds=60)  # the start of the previous pass, minus overlap
    with pytest.raises(ValueError, match="naive"):
        InterruptionWatcher(s.migrator, s.offers_for, clock=lambda: datetime(2026, 1, 1)).poll()


# -- with real processes ----------------------------------------------------------------------------

LOCAL_OFFERS = (
    OfferKey(Cloud.LOCAL, "local", "local-a", "cpu-1", Market.SPOT),
    OfferKey(Cloud.LOCAL, "local", "local-b", "cpu-1", Market.SPOT),
)
ENDLESS = [sys.executable, str(PROJECT_ROOT / "examples" / "train.py"), "--steps", "1000000",
           "--checkpoint-every", "50", "--step-seconds", "0.005"]  # fmt: skip


def test_with_the_local_provider_a_preempted_copy_checkpoints_on_notice_and_the_watcher_recovers_it(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = Migrator(engine, local, checkpoint_timeout=20.0, verify_timeout=20.0, poll_seconds=0.05)
    uri = str(tmp_path / "ckpt" / "job-1")
    mig.register_job("job-1", ENDLESS, uri)
    assert mig.start("job-1", LOCAL_OFFERS).state is State.DONE
    unavailable = UnavailableOffers(engine)
    watcher = InterruptionWatcher(mig, lambda job: LOCAL_OFFERS, unavailable=unavailable)
    end = time.monotonic() + 20
    while not control.progress(uri, 1).progressing and time.monotonic() < end:
        time.sleep(0.05)
    old = mig.job("job-1")
    assert old.instance_id is not None
    local.preempt(old.instance_id, notice_seconds=5.0)
    recovered: list[RecoveryStarted] = []
    while not recovered and time.monotonic() < end:
        recovered = [r for r in watcher.poll().recoveries if r.recovered]
        time.sleep(0.05)
    assert recovered, "the watcher did not recover the job"
    new = mig.job("job-1")
    assert (new.epoch, new.status, new.offer) == (2, JobStatus.RUNNING, LOCAL_OFFERS[1])
    assert unavailable.is_unavailable(LOCAL_OFFERS[0])
    # The copy saw the notice, checkpointed and stopped before its deadline: its successor resumed there.
    p1 = control.progress(uri, 1)
    assert p1.checkpoints and control.progress(uri, 2).restored_step == p1.checkpoints[-1] == p1.last_step
    assert watcher.poll().recoveries == ()
    assert [i.instance_id for i in local.list({}) if i.state in ALIVE_STATES] == [new.instance_id]


def test_events_are_acknowledged_once_acted_on_and_failed_requests_are_not(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = s.start()
    assert job.instance_id is not None
    stranger = s.cloud.notice("i-not-costopts")
    notice = s.cloud.notice(job.instance_id)

    def unreachable(*args: object, **kwargs: object) -> str:
        raise OSError("checkpoint store unreachable")

    monkeypatch.setattr("costopt.migration.watch.control.request_checkpoint", unreachable)
    watcher = s.watcher()
    first = watcher.poll()
    assert first.notices == ()
    assert s.cloud.acknowledged == [stranger]  # ignored: nothing to do; the failed request: not acknowledged
    monkeypatch.undo()

    second = watcher.poll()  # the notice read again is acted on now, not taken for a duplicate

    assert [n.instance_id for n in second.notices] == [job.instance_id]
    assert s.cloud.acknowledged[1:] == [stranger, notice]  # a duplicate is acknowledged again (idempotent)
    s.clock.tick(10)
    taken = s.cloud.preempt(job.instance_id)
    third = watcher.poll()
    assert [r.state for r in third.recoveries] == ["done"]
    assert s.cloud.acknowledged[-1] == taken  # after its recovery ran


def test_copies_taken_at_once_are_recovered_at_once(s: Setup, tmp_path: Path) -> None:
    # A reclaim takes every instance of an offer: the jobs' recoveries run side by side (the pass waits
    # for them all), not one after another. The cloud lets a launch through only once all three are in
    # flight; one after another, the first launch finds nobody and fails (BrokenBarrierError).
    import threading

    for n in (1, 2, 3):
        s.migrator.register_job(f"job-{n}", ["train"], str(tmp_path / "ckpt" / f"job-{n}"))
        assert s.migrator.start(f"job-{n}", OFFERS).state is State.DONE
    together = threading.Barrier(3, timeout=30)
    lock = threading.Lock()
    launch = s.cloud.launch

    def side_by_side(spec: LaunchSpec, idempotency_token: str) -> Instance:
        together.wait()
        with lock:
            return launch(spec, idempotency_token)

    s.cloud.launch = side_by_side  # type: ignore[method-assign]
    for n in (1, 2, 3):
        s.cloud.preempt(s.migrator.job(f"job-{n}").instance_id or "")
    report = s.watcher(workers=3).poll()
    assert sorted(r.job_id for r in report.recoveries if r.recovered) == ["job-1", "job-2", "job-3"]
    assert report.waiting == ()
    assert {s.migrator.job(f"job-{n}").epoch for n in (1, 2, 3)} == {2}
    with pytest.raises(ValueError, match="workers must be >= 1"):
        s.watcher(workers=0)


def _jobs(s: Setup, tmp_path: Path, n: int) -> list[str]:
    ids = [f"job-{k}" for k in range(1, n + 1)]
    for job_id in ids:
        s.migrator.register_job(job_id, ["train"], str(tmp_path / "ckpt" / job_id))
        assert s.migrator.start(job_id, OFFERS).state is State.DONE
    return ids


def test_the_recovery_cap_counts_the_recoveries_a_previous_process_left_active(s: Setup, tmp_path: Path) -> None:
    # A service killed with 2 recoveries in flight (the job engine resumes them at restart): a fresh
    # watcher with a cap of 3 starts 1 of the 3 due recoveries, not 3 beside the 2 (its pool is empty).
    ids = _jobs(s, tmp_path, 5)
    for job_id in ids[:2]:
        s.cloud.preempt(s.migrator.job(job_id).instance_id or "")
        s.migrator.plan(job_id, OFFERS, Kind.RECOVER)  # planned by the killed process, still active
    s.clock.tick(5)
    for job_id in reversed(ids[2:]):  # taken at once: the order is then the job ids'
        s.cloud.preempt(s.migrator.job(job_id).instance_id or "")
    report = s.watcher(workers=3, cap=3).poll()
    assert [r.job_id for r in report.recoveries] == ["job-3"]
    assert [(w.job_id, w.why) for w in report.waiting] == [
        ("job-4", "the recovery cap: 3 of 3 active"),
        ("job-5", "the recovery cap: 3 of 3 active"),
    ]
    assert {s.migrator.job(j).epoch for j in ids[3:]} == {1}  # not started
    assert len(s.migrator.active_migrations()) == 2  # the resumed ones still in flight
    with pytest.raises(ValueError, match="cap must be >= 1"):
        s.watcher(cap=0)


def test_recoveries_waiting_for_the_cap_start_in_the_same_order_after_a_restart(s: Setup, tmp_path: Path) -> None:
    # Five copies taken at different times (one after its notice); a cap of 2. A watcher killed after
    # its first pass is replaced by a fresh one: the preemptions left waiting are read again (not
    # acknowledged, the watermark kept before them), and the next two started are those a watcher never
    # killed starts: by the time their copies were lost, then by job id.
    ids = _jobs(s, tmp_path, 5)
    lost = {job_id: s.migrator.job(job_id).instance_id or "" for job_id in ids}
    s.clock.tick(1)
    s.cloud.preempt(lost["job-4"])
    s.clock.tick(1)
    s.cloud.notice(lost["job-2"])  # then gone: lost at its notice's time
    s.cloud.set_state(lost["job-2"], InstanceState.TERMINATED)
    s.clock.tick(1)
    s.cloud.preempt(lost["job-5"])
    s.cloud.preempt(lost["job-1"])
    s.clock.tick(1)
    s.cloud.preempt(lost["job-3"])
    s.clock.tick(300)  # more than the overlap after the events: only the watermark keeps them in reach

    def passes(restart: bool) -> list[list[str]]:
        started: list[list[str]] = []
        watcher = s.watcher(workers=2, cap=2, watermark=MemoryWatermark(T0))
        for _ in range(3):
            report = watcher.poll()
            started.append([r.job_id for r in report.recoveries])
            acked.append({ev.instance_id for ev in s.cloud.acknowledged if ev.kind == "preempted"})
            s.clock.tick(300)
            if restart:  # killed between passes: nothing in memory but the watermark
                watcher = s.watcher(workers=2, cap=2, watermark=watcher.watermark)
        return started

    acked: list[set[str]] = []
    assert passes(restart=True) == [["job-4", "job-2"], ["job-1", "job-5"], ["job-3"]]
    assert {s.migrator.job(j).epoch for j in ids} == {2}
    # a preemption is acknowledged once its recovery ran, not while it waits for the cap
    assert acked == [
        {lost["job-4"]},
        {lost[j] for j in ("job-4", "job-1", "job-5")},
        {lost[j] for j in ids} - {lost["job-2"]},
    ]


def test_without_restart_the_capped_passes_start_the_same_recoveries(s: Setup, tmp_path: Path) -> None:
    ids = _jobs(s, tmp_path, 5)
    lost = {job_id: s.migrator.job(job_id).instance_id or "" for job_id in ids}
    for job_id in ("job-5", "job-2", "job-4", "job-1", "job-3"):
        s.clock.tick(1)
        s.cloud.preempt(lost[job_id])
    watcher = s.watcher(workers=2, cap=2)
    started = []
    for _ in range(3):
        started.append([r.job_id for r in watcher.poll().recoveries])
        s.clock.tick(300)
    assert started == [["job-5", "job-2"], ["job-4", "job-1"], ["job-3"]]
    # The watermark was held at the oldest waiting preemption, then advanced once none waited.
    assert watcher.watermark.load() == s.clock() - timedelta(seconds=300)
