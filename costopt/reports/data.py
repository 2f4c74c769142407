"""What a report reads from the database, in one place: the ledger's lines, the jobs, their events, and
how each copy was launched (a job's start, a move or a recovery: the migrator's ``migration_copies`` and
``migrations``). Reads only; the report itself (:mod:`costopt.reports.savings`) is computed from a
:class:`ReportData` and never touches the database.

Scope: ``team`` None reads every team's lines (an admin); a team reads the lines billed to it (the
ledger's ``team``: a managed job's team id, see docs/ledger.md) and its own jobs only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, case, null, select

from costopt.db.jobs_schema import jobs
from costopt.db.migration_schema import migration_copies, migrations
from costopt.jobs.records import JobEvent, JobRecord, JobRepository
from costopt.ledger.model import ChargeLine, IntervalLine
from costopt.ledger.sql import SqlLedger

__all__ = [
    "BATCH_JOBS",
    "CopyKind",
    "ReportData",
    "ReportScope",
    "iter_report_data",
    "load_report_data",
    "report_scope",
]

_CHUNK = 500
BATCH_JOBS = 200
"""How many jobs a report reads and folds at a time (:func:`iter_report_data`)."""

EVENT_KINDS = ("move", "preemption", "copy_lost")
"""The job events a report reads (:mod:`costopt.reports.savings`: the moves and preemptions it counts by day,
the work lost to preemptions and lost copies): the others (a job's submission, launches, progress, ...) are
not read, so a report's memory does not grow with every event of every job in scope."""


class CopyKind:
    """How a copy was launched: its job's first launch, a move, a recovery, or unknown (no migration)."""

    START = "start"
    MOVE = "move"
    RECOVERY = "recovery"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ReportData:
    """The lines and records a report is computed from (``jobs``: by id; ``events``: each job's events of
    :data:`EVENT_KINDS`, all of them, in order)."""

    intervals: Sequence[IntervalLine]
    charges: Sequence[ChargeLine]
    jobs: Mapping[str, JobRecord] = field(default_factory=dict)
    events: Mapping[str, Sequence[JobEvent]] = field(default_factory=dict)
    copy_kinds: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportScope:
    """What a report covers, read without its lines: the ids of the jobs billed in scope (sorted) and the
    first and last start of their intervals (tz-aware UTC; None: no interval), which bound its price memo."""

    job_ids: tuple[str, ...]
    first_start: datetime | None
    last_start: datetime | None


def report_scope(ledger: SqlLedger, *, team: str | None) -> ReportScope:
    """The jobs billed to ``team`` (None: every team) and the span of their intervals' starts."""
    ids, first, last = ledger.billed_jobs(team=team)
    return ReportScope(tuple(ids), first, last)


def load_report_data(
    engine: Engine,
    ledger: SqlLedger,
    *,
    team: str | None,
    needs_quote: Callable[[str], bool] | None = None,
    job_ids: Sequence[str] | None = None,
) -> ReportData:
    """Every ledger line of ``team`` (None: all), the jobs they bill, those jobs' events and copy kinds.
    ``job_ids``: only these jobs' lines (None: every job's; a report reads its scope a batch at a time:
    :func:`iter_report_data`). ``needs_quote``: whether a job's quote must be read (None: every one's);
    a job it says no for comes with ``quote`` None (its baselines' source answers it from what it keeps)."""
    intervals = ledger.intervals(team=team, job_ids=job_ids)
    charges = ledger.charges(team=team, job_ids=job_ids)
    ids = sorted({ln.record.job_id for ln in intervals} | {c.record.job_id for c in charges})
    found: dict[str, JobRecord] = {}
    kinds: dict[str, str] = {}
    with engine.connect() as conn:
        for lo in range(0, len(ids), _CHUNK):
            chunk = ids[lo : lo + _CHUNK]
            quoted = chunk if needs_quote is None else [j for j in chunk if needs_quote(j)]
            cols = [c for c in jobs.c if c.name != "quote"]
            quote = case((jobs.c.id.in_(quoted), jobs.c.quote), else_=null()) if quoted else null()
            query = select(*cols, quote.label("quote")).where(jobs.c.id.in_(chunk))
            if team is not None:
                query = query.where(jobs.c.team_id == team)
            found.update({r.id: JobRecord.of(r) for r in conn.execute(query)})
            c, m = migration_copies.c, migrations.c
            rows = conn.execute(
                select(c.interval_key, m.kind, m.from_epoch)
                .select_from(migration_copies.outerjoin(migrations, m.id == c.migration_id))
                .where(c.job_id.in_(chunk))
            )
            for r in rows:
                if r.kind is None:
                    kinds[r.interval_key] = CopyKind.UNKNOWN
                elif r.kind == "move":
                    kinds[r.interval_key] = CopyKind.MOVE
                else:  # a recovery; the migrator starts a job as its recovery from epoch 0
                    kinds[r.interval_key] = CopyKind.START if int(r.from_epoch) == 0 else CopyKind.RECOVERY
    events = JobRepository(engine).events_of(sorted(found), kinds=EVENT_KINDS, limit=None)
    return ReportData(intervals, charges, found, events, kinds)


def iter_report_data(
    engine: Engine,
    ledger: SqlLedger,
    scope: ReportScope,
    *,
    team: str | None,
    needs_quote: Callable[[str], bool] | None = None,
    batch: int = BATCH_JOBS,
) -> Iterator[ReportData]:
    """``scope``'s jobs' data, ``batch`` jobs at a time (each a :class:`ReportData` of those jobs only, in
    job-id order), read as the caller asks for it: a report folds one batch before the next is read, so its
    memory follows the batch, not the team's history."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    for lo in range(0, len(scope.job_ids), batch):
        chunk = scope.job_ids[lo : lo + batch]
        yield load_report_data(engine, ledger, team=team, needs_quote=needs_quote, job_ids=chunk)
