"""A job preempted a hundred times has more events than one page (``MAX_PAGE``): the engine's record of
what it already wrote (keyed by migration id) and an offline run's events must hold all of them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import Engine, insert

from costopt.db.jobs_schema import job_events
from costopt.jobs.engine import JobEngine
from costopt.jobs.offline import _all_events
from costopt.jobs.records import MAX_PAGE, JobRepository, NewJob

T0 = datetime(2020, 3, 2, tzinfo=UTC)
N = 2 * MAX_PAGE + 3


class _NoPlacements:
    def rank(self, *args: object, **kwargs: object) -> list[object]:
        return []

    def at_offer(self, *args: object, **kwargs: object) -> None:
        return None


def _job_with_events(engine: Engine, n: int) -> tuple[JobRepository, str]:
    repo = JobRepository(engine, now=lambda: T0)
    job, _ = repo.create(NewJob(team_id="t", spec={"command": ["train"]}, steps_total=10, provider="sim"))
    rows = [  # one "preemption" per migration id, as the engine writes them (in one transaction: fast)
        {
            "job_id": job.id,
            "at": T0,
            "kind": "preemption",
            "reason": f"copy {i} preempted",
            "detail": json.dumps({"migration_id": i + 1}),
        }
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(insert(job_events), rows)
    return repo, job.id


def test_the_engine_sees_every_recorded_migration_past_the_first_page_and_then_only_new_events(
    engine: Engine,
) -> None:
    repo, job_id = _job_with_events(engine, N)
    eng = JobEngine(repo, {}, _NoPlacements(), lambda: T0, "mem://pages", workers=0)  # type: ignore[arg-type]
    seen = eng._seen(job_id)
    assert ("preemption", N) in seen and ("preemption", 1) in seen
    assert len([k for k in seen if k[0] == "preemption"]) == N
    repo.add_event(job_id, "recovery", "recovered", detail={"migration_id": N}, at=T0)
    assert ("recovery", N) in eng._seen(job_id)
    assert len(eng._events(job_id, "preemption")) == N
    assert len(eng._events(job_id, "recovery")) == 1


def test_an_offline_run_reads_all_of_a_jobs_events(engine: Engine) -> None:
    repo, job_id = _job_with_events(engine, N)
    events = _all_events(repo, [job_id])[job_id]
    assert len(events) == N + 1  # the submission's state event, then every preemption
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert sum(1 for e in events if e.kind == "preemption") == N
