"""The schedule: one interval job per price source (never overlapping, backing off on failure), and the
migration jobs (reconciler, interruption watcher) over every provider, surviving failures."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine

from api.scheduler import (
    POLL_SUMMARY_EVERY_S,
    RECONCILE_JOB_ID,
    WATCH_JOB_ID,
    MigrationJobs,
    Poll,
    _job,
    add_migration_jobs,
    build_scheduler,
    new_scheduler,
    reconcile_job,
    watch_job,
)
from costopt.agent.contract import ENV_CHECKPOINT_URI, ENV_EPOCH, ENV_JOB_ID
from costopt.cloud import CloudError, Instance, Interruption, LaunchSpec
from costopt.errors import SourceUnavailable
from costopt.migration.machine import Migrator
from costopt.migration.records import ConcurrentTransition, JobRecord, JobStatus, Kind, State, job_tags
from costopt.settings import Settings
from pricing.base import FetchResult
from pricing.store import PriceStore
from tests.fakes.sources import FakeSource
from tests.migration.test_watch import OFFERS, Clock, InProcessCloud


def test_each_source_gets_one_interval_job_that_never_overlaps_itself(engine: Engine) -> None:
    store = PriceStore(engine)
    settings = Settings(aws_spot_interval=timedelta(minutes=15), azure_interval=timedelta(hours=2))
    sched = build_scheduler(store, [FakeSource("aws-spot"), FakeSource("azure")], settings)
    jobs = {j.id: j for j in sched.get_jobs()}
    assert set(jobs) == {"collect:aws-spot", "collect:azure"}
    for job in jobs.values():
        assert job.max_instances == 1
        assert job.coalesce is True
        assert isinstance(job.trigger, IntervalTrigger)
    assert jobs["collect:aws-spot"].trigger.interval == timedelta(minutes=15)
    assert jobs["collect:azure"].trigger.interval == timedelta(hours=2)


def test_a_failing_source_is_skipped_while_it_backs_off(engine: Engine) -> None:
    store = PriceStore(engine)
    src = FakeSource("azure", [SourceUnavailable("down"), SourceUnavailable("down")])
    hour = timedelta(hours=1)
    _job(store, src, hour)  # first failure: recorded
    _job(store, src, hour)  # one failure: the next run goes ahead
    assert src.calls == 2
    _job(store, src, hour)  # two failures in a row: wait two intervals since the last attempt
    assert src.calls == 2


def test_a_source_that_failed_long_ago_is_tried_again(engine: Engine) -> None:
    store = PriceStore(engine)
    long_ago = datetime.now(UTC) - timedelta(days=2)
    for _ in range(3):
        store.record_fetch("gcp", ok=False, at=long_ago, error="down")
    src = FakeSource("gcp", [FetchResult("gcp")])
    _job(store, src, timedelta(hours=1))
    assert src.calls == 1
    assert store.sources()[0].consecutive_failures == 0


# -- migration jobs: the reconciler and the interruption watcher --------------------------------------


class Flaky:
    """Wraps a provider: ``interruptions`` and ``list`` raise CloudError while ``failures`` > 0."""

    def __init__(self, inner: InProcessCloud, failures: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.failures = failures
        self.calls = 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise CloudError(f"{self.name} is down")

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        return self.inner.launch(spec, idempotency_token)

    def terminate(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)

    def describe(self, instance_id: str) -> Instance:
        return self.inner.describe(instance_id)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        self._maybe_fail()
        return self.inner.list(tags)

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        self._maybe_fail()
        return self.inner.interruptions(since)

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.inner.acknowledge(interruptions)


def _cloud(name: str, clock: Clock) -> InProcessCloud:
    cloud = InProcessCloud(clock, prefix=f"{name}-")  # instance ids differ between clouds
    cloud.name = name
    return cloud


def _started(engine: Engine, cloud: object, job_id: str, tmp_path: Path) -> JobRecord:
    mig = Migrator(engine, cloud, backoff_base=0.001)  # type: ignore[arg-type]
    mig.register_job(job_id, ["train"], str(tmp_path / "ckpt" / job_id))
    assert mig.start(job_id, OFFERS).state is State.DONE
    return mig.job(job_id)


def _jobs(engine: Engine, providers: list[object], **kw: object) -> MigrationJobs:
    return MigrationJobs(engine, providers, lambda job: OFFERS, **kw)  # type: ignore[arg-type]


def test_a_scheduler_holds_price_jobs_migration_jobs_or_both(engine: Engine) -> None:
    store = PriceStore(engine)
    sources = [FakeSource("aws-spot")]
    migration = _jobs(engine, [_cloud("a", Clock())])
    price_only = {j.id for j in build_scheduler(store, sources, Settings()).get_jobs()}
    migration_only = {j.id for j in build_scheduler(migration=migration).get_jobs()}
    both = {j.id for j in build_scheduler(store, sources, Settings(), migration=migration).get_jobs()}
    assert price_only == {"collect:aws-spot"}
    assert migration_only == {RECONCILE_JOB_ID, WATCH_JOB_ID} == {"migration:reconcile", "migration:watch"}
    assert both == price_only | migration_only
    with pytest.raises(ValueError, match="settings"):
        build_scheduler(store, sources)


def test_the_reconciler_runs_every_few_minutes_and_the_watcher_every_few_seconds_never_overlapping(
    engine: Engine,
) -> None:
    sched = new_scheduler()
    added = add_migration_jobs(sched, _jobs(engine, [_cloud("a", Clock())]))
    jobs = {j.id: j for j in added}
    assert jobs[RECONCILE_JOB_ID].trigger.interval == timedelta(minutes=5)
    assert jobs[WATCH_JOB_ID].trigger.interval == timedelta(seconds=5)
    for job in jobs.values():
        assert isinstance(job.trigger, IntervalTrigger)
        assert job.max_instances == 1 and job.coalesce is True
    custom = _jobs(engine, [_cloud("a", Clock())], reconcile_interval=timedelta(minutes=2))
    assert add_migration_jobs(new_scheduler(), custom)[0].trigger.interval == timedelta(minutes=2)
    with pytest.raises(ValueError, match="two providers"):
        _jobs(engine, [_cloud("a", Clock()), _cloud("a", Clock())])
    with pytest.raises(ValueError, match="positive"):
        _jobs(engine, [_cloud("a", Clock())], watch_interval=timedelta(0))


def test_the_reconciler_iterates_every_provider_and_leaves_each_job_to_its_own(engine: Engine, tmp_path: Path) -> None:
    clock = Clock()
    a, b = _cloud("a", clock), _cloud("b", clock)
    job_a = _started(engine, a, "job-a", tmp_path)
    job_b = _started(engine, b, "job-b", tmp_path)
    gone = _started(engine, a, "job-gone", tmp_path)
    assert gone.instance_id is not None
    del a.instances[gone.instance_id]  # vanished on cloud a
    orphan = b.launch(LaunchSpec(OFFERS[0], env=dict(job_b_env(tmp_path)), tags=job_tags("nobody", 1)), "tok-x")
    reports = _jobs(engine, [a, b]).reconcile()
    assert reports["a"].marked_for_recovery == ("job-gone",)
    assert reports["b"].orphans_terminated == (orphan.instance_id,)
    assert reports["b"].marked_for_recovery == ()  # job-a and job-gone live on a, not "vanished" from b
    mig = Migrator(engine, a)  # type: ignore[arg-type]
    assert mig.job("job-a").status is JobStatus.RUNNING and mig.job("job-b").status is JobStatus.RUNNING
    assert (job_a.instance_id, job_b.instance_id) == (mig.job("job-a").instance_id, mig.job("job-b").instance_id)


def job_b_env(tmp_path: Path) -> dict[str, str]:
    return {ENV_JOB_ID: "nobody", ENV_CHECKPOINT_URI: str(tmp_path / "ckpt" / "nobody"), ENV_EPOCH: "1"}


def test_the_watcher_job_recovers_a_preempted_job(engine: Engine, tmp_path: Path) -> None:
    a = _cloud("a", Clock(datetime.now(UTC)))
    job = _started(engine, a, "job-a", tmp_path)
    assert job.instance_id is not None
    a.preempt(job.instance_id, at=datetime.now(UTC))
    reports = _jobs(engine, [a]).watch()
    assert [(r.job_id, r.state) for r in reports["a"].recoveries] == [("job-a", "done")]


def test_a_failing_provider_is_logged_and_the_others_still_run(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = Clock(datetime.now(UTC))
    down, up = Flaky(_cloud("down", now), failures=10), _cloud("up", now)
    job = _started(engine, up, "job-up", tmp_path)
    assert job.instance_id is not None
    up.preempt(job.instance_id, at=datetime.now(UTC))
    jobs = _jobs(engine, [down, up])
    with caplog.at_level(logging.ERROR, logger="costopt.scheduler"):
        watched = jobs.watch()
        reconciled = jobs.reconcile()
        watch_job(jobs)  # the scheduled forms never raise
        reconcile_job(jobs)
    assert set(watched) == {"up"} and [r.state for r in watched["up"].recoveries] == ["done"]
    assert set(reconciled) == {"up"}
    assert "provider down failed" in caplog.text


def test_the_first_reconciler_pass_resumes_the_migrations_a_crash_left_active(engine: Engine, tmp_path: Path) -> None:
    a = _cloud("a", Clock())
    _started(engine, a, "job-a", tmp_path)
    mig = Migrator(engine, a)  # type: ignore[arg-type]
    left = mig.plan("job-a", OFFERS, Kind.RECOVER)  # planned, then the process died
    jobs = _jobs(engine, [a])
    jobs.reconcile()
    assert mig.migration(left.id).state is State.DONE and mig.job("job-a").epoch == 2
    again = mig.plan("job-a", OFFERS, Kind.RECOVER)
    jobs.reconcile()  # later passes leave active migrations to whoever runs them
    assert mig.migration(again.id).state is State.PLANNED


def test_the_first_reconciler_pass_leaves_the_job_engines_migrations_to_it(engine: Engine, tmp_path: Path) -> None:
    """In the service the job engine resumes its jobs' migrations at its first tick, side by side in its
    workers: the reconciler's first pass leaves those to it (resuming them too, one after another under the
    lock the watcher needs, held the watcher back) and resumes the others."""
    a = _cloud("a", Clock())
    for job_id in ("job-engine", "job-other"):
        _started(engine, a, job_id, tmp_path)
    mig = Migrator(engine, a)  # type: ignore[arg-type]
    engines = mig.plan("job-engine", OFFERS, Kind.RECOVER)  # both left planned by a crash
    other = mig.plan("job-other", OFFERS, Kind.RECOVER)
    jobs = _jobs(engine, [a])
    asked: list[str] = []

    def elsewhere(job_id: str) -> bool:
        asked.append(job_id)
        return job_id == "job-engine"

    jobs.resumed_elsewhere = elsewhere
    jobs.reconcile()
    assert sorted(asked) == ["job-engine", "job-other"]
    assert mig.migration(engines.id).state is State.PLANNED  # the engine's to resume
    assert mig.migration(other.id).state is State.DONE and mig.job("job-other").epoch == 2


def test_a_resume_that_loses_a_race_is_one_warning_line_and_the_other_jobs_are_still_resumed(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _cloud("a", Clock())
    for job_id in ("job-a", "job-b"):
        _started(engine, a, job_id, tmp_path)
    mig = Migrator(engine, a)  # type: ignore[arg-type]
    raced = mig.plan("job-a", OFFERS, Kind.RECOVER)  # both left planned by a crash
    left = mig.plan("job-b", OFFERS, Kind.RECOVER)
    jobs = _jobs(engine, [a])
    real_run = Migrator.run

    def run(self: Migrator, migration_id: int) -> object:
        if migration_id == raced.id:  # the restarted engine advanced this one first
            raise ConcurrentTransition(f"migration {migration_id} is not in state planned")
        return real_run(self, migration_id)

    monkeypatch.setattr(Migrator, "run", run)
    with caplog.at_level(logging.WARNING):
        reports = jobs.reconcile()
    assert set(reports) == {"a"}  # the provider's reconcile pass still ran
    assert mig.migration(left.id).state is State.DONE and mig.job("job-b").epoch == 2
    assert mig.migration(raced.id).state is State.PLANNED  # left to the actor that won
    race_lines = [r for r in caplog.records if "another actor advanced its migration first" in r.getMessage()]
    assert len(race_lines) == 1 and race_lines[0].levelno == logging.WARNING and race_lines[0].exc_info is None
    assert "job-a" in race_lines[0].getMessage() and "ConcurrentTransition" in race_lines[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_real_scheduler_keeps_running_a_job_that_raised(engine: Engine) -> None:
    flaky = Flaky(_cloud("a", Clock(datetime.now(UTC))), failures=2)
    jobs = _jobs(engine, [flaky], watch_interval=timedelta(seconds=0.2), reconcile_interval=timedelta(hours=1))
    sched = build_scheduler(migration=jobs)
    sched.start()
    try:
        end = time.monotonic() + 10
        while flaky.calls < 5 and time.monotonic() < end:
            time.sleep(0.05)
        assert sched.running
    finally:
        sched.shutdown(wait=True)
    assert flaky.calls >= 5 and flaky.failures == 0  # failed twice (logged), then ran again and again


class _Wall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_poll_finding_the_previous_run_going_returns_at_once_and_one_line_a_minute_counts_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service-clock job is polled every COSTOPT_SIM_TICK: a poll during a longer run returns False at once
    (APScheduler, with two instances allowed, never logs its "maximum number of running instances" warning
    at each such poll), and one WARNING line per POLL_SUMMARY_EVERY_S at most gives the runs and the busy polls."""
    wall = _Wall()
    inside, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def work() -> bool:
        runs.append(1)
        inside.set()
        wall.t += 2.5  # a run of 2.5 s of wall time
        release.wait(10)
        return True

    poll = Poll("engine", work, wall=wall)
    caplog.set_level(logging.WARNING, logger="costopt.scheduler")
    first = threading.Thread(target=poll)
    first.start()
    assert inside.wait(10)
    assert [poll() for _ in range(3)] == [False, False, False]  # the run goes on: each poll returns at once
    assert runs == [1] and poll.busy_polls == 3
    release.set()
    first.join(10)
    assert not [r for r in caplog.records if "poll(s) found a run going" in r.getMessage()]  # not a minute yet
    wall.t += POLL_SUMMARY_EVERY_S
    inside.clear()
    assert poll() is True  # the next run, past the minute: the summary
    (line,) = [r.getMessage() for r in caplog.records if "poll(s) found a run going" in r.getMessage()]
    assert line.startswith("engine: 2 run(s) in the last 65 s, longest 2.50 s, mean 2.50 s; 3 poll(s)")
    assert poll.busy_polls == 0 and poll.runs == []
    # a quiet minute (no poll found a run going) logs nothing
    caplog.clear()
    wall.t += POLL_SUMMARY_EVERY_S
    assert poll() is True
    assert not [r for r in caplog.records if "found a run going" in r.getMessage()]
