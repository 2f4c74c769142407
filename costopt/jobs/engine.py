"""The job engine: takes a managed job from ``queued`` to ``succeeded``, ``failed`` or ``cancelled``.

:class:`JobEngine` drives the jobs of :class:`~costopt.jobs.records.JobRepository` through the pieces the
core already has, and keeps no state of its own that a crash could lose:

- the :class:`~costopt.migration.machine.Migrator` of the job's provider launches every copy (the first
  one is its recovery from epoch 0), moves and recovers it, bills each copy to the ledger and keeps the
  facts in ``migration_jobs`` / ``migrations`` / ``migration_copies``;
- the :class:`~costopt.migration.watch.InterruptionWatcher` (the service's ``migration:watch`` job)
  recovers copies taken by the cloud; the engine only follows (state ``recovering``, events);
- :mod:`costopt.agent.control` tells the steps done, whether the job finished, and serves checkpoint
  requests;
- ``job_events`` (through the repository) records what the engine saw, keyed by migration id, so a
  restarted engine never records a preemption or a move twice.

One :meth:`JobEngine.tick` is one idempotent pass over the active jobs (docs/jobs.md has the table):

- ``queued``: rank placements (:class:`~costopt.jobs.placement.Placements`), register the job with its
  provider's migrator, ``launching``, start it on the ranked offers (in a worker);
- ``launching``: the start done -> ``running`` (offer, whole-instance price); launched nowhere -> a
  ``launch_failed`` event, retried after a backoff up to ``launch_attempts`` times, then ``failed``
  with each refusal's reason; the copy exited with a non-zero code -> ``failed`` (not retried);
- ``running``: progress -> ``steps_done``; the agent's ``done`` with exactly ``steps_total`` steps ->
  ``succeeded`` (copy terminated, the migrator's job finished, its interval closed); a migration in
  flight -> ``migrating`` / ``recovering`` with a ``preemption`` (or ``copy_lost``) event; a copy that
  ended without a preemption: a non-zero exit code -> ``failed`` with the code and the tail of its
  output; exit 0 (or :data:`RESUMABLE_EXIT_CODES`, or unknown) without the steps done -> recovered from
  the last checkpoint, at most ``launch_attempts`` times;
- ``recovering`` / ``migrating``: the new copy runs -> ``running`` with a ``recovery`` event; a recovery
  that cannot launch anywhere is retried by the watcher with its backoff, and after ``launch_attempts``
  rolled-back recoveries in a row the job is ``failed``;
- ``cancel_requested_at`` set: a checkpoint request, waited for across ticks up to ``cancel_timeout``,
  then the copy is terminated and the job ``cancelled`` (its record and bill stay).

Long steps (a start or a recovery waits for boots and the first progress) run in a worker thread owned
by the engine, at most one per job; a later tick records their outcome from the migrator's rows. The
first tick of an engine resumes the migrations of its jobs a crash left in flight
(:meth:`Migrator.resume`). ``workers=0`` runs them inline (offline tests over the simulated cloud).

Times are tz-aware UTC from ``clock`` (the simulated clock over the simulated cloud); money is Decimal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from costopt.agent import control
from costopt.agent.contract import job_env as contract_job_env
from costopt.agent.storage import is_local_uri
from costopt.clock import submit as clock_submit
from costopt.cloud import ACTIVE_STATES as ALIVE_STATES
from costopt.cloud import CloudError, Instance, InstanceState, NotFoundError
from costopt.db.inlist import InList
from costopt.db.migration_schema import migrations
from costopt.domain import OfferKey
from costopt.errors import CostoptError
from costopt.fleets.model import FLEET_PROVIDER
from costopt.jobs.costs import CopyKeys, MigrationCost, job_charges, migration_charge_keys, migration_cost
from costopt.jobs.model import ACTIVE_STATES, JobState
from costopt.jobs.placement import Placement, Placements
from costopt.jobs.records import MAX_PAGE, ConcurrentUpdate, IllegalTransition, JobEvent, JobRecord, JobRepository
from costopt.jobs.view import JobView, job_view
from costopt.ledger.book import Ledger
from costopt.ledger.model import LedgerError
from costopt.migration.machine import Migrator
from costopt.migration.records import RACES as MIGRATION_RACES
from costopt.migration.records import (
    CopyRecord,
    JobStatus,
    Kind,
    MigrationError,
    MigrationRecord,
    State,
)
from costopt.migration.records import JobRecord as MigratorJob

log = logging.getLogger("costopt.jobs.engine")

__all__ = [
    "RESUMABLE_EXIT_CODES",
    "EngineError",
    "JobEngine",
    "MoveRefused",
    "TickReport",
    "job_env",
]

RESUMABLE_EXIT_CODES: frozenset[int] = frozenset({0, 75})
"""Exit codes after which a copy that did not finish is recovered from its last checkpoint: 0, and 75
(EX_TEMPFAIL: the agent stopped after a checkpoint, e.g. on SIGTERM or a notice). Any other code fails
the job (a failing command is never retried for ever)."""

CANCEL_PREFIX = "cancel"
_FINISHED_BY_ENGINE = "engine:"


class EngineError(CostoptError):
    """The engine cannot act on a job (unknown provider, a job in the wrong state)."""


class MoveRefused(EngineError):
    """A move asked of a job that is not running (or already busy): re-read it and decide again."""


def job_env(job: JobRecord, first: Placement | None = None) -> dict[str, str]:
    """The environment the job's copies get beyond the agent contract (:func:`costopt.agent.contract.job_env`):
    its steps, its catalog type, its precision, and for a job given by throughput its steps/s (the one
    accelerator's, or on several the first placement's: the migrator keeps one environment per job)."""
    job_type = job.spec.get("job_type") or None
    throughput = {str(k): float(v) for k, v in dict(job.spec.get("throughput") or {}).items()}
    sps: float | None = None
    if throughput:
        sps = next(iter(throughput.values())) if len(throughput) == 1 else None
        if sps is None and first is not None:
            sps = first.steps_per_s
    return contract_job_env(
        int(job.steps_total),
        job_type=str(job_type) if job_type else None,
        steps_per_second=sps if sps is not None and sps > 0 else None,
        precision=job.spec.get("precision") or None,
    )


@dataclass(frozen=True, slots=True)
class TickReport:
    """One :meth:`JobEngine.tick`: jobs looked at, jobs whose state changed (``id: from -> to``), jobs with a
    worker still busy, and errors (a failing job never stops the others). ``skipped``: another tick of
    this engine was running (nothing was done)."""

    at: datetime
    jobs: int = 0
    changed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    skipped: bool = False


def _log_failure(what: str, exc: BaseException) -> None:
    """Log a failed step (call it in the ``except`` block): a lost race (:data:`MIGRATION_RACES`, or a job
    record's compare-and-set refused twice in :meth:`JobEngine._to`: another actor advanced the job first,
    nothing was written; the next pass looks at it afresh) in one line, anything else with its traceback."""
    if isinstance(exc, (*MIGRATION_RACES, ConcurrentUpdate)):
        log.warning("%s: %s: %s", what, type(exc).__name__, exc)
    else:
        log.exception("%s failed", what)


@dataclass(slots=True)
class _Pass:
    changed: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The migrators' rows read once per tick (one query each, not a few per job): jobs, active
    migrations, and each job's newest migration id. ``working``: the jobs a worker was driving when the
    reads began; their rows may be from before, between or after the worker's transitions, so a tick
    leaves them alone even if the worker has finished by the time it reaches them."""

    jobs: Mapping[str, MigratorJob]
    active: Mapping[str, MigrationRecord]
    last_migration: Mapping[str, int]
    working: frozenset[str] = frozenset()


