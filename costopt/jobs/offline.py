"""Managed jobs offline: N jobs through the service's own path over a simulated cloud, in seconds.

:func:`run_offline` assembles what the service runs, over one fresh database and one simulated cloud:

- the jobs' records (:class:`~costopt.jobs.records.JobRepository`), created ``queued``;
- the :class:`~costopt.migration.machine.Migrator` of the cloud, billed to a
  :class:`~costopt.ledger.sql.SqlLedger` at ``prices``, sleeping on the simulated clock
  (``cloud.sleeper()``), so its waits for boots and checkpoints advance simulated time;
- the :class:`~costopt.jobs.engine.JobEngine` (inline, ``workers=0``) over the given
  :class:`~costopt.jobs.placement.Placements` (where a job may run, best first: the policy);
- the :class:`~costopt.migration.watch.InterruptionWatcher`, which recovers preempted copies on the job's
  ranked placements (:meth:`JobEngine.recovery_offers`), as the service wires it;
- the :class:`~costopt.jobs.rebalance.Rebalancer` with ``rule`` (None: never rebalance), every
  ``rebalance_every`` after ``start``, moving through :meth:`JobEngine.move`.

The loop advances the simulated clock to the next thing the service would react to: the next rebalancing
time, or the first preemption or finished copy of a job's instance (:meth:`SimulatedCloud.run_until`
stops there), with an engine tick and a watcher pass after each; while a job is between states
(launching, migrating, recovering) or has no live copy, they pass at least every ``poll_seconds``. A
job's ``steps_done`` is as of its last tick (one runs right before each rebalancing pass). What is
measured offline is therefore what runs live; only the clock differs.

Jobs keep their checkpoints under ``checkpoint_root`` (default ``mem://offline-<pid>-<n>``: the in-memory
storage of :mod:`costopt.agent.storage`, one per run, freed at its end). The database is an in-memory
SQLite database of its own unless ``db`` is given; a database reused by the runs of one process
(:func:`memory_database`, ``reset_db=True``) is emptied before each run, so runs share no state but
SQLAlchemy's compiled statements (the cache is per engine).
Times are tz-aware UTC; money is Decimal USD.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Delete, Engine, Executable, and_, create_engine, event, exists, literal_column, or_, select
from sqlalchemy.pool import StaticPool

from costopt.agent.storage import drop_memory
from costopt.db.jobs_schema import jobs as jobs_table
from costopt.db.migration_schema import migration_copies
from costopt.domain import Cloud, utc
from costopt.jobs.engine import JobEngine
from costopt.jobs.model import ACTIVE_STATES, JobState
from costopt.jobs.placement import Placements
from costopt.jobs.rebalance import Rebalancer, RebalanceReport
from costopt.jobs.records import MAX_PAGE, JobEvent, JobRecord, JobRepository, NewJob
from costopt.ledger.model import CostReport
from costopt.ledger.prices import PriceSteps
from costopt.ledger.sql import SqlLedger
from costopt.migration.decision import MigrationRule
from costopt.migration.machine import Migrator
from costopt.migration.records import CopyRecord
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import InterruptionWatcher, MemoryWatermark
from costopt.planning.model import EgressRates
from costopt.simulated import SimulatedCloud

__all__ = [
    "ALWAYS_MOVE",
    "OfflineError",
    "OfflineJob",
    "OfflineRun",
    "memory_database",
    "reset_database",
    "run_offline",
]

_RUNS = itertools.count()

ALWAYS_MOVE = MigrationRule(
    margin_fraction=0.0,
    margin_min_usd=0.0,
    dwell_hours=0.0,
    restart_hours=0.0,
    checkpoint_overlap_hours=0.0,
    egress=EgressRates(inter_region=dict.fromkeys(Cloud, 0.0), internet=dict.fromkeys(Cloud, 0.0)),
)
"""A rebalancer rule that takes moves as free (no margin, dwell, restart, overlap or egress): a job moves
whenever another offer is cheaper per step (the backtests' ``dynamic`` policy)."""


class OfflineError(ValueError):
    """An offline run cannot run as asked (no jobs, bad times)."""


@dataclass(frozen=True, slots=True)
class OfflineJob:
    """One job to run: ``steps_total`` steps, its ``spec`` as the REST layer stores it (``command``,
    ``job_type`` or ``throughput``, ``gpus``, ``checkpoint_gb``, ...), ``name`` and ``team_id`` for the
    ledger."""

    steps_total: int
    spec: Mapping[str, Any]
    name: str | None = None
    team_id: str = "offline"


@dataclass(frozen=True, eq=False)
class OfflineRun:
    """What a run left: the job records (in submission order), each job's events and copies, the ledger's
    report per job (open intervals costed up to ``ended_at``), every rebalancing pass, and the database
    (still open: query it, or dispose of it)."""

    jobs: tuple[JobRecord, ...]
    events: Mapping[str, tuple[JobEvent, ...]]
    copies: Mapping[str, tuple[CopyRecord, ...]]
    costs: Mapping[str, CostReport]
    rebalances: tuple[RebalanceReport, ...]
    started_at: datetime
    ended_at: datetime
    db: Engine = field(repr=False)

    @property
    def finished(self) -> bool:
        return all(j.state.terminal for j in self.jobs)


def memory_database() -> Engine:
    """A fresh in-memory SQLite database with the whole schema (one connection, shared by the threads of
    this process)."""
    import costopt.db.schema  # noqa: F401  (declares every table)
    from costopt.db.metadata import metadata

    db = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})

    @event.listens_for(db, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    metadata.create_all(db)
    return db


def run_offline(
    cloud: SimulatedCloud,
    prices: PriceSteps,
    placements: Placements,
    jobs: Sequence[OfflineJob],
    *,
    until: datetime,
    rule: MigrationRule | None = None,
    rebalance_every: timedelta | None = timedelta(hours=24),
    db: Engine | None = None,
    checkpoint_root: str | None = None,
    poll_seconds: float = 30.0,
    launch_attempts: int = 5,
    rank_top: int = 10,
    keep_checkpoints: bool = False,
    reset_db: bool = False,
) -> OfflineRun:
    """Run ``jobs`` from the cloud's clock (now) until they end or ``until`` (module docstring).

    ``rule``: the rebalancer's decision rule (None: no rebalancing); ``rebalance_every``: how often it
    passes, from the start. ``poll_seconds``: the migrator's poll interval, in simulated seconds.
    ``keep_checkpoints``: keep the default in-memory checkpoints after the run (to audit them); otherwise
    they are freed.
    ``reset_db``: empty ``db`` first (:func:`reset_database`).
    Raises :class:`OfflineError` on no jobs or ``until`` not after the start."""
    if not jobs:
        raise OfflineError("give at least one job")
    start = utc(cloud.now())
    until = utc(until)
    if until <= start:
        raise OfflineError(f"until ({until.isoformat()}) must be after the cloud's clock ({start.isoformat()})")
    if rebalance_every is not None and rebalance_every <= timedelta(0):
        raise OfflineError("rebalance_every must be > 0")
    if db is None:
        db = memory_database()
    elif reset_db:
        reset_database(db)
    root = checkpoint_root or f"mem://offline-{os.getpid()}-{next(_RUNS)}"
    repo = JobRepository(db, now=cloud.now)
    unavailable = UnavailableOffers(db, clock=cloud.now)
    ledger = SqlLedger(db, prices)
    migrator = Migrator(
        db,
        cloud,
        sleep=cloud.sleeper(),
        now=cloud.now,
        poll_seconds=poll_seconds,
        backoff_base=0.0,
        ledger=ledger,
        unavailable=unavailable,
        **cloud.migrator_timeouts(),  # type: ignore[arg-type]
    )
    engine = JobEngine(
        repo,
        {cloud.name: migrator},
        placements,
        cloud.now,
        root,
        workers=0,
        retry_base=0.0,
        launch_attempts=launch_attempts,
        rank_top=rank_top,
    )
    watcher = InterruptionWatcher(
        migrator,
        lambda mj: engine.recovery_offers(repo.get(mj.job_id), mj),
        unavailable=unavailable,
        watermark=MemoryWatermark(),
        clock=cloud.now,
        retry_base=0.0,
    )
    rebalancer = (
        None if rule is None else Rebalancer(repo, placements, engine.move, rule, clock=cloud.now, top=rank_top)
    )
    records = [
        repo.create(
            NewJob(
                team_id=j.team_id, spec=dict(j.spec), steps_total=j.steps_total, provider=cloud.name, name=j.name or ""
            )
        )[0]
        for j in jobs
    ]
    ids = [r.id for r in records]
    wanted = set(ids)
    passes: list[RebalanceReport] = []
    next_pass = start + rebalance_every if rebalancer is not None and rebalance_every is not None else None
    settle = timedelta(seconds=poll_seconds)
    spins = 0
    try:
        while True:
            engine.tick()
            watcher.poll()
            active, live_copies = _active_jobs(db, wanted)
            now = utc(cloud.now())
            if not active or now >= until:
                break
            if next_pass is not None and rebalancer is not None and now >= next_pass:
                passes.append(rebalancer.run_once(dry_run=False))
                while next_pass <= utc(cloud.now()):
                    next_pass += rebalance_every  # type: ignore[operator]
                continue
            # a job between states (launching, migrating, recovering), or without a live copy (a recovery
            # that rolled back, for the watcher to retry), is ticked again at once, then every poll
            # interval: the engine and the watcher act on a later pass
            watch = [iid for _, iid in live_copies]
            live = {job_id for job_id, _ in live_copies}
            settling = any(state is not JobState.RUNNING or job_id not in live for job_id, state in active)
            if settling and spins < 2:
                spins += 1
                continue
            spins = 0
            stop = until if next_pass is None else min(until, next_pass)
            if settling:
                stop = min(stop, now + settle)
            cloud.run_until(stop, watch=watch)
    finally:
        engine.close()
    ended = utc(cloud.now())
    final = [repo.get(i) for i in ids]
    events = _all_events(repo, ids)
    run = OfflineRun(
        jobs=tuple(final),
        events={i: tuple(events[i]) for i in ids},
        copies={i: tuple(migrator.copies(i)) for i in ids},
        costs={i: ledger.costs(job_id=i, as_of=ended) for i in ids},
        rebalances=tuple(passes),
        started_at=start,
        ended_at=ended,
        db=db,
    )
    if checkpoint_root is None and not keep_checkpoints:
        drop_memory(root)
    return run


_ACTIVE_WITH_COPIES = (
    select(jobs_table.c.id, jobs_table.c.state, migration_copies.c.instance_id)
    .select_from(
        jobs_table.outerjoin(
            migration_copies,
            and_(migration_copies.c.job_id == jobs_table.c.id, migration_copies.c.ended_at.is_(None)),
        )
    )
    .where(or_(*(jobs_table.c.state == v for v in sorted(s.value for s in ACTIVE_STATES))))
    .order_by(jobs_table.c.created_at, jobs_table.c.id, migration_copies.c.instance_id)
)
"""The active jobs with their copies still open in the migrator's records (one query, built once; the states as
plain bound values, not an ``IN`` list SQLAlchemy would expand at every execution)."""


def _active_jobs(db: Engine, wanted: set[str]) -> tuple[list[tuple[str, JobState]], list[tuple[str, str]]]:
    """``(job id, state)`` of the active jobs among ``wanted``, and ``(job id, instance id)`` of their open
    copies."""
    with db.connect() as conn:
        rows = conn.execute(_ACTIVE_WITH_COPIES).all()
    active: dict[str, JobState] = {}
    copies: list[tuple[str, str]] = []
    for r in rows:
        job_id = str(r.id)
        if job_id not in wanted:
            continue
        active[job_id] = JobState(r.state)
        if r.instance_id is not None:
            copies.append((job_id, str(r.instance_id)))
    return list(active.items()), copies


def _all_events(repo: JobRepository, ids: Sequence[str]) -> dict[str, list[JobEvent]]:
    """Every event of each job, in order: :meth:`JobRepository.events_of` gives at most a page per job
    (:data:`MAX_PAGE`), and a job preempted a hundred times has more; the rest is read page by page."""
    out = repo.events_of(ids)
    for job_id, got in out.items():
        while len(got) % MAX_PAGE == 0 and got:
            more = repo.events(job_id, after_id=got[-1].id, limit=MAX_PAGE)
            if not more:
                break
            got.extend(more)
    return out


def reset_database(db: Engine) -> None:
    """Delete every row of every table (children first): a database reused across runs starts empty. One read
    says which tables hold rows (an offline run writes a few of the schema's tables); only those are emptied."""
    probe, deletes = _reset_statements()
    with db.begin() as conn:
        filled = conn.execute(probe).one()
        for delete, has_rows in zip(deletes, filled, strict=True):
            if has_rows:
                conn.execute(delete)


@functools.cache
def _reset_statements() -> tuple[Executable, tuple[Delete, ...]]:
    """One read of whether each table holds a row (``EXISTS`` per table, children first) and each table's
    delete, in that order (built once)."""
    import costopt.db.schema  # noqa: F401  (declares every table)
    from costopt.db.metadata import metadata

    tables = tuple(reversed(metadata.sorted_tables))
    probe = select(*(exists(select(literal_column("1")).select_from(t)).label(f"t{i}") for i, t in enumerate(tables)))
    return probe, tuple(t.delete() for t in tables)
