"""Jobs billed for the report tests: submitted over REST, their copies billed as the migrator does
(``migration_copies`` then the ledger's sync)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from costopt.jobs.model import JobState
from costopt.migration.ledger_sync import sync_ledger, write_copy_end, write_copy_start, write_verified
from costopt.migration.records import CopyEnd, CopyStart, EndReason
from tests.api.jobs_helpers import P3_2X_SPOT, T0, Service


def _run(svc: Service, job: dict[str, Any], start: datetime, end: datetime | None, steps: int) -> None:
    """Bill one copy of ``job`` on p3.2xlarge spot as the migrator does (its copy row, then the sync)."""
    engine, job_id = svc.store.engine, job["id"]
    with engine.begin() as conn:
        write_copy_start(conn, "sim", CopyStart(job_id, 1, f"i-{job_id}", P3_2X_SPOT, start), start)
        write_verified(conn, "sim", job_id, f"i-{job_id}", start, start)
        if end is not None:
            write_copy_end(conn, "sim", CopyEnd(job_id, 1, f"i-{job_id}", None, None, end, EndReason.FINISHED), end)
    svc.jobs.transition(job_id, JobState.LAUNCHING, "test")
    svc.jobs.transition(job_id, JobState.RUNNING, "test")
    svc.jobs.update(job_id, steps_done=steps)
    if end is not None:
        svc.jobs.transition(job_id, JobState.SUCCEEDED, "test")


def bill(svc: Service) -> dict[str, Any]:
    """Two jobs billed: alpha's a1 finished (6 h on p3.2xlarge spot across the price change at T0+5h),
    beta's b1 still running; the service's clock at T0+8h. ``from``: a period start before both."""
    a = svc.submit(svc.alpha, name="a1")
    b = svc.submit(svc.beta, name="b1")
    t0 = T0  # the seeded prices' origin (the jobs were submitted at T0 + a few seconds)
    _run(svc, a, t0 + timedelta(hours=1), t0 + timedelta(hours=7), 50_000)  # the price moves 0.95 -> 1.05 at T0+5h
    _run(svc, b, t0 + timedelta(hours=2), None, 20_000)
    svc.jobs.add_event(a["id"], "move", "moved (test)", at=t0 + timedelta(hours=3))
    svc.jobs.add_event(b["id"], "preemption", "preempted (test)", at=t0 + timedelta(hours=4))
    svc.advance(timedelta(hours=8))
    assert sync_ledger(svc.store.engine, svc.app.state.ledger).pending == 0
    return {"a": a, "b": b, "from": (t0 - timedelta(days=1)).date().isoformat()}