_LAST_MIGRATIONS = select(migrations.c.job_id, func.max(migrations.c.id)).group_by(migrations.c.job_id)
_LAST_MIGRATIONS_IN = InList(_LAST_MIGRATIONS.where, migrations.c.job_id, "b_ids")
"""Each job's newest migration id, of the jobs among some ids (built once per list length: a statement built
per tick costs its construction and cache key at every tick, several times a plain read's)."""


def _snapshot(migrator: Migrator, job_ids: Collection[str], working: frozenset[str] = frozenset()) -> _Snapshot:
    """The rows of ``job_ids`` (the tick's active jobs: not every job the migrator ever ran, which grew with
    the history, each tick reading and parsing every finished job's row; the soak, session 11).
    ``working``: the jobs with a worker in flight, taken before the reads (see :class:`_Snapshot`)."""
    ids = sorted(set(job_ids))
    rows: Sequence[Any] = []
    with migrator.engine.connect() as conn:  # the three reads on one connection (one pool checkout)
        mjobs = {j.job_id: j for j in migrator.jobs(ids, conn=conn)}
        active = {m.job_id: m for m in migrator.active_migrations(conn=conn)}
        if ids:
            query, params = _LAST_MIGRATIONS_IN.bind(ids)
            rows = conn.execute(query, params).all()
    last = {job_id: int(mid) for job_id, mid in rows}
    return _Snapshot(mjobs, active, last, working)


@dataclass(slots=True)
class _EventLog:
    """The events of one job read so far (ids only grow: later reads ask only for newer ones)."""

    last_id: int = 0
    events: list[JobEvent] = field(default_factory=list)
    keys: set[tuple[str, int]] = field(default_factory=set)
    """``(kind, migration id)`` of the events that name a migration."""


def _offer_doc(offer: OfferKey | None) -> dict[str, str] | None:
    return offer.to_doc() if offer is not None else None


def _total(cost: MigrationCost | None) -> Decimal | None:
    """A migration's cost for its event (None: unknown)."""
    return cost.total if cost is not None and cost.known else None


def _usd(value: float | Decimal | None) -> Decimal | None:
    if value is None:
        return None
    return value if isinstance(value, Decimal) else Decimal(repr(float(value)))


