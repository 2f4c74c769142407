"""The job engine when the database fails in the middle of a migration step (the step's worker inline,
``workers=0``): the tick raises, and the next tick of the same engine resumes the migration (one copy,
the job finishes) instead of leaving it in flight until the process restarts."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from costopt.agent import control
from costopt.jobs.model import JobState
from costopt.migration.records import TAG_JOB
from providers.local import LocalProvider
from tests.jobs.engine_support import Harness, train_command
from tests.migration.conftest import local  # noqa: F401


def test_a_database_error_mid_launch_is_resumed_by_the_next_tick_of_the_same_engine(
    engine,
    local: LocalProvider,  # noqa: F811
    tmp_path: Path,
) -> None:
    lost: list[str] = []

    def database_lost(point: str) -> None:
        if point == "launch:returned" and not lost:  # the instance runs; its row is not written yet
            lost.append(point)
            raise OperationalError("UPDATE migrations", {}, psycopg.OperationalError("server closed the connection"))

    h = Harness(engine, local, tmp_path, workers=0, hook=database_lost)
    try:
        h.engine.tick()  # a tick before: the failure is not in the engine's first tick (which resumes everything)
        job = h.submit(train_command(40), 40)
        with pytest.raises(OperationalError):
            h.engine.tick()
        assert lost and h.repo.get(job.id).state is JobState.LAUNCHING
        done = h.run_until(job.id, lambda j: j.state.terminal, timeout=20.0)
        assert done.state is JobState.SUCCEEDED, done.reason
        assert len(local.history({TAG_JOB: job.id})) == 1  # the launched copy was adopted, not launched again
        assert control.audit_job(h.engine.checkpoint_uri(done), 40).ok
    finally:
        h.close()
