"""The job engine end to end on both backends, over the real migrator, ledger, watcher and local provider
(each copy is a real process running examples/train.py): queued -> running -> succeeded with exactly its
steps and its ledger cost; a preemption recovered through the watcher; a failing command not retried;
cancel; a crash mid-tick; a move."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Connection

from costopt.agent import control
from costopt.agent.contract import ENV_JOB_STEPS, ENV_JOB_TYPE, ENV_STEPS_PER_SECOND
from costopt.cloud import CapacityError, Instance, InstanceState, LaunchSpec
from costopt.domain import OfferKey
from costopt.jobs.costs import job_cost
from costopt.jobs.engine import CANCEL_PREFIX, JobEngine, MoveRefused, _Pass, _snapshot
from costopt.jobs.model import JobState
from costopt.jobs.records import JobRecord, NewJob
from costopt.ledger.model import micro_to_usd, usd_to_micro
from costopt.migration.machine import Migrator
from costopt.migration.records import ALIVE_STATES, TAG_EPOCH, TAG_JOB, JobStatus
from costopt.migration.records import JobRecord as CopyRecord
from costopt.migration.watch import InterruptionWatcher, MemoryWatermark
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider
from tests.jobs.engine_support import LOCAL_A, LOCAL_B, PRICES, Harness, placement, train_command

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py


@pytest.fixture
def h(engine, local: LocalProvider, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(engine, local, tmp_path)
    yield harness
    harness.close()


def _terminal(job: JobRecord) -> bool:
    return job.state.terminal


def _ledger_bill(h: Harness, job_id: str) -> Decimal:
    """The job's bill recomputed by hand from its copies: seconds x flat price, each rounded to the µ$."""
    total = 0
    for copy in h.migrator.copies(job_id):
        assert copy.ended_at is not None, f"copy {copy.instance_id} still open"
        seconds = Decimal((copy.ended_at - copy.started_at) // timedelta(microseconds=1)).scaleb(-6)
        total += usd_to_micro(seconds * Decimal(repr(PRICES[copy.offer])) / 3600)
    return micro_to_usd(total)


def test_a_job_runs_from_queued_to_succeeded_with_exactly_its_steps_and_its_ledger_cost(h: Harness) -> None:
    job = h.submit(train_command(60), 60, job_type="demo")
    done = h.run_until(job.id, _terminal)

    assert done.state is JobState.SUCCEEDED, done.reason
    assert h.states(job.id) == ["queued", "launching", "running", "succeeded"]
    assert done.steps_done == 60 and done.offer == LOCAL_A and done.usd_per_hour == Decimal("3.6")
    audit = control.audit_job(h.engine.checkpoint_uri(done), 60)
    assert audit.ok and audit.steps_done == 60, audit.problems
    # The migrator's job is finished, its one copy closed and billed.
    assert h.migrator.job(job.id).status is JobStatus.FINISHED
    copies = h.migrator.copies(job.id)
    assert len(copies) == 1 and copies[0].ended_at is not None and copies[0].ledger_closed
    cost = job_cost(h.engine, job.id, datetime.now(UTC))
    assert cost == _ledger_bill(h, job.id) and cost > 0
    # The copy got the job's environment beyond the agent contract.
    env = h.migrator.job(job.id).env
    assert env[ENV_JOB_STEPS] == "60" and env[ENV_JOB_TYPE] == "demo" and ENV_STEPS_PER_SECOND not in env
    view = h.engine.view(job.id)
    assert view.cost_so_far_usd == cost and view.eta is None and view.moves == () and view.steps_done == 60


def test_a_tick_whose_reads_straddle_a_finishing_start_leaves_the_job_alone(
    engine, local: LocalProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a second copy of a healthy job: a tick reads the migrator's jobs while the start is in
    flight (status recovering), the start finishes (migration done) before the tick reads the active
    migrations and reaches the job. The tick must not take the stale row for a rolled-back start."""
    import threading

    at_gate, may_finish = threading.Event(), threading.Event()

    def hook(point: str) -> None:
        if point == "enter:terminating_old":  # the copy progressed; the start is one transition from done
            at_gate.set()
            assert may_finish.wait(30), "the test never let the start finish"

    h = Harness(engine, local, tmp_path, hook=hook, workers=1)
    try:
        job = h.submit(train_command(100, step_seconds=0.01), 100)
        h.engine.tick()  # queued -> launching; the start runs in the worker
        assert at_gate.wait(30), "the start never reached terminating_old"
        reads = Migrator.jobs
        armed = [True]

        def straddling_reads(
            self: Migrator, job_ids: Collection[str] | None = None, *, conn: Connection | None = None
        ) -> list[CopyRecord]:
            rows = reads(self, job_ids, conn=conn)
            if not armed[0]:
                return rows
            armed[0] = False  # the job as the start left it so far: recovering, its migration active
            assert {r.job_id: r.status for r in rows}[job.id] is JobStatus.RECOVERING
            may_finish.set()
            end = time.monotonic() + 30
            while h.engine.busy(job.id) and time.monotonic() < end:
                time.sleep(0.01)
            assert not h.engine.busy(job.id)
            return rows

        monkeypatch.setattr(Migrator, "jobs", straddling_reads)
        report = h.engine.tick()
        assert not armed[0]
        done = h.run_until(job.id, _terminal)
        assert done.state is JobState.SUCCEEDED, done.reason
        assert len(h.migrator.copies(job.id)) == 1, [c.instance_id for c in h.migrator.copies(job.id)]
        assert len(h.migrator.history(job.id)) == 1
        assert job.id in report.busy  # left for the next tick's fresh reads
    finally:
        may_finish.set()
        h.close()


def test_a_preemption_is_recovered_through_the_watcher_and_the_job_follows(h: Harness) -> None:
    watcher = InterruptionWatcher(
        h.migrator, lambda j: [LOCAL_B, LOCAL_A], unavailable=h.unavailable, watermark=MemoryWatermark()
    )
    job = h.submit(train_command(400, every=20, step_seconds=0.01), 400)
    running = h.run_until(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 40)
    first = h.migrator.job(job.id).instance_id
    assert first is not None and running.offer == LOCAL_A

    h.local.preempt(first, notice_seconds=0.3, wait=True)
    assert h.local.describe(first).state is InstanceState.PREEMPTED
    h.engine.tick()  # may still count steps the copy logged before it was taken
    h.engine.tick()  # no new steps: the engine looks at the copy
    assert h.repo.get(job.id).state is JobState.RECOVERING
    done = h.run_until(job.id, _terminal, also=watcher.poll)

    assert done.state is JobState.SUCCEEDED, done.reason
    states = h.states(job.id)
    assert states[:3] == ["queued", "launching", "running"] and states[-1] == "succeeded"
    assert "recovering" in states and states.count("running") >= 2
    kinds = [e.kind for e in h.repo.events(job.id)]
    assert kinds.count("preemption") == 1 and kinds.count("recovery") == 1
    view = h.engine.view(job.id)
    pre, rec = (m for m in view.moves if m.kind in ("preemption", "recovery"))
    assert pre.from_offer == LOCAL_A and rec.from_offer == LOCAL_A and rec.to_offer == LOCAL_B
    assert done.offer == LOCAL_B and done.usd_per_hour == Decimal("7.2")
    audit = control.audit_job(h.engine.checkpoint_uri(done), 400)
    assert audit.ok and audit.lost_steps == 0 and audit.repeated_steps == 0, audit.problems
    assert job_cost(h.engine, job.id, datetime.now(UTC)) == _ledger_bill(h, job.id)
    assert len(h.migrator.copies(job.id)) == 2


def test_a_command_exiting_3_fails_with_its_exit_code_and_is_not_retried(h: Harness) -> None:
    job = h.submit([sys.executable, "-c", "import sys; print('bad input file'); sys.exit(3)"], 10)
    done = h.run_until(job.id, _terminal)

    assert done.state is JobState.FAILED and done.exit_code == 3
    assert "exited with code 3" in done.reason
    assert len(h.local.history({TAG_JOB: job.id})) == 1  # launched once, never retried
    assert not [e for e in h.repo.events(job.id) if e.kind == "launch_failed"]
    assert h.migrator.job(job.id).status is JobStatus.FINISHED
    assert all(c.ended_at is not None for c in h.migrator.copies(job.id))


def test_a_copy_that_exits_0_without_finishing_is_retried_a_bounded_number_of_times(h: Harness) -> None:
    job = h.submit([sys.executable, "-c", "pass"], 10)
    done = h.run_until(job.id, _terminal)

    assert done.state is JobState.FAILED and done.exit_code is None
    assert "launched nowhere after 3 attempt(s)" in done.reason
    assert len([e for e in h.repo.events(job.id) if e.kind == "launch_failed"]) == 3
    assert len(h.local.history({TAG_JOB: job.id})) == 3


def test_a_copy_stopped_outside_a_preemption_is_recovered_from_its_checkpoint(h: Harness) -> None:
    job = h.submit(train_command(300, every=20, step_seconds=0.01), 300)
    h.run_until(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 40)
    first = h.migrator.job(job.id).instance_id
    assert first is not None
    h.local.terminate(first)  # not by the migrator: the agent checkpoints on SIGTERM and exits 75
    assert h.local.exit_code(first) == 75 and h.local.describe(first).state is InstanceState.TERMINATED
    done = h.run_until(job.id, _terminal)

    assert done.state is JobState.SUCCEEDED, done.reason
    kinds = [e.kind for e in h.repo.events(job.id)]
    assert kinds.count("copy_lost") == 1 and kinds.count("recovery") == 1 and "preemption" not in kinds
    assert "recovering" in h.states(job.id)
    audit = control.audit_job(h.engine.checkpoint_uri(done), 300)
    assert audit.ok and audit.lost_steps == 0, audit.problems
    assert len(h.local.history({TAG_JOB: job.id})) == 2


def test_cancel_checkpoints_terminates_and_keeps_the_record(h: Harness) -> None:
    job = h.submit(train_command(5000, every=1000, step_seconds=0.01), 5000)
    h.run_until(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 20)
    instance = h.migrator.job(job.id).instance_id
    assert instance is not None
    h.repo.request_cancel(job.id, "team-a")
    done = h.run_until(job.id, _terminal)

    assert done.state is JobState.CANCELLED and "checkpointed at step" in done.reason
    latest = control.latest(h.engine.checkpoint_uri(done))
    assert latest is not None and latest.step >= 20
    assert latest.request_id is None or latest.request_id.startswith(CANCEL_PREFIX) or latest.step < 1000
    requested = [e for e in h.repo.events(job.id) if e.kind == "checkpoint_requested"]
    assert len(requested) == 1 and requested[0].detail is not None
    assert control.request_served(h.engine.checkpoint_uri(done), requested[0].detail["request_id"])
    assert h.local.describe(instance).state is InstanceState.TERMINATED
    assert h.migrator.job(job.id).status is JobStatus.FINISHED
    assert all(c.ended_at is not None and c.ledger_closed for c in h.migrator.copies(job.id))
    assert h.repo.get(job.id).id == job.id  # the record stays
    assert job_cost(h.engine, job.id, datetime.now(UTC)) == _ledger_bill(h, job.id)


class Crash(BaseException):
    """A process dying mid-tick (not an error the engine handles)."""


def test_a_crash_mid_tick_then_a_new_engine_finishes_the_job_without_a_second_copy(
    engine,
    local: LocalProvider,
    tmp_path: Path,
) -> None:
    def crash(point: str) -> None:
        if point == "launch:returned":
            raise Crash(point)

    first = Harness(engine, local, tmp_path, workers=0, hook=crash)
    job = first.submit(train_command(60), 60)
    with pytest.raises(Crash):
        first.engine.tick()
    assert first.repo.get(job.id).state is JobState.LAUNCHING
    assert len(local.history({TAG_JOB: job.id})) == 1

    again = Harness(engine, local, tmp_path, workers=0)  # a new process: new migrator, new engine
    done = again.run_until(job.id, _terminal)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert len(local.history({TAG_JOB: job.id, TAG_EPOCH: "1"})) == 1
    assert len(local.history({TAG_JOB: job.id})) == 1
    assert control.audit_job(again.engine.checkpoint_uri(done), 60).ok


def test_move_moves_the_job_and_records_the_event_with_its_cost(h: Harness) -> None:
    job = h.submit(train_command(300, every=20, step_seconds=0.01), 300)
    h.run_until(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 20)
    with pytest.raises(ValueError, match="at least one placement"):
        h.engine.move(job.id, [], reason="nowhere", expected_saving_usd=Decimal(0))

    moved = h.engine.move(job.id, [placement(LOCAL_B)], reason="cheaper per step", expected_saving_usd=Decimal("0.5"))

    assert moved.state is JobState.RUNNING and moved.offer == LOCAL_B and moved.usd_per_hour == Decimal("7.2")
    (ev,) = [e for e in h.repo.events(job.id) if e.kind == "move"]
    assert ev.detail is not None
    assert ev.reason == "cheaper per step" and ev.detail["expected_saving_usd"] == "0.5"
    assert ev.detail["from"] == LOCAL_A.to_doc() and ev.detail["to"] == LOCAL_B.to_doc()
    # Restart (the new copy's boot) and overlap (the old copy's tail) from the ledger; no egress in place.
    assert ev.cost_usd is not None and ev.cost_usd > 0
    assert Decimal(ev.detail["restart_usd"]) + Decimal(ev.detail["overlap_usd"]) == ev.cost_usd
    assert h.states(job.id)[-2:] == ["migrating", "running"]

    done = h.run_until(job.id, _terminal)
    assert done.state is JobState.SUCCEEDED
    assert [e.kind for e in h.repo.events(job.id)].count("move") == 1  # the tick did not record it again
    assert control.audit_job(h.engine.checkpoint_uri(done), 300).ok
    assert [m.kind for m in h.engine.view(job.id).moves] == ["move"]
    with pytest.raises(MoveRefused):
        h.engine.move(job.id, [placement(LOCAL_A)], reason="too late", expected_saving_usd=Decimal(0))


def test_no_placement_fails_after_the_bounded_attempts_with_each_reason(engine, local, tmp_path: Path) -> None:
    h = Harness(engine, local, tmp_path, offers=(), workers=0, launch_attempts=2)
    job = h.submit(["true"], 5)
    h.engine.tick()
    assert h.repo.get(job.id).state is JobState.QUEUED
    h.engine.tick()
    done = h.repo.get(job.id)
    assert done.state is JobState.FAILED and "after 2 attempt(s)" in done.reason
    assert "no offer can run the job" in done.reason
    assert h.placements.ranks == 2 and local.history({}) == []


def test_an_engine_refuses_a_job_of_an_unknown_provider_with_the_known_ones(engine, local, tmp_path: Path) -> None:
    h = Harness(engine, local, tmp_path, workers=0)
    job, _ = h.repo.create(NewJob(team_id="t", spec={"command": ["true"]}, steps_total=1, provider="aws"))
    report = h.engine.tick()
    assert report.errors and "configured: ['local']" in report.errors[0]
    assert h.repo.get(job.id).state is JobState.QUEUED


def test_the_engine_checks_its_arguments(engine, local, tmp_path: Path) -> None:
    m = Migrator(engine, local)
    with pytest.raises(ValueError, match="launch_attempts"):
        JobEngine(None, {"local": m}, None, lambda: datetime.now(UTC), tmp_path, launch_attempts=0)  # type: ignore[arg-type]


class FlakyLocal(LocalProvider):
    """The local provider, refusing launches on the offers in ``failing`` for capacity."""

    failing: frozenset[OfferKey] = frozenset()

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if spec.offer in self.failing:
            raise CapacityError(f"no capacity for {spec.offer.instance_type}")
        return super().launch(spec, idempotency_token)


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[FlakyLocal]:
    prov = FlakyLocal(tmp_path / "flaky", cwd=PROJECT_ROOT, grace_seconds=3.0)
    yield prov
    for inst in prov.list({}):
        if inst.state in ALIVE_STATES:
            prov.terminate(inst.instance_id)
    prov.close()


def test_a_start_refused_on_the_best_offer_runs_on_the_next_and_one_refused_everywhere_fails(
    engine, flaky: FlakyLocal, tmp_path: Path
) -> None:
    h = Harness(engine, flaky, tmp_path, workers=0, launch_attempts=2)
    flaky.failing = frozenset({LOCAL_A})
    job = h.submit(train_command(30), 30)
    done = h.run_until(job.id, _terminal)
    assert done.state is JobState.SUCCEEDED and done.offer == LOCAL_B and done.usd_per_hour == Decimal("7.2")

    flaky.failing = frozenset({LOCAL_A, LOCAL_B})
    nowhere = h.submit(train_command(30), 30)
    failed = h.run_until(nowhere.id, _terminal)
    assert failed.state is JobState.FAILED and "launched nowhere after 2 attempt(s)" in failed.reason
    assert failed.reason.count("CapacityError") >= 2  # the reason of each refusal
    assert flaky.history({TAG_JOB: nowhere.id}) == []


def test_a_recovery_that_launches_nowhere_is_retried_then_the_job_fails(
    engine, flaky: FlakyLocal, tmp_path: Path
) -> None:
    h = Harness(engine, flaky, tmp_path, launch_attempts=2)
    watcher = InterruptionWatcher(
        h.migrator,
        lambda j: [LOCAL_A, LOCAL_B],
        unavailable=h.unavailable,
        watermark=MemoryWatermark(),
        retry_base=0.0,
    )
    job = h.submit(train_command(2000, every=20, step_seconds=0.01), 2000)
    h.run_until(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 20)
    flaky.failing = frozenset({LOCAL_A, LOCAL_B})
    first = h.migrator.job(job.id).instance_id
    assert first is not None
    flaky.preempt(first, notice_seconds=0)  # taken at once
    done = h.run_until(job.id, _terminal, also=watcher.poll)

    assert done.state is JobState.FAILED and "recovered nowhere after 2 attempt(s)" in done.reason
    assert "recovering" in h.states(job.id)
    assert [e.kind for e in h.repo.events(job.id)].count("recovery_failed") == 2
    assert h.migrator.job(job.id).status is JobStatus.FINISHED
    recoveries = len(h.migrator.history(job.id))
    watcher.poll()
    h.engine.tick()
    assert len(h.migrator.history(job.id)) == recoveries  # nobody retries a failed job


def test_a_job_that_finishes_before_a_tick_sees_it_run_still_goes_through_running(
    engine, local: LocalProvider, tmp_path: Path
) -> None:
    uri = str(tmp_path / "checkpoints")

    def finish_first(point: str) -> None:  # the copy finishes while its start is still being verified
        if point == "enter:terminating_old":
            job_uri = f"{uri}/{job.id}"
            end = time.monotonic() + 20
            while not control.progress(job_uri, 1).done:
                assert time.monotonic() < end, "the copy did not finish"
                time.sleep(0.02)

    h = Harness(engine, local, tmp_path, workers=0, hook=finish_first)
    job = h.submit(train_command(5, step_seconds=0.0), 5)
    h.engine.tick()  # start, verification, and the copy has finished meanwhile
    assert h.repo.get(job.id).state is JobState.LAUNCHING
    done = h.run_until(job.id, _terminal)
    assert done.state is JobState.SUCCEEDED and done.steps_done == 5
    assert h.states(job.id) == ["queued", "launching", "running", "succeeded"]
    assert done.offer == LOCAL_A


def test_a_tick_logs_a_lost_race_in_one_line_and_a_real_fault_with_its_traceback(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from costopt.migration.records import ConcurrentTransition, MigrationError

    raced = h.submit(train_command(10), 10)
    broken = h.submit(train_command(10), 10)

    def step(self: JobEngine, job, *args, **kwargs) -> None:
        if job.id == raced.id:
            raise ConcurrentTransition("another migrator advanced it")
        raise MigrationError("the provider said no")

    monkeypatch.setattr(JobEngine, "_step", step)
    with caplog.at_level(logging.WARNING, logger="costopt.jobs.engine"):
        report = h.engine.tick()
    assert sorted(report.errors) == sorted(
        [
            f"{raced.id}: ConcurrentTransition: another migrator advanced it",
            f"{broken.id}: MigrationError: the provider said no",
        ]
    )
    race = [r for r in caplog.records if raced.id in r.getMessage()]
    fault = [r for r in caplog.records if broken.id in r.getMessage()]
    assert len(race) == 1 and race[0].levelno == logging.WARNING and race[0].exc_info is None
    assert len(fault) == 1 and fault[0].levelno == logging.ERROR and fault[0].exc_info is not None


def test_a_queued_job_another_engine_launched_meanwhile_is_left_to_it_in_one_line(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Two engines ticking at once (a replica whose lease overlapped under load, the soak): this tick read
    the job queued, the other engine launched it and its start ran it before this tick reached it. Was a
    traceback (IllegalTransition running -> launching) logged as a fault; now one line, and no start."""
    import logging

    stale = h.submit(train_command(10), 10)
    h.repo.transition(stale.id, JobState.LAUNCHING, "the other engine", expect=JobState.QUEUED)
    h.repo.transition(stale.id, JobState.RUNNING, "the other engine's start", expect=JobState.LAUNCHING)
    with caplog.at_level(logging.WARNING, logger="costopt.jobs.engine"):
        h.engine._step(stale, h.migrator, _snapshot(h.migrator, [stale.id]), _Pass(), first=False)
    assert not h.engine.busy(stale.id) and h.repo.get(stale.id).state is JobState.RUNNING
    lines = [r for r in caplog.records if stale.id in r.getMessage()]
    assert len(lines) == 1 and "another engine" in lines[0].getMessage() and lines[0].exc_info is None
    finished = h.submit(train_command(10), 10)  # cancelled meanwhile: nothing to start either
    h.repo.transition(finished.id, JobState.CANCELLED, "cancelled", expect=JobState.QUEUED)
    h.engine._step(finished, h.migrator, _snapshot(h.migrator, [finished.id]), _Pass(), first=False)
    assert not h.engine.busy(finished.id) and h.repo.get(finished.id).state is JobState.CANCELLED


def test_a_finished_job_leaves_no_state_in_the_engine_after_the_next_tick(h: Harness) -> None:
    """The engine's per-job memory (ranked placements, progress and history marks, workers) is bounded by
    the active jobs: a finished job's is dropped at the next tick (the soak's growth, issue 14)."""
    # 30 steps of 0.2 s: long enough that a tick on a loaded machine still sees it running before it ends
    job = h.submit(train_command(30, step_seconds=0.2), 30, job_type="demo")
    h.run_until(job.id, lambda j: j.state is JobState.RUNNING)
    assert job.id in h.engine.held_jobs()  # a running job's state is kept
    done = h.run_until(job.id, _terminal)
    assert done.state is JobState.SUCCEEDED, done.reason

    h.engine.tick()

    assert job.id not in h.engine.held_jobs()