class JobEngine:
    """Drives managed jobs (module docstring).

    - ``repo``: the jobs; ``migrators``: one per provider name (``job.provider``), billed to the ledger;
    - ``placements``: ranked offers for a job (D1's planner-backed implementation in the service);
    - ``clock``: now, tz-aware UTC; ``checkpoint_root``: where a job without ``spec.checkpoint_uri`` keeps
      its checkpoints (``<root>/<job id>``; a local path or a URI);
    - ``launch_attempts``: how many failed launches (and rolled-back recoveries in a row, and copies ended
      without finishing) a job gets before it is ``failed``; ``retry_base``/``retry_cap`` (seconds):
      the backoff before the n-th relaunch, ``min(cap, base * 2**(n-1))``;
    - ``cancel_timeout`` (seconds): how long a cancelled job's checkpoint is waited for;
    - ``workers``: worker threads for starts and recoveries (0: run them inline, in the tick);
    - ``output_tail``: lines of a failed copy's output kept in its ``failed`` event.
    """

    def __init__(
        self,
        repo: JobRepository,
        migrators: Mapping[str, Migrator],
        placements: Placements,
        clock: Callable[[], datetime],
        checkpoint_root: str | Path,
        *,
        launch_attempts: int = 3,
        retry_base: float = 5.0,
        retry_cap: float = 300.0,
        cancel_timeout: float = 300.0,
        workers: int = 4,
        output_tail: int = 50,
        rank_top: int = 10,
        progress_observer: Callable[[JobRecord, MigratorJob, Any], None] | None = None,
    ) -> None:
        """``progress_observer``: called with each look at a running copy's progress (the job, its migrator
        record, the copy's :class:`~costopt.agent.progress.EpochProgress`); the service's learns the job's
        throughput from it (:mod:`costopt.throughput.learning`). It must not raise."""
        if launch_attempts < 1:
            raise ValueError(f"launch_attempts must be >= 1, got {launch_attempts}")
        if workers < 0 or cancel_timeout < 0 or retry_base < 0 or retry_cap < 0:
            raise ValueError("workers, cancel_timeout, retry_base and retry_cap must be >= 0")
        if not str(checkpoint_root):
            raise ValueError("checkpoint_root must not be empty")
        self.repo = repo
        self.migrators = dict(migrators)
        self.placements = placements
        self.clock = clock
        self.checkpoint_root = str(checkpoint_root)
        self.launch_attempts = launch_attempts
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.cancel_timeout = cancel_timeout
        self.output_tail = output_tail
        self.rank_top = rank_top
        self.progress_observer = progress_observer
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="costopt-engine") if workers else None
        self._workers = workers
        self._work: dict[str, Future[Any]] = {}
        self._orphaned: set[str] = set()  # jobs whose worker died: their migration is resumed
        self._ranked: dict[str, dict[OfferKey, Placement]] = {}
        self._moved: dict[str, JobState] = {}  # job -> the state this step's last transition left it in
        self._seen_steps: dict[str, tuple[int, int]] = {}  # job -> (epoch, last step) at the previous look
        self._history_mark: dict[str, int] = {}  # the last finished migration whose events are recorded
        self._history_done: dict[str, int] = {}  # every migration up to this id is finished and recorded
        self._event_logs: dict[str, _EventLog] = {}  # the job events read so far, per active job
        self._tick_lock = threading.Lock()
        self._work_lock = threading.Lock()
        self._started = False

    # -- public ----------------------------------------------------------------------------------------

    @property
    def ledger(self) -> Ledger | None:
        """The ledger the migrators bill to (the first one that has a ledger), for :func:`job_cost`."""
        for m in self.migrators.values():
            if m.ledger is not None:
                return m.ledger
        return None

    def now(self) -> datetime:
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the engine's clock returned a naive datetime {now!r}: it must be tz-aware UTC")
        return now.astimezone(UTC)

    def checkpoint_uri(self, job: JobRecord) -> str:
        """The job's checkpoint location: ``spec.checkpoint_uri``, else ``<checkpoint_root>/<job id>``."""
        given = job.spec.get("checkpoint_uri")
        if given:
            return str(given)
        root = self.checkpoint_root
        if is_local_uri(root) and "://" not in root:
            return str(Path(root) / job.id)
        return f"{root.rstrip('/')}/{job.id}"

    def migrator_of(self, job: JobRecord) -> Migrator:
        migrator = self.migrators.get(job.provider)
        if migrator is None:
            raise EngineError(
                f"job {job.id} runs on provider {job.provider!r}, which the engine has no migrator for; "
                f"configured: {sorted(self.migrators)}"
            )
        return migrator

    def _working(self) -> frozenset[str]:
        """The jobs whose worker has not finished yet."""
        with self._work_lock:
            return frozenset(job_id for job_id, fut in self._work.items() if not fut.done())

    def busy(self, job_id: str) -> bool:
        """True while a worker of this engine runs a migration (or a move) of the job."""
        with self._work_lock:
            fut = self._work.get(job_id)
            return fut is not None and not fut.done()

    def tick(self) -> TickReport:
        """One idempotent pass over the active jobs (module docstring). Safe to run again after a crash at
        any point; a second concurrent call on the same engine returns at once (``skipped``). Several
        engines on one database must not tick at once (the service holds the ``engine`` lease)."""
        at = self.now()
        if not self._tick_lock.acquire(blocking=False):
            return TickReport(at=at, skipped=True)
        try:
            out = _Pass()
            first = not self._started
            # a fleet's jobs are run by its round executor (costopt/fleets), not launched one by one
            jobs = [j for j in self.repo.in_states(ACTIVE_STATES) if j.provider != FLEET_PROVIDER]
            snaps: dict[int, _Snapshot] = {}
            for job in jobs:
                try:
                    migrator = self.migrator_of(job)
                    snap = snaps.get(id(migrator.engine))
                    if snap is None:
                        snap = snaps[id(migrator.engine)] = _snapshot(migrator, [j.id for j in jobs], self._working())
                    self._step(job, migrator, snap, out, first=first)
                except (CostoptError, CloudError, OSError, ValueError) as exc:
                    _log_failure(f"engine: job {job.id}", exc)
                    out.errors.append(f"{job.id}: {type(exc).__name__}: {exc}")
            self._started = True
            self._forget(job.id for job in jobs)
            return TickReport(at, len(jobs), tuple(out.changed), tuple(out.busy), tuple(out.errors))
        finally:
            self._tick_lock.release()

    def _forget(self, active: Iterable[str]) -> None:
        """Drop the per-job state of every job not in ``active`` (this tick's active jobs): what the engine
        holds in memory is bounded by the active jobs, not by every job it ever ran (a finished job's
        ranked placements, progress mark, history marks and done worker were kept for the process's life
        before: the soak, issue 14). A job's worker still running is kept (its state comes back with it)."""
        live = set(active)
        with self._work_lock:
            for job_id in [j for j, fut in self._work.items() if j not in live and fut.done()]:
                del self._work[job_id]
            live |= self._work.keys()
        for cache in self._per_job():
            for job_id in [j for j in list(cache) if j not in live]:  # list(): workers add keys meanwhile
                cache.pop(job_id, None)
        self._orphaned &= live

    def _per_job(self) -> tuple[dict[str, Any], ...]:
        """The engine's per-job maps besides its workers (``_work``) and orphans."""
        return (self._event_logs, self._history_done, self._history_mark, self._seen_steps, self._ranked, self._moved)

    def held_jobs(self) -> frozenset[str]:
        """The jobs this engine keeps any per-job state of in memory (bounded by the active jobs and the
        workers in flight: :meth:`tick` forgets the others)."""
        with self._work_lock:
            held = set(self._work)
        for cache in self._per_job():
            held |= set(cache)
        return frozenset(held | self._orphaned)

    def view(self, job: JobRecord | str, at: datetime | None = None) -> JobView:
        """:func:`costopt.jobs.view.job_view` of a job (a record or an id) at ``at`` (default: now)."""
        record = self.repo.get(job) if isinstance(job, str) else job
        return job_view(
            record, self.repo.events(record.id), ledger=self.ledger, placements=self.placements, at=at or self.now()
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop the worker threads (``wait``: let running migrations finish first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def move(
        self, job_id: str, placements: Sequence[Placement], *, reason: str, expected_saving_usd: Decimal
    ) -> JobRecord:
        """Move a running job to the first of ``placements`` that launches (blocking: checkpoint, new copy,
        verification, old copy terminated), recording a ``move`` event with ``reason``, the saving the
        caller expected and the move's real cost from the ledger (egress + overlap + restart).

        Returns the job: ``running`` on the new offer, or on its old copy when the move rolled back (a
        ``move_rolled_back`` event with the reason), or ``recovering`` when the old copy could not go on.
        Raises :class:`MoveRefused` when the job is not ``running`` or a migration of it is in flight.
        """
        if not placements:
            raise ValueError("a move needs at least one placement")
        job = self.repo.get(job_id)
        if job.state is not JobState.RUNNING or job.cancel_requested_at is not None:
            raise MoveRefused(f"job {job_id} is {job.state.value}, not running: it cannot be moved now")
        migrator = self.migrator_of(job)
        done: Future[Any] = Future()
        with self._work_lock:
            fut = self._work.get(job_id)
            if fut is not None and not fut.done():
                raise MoveRefused(f"job {job_id} has a migration in flight: move it later")
            self._work[job_id] = done
        try:
            self._ranked[job_id] = {p.offer: p for p in placements}
            gb = job.spec.get("checkpoint_gb", 1)
            if migrator.active_migration(job_id) is not None:
                raise MoveRefused(f"job {job_id} has a migration in flight: move it later")
            try:
                planned = migrator.plan(job_id, [p.offer for p in placements], Kind.MOVE, checkpoint_gb=gb)
            except MigrationError as exc:
                raise MoveRefused(f"job {job_id} cannot be moved now: {exc}") from exc
            if planned.kind is not Kind.MOVE:
                raise MoveRefused(f"job {job_id} is being recovered (migration {planned.id}): move it later")
            self._to(
                job,
                JobState.MIGRATING,
                f"moving: {reason}",
                detail={
                    "migration_id": planned.id,
                    "candidates": [p.offer.to_doc() for p in placements],
                    "expected_saving_usd": str(expected_saving_usd),
                },
            )
            try:
                mig = migrator.run(planned.id)
            except BaseException:
                self._orphaned.add(job_id)  # the next tick resumes the move where it stopped
                raise
            self._record_move(self.repo.get(job_id), migrator, mig, reason=reason, expected=expected_saving_usd)
            self._after_migration(self.repo.get(job_id), migrator)
            return self.repo.get(job_id)
        finally:
            self._event_logs.pop(job_id, None)
            done.set_result(None)

    # -- one job ---------------------------------------------------------------------------------------

    def _step(self, job: JobRecord, migrator: Migrator, snap: _Snapshot, out: _Pass, *, first: bool) -> None:
        with self._work_lock:
            fut = self._work.get(job.id)
            if fut is not None and fut.done():
                del self._work[job.id]
                exc = fut.exception()
                if exc is not None:
                    self._orphaned.add(job.id)
                    log.error("engine: the worker of job %s failed: %s: %s", job.id, type(exc).__name__, exc)
                    self.repo.add_event(job.id, "engine_error", f"{type(exc).__name__}: {exc}"[:2000], at=self.now())
        before = job.state
        if self.busy(job.id) or job.id in snap.working:
            # the tick's snapshot of the migrator's row, not a read per job (it may be a worker's step old:
            # the progress of the epoch it names is read, the newer one at the next tick)
            self._follow_progress(job, migrator, snap.jobs.get(job.id))
            out.busy.append(job.id)
            return
        self._moved.pop(job.id, None)
        if job.state is JobState.QUEUED:
            self._queued(job, migrator)
        else:
            self._active(job, migrator, snap, first=first)
        after = self._moved.pop(job.id, before)
        if after is not before:
            out.changed.append(f"{job.id}: {before.value} -> {after.value}")

    # queued: rank, register, launching, start.
    def _queued(self, job: JobRecord, migrator: Migrator) -> None:
        if job.cancel_requested_at is not None:
            self._to(job, JobState.CANCELLED, "cancelled before launch")
            return
        self._launch(job, migrator)

    def _launch(self, job: JobRecord, migrator: Migrator) -> None:
        """Rank placements and start the job on them (from ``queued``, or again from ``launching``)."""
        failures = self._events(job.id, "launch_failed")
        if failures and self.now() < failures[-1].at + self._backoff(len(failures)):
            return
        at = self.now()
        try:
            ranked = list(
                self.placements.rank(job, remaining_steps=job.steps_total - job.steps_done, at=at, top=self.rank_top)
            )
        except (CostoptError, ValueError, LookupError) as exc:
            self._launch_failed(job, migrator, f"placements failed: {type(exc).__name__}: {exc}", None)
            return
        if not ranked:
            self._launch_failed(job, migrator, "no offer can run the job now under its constraints", None)
            return
        uri = self.checkpoint_uri(job)
        command = [str(a) for a in job.spec.get("command") or ()]
        try:
            if not command:
                raise ValueError("the job has no command")
            env = job_env(job, ranked[0])
        except ValueError as exc:  # bad input: fail it with the reason, never launch it
            self._fail(job, migrator, f"the job cannot be launched: {exc}")
            return
        migrator.register_job(job.id, command, uri, env=env, image=job.spec.get("image") or None)
        self._ranked[job.id] = {p.offer: p for p in ranked}
        offers = [p.offer for p in ranked]
        if job.state is JobState.QUEUED:
            try:
                job = self._to(
                    job,
                    JobState.LAUNCHING,
                    f"launching on {len(offers)} offer(s), best {offers[0]}",
                    detail={"candidates": [o.to_doc() for o in offers], "checkpoint_uri": uri},
                )
            except (ConcurrentUpdate, IllegalTransition) as exc:  # moved on since this tick read it (_to)
                log.warning("engine: job %s: launched by another engine meanwhile (%s); left to it", job.id, exc)
                return
            if job.state is not JobState.LAUNCHING:  # finished or cancelled meanwhile: nothing to start
                return
        self._submit(job.id, lambda: migrator.start(job.id, offers))

    def _launch_failed(self, job: JobRecord, migrator: Migrator, reason: str, mig: MigrationRecord | None) -> None:
        detail: dict[str, Any] = {"migration_id": mig.id} if mig is not None else {}
        n = len(self._events(job.id, "launch_failed")) + 1
        detail["attempt"] = n
        self.repo.add_event(job.id, "launch_failed", reason, detail=detail, at=self.now())
        log.warning("engine: job %s: launch attempt %d failed: %s", job.id, n, reason)
        if n >= self.launch_attempts:
            reasons = [e.reason for e in self._events(job.id, "launch_failed")]
            why = f"launched nowhere after {n} attempt(s): " + " | ".join(reasons)
            self._fail(job, migrator, why[:4000], detail={"refusals": reasons})

    # launching, running, migrating, recovering.
    def _active(self, job: JobRecord, migrator: Migrator, snap: _Snapshot, *, first: bool) -> None:
        mj = snap.jobs.get(job.id)
        if mj is None:  # crashed between the transition and the registration
            if job.state is JobState.LAUNCHING:
                if job.cancel_requested_at is not None:
                    self._to(job, JobState.CANCELLED, "cancelled before launch")
                else:
                    self._launch(job, migrator)
                return
            raise EngineError(f"job {job.id} is {job.state.value} but its migrator does not know it")
        active = snap.active.get(job.id)
        last = snap.last_migration.get(job.id)
        unseen = last is not None and self._history_mark.get(job.id) != last
        if (active is not None or unseen) and self._record_history(job, migrator):
            job = self.repo.get(job.id)  # failed by a lost copy's exit (events alone leave its row as read)
        if job.state.terminal:
            return
        prog = self._follow_progress(job, migrator, mj)
        if active is not None:
            if first or job.id in self._orphaned:
                self._orphaned.discard(job.id)
                log.warning("engine: resuming migration %d of job %s", active.id, job.id)
                self._submit(job.id, lambda: migrator.resume(job.id))
            want = JobState.MIGRATING if active.kind is Kind.MOVE else JobState.RECOVERING
            if active.kind is Kind.RECOVER and active.from_epoch == 0:
                want = JobState.LAUNCHING
                if job.state is JobState.RUNNING:  # the start ran it after this tick's snapshot was read
                    return  # (the soak's log, load 15-24): the next tick reads both afresh
            if job.state is not want and not (job.state is JobState.LAUNCHING and want is JobState.RECOVERING):
                self._to(job, want, f"{active.kind.value} {active.id} in flight")
            return
        if mj.status is JobStatus.FINISHED:
            self._finished_by_migrator(job, migrator, mj, prog)
            return
        if prog is not None and prog.done:
            self._done(job, migrator, mj, prog)
            return
        if job.cancel_requested_at is not None:
            self._cancel(job, migrator, mj)
            return
        if mj.status is JobStatus.PENDING:  # registered, never started (a crash before the start)
            self._launch(job, migrator)
            return
        if mj.status is JobStatus.RECOVERING:
            self._recovering(job, migrator, mj)
            return
        if mj.status is JobStatus.RUNNING:
            self._running(job, migrator, mj, progressed=self._progressed(job.id, mj, prog))

    def _running(self, job: JobRecord, migrator: Migrator, mj: MigratorJob, *, progressed: bool = False) -> None:
        assert mj.instance_id is not None
        if progressed and job.state is JobState.RUNNING and job.offer == mj.offer:
            return  # it reported new steps since the last look: alive, no call to the cloud needed
        inst = self._describe(migrator, mj.instance_id)
        if inst is not None and inst.state in ALIVE_STATES:
            if job.state is not JobState.RUNNING or job.offer != mj.offer:
                self._to_running(job, migrator, mj)
            return
        if inst is not None and inst.state is InstanceState.PREEMPTED:
            if job.state is not JobState.RECOVERING:
                self._to(
                    job,
                    JobState.RECOVERING,
                    f"copy {mj.instance_id} preempted; the interruption watcher recovers it",
                    detail={"instance_id": mj.instance_id, "offer": _offer_doc(mj.offer)},
                )
            return
        # Ended without a preemption, the job not done. Decide on fresh rows (the tick's snapshot may predate a
        # move another process just finished, whose old copy is the one found gone).
        fresh = self._migrator_job(migrator, job.id)
        if fresh is None or fresh.instance_id != mj.instance_id or migrator.active_migration(job.id) is not None:
            return
        code = self._exit_code(migrator, mj.instance_id, inst)
        if code is not None and code not in RESUMABLE_EXIT_CODES:
            self._fail_exit(job, migrator, mj.instance_id, code)
            return
        lost = self._events(job.id, "copy_lost")
        if len(lost) >= self.launch_attempts:
            self._fail(job, migrator, f"the job's copies ended {len(lost)} time(s) without finishing it")
            return
        offers = self.recovery_offers(job, mj)
        if not offers:
            raise EngineError(f"job {job.id}: no offer to recover it on")
        mig = migrator.plan(job.id, offers, Kind.RECOVER)
        self._record_history(job, migrator)
        self._to(
            self.repo.get(job.id),
            JobState.RECOVERING,
            f"copy {mj.instance_id} ended (exit code {code if code is not None else 'unknown'}) before the job "
            "finished: recovering from the last checkpoint",
            detail={"migration_id": mig.id, "exit_code": code},
        )
        self._submit(job.id, lambda: migrator.run(mig.id))

    def _recovering(self, job: JobRecord, migrator: Migrator, mj: MigratorJob) -> None:
        """The migrator's job needs a new copy (a rolled-back start or recovery, or the reconciler's mark)."""
        history = migrator.history(job.id)
        last = history[-1] if history else None
        if job.state is JobState.LAUNCHING:
            # The start rolled back: its launch failed everywhere, or its copy did not progress.
            if (
                last is not None
                and last.state is State.ROLLED_BACK
                and not self._recorded(job.id, "launch_failed", last.id)
            ):
                if self._failed_copy(job, migrator, last.new_instance_id):
                    return
                self._launch_failed(job, migrator, last.reason, last)
                if self.repo.get(job.id).state.terminal:
                    return
            self._launch(self.repo.get(job.id), migrator)
            return
        if job.state is not JobState.RECOVERING:
            job = self._to(job, JobState.RECOVERING, mj.reason or "the copy was lost: waiting for a recovery")
        failed = 0
        for mig in reversed(history):
            if mig.state is State.DONE:
                break
            if mig.kind is Kind.RECOVER and mig.state is State.ROLLED_BACK:
                failed += 1
        if failed >= self.launch_attempts:
            reasons = [m.reason for m in history[-failed:]]
            self._fail(
                job,
                migrator,
                f"recovered nowhere after {failed} attempt(s): " + " | ".join(reasons),
                detail={"refusals": reasons},
            )

    # -- outcomes ------------------------------------------------------------------------------------

    def _to_running(self, job: JobRecord, migrator: Migrator, mj: MigratorJob) -> JobRecord:
        offer = mj.offer
        price = self._price(job, offer) if offer is not None else None
        latest = migrator.latest_migration(job.id)
        mid = latest.id if latest is not None else None
        if job.state is JobState.RUNNING:
            # Recovered (or moved) between two ticks: the events say so; only the placement changes.
            return self.repo.update(job.id, offer=offer, usd_per_hour=price)
        what = "started" if job.state is JobState.LAUNCHING else "running"
        if job.state is JobState.RECOVERING:
            what = "recovered"
        elif job.state is JobState.MIGRATING:
            what = "moved" if latest is not None and latest.state is State.DONE else "move rolled back"
        return self._to(
            job,
            JobState.RUNNING,
            f"{what} on {offer} ({mj.instance_id}, epoch {mj.epoch})",
            detail={
                "migration_id": mid,
                "instance_id": mj.instance_id,
                "epoch": mj.epoch,
                "offer": _offer_doc(offer),
                "usd_per_hour": str(price) if price is not None else None,
            },
            offer=offer,
            usd_per_hour=price,
        )

    def _after_migration(self, job: JobRecord, migrator: Migrator) -> None:
        """Map the migrator's job after a migration this call drove (a move) to the job's state."""
        mj = migrator.job(job.id)
        if mj.status is JobStatus.RUNNING and not job.state.terminal:
            self._to_running(job, migrator, mj)
        elif mj.status is JobStatus.RECOVERING and job.state is not JobState.RECOVERING and not job.state.terminal:
            self._to(job, JobState.RECOVERING, mj.reason or "the move left the job without a copy")

    def _done(self, job: JobRecord, migrator: Migrator, mj: MigratorJob, prog: Any) -> None:
        uri = self.checkpoint_uri(job)
        if prog.last_step != job.steps_total:
            self._fail(job, migrator, f"the job reported done at step {prog.last_step}, not {job.steps_total}")
            return
        if job.state is JobState.LAUNCHING:  # finished before a tick saw it run: it ran
            job = self._to_running(job, migrator, mj)
        audit = control.audit_job(uri, job.steps_total)
        # the finishing copy's exit code (None: the provider does not know it), read before it is terminated
        iid = mj.instance_id
        code = self._exit_code(migrator, iid, self._describe(migrator, iid)) if iid is not None else None
        self._finish_copy(migrator, job.id, f"{_FINISHED_BY_ENGINE} succeeded")
        self.repo.set_progress(job.id, job.steps_total)
        self._to(
            self.repo.get(job.id),
            JobState.SUCCEEDED,
            f"finished: {job.steps_total} steps",
            **({"exit_code": code} if code is not None else {}),
            detail={
                "audit": {
                    k: audit.to_dict()[k]
                    for k in ("steps_done", "lost_steps", "repeated_steps", "wasted_steps", "runs", "ok")
                }
            },
        )

    def _finished_by_migrator(self, job: JobRecord, migrator: Migrator, mj: MigratorJob, prog: Any) -> None:
        """The migrator's job is finished while the job is still active: the reconciler or a move saw the
        copy finish, or this engine crashed between finishing the copy and writing the job's state."""
        if prog is not None and prog.done and prog.last_step == job.steps_total:
            self._done(job, migrator, mj, prog)
        elif job.cancel_requested_at is not None:
            self._finish_copy(migrator, job.id, f"{_FINISHED_BY_ENGINE} cancelled")
            self._to(job, JobState.CANCELLED, "cancelled by the team")
        else:
            why = mj.reason.removeprefix(_FINISHED_BY_ENGINE).strip() or "the job's migrator finished it"
            self._fail(job, migrator, why)

    def _cancel(self, job: JobRecord, migrator: Migrator, mj: MigratorJob) -> None:
        uri = self.checkpoint_uri(job)
        alive = False
        if mj.instance_id is not None:
            inst = self._describe(migrator, mj.instance_id)
            alive = inst is not None and inst.state in ALIVE_STATES
        reason = "cancelled by the team"
        if alive:
            rid = f"{CANCEL_PREFIX}-{job.id}-e{mj.epoch}"[:64]
            if not self._events(job.id, "checkpoint_requested"):
                control.request_checkpoint(
                    uri, epoch=mj.epoch, request_id=rid, reason="cancelled by the team", at=self.clock().timestamp()
                )
                self.repo.add_event(
                    job.id,
                    "checkpoint_requested",
                    "cancel: checkpoint before terminating",
                    detail={"request_id": rid, "epoch": mj.epoch},
                    at=self.now(),
                )
            served = control.request_served(uri, rid)
            started = job.cancel_requested_at or self.now()
            if not served and self.now() < started + timedelta(seconds=self.cancel_timeout):
                return  # wait for the checkpoint (next tick)
            info = control.latest(uri)
            if served and info is not None:
                reason = f"cancelled by the team; checkpointed at step {info.step}"
            else:
                reason = f"cancelled by the team; no checkpoint within {self.cancel_timeout:g} s"
        self._finish_copy(migrator, job.id, f"{_FINISHED_BY_ENGINE} cancelled")
        self._to(self.repo.get(job.id), JobState.CANCELLED, reason)

    def _fail_exit(self, job: JobRecord, migrator: Migrator, instance_id: str, code: int) -> None:
        tail = self._output(migrator, instance_id)
        last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "") if tail else ""
        why = f"the command exited with code {code} on {instance_id}" + (f": {last[:300]}" if last else "")
        self._fail(job, migrator, why, exit_code=code, detail={"instance_id": instance_id, "output": tail or None})

    def _failed_copy(self, job: JobRecord, migrator: Migrator, instance_id: str | None) -> bool:
        """Fail the job when ``instance_id`` (a copy that ended) exited with a non-resumable code."""
        if instance_id is None:
            return False
        code = self._exit_code(migrator, instance_id, self._describe(migrator, instance_id))
        if code is None or code in RESUMABLE_EXIT_CODES:
            return False
        self._fail_exit(job, migrator, instance_id, code)
        return True

    def _fail(
        self,
        job: JobRecord,
        migrator: Migrator,
        reason: str,
        *,
        exit_code: int | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        if self._migrator_job(migrator, job.id) is not None:
            self._finish_copy(migrator, job.id, f"{_FINISHED_BY_ENGINE} {reason}"[:2000])
        fields: dict[str, Any] = {}
        if exit_code is not None:
            fields["exit_code"] = exit_code
        self._to(self.repo.get(job.id), JobState.FAILED, reason[:4000], detail=detail, **fields)

    def _finish_copy(self, migrator: Migrator, job_id: str, reason: str) -> None:
        """Finish the migrator's job (:meth:`Migrator.finish`: neither the watcher nor the reconciler recovers
        it), terminate its copy (idempotent), and close the copy's interval the migrator's way (a reconciler
        pass over this job alone closes its copies found gone, with the provider's end time, and syncs its
        ledger lines; the whole pass, once per finished job, grew with the history: the soak, session 11)."""
        migrator.finish(job_id, reason)
        mj = migrator.job(job_id)
        if mj.instance_id is not None:
            migrator.provider.terminate(mj.instance_id)
        migrator.reconcile(job_id)

    # -- events from the migrator's history ------------------------------------------------------------

    def _record_history(self, job: JobRecord, migrator: Migrator) -> bool:
        """Record, once each, the preemptions, recoveries and moves the migrator ran for the job (keyed by
        migration id: a restarted engine records nothing twice). True when it failed the job (a lost copy's
        exit code): the caller re-reads the job; events alone leave the job's row as it was read.

        Reads the history and the job's events; the copies (and the cloud, for a loss's kind) only when there
        is something to record, so a tick during a recovery that is recorded already costs two reads."""
        done = self._history_done.get(job.id, 0)
        history = migrator.history(job.id, after_id=done)  # the migrations before are recorded and final
        if not history:
            return False
        if all(m.finished for m in history) and self._history_mark.get(job.id) == history[-1].id:
            return False  # nothing new since the last look
        seen = self._seen(job.id)
        read: list[list[CopyRecord]] = []

        def copies() -> list[CopyRecord]:  # the copies these migrations name (a job may have hundreds)
            if not read:
                ids = {i for m in history for i in (m.old_instance_id, m.new_instance_id) if i is not None}
                read.append(migrator.copies(job.id, instance_ids=ids))
            return read[0]

        for mig in history:
            if mig.kind is Kind.RECOVER and mig.from_epoch >= 1:
                if ("preemption", mig.id) not in seen and ("copy_lost", mig.id) not in seen:
                    lost_kind = self._lost_kind(migrator, mig, copies())
                    self._record_loss(job, migrator, mig, lost_kind, copies())
                    if lost_kind == "copy_lost" and self._failed_copy(
                        self.repo.get(job.id), migrator, mig.old_instance_id
                    ):
                        return True
                if mig.state is State.DONE and ("recovery", mig.id) not in seen:
                    self.repo.add_event(
                        job.id,
                        "recovery",
                        f"recovered on {mig.offers[mig.offer_index]} (epoch {mig.to_epoch})",
                        cost_usd=_total(self._migration_cost(job.id, mig, copies())),
                        detail={
                            "migration_id": mig.id,
                            "instance_id": mig.new_instance_id,
                            "epoch": mig.to_epoch,
                            "from": _offer_doc(self._copy_offer(copies(), mig.old_instance_id)),
                            "to": mig.offers[mig.offer_index].to_doc(),
                        },
                        at=self.now(),
                    )
                elif mig.state is State.ROLLED_BACK and ("recovery_failed", mig.id) not in seen:
                    self.repo.add_event(
                        job.id, "recovery_failed", mig.reason, detail={"migration_id": mig.id}, at=self.now()
                    )
            elif (
                mig.kind is Kind.MOVE
                and mig.finished
                and ("move", mig.id) not in seen
                and ("move_rolled_back", mig.id) not in seen
            ):
                self._record_move(job, migrator, mig, reason=f"moved (migration {mig.id})", expected=None)
        for mig in history:  # every finished migration of the prefix is recorded now: never read again
            if not mig.finished:
                break
            done = mig.id
        self._history_done[job.id] = done
        if all(m.finished for m in history):
            self._history_mark[job.id] = history[-1].id
        return False

    def _record_move(
        self, job: JobRecord, migrator: Migrator, mig: MigrationRecord, *, reason: str, expected: Decimal | None
    ) -> None:
        ids = {i for i in (mig.old_instance_id, mig.new_instance_id) if i is not None}
        copies = migrator.copies(job.id, instance_ids=ids)
        src = self._copy_offer(copies, mig.old_instance_id)
        if mig.state is State.DONE:
            cost = self._migration_cost(job.id, mig, copies)
            detail: dict[str, Any] = {}
            if cost is not None:
                detail = {
                    "egress_usd": str(cost.egress),
                    "overlap_usd": str(cost.overlap),
                    "restart_usd": str(cost.restart),
                    "cost_known": cost.known,
                }
            detail.update(
                {
                    "migration_id": mig.id,
                    "from": _offer_doc(src),
                    "to": mig.offers[mig.offer_index].to_doc(),
                    "expected_saving_usd": str(expected) if expected is not None else None,
                }
            )
            self.repo.add_event(job.id, "move", reason, cost_usd=_total(cost), detail=detail, at=self.now())
        else:
            self.repo.add_event(
                job.id,
                "move_rolled_back",
                f"{reason}: rolled back: {mig.reason}",
                detail={
                    "migration_id": mig.id,
                    "from": _offer_doc(src),
                    "candidates": [o.to_doc() for o in mig.offers],
                    "expected_saving_usd": str(expected) if expected is not None else None,
                },
                at=self.now(),
            )

    def _record_loss(
        self, job: JobRecord, migrator: Migrator, mig: MigrationRecord, kind: str, copies: Sequence[CopyRecord]
    ) -> None:
        uri = self.checkpoint_uri(job)
        prog = control.progress(uri, mig.from_epoch)
        saved = max((*prog.checkpoints, prog.restored_step), default=0)
        lost_steps = max(0, prog.last_step - saved) if prog.started else None
        offer = self._copy_offer(copies, mig.old_instance_id) or job.offer
        cost = None
        if lost_steps is not None and offer is not None:
            cost = self._lost_work_usd(job, offer, lost_steps)
        what = "preempted" if kind == "preemption" else "lost"
        self.repo.add_event(
            job.id,
            kind,
            f"copy {mig.old_instance_id} (epoch {mig.from_epoch}) {what}"
            + (f"; {lost_steps} step(s) since the last checkpoint lost" if lost_steps is not None else ""),
            cost_usd=cost,
            detail={
                "migration_id": mig.id,
                "instance_id": mig.old_instance_id,
                "epoch": mig.from_epoch,
                "from": _offer_doc(offer),
                "lost_steps": lost_steps,
            },
            at=self.now(),
        )

    def _lost_work_usd(self, job: JobRecord, offer: OfferKey, lost_steps: int) -> Decimal | None:
        """The lost steps valued at the copy's price over the time they took (None: throughput unknown)."""
        try:
            p = self.placements.at_offer(job, offer, remaining_steps=float(lost_steps), at=self.now())
        except (CostoptError, ValueError, LookupError):
            return None
        if p is None or p.steps_per_s <= 0:
            return None
        hours = Decimal(repr(lost_steps / p.steps_per_s / 3600.0))
        return (hours * Decimal(repr(p.usd_per_hour))).quantize(Decimal("0.000001"))

    def _lost_kind(self, migrator: Migrator, mig: MigrationRecord, copies: Sequence[CopyRecord]) -> str:
        old = next((c for c in copies if c.instance_id == mig.old_instance_id and c.epoch == mig.from_epoch), None)
        if old is not None and old.end_reason is not None:
            return "preemption" if old.end_reason == "preempted" else "copy_lost"
        if mig.old_instance_id is not None:
            inst = self._describe(migrator, mig.old_instance_id)
            if inst is not None and inst.state is InstanceState.PREEMPTED:
                return "preemption"
        return "copy_lost"

    def _migration_cost(self, job_id: str, mig: MigrationRecord, copies: Sequence[CopyRecord]) -> MigrationCost | None:
        """The migration's cost from the ledger's charge lines (None: no ledger, or its charges unreadable)."""
        keys = self._keys(mig, copies)
        charges = self._charges(job_id, migration_charge_keys(job_id, mig.id, keys))
        return migration_cost(charges, job_id, mig.id, keys) if charges is not None else None

    def _charges(self, job_id: str, keys: Sequence[str]) -> Sequence[Any] | None:
        """The job's charge lines with these keys (all of the job's when the ledger cannot pick)."""
        if self.ledger is None:
            return None
        try:
            by_key = getattr(self.ledger, "charges_by_key", None)
            if by_key is not None:
                lines: Sequence[Any] = by_key(keys)
                return lines
            return job_charges(self.ledger, job_id)
        except (LedgerError, TypeError) as exc:
            log.warning("engine: cannot read the charges of job %s: %s", job_id, exc)
            return None

    @staticmethod
    def _keys(mig: MigrationRecord, copies: Sequence[CopyRecord]) -> CopyKeys:
        old = next((c for c in copies if c.instance_id == mig.old_instance_id and c.epoch == mig.from_epoch), None)
        new = next((c for c in copies if c.instance_id == mig.new_instance_id and c.epoch == mig.to_epoch), None)
        return CopyKeys(old.interval_key if old else None, new.interval_key if new else None)

    @staticmethod
    def _copy_offer(copies: Sequence[CopyRecord], instance_id: str | None) -> OfferKey | None:
        return next((c.offer for c in copies if c.instance_id == instance_id), None) if instance_id else None

    # -- helpers ---------------------------------------------------------------------------------------

    def _to(self, job: JobRecord, to: JobState, reason: str, **kwargs: Any) -> JobRecord:
        """Change the job's state (compare-and-set from the state it was read in). Another writer that got
        there first (already in ``to``, or finished) is not an error: the fresh record is returned. The
        write is tried again on the fresh record when only the row's version moved (same state), or when
        ``to`` ends the job (cancel, fail: whatever state it reached); a job another writer moved to a third
        state was decided on a stale read: :class:`ConcurrentUpdate`, a race the next tick looks at afresh."""
        try:
            done = self.repo.transition(job.id, to, reason, expect=job.state, **kwargs)
        except (ConcurrentUpdate, IllegalTransition) as exc:
            done = self.repo.get(job.id)
            if done.state is not to and not done.state.terminal:
                if done.state is not job.state and not to.terminal:
                    raise ConcurrentUpdate(
                        f"job {job.id} is {done.state.value} now, read as {job.state.value}: not moved to {to.value}"
                    ) from exc
                done = self.repo.transition(job.id, to, reason, expect=done.state, **kwargs)
        self._moved[job.id] = done.state
        return done

    def _submit(self, job_id: str, fn: Callable[[], Any]) -> None:
        """Run one migration step of the job in a worker (at most one per job), or inline without workers."""
        if self._pool is None:
            try:
                fn()
            except (CostoptError, CloudError, OSError, ValueError) as exc:
                self._orphaned.add(job_id)
                _log_failure(f"engine: job {job_id}: migration step", exc)
                self.repo.add_event(job_id, "engine_error", f"{type(exc).__name__}: {exc}"[:2000], at=self.now())
            except Exception:  # e.g. the database went away: the tick stops, the next one resumes the step
                self._orphaned.add(job_id)
                raise
            return
        with self._work_lock:
            fut = self._work.get(job_id)
            if fut is not None and not fut.done():
                return
            # counted by a lockstep clock (the kill drill's stepped simulated clock) when one drives the service
            self._work[job_id] = clock_submit(self._pool, fn, capacity=self._workers)

    def _follow_progress(self, job: JobRecord, migrator: Migrator, mj: MigratorJob | None = None) -> Any:
        mj = mj or self._migrator_job(migrator, job.id)
        if mj is None or mj.epoch < 1:
            return None
        prog = control.progress(mj.checkpoint_uri, mj.epoch)
        if prog.last_step > job.steps_done:
            self.repo.set_progress(job.id, min(prog.last_step, job.steps_total))
        if self.progress_observer is not None:
            self.progress_observer(job, mj, prog)
        return prog

    def _progressed(self, job_id: str, mj: MigratorJob, prog: Any) -> bool:
        """True when the job's current copy reported steps beyond those seen at the previous look."""
        if prog is None:
            return False
        mark = (mj.epoch, int(prog.last_step))
        before = self._seen_steps.get(job_id)
        self._seen_steps[job_id] = mark
        return before is not None and before[0] == mark[0] and mark[1] > before[1]

    @staticmethod
    def _migrator_job(migrator: Migrator, job_id: str) -> MigratorJob | None:
        try:
            return migrator.job(job_id)
        except MigrationError:
            return None

    def _event_log(self, job_id: str) -> _EventLog:
        """The job's events, all of them (page after page), reading only those written since the last
        call (events are only ever added). The events that name a migration are written by this engine's
        tick, or by :meth:`move` while the tick leaves the job alone (:meth:`busy`); a move drops the job's
        log when it ends, so an event of it committed after a newer one (PostgreSQL ids) is read again."""
        log_ = self._event_logs.get(job_id)
        if log_ is None:
            log_ = self._event_logs[job_id] = _EventLog()
        while True:
            new = self.repo.events(job_id, after_id=log_.last_id, limit=MAX_PAGE)
            for e in new:
                log_.events.append(e)
                mid = (e.detail or {}).get("migration_id")
                if isinstance(mid, int):
                    log_.keys.add((e.kind, mid))
                log_.last_id = max(log_.last_id, e.id)
            if len(new) < MAX_PAGE:
                return log_

    def _events(self, job_id: str, kind: str) -> list[JobEvent]:
        return [e for e in self._event_log(job_id).events if e.kind == kind]

    def _recorded(self, job_id: str, kind: str, migration_id: int) -> bool:
        return (kind, migration_id) in self._seen(job_id)

    def _seen(self, job_id: str) -> set[tuple[str, int]]:
        """``(kind, migration id)`` of the job's events that name a migration (all of them: a job preempted
        a hundred times has more events than one page)."""
        return set(self._event_log(job_id).keys)

    def _backoff(self, failures: int) -> timedelta:
        return timedelta(seconds=min(self.retry_cap, self.retry_base * 2 ** max(0, failures - 1)))

    def _price(self, job: JobRecord, offer: OfferKey) -> Decimal | None:
        """The whole-instance price of the job on ``offer``: the ranked placement it was started or moved
        with, else the planner's price now (None: unknown)."""
        ranked = self._ranked.get(job.id, {}).get(offer)
        if ranked is not None:
            return _usd(ranked.usd_per_hour)
        try:
            p = self.placements.at_offer(
                job, offer, remaining_steps=float(max(0, job.steps_total - job.steps_done)), at=self.now()
            )
        except (CostoptError, ValueError, LookupError):
            return None
        return _usd(p.usd_per_hour) if p is not None else None

    def recovery_offers(self, job: JobRecord, mj: MigratorJob) -> list[OfferKey]:
        """Where to recover ``job`` (its migrator record ``mj``): its ranked placements for the remaining
        steps, then the offer it ran on as a last resort; empty when there is none."""
        try:
            ranked = list(
                self.placements.rank(
                    job, remaining_steps=job.steps_total - job.steps_done, at=self.now(), top=self.rank_top
                )
            )
        except (CostoptError, ValueError, LookupError) as exc:
            log.warning("engine: job %s: no ranked placements for a recovery: %s", job.id, exc)
            ranked = []
        self._ranked[job.id] = {p.offer: p for p in ranked}
        offers = [p.offer for p in ranked]
        if mj.offer is not None and mj.offer not in offers:
            offers.append(mj.offer)  # where it ran, as a last resort
        return offers

    @staticmethod
    def _describe(migrator: Migrator, instance_id: str) -> Instance | None:
        try:
            return migrator.provider.describe(instance_id)
        except NotFoundError:
            return None

    @staticmethod
    def _exit_code(migrator: Migrator, instance_id: str, inst: Instance | None) -> int | None:
        """The copy's exit code (:attr:`Instance.exit_code`; None: unknown, or killed without one)."""
        return inst.exit_code if inst is not None else None

    def _output(self, migrator: Migrator, instance_id: str) -> str:
        try:
            text = migrator.provider.output(instance_id, tail=self.output_tail)
        except (CloudError, OSError, ValueError) as exc:
            log.warning("engine: cannot read the output of %s: %s", instance_id, exc)
            return ""
        return str(text or "")
