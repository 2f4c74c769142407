"""The engine's reads straddling another writer (issue 14's soak, load 15-24): a tick's snapshot of the
migrator older than the job's record must not try an illegal transition (logged with a traceback)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from costopt.jobs.engine import _log_failure, _Pass, _snapshot
from costopt.jobs.model import JobState
from costopt.jobs.records import ConcurrentUpdate
from providers.local import LocalProvider
from tests.jobs.engine_support import Harness, train_command

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py


@pytest.fixture
def h(engine: Engine, local: LocalProvider, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(engine, local, tmp_path)
    yield harness
    harness.close()


def test_a_running_job_whose_start_the_snapshot_still_shows_in_flight_is_left_for_the_next_tick(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    job = h.submit(train_command(400, step_seconds=0.01), 400)
    running = h.run_until(job.id, lambda j: j.state is JobState.RUNNING)
    (start,) = h.migrator.history(job.id)  # the start: a recovery from epoch 0, finished
    assert start.from_epoch == 0
    snap = _snapshot(h.migrator, [job.id])
    stale = dataclasses.replace(snap, active={**snap.active, job.id: start})  # read before the start ended
    with caplog.at_level(logging.WARNING, logger="costopt.jobs.engine"):
        h.engine._step(running, h.migrator, stale, _Pass(), first=False)  # was: IllegalTransition running -> launching
    assert h.repo.get(job.id).state is JobState.RUNNING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    done = h.run_until(job.id, lambda j: j.state.terminal)  # the next ticks read afresh and finish it
    assert done.state is JobState.SUCCEEDED, done.reason


def test_a_transition_lost_twice_is_a_race_logged_in_one_line_and_nothing_is_written(
    h: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak at load 15 (session 9): the engine's compare-and-set from ``queued`` lost, the re-read
    state's retry lost again (the watcher moved the job meanwhile); that was logged with a traceback."""
    job = h.submit(train_command(400, step_seconds=0.01), 400)
    before = h.repo.get(job.id)

    def lost(job_id: str, to: JobState, reason: str, **kwargs: object) -> object:
        raise ConcurrentUpdate(f"job {job_id} is running, expected ['queued']")

    class Losing:
        """The engine's repository whose every compare-and-set loses."""

        transition = staticmethod(lost)

        def __getattr__(self, name: str) -> object:
            return getattr(h.repo, name)

    monkeypatch.setattr(h.engine, "repo", Losing())
    with pytest.raises(ConcurrentUpdate):
        h.engine._to(before, JobState.LAUNCHING, "launch")
    monkeypatch.undo()
    after = h.repo.get(job.id)
    assert (after.state, after.version) == (before.state, before.version)  # nothing written
    with caplog.at_level(logging.WARNING, logger="costopt.jobs.engine"):
        try:
            lost(job.id, JobState.LAUNCHING, "launch")
        except ConcurrentUpdate as exc:
            _log_failure(f"job {job.id}", exc)
        try:
            raise RuntimeError("a real failure")
        except RuntimeError as exc:
            _log_failure(f"job {job.id}", exc)
    race, real = caplog.records[-2:]
    assert race.levelno == logging.WARNING and race.exc_info is None and "ConcurrentUpdate" in race.getMessage()
    assert real.levelno == logging.ERROR and real.exc_info is not None


def test_a_job_another_writer_moved_to_a_third_state_is_not_moved_on_the_stale_read(h: Harness) -> None:
    """Read queued, meanwhile launched and running: the tick's launch decision is stale. It used to be
    retried from the fresh state (running -> launching); now it is a race and the job stays running. A
    terminal target (cancel, fail) is still written from whatever state the job reached."""
    job = h.submit(train_command(400, step_seconds=0.01), 400)
    stale = h.repo.get(job.id)
    assert stale.state is JobState.QUEUED
    h.repo.transition(job.id, JobState.LAUNCHING, "another engine", expect=JobState.QUEUED)
    h.repo.transition(job.id, JobState.RUNNING, "another engine", expect=JobState.LAUNCHING)
    with pytest.raises(ConcurrentUpdate, match="running now, read as queued"):
        h.engine._to(stale, JobState.LAUNCHING, "launch")
    assert h.repo.get(job.id).state is JobState.RUNNING
    done = h.engine._to(stale, JobState.CANCELLED, "cancelled by the team")
    assert done.state is JobState.CANCELLED


def test_a_ticks_snapshot_reads_the_active_jobs_rows_only(h: Harness) -> None:
    """The tick's snapshot of the migrator reads the rows of the jobs it was given (the tick's active jobs), not
    every job the migrator ever ran: the soak's engine read and parsed every finished job's row each tick, a
    cost that grew with the history (docs/reliability.md "Soak", session 11)."""
    done = h.submit(train_command(10, step_seconds=0.01), 10)
    h.run_until(done.id, lambda j: j.state is JobState.SUCCEEDED)
    live = h.submit(train_command(400, step_seconds=0.01), 400)
    h.run_until(live.id, lambda j: j.state is JobState.RUNNING)
    assert {j.job_id for j in h.migrator.jobs()} == {done.id, live.id}
    snap = _snapshot(h.migrator, [live.id])
    assert set(snap.jobs) == {live.id} and set(snap.last_migration) == {live.id}
    assert snap.jobs[live.id] == h.migrator.job(live.id)
    assert snap.last_migration[live.id] == max(m.id for m in h.migrator.history(live.id))
    assert _snapshot(h.migrator, []).jobs == {}
