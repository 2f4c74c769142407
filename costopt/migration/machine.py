"""The migration execution state machine (:class:`Migrator`): move one job, or recover it, persisted
and crash-safe.

A move goes through::

    planned -> checkpointing -> checkpointed -> launching -> launched -> verifying -> terminating_old -> done

and a failure ends it in ``rolled_back`` with a reason (the job keeps running on its old copy, or is
marked ``recovering`` when the old copy can no longer run). A recovery (after a preemption: the old
copy is gone) skips the checkpoint request: ``planned`` terminates whatever is left of the old copy
(idempotent) and goes straight to ``checkpointed``: the new epoch restores the last checkpoint.

Every state is a row in ``migrations`` (:mod:`costopt.db.migration_schema`; the records, states and
keys are in :mod:`costopt.migration.records`); every transition is a compare-and-set on that row,
committed *before* the next side effect, and every side effect is idempotent, so
:meth:`Migrator.resume` continues from whatever state a crash left. Two states are passed through in
the transition that follows them, not written on their own (one compare-and-set instead of two, nothing
learned left uncommitted): ``checkpointed`` (nothing happens in it but choosing the launch token, which
is derived from the row: ``checkpointing``/``planned`` -> ``launching`` is one commit, with the old
copy's end) and ``launched`` (``launching`` -> ``verifying`` is one commit after the launch returned and
the epoch was claimed: a crash before it launches again with the stored token and gets the same
instance). A row left in one of them by an older version is still resumed from it:

- ``planned``: the checkpoint request id is stored in the row; repeating the request is a no-op for
  the agent;
- ``launching``: the idempotency token (job id + epoch + attempt) is stored before ``launch`` is
  called; a crash after ``launch`` returned but before the instance id was saved calls ``launch``
  again with the same token, and the provider returns the same instance. Before a new attempt (next
  offer) every instance left by an earlier attempt of the same epoch is terminated, so an ambiguous
  failure never leaves two copies of one epoch;
- ``launched`` (passed through): :func:`costopt.agent.control.claim_epoch` (idempotent) raises the fencing
  marker; the new copy's id and start are written in the same transaction the job's epoch and instance
  move to the new copy. From then on the old copy cannot publish a checkpoint (the agent's fencing), so
  two copies never both write;
- ``verifying``: the new copy restored and is progressing (``control.progress(uri, epoch)``);
- ``terminating_old``: ``terminate`` is idempotent.

The epoch is claimed only *after* a successful launch, so a move whose launches all fail leaves the
old copy running, unfenced: that is the rollback. A new copy that does not progress is terminated and
the job is marked ``recovering`` (its old copy is fenced by then).

Billing (optional ``ledger``): every copy's facts (launch, end and its reason, verification) are
written to ``migration_copies`` in the same transaction as the transition that learned them, then synced
to the ledger after every transition that wrote one, on :meth:`Migrator.resume` and by the reconciler
(:mod:`costopt.migration.ledger_sync`). A ledger failure never stops a migration.

Unavailable offers (optional ``unavailable``, :mod:`costopt.migration.unavailable`): a launch refused
for capacity or quota marks its offer; a copy found preempted marks its offer. A plan skips offers
marked unavailable (a recovery keeps them at the end as a last resort); when every candidate is
marked, they are all tried anyway, in order, and the migration's reason says so.

The reconciler is :mod:`costopt.migration.reconcile`.

Fault injection: ``hook(point)`` is called after each committed transition (``"enter:<state>"``; of
the states passed through, ``checkpointed`` after the commit to ``launching``, before its hook, and
``launched`` right after ``"launch:returned"``, before the epoch is claimed), right after ``launch``
returned (``"launch:returned"``), and right after each ledger write, before its
flag is committed (``"ledger:opened"``, ``"ledger:closed"``). The default hook SIGKILLs this process
when ``COSTOPT_MIGRATOR_KILL_AT`` names the point (the crash tests run the migrator in a subprocess).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from costopt.agent import control
from costopt.agent.contract import contract_env
from costopt.agent.errors import StaleEpoch
from costopt.cloud import (
    HELD_STATES,
    CloudError,
    CloudProvider,
    InstanceState,
    LaunchSpec,
    ProviderConfigError,
)
from costopt.db.inlist import InList
from costopt.db.migration_schema import migration_jobs, migrations
from costopt.domain import OfferKey
from costopt.ledger.book import Ledger
from costopt.migration.ledger_sync import (
    LedgerSync,
    copies,
    copy_end,
    describe_or_none,
    end_reason_of,
    mark_preempted,
    sync_ledger,
    write_copy_end,
    write_copy_start,
    write_verified,
)
from costopt.migration.reconcile import ReconcileReport, reconcile
from costopt.migration.records import (
    ALIVE_STATES,
    TAG_EPOCH,
    TAG_JOB,
    ConcurrentTransition,
    CopyEnd,
    CopyRecord,
    CopyStart,
    EndReason,
    JobFinished,
    JobRecord,
    JobStatus,
    Kind,
    MigrationError,
    MigrationRecord,
    State,
    active_condition,
    job_tags,
    launch_token,
    request_id,
)
from costopt.migration.unavailable import UnavailableOffers, reason_for_launch_error
from costopt.planning.model import DEFAULT_EGRESS, EgressRates

log = logging.getLogger("costopt.migration.machine")

ENV_KILL_AT = "COSTOPT_MIGRATOR_KILL_AT"


def env_kill_hook(point: str) -> None:
    """SIGKILL this process at the point named by ``COSTOPT_MIGRATOR_KILL_AT`` (fault injection)."""
    if os.environ.get(ENV_KILL_AT) == point:
        log.warning("fault injection: SIGKILL at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# The hot statements, built once: SQLAlchemy memoizes a statement object's cache key, so reusing the same
# object skips both the construction and the key generation on every call (bound values are parameters).
_MJ = migration_jobs.c
_M = migrations.c
_JOB = select(migration_jobs).where(_MJ.job_id == bindparam("b_job_id"))
_JOBS = select(migration_jobs).order_by(_MJ.job_id)
_JOBS_IN = InList(_JOBS.where, _MJ.job_id, "b_ids")
"""The jobs among some ids (a tick's active jobs; a statement per list length)."""
_SET_JOB = update(migration_jobs).where(_MJ.job_id == bindparam("b_job_id"))
"""Executed with the columns to set as parameters (the SET clause is the parameters' keys)."""
_SET_JOB_RETURNING = _SET_JOB.returning(*migration_jobs.c)
_FINISH = (
    update(migration_jobs)
    .where(_MJ.job_id == bindparam("b_job_id"), _MJ.status != JobStatus.FINISHED.value)
    .values(status=JobStatus.FINISHED.value)
)
_MIGRATION = select(migrations).where(_M.id == bindparam("b_id"))
_ACTIVE_OF = select(migrations).where(_M.job_id == bindparam("b_job_id"), active_condition()).order_by(_M.id)
_ACTIVE = select(migrations).where(active_condition()).order_by(_M.id)
_HISTORY = select(migrations).where(_M.job_id == bindparam("b_job_id"), _M.id > bindparam("b_after")).order_by(_M.id)
_LATEST = select(migrations).where(_M.job_id == bindparam("b_job_id")).order_by(_M.id.desc()).limit(1)
_TRANSITION = (
    update(migrations).where(_M.id == bindparam("b_id"), _M.state == bindparam("b_state")).returning(*migrations.c)
)
"""Compare-and-set of a migration's state; the columns to set are the parameters besides ``b_*``."""
_PLAN = insert(migrations).returning(*migrations.c)


def _gb(value: float | Decimal | None) -> Decimal | None:
    if value is None:
        return None
    dec = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
    if not dec.is_finite() or dec < 0:
        raise MigrationError(f"checkpoint_gb must be a finite number of GB >= 0, got {value!r}")
    return dec


@dataclass(slots=True)
class Migrator:
    """Runs moves and recoveries of jobs on one provider, persisted in ``engine``.

    - ``checkpoint_timeout``: how long the old copy has to answer the checkpoint request;
    - ``verify_timeout``: how long the new copy has to restore and progress;
    - ``poll_seconds``: how often a waiting step looks again (each look describes an instance at the cloud
      and reads the latest checkpoint's record; drills and tests on this machine use 0.05 s);
    - ``backoff``: seconds before the n-th retry on another offer: ``min(cap, base * 2**n)``;
    - ``hook``: fault-injection hook (see the module doc);
    - ``ledger``: where each copy's interval and each move's charges are recorded (None: not billed;
      the service passes a :class:`~costopt.ledger.sql.SqlLedger`, which prices intervals at close);
    - ``unavailable``: the unavailable-offers cache (None: no offer is skipped or marked);
    - ``egress``: USD/GB rates of a move's checkpoint (the egress charge, when a move gives its size).
    """

    engine: Engine
    provider: CloudProvider
    checkpoint_timeout: float = 60.0
    verify_timeout: float = 60.0
    poll_seconds: float = 2.0
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], datetime] = _utcnow
    hook: Callable[[str], None] = env_kill_hook
    image: str | None = None
    ledger: Ledger | None = None
    unavailable: UnavailableOffers | None = None
    egress: EgressRates = field(default_factory=lambda: DEFAULT_EGRESS)
    _running: dict[str, JobRecord] = field(default_factory=dict, init=False, repr=False, compare=False)
    """The job record of each migration :meth:`run` drives now, as its own transitions last wrote it (read
    once per run, not once per step; dropped when the run returns)."""

    # -- jobs ------------------------------------------------------------------------------------------

    def register_job(
        self,
        job_id: str,
        command: Sequence[str],
        checkpoint_uri: str,
        *,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
    ) -> JobRecord:
        """Register a job (idempotent: an existing job is returned unchanged, also when another process
        registers it between this one's read and its insert). ``image``: what every copy launches (None: the
        migrator's ``image``, else the provider's default)."""
        try:
            with self.engine.begin() as conn:
                row = conn.execute(_JOB, {"b_job_id": job_id}).first()
                if row is None:
                    conn.execute(
                        insert(migration_jobs).values(
                            job_id=job_id,
                            provider=self.provider.name,
                            command=json.dumps(list(command)),
                            env=json.dumps(dict(env or {})),
                            checkpoint_uri=checkpoint_uri,
                            epoch=0,
                            status=JobStatus.PENDING.value,
                            reason="registered",
                            updated_at=self.now(),
                            image=image,
                        )
                    )
        except IntegrityError:
            with self.engine.connect() as conn:
                if conn.execute(_JOB, {"b_job_id": job_id}).first() is None:
                    raise  # not the race (the job is still not there): the constraint's own error
            log.info("job %s was registered by another process at the same time: its record stands", job_id)
        return self.job(job_id)

    def job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(_JOB, {"b_job_id": job_id}).first()
        if row is None:
            raise MigrationError(f"unknown job {job_id!r}")
        return JobRecord.of(row)

    def _job(self, job_id: str) -> JobRecord:
        """The job as the running migration's last transition left it (read once per :meth:`run`)."""
        job = self._running.get(job_id)
        if job is None:
            job = self._running[job_id] = self.job(job_id)
        return job

    def jobs(self, job_ids: Collection[str] | None = None, *, conn: Connection | None = None) -> list[JobRecord]:
        """Every registered job (``job_ids`` given: only those, e.g. a tick's active jobs instead of every
        job ever registered), by id; read on ``conn`` when given (a caller's, which reads more on it)."""
        if conn is None:
            with self.engine.connect() as own:
                return self.jobs(job_ids, conn=own)
        if job_ids is None:
            rows = conn.execute(_JOBS).all()
        else:
            ids = sorted(set(job_ids))
            if not ids:
                return []
            query, params = _JOBS_IN.bind(ids)
            rows = conn.execute(query, params).all()
        return [JobRecord.of(r) for r in rows]

    def copies(self, job_id: str | None = None, *, instance_ids: Collection[str] | None = None) -> list[CopyRecord]:
        """The job's copies as billed (every job's with None), by epoch; only those of ``instance_ids``
        when given."""
        return copies(self.engine, job_id, instance_ids=instance_ids)

    def _set_job(self, conn: Any, job_id: str, *, returning: bool = False, **values: Any) -> JobRecord | None:
        values["updated_at"] = self.now()
        if isinstance(values.get("status"), JobStatus):
            values["status"] = values["status"].value
        values["b_job_id"] = job_id
        if not returning:
            conn.execute(_SET_JOB, values)
            return None
        row = conn.execute(_SET_JOB_RETURNING, values).first()
        return None if row is None else JobRecord.of(row)

    def finish(self, job_id: str, reason: str) -> bool:
        """Mark the job finished with ``reason`` (so neither the watcher nor the reconciler recovers it);
        its copy is left to the caller to terminate. Idempotent: True when this call finished it."""
        with self.engine.begin() as conn:
            done = conn.execute(_FINISH, {"b_job_id": job_id, "reason": reason[:2000], "updated_at": self.now()})
        return bool(done.rowcount)

    # -- migrations ------------------------------------------------------------------------------------

    def migration(self, migration_id: int) -> MigrationRecord:
        with self.engine.connect() as conn:
            row = conn.execute(_MIGRATION, {"b_id": migration_id}).first()
        if row is None:
            raise MigrationError(f"unknown migration {migration_id}")
        return MigrationRecord.of(row)

    def active_migration(self, job_id: str) -> MigrationRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_ACTIVE_OF, {"b_job_id": job_id}).first()
        return MigrationRecord.of(row) if row is not None else None

    def active_migrations(self, *, conn: Connection | None = None) -> list[MigrationRecord]:
        """Every migration not finished, by id; read on ``conn`` when given (as :meth:`jobs`)."""
        if conn is None:
            with self.engine.connect() as own:
                return self.active_migrations(conn=own)
        return [MigrationRecord.of(r) for r in conn.execute(_ACTIVE).all()]

    def history(self, job_id: str, *, after_id: int = 0) -> list[MigrationRecord]:
        """The job's migrations in order (those after ``after_id``: the history read so far is immutable
        once finished, so a reader may keep it and ask only for what came since)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_HISTORY, {"b_job_id": job_id, "b_after": after_id}).all()
        return [MigrationRecord.of(r) for r in rows]

    def latest_migration(self, job_id: str) -> MigrationRecord | None:
        """The job's newest migration (None: it never had one)."""
        with self.engine.connect() as conn:
            row = conn.execute(_LATEST, {"b_job_id": job_id}).first()
        return MigrationRecord.of(row) if row is not None else None

    def _order_offers(self, offers: Sequence[OfferKey], kind: Kind) -> tuple[list[OfferKey], str]:
        """The candidates in the order they will be tried, and a note on the unavailable ones.

        Offers marked unavailable are skipped by a move (its old copy keeps running) and put last by a
        recovery (the job runs nowhere: better a doubtful offer than none); when every candidate is
        marked, all are tried anyway, in the order given."""
        if self.unavailable is None:
            return list(offers), ""
        out = self.unavailable.unavailable_set(at=self.now())
        available = [o for o in offers if o not in out]
        marked = [o for o in offers if o in out]
        if not marked:
            return list(offers), ""
        names = ", ".join(_offer_name(o) for o in marked)
        if not available:
            return list(offers), (
                f"all {len(offers)} candidate offer(s) are marked unavailable ({names}); trying them anyway in order"
            )
        if kind is Kind.MOVE:
            return available, f"skipped {len(marked)} offer(s) marked unavailable: {names}"
        return available + marked, f"{len(marked)} offer(s) marked unavailable tried last: {names}"

    def plan(
        self,
        job_id: str,
        offers: Sequence[OfferKey],
        kind: Kind = Kind.MOVE,
        *,
        checkpoint_gb: float | Decimal | None = None,
    ) -> MigrationRecord:
        """Persist a planned move (or recovery) of ``job_id`` to the first offer that launches.

        ``checkpoint_gb``: the checkpoint's size when the decision knows it (the move's egress charge).
        Idempotent per job: while a migration of the job is active, that one is returned.
        """
        return self._plan(job_id, offers, kind, checkpoint_gb=checkpoint_gb)[0]

    def _plan(
        self,
        job_id: str,
        offers: Sequence[OfferKey],
        kind: Kind,
        *,
        checkpoint_gb: float | Decimal | None = None,
    ) -> tuple[MigrationRecord, JobRecord | None]:
        """:meth:`plan`, and the job's record as the plan's own write left it (None: a migration of the job was
        active already, returned as it is), which the first step of the migration then needs not read."""
        if not offers:
            raise MigrationError("a migration needs at least one candidate offer")
        gb = _gb(checkpoint_gb)
        ordered, note = self._order_offers(offers, kind)
        with self.engine.begin() as conn:
            active = conn.execute(_ACTIVE_OF, {"b_job_id": job_id}).first()
            if active is not None:
                return MigrationRecord.of(active), None
            row = conn.execute(_JOB, {"b_job_id": job_id}).first()
            if row is None:
                raise MigrationError(f"unknown job {job_id!r}")
            job = JobRecord.of(row)
            if job.status is JobStatus.FINISHED:
                raise JobFinished(f"job {job_id!r} has finished")
            if kind is Kind.MOVE and (job.status is not JobStatus.RUNNING or job.instance_id is None):
                raise MigrationError(f"job {job_id!r} is {job.status.value}, not running: recover it instead")
            marker = control.current_epoch(job.checkpoint_uri)
            to_epoch = max(job.epoch, marker) + 1
            now = self.now()
            planned = conn.execute(
                _PLAN,
                {
                    "job_id": job_id,
                    "kind": kind.value,
                    "state": State.PLANNED.value,
                    "from_epoch": job.epoch,
                    "to_epoch": to_epoch,
                    "old_instance_id": job.instance_id,
                    "request_id": request_id(job_id, to_epoch),
                    "offers": json.dumps([o.to_doc() for o in ordered]),
                    "offer_index": 0,
                    "attempts": 0,
                    "reason": note,
                    "checkpoint_gb": gb,
                    "created_at": now,
                    "updated_at": now,
                },
            ).one()
            mid = int(planned.id)
            written = self._set_job(
                conn, job_id, returning=True, status=JobStatus.MIGRATING if kind is Kind.MOVE else JobStatus.RECOVERING
            )
        if note:
            log.warning("migration %d (%s): %s", mid, job_id, note)
        self.hook(f"enter:{State.PLANNED.value}")
        return MigrationRecord.of(planned), written

    def move(
        self, job_id: str, offers: Sequence[OfferKey], *, checkpoint_gb: float | Decimal | None = None
    ) -> MigrationRecord:
        """Plan and run a move of a running job; returns the finished migration (done or rolled back)."""
        return self._drive(*self._plan(job_id, offers, Kind.MOVE, checkpoint_gb=checkpoint_gb))

    def recover(
        self, job_id: str, offers: Sequence[OfferKey], *, checkpoint_gb: float | Decimal | None = None
    ) -> MigrationRecord:
        """Launch a new epoch from the last checkpoint at once (the old copy is gone, e.g. preempted).
        Also starts a registered job that never ran (epoch 1, from scratch)."""
        return self._drive(*self._plan(job_id, offers, Kind.RECOVER, checkpoint_gb=checkpoint_gb))

    start = recover

    def resume(self, job_id: str | None = None) -> list[MigrationRecord]:
        """Continue every active migration (of ``job_id``, or all) from the state its row records, after
        bringing the ledger up to date with the copies' recorded facts."""
        self.sync_ledger(job_id)
        out = []
        for mig in self.active_migrations():
            if job_id is None or mig.job_id == job_id:
                out.append(self.run(mig.id))
        return out

    def run(self, migration_id: int) -> MigrationRecord:
        """Drive one migration until it is done or rolled back."""
        return self._drive(self.migration(migration_id))

    def _drive(self, mig: MigrationRecord, job: JobRecord | None = None) -> MigrationRecord:
        """:meth:`run` from the row as just read (or written, by :meth:`plan`); ``job``: the job's record as the
        plan just wrote it (None: read afresh at the first step)."""
        if mig.finished:
            return mig
        job_id = mig.job_id
        if job is None:
            self._running.pop(job_id, None)  # read afresh at the first step
        else:
            self._running[job_id] = job
        try:
            while not mig.finished:
                step = getattr(self, f"_step_{mig.state.value}")
                mig = step(mig)
        finally:
            self._running.pop(job_id, None)
        return mig

    def sync_ledger(self, job_id: str | None = None) -> LedgerSync:
        """Record in the ledger what it does not hold yet of the copies' facts (see :func:`sync_ledger`)."""
        if self.ledger is None:
            return LedgerSync(0, 0, ())
        return sync_ledger(self.engine, self.ledger, job_id=job_id, egress=self.egress, hook=self.hook)

    # -- transitions -----------------------------------------------------------------------------------

    def _advance(
        self,
        mig: MigrationRecord,
        state: State,
        *,
        job: Mapping[str, Any] | None = None,
        started: CopyStart | None = None,
        ended: Sequence[CopyEnd] = (),
        verified: str | None = None,
        through: Sequence[State] = (),
        **values: Any,
    ) -> MigrationRecord:
        """Compare-and-set the row from ``mig.state`` to ``state``; in the same transaction update the job
        and write the copies' facts (``started``, ``ended``, ``verified``: the instance seen progressing).
        Then the hooks (``through``: the states this commit passes through without writing them, each
        ``enter:`` hook in order, then ``state``'s), then the ledger sync when a fact was written. Returns the
        row as the transition wrote it."""
        values = {k: (v.value if isinstance(v, StrEnum) else v) for k, v in values.items()}
        pname = self.provider.name
        with self.engine.begin() as conn:
            now = self.now()
            params = {**values, "state": state.value, "updated_at": now, "b_id": mig.id, "b_state": mig.state.value}
            row = conn.execute(_TRANSITION, params).first()
            if row is None:
                self._running.pop(mig.job_id, None)
                raise ConcurrentTransition(f"migration {mig.id} is no longer {mig.state.value}")
            if job:
                written = self._set_job(conn, mig.job_id, returning=True, **job)
                if written is None:
                    self._running.pop(mig.job_id, None)
                else:
                    self._running[mig.job_id] = written
            wrote = False
            if started is not None:
                wrote |= write_copy_start(conn, pname, started, now)
            for end in ended:
                wrote |= write_copy_end(conn, pname, end, now)
            if verified is not None:
                wrote |= write_verified(conn, pname, mig.job_id, verified, now, now)
        log.info("migration %d (%s): %s -> %s %s", mig.id, mig.job_id, mig.state.value, state.value, values or "")
        for passed in through:
            self.hook(f"enter:{passed.value}")
        if state is not mig.state:
            self.hook(f"enter:{state.value}")
        if wrote:  # nothing new (e.g. a recovery's old copy, closed when it was stopped): nothing to sync
            self.sync_ledger(mig.job_id)
        return MigrationRecord.of(row)

    def _rollback(
        self,
        mig: MigrationRecord,
        reason: str,
        *,
        job: Mapping[str, Any],
        ended: Sequence[CopyEnd] = (),
        started: CopyStart | None = None,
        **values: Any,
    ) -> MigrationRecord:
        log.warning("migration %d (%s) rolled back: %s", mig.id, mig.job_id, reason)
        return self._advance(
            mig, State.ROLLED_BACK, reason=reason, job={**job, "reason": reason}, ended=ended, started=started, **values
        )

    def _to_launching(self, mig: MigrationRecord, **values: Any) -> MigrationRecord:
        """The old copy checkpointed (a move) or stopped (a recovery): ``checkpointed`` and ``launching`` in
        one compare-and-set, with the first attempt's token (nothing happens between the two states: the
        token is derived from the row). The facts learned (``values``: the old copy's end, a reason) are
        committed with it, before any launch; ``enter:checkpointed`` and ``enter:launching`` fire after it."""
        return self._advance(
            mig,
            State.LAUNCHING,
            through=(State.CHECKPOINTED,),
            token=launch_token(mig.job_id, mig.to_epoch, mig.attempts),
            deadline_at=None,
            **values,
        )

    def _deadline(self, seconds: float) -> datetime:
        return self.now() + timedelta(seconds=seconds)

    def _alive(self, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        inst = describe_or_none(self.provider, instance_id)
        return inst is not None and inst.state in ALIVE_STATES

    def _stop(
        self,
        job: JobRecord,
        epoch: int,
        instance_id: str,
        *,
        alive_reason: EndReason,
        dead_reason: EndReason | None = None,
        terminate: bool = True,
    ) -> CopyEnd:
        """Terminate a copy (idempotent) and say how it ended: ``alive_reason`` when it was still alive,
        else ``preempted`` if the cloud took it, else ``dead_reason`` (default: finished or gone)."""
        inst = describe_or_none(self.provider, instance_id)
        was_alive = inst is not None and inst.state in ALIVE_STATES
        if terminate:
            self.provider.terminate(instance_id)
            if was_alive:
                inst = describe_or_none(self.provider, instance_id)
        if inst is not None and inst.state is InstanceState.PREEMPTED:
            reason = EndReason.PREEMPTED
        elif was_alive:
            reason = alive_reason
        else:
            reason = dead_reason or end_reason_of(inst, job.checkpoint_uri, epoch)
        end = copy_end(inst, job.job_id, epoch, instance_id, reason, self.now())
        mark_preempted(self.unavailable, end)
        return end

    # planned: ask the old copy for a checkpoint (move) or make sure it is gone (recover).
    def _step_planned(self, mig: MigrationRecord) -> MigrationRecord:
        job = self._job(mig.job_id)
        if mig.kind is Kind.RECOVER:
            ended = []
            if mig.old_instance_id is not None:
                ended.append(self._stop(job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.REPLACED))
            return self._to_launching(mig, reason=_join(mig.reason, "recovery: old copy gone"), ended=ended)
        assert mig.request_id is not None
        control.request_checkpoint(
            job.checkpoint_uri,
            epoch=mig.from_epoch,
            request_id=mig.request_id,
            reason=f"migration {mig.id}",
            at=self.now().timestamp(),
        )
        return self._advance(mig, State.CHECKPOINTING, deadline_at=self._deadline(self.checkpoint_timeout))

    # checkpointing: wait until the old copy has answered the request.
    def _step_checkpointing(self, mig: MigrationRecord) -> MigrationRecord:
        job = self._job(mig.job_id)
        assert mig.request_id is not None
        deadline = mig.deadline_at or self._deadline(self.checkpoint_timeout)
        while True:
            if control.request_served(job.checkpoint_uri, mig.request_id):
                return self._to_launching(mig)
            if control.progress(job.checkpoint_uri, mig.from_epoch).done:
                ended = []
                if mig.old_instance_id is not None and not self._alive(mig.old_instance_id):
                    ended.append(
                        self._stop(
                            job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.FINISHED, terminate=False
                        )
                    )  # still exiting: the reconciler closes it once gone
                return self._rollback(
                    mig, "the job finished before it could be moved", job={"status": JobStatus.FINISHED}, ended=ended
                )
            if not self._alive(mig.old_instance_id):
                # Preempted (or gone) during the move: continue from the last checkpoint at once.
                ended = []
                if mig.old_instance_id is not None:
                    ended.append(
                        self._stop(
                            job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.GONE, terminate=False
                        )
                    )
                return self._to_launching(mig, reason="old copy gone while checkpointing", ended=ended)
            if self.now() >= deadline:
                return self._rollback(
                    mig,
                    f"checkpoint request {mig.request_id} not served within {self.checkpoint_timeout:g} s; "
                    "the old copy keeps running",
                    job={"status": JobStatus.RUNNING},
                )
            self.sleep(self.poll_seconds)

    # checkpointed (a row written before the two states were one transition, see _to_launching): choose the
    # attempt's token and store it before any launch call.
    def _step_checkpointed(self, mig: MigrationRecord) -> MigrationRecord:
        return self._advance(
            mig, State.LAUNCHING, token=launch_token(mig.job_id, mig.to_epoch, mig.attempts), deadline_at=None
        )

    def _spec(self, job: JobRecord, mig: MigrationRecord, offer: OfferKey) -> LaunchSpec:
        env = {**job.env, **contract_env(job.job_id, job.checkpoint_uri, mig.to_epoch)}
        return LaunchSpec(
            offer=offer,
            command=job.command,
            env=env,
            tags=job_tags(job.job_id, mig.to_epoch),
            image=job.image or self.image,
        )

    def _terminate_leftovers(self, job: JobRecord, epochs: range, reason: EndReason) -> list[CopyEnd]:
        """Terminate every instance of the job tagged with an epoch in ``epochs`` that still holds resources,
        found with one ``list`` call (however many epochs: a job preempted n times has n of them)."""
        if not epochs:
            return []
        wanted = {str(e) for e in epochs}
        tags = {TAG_JOB: job.job_id}
        if len(epochs) == 1:
            tags[TAG_EPOCH] = str(epochs[0])
        gone = []
        for inst in self.provider.list(tags):
            epoch = inst.tags.get(TAG_EPOCH, "")
            if epoch in wanted and inst.state in HELD_STATES:
                gone.append(self._stop(job, int(epoch), inst.instance_id, alive_reason=reason))
        return gone

    def _next_offer(self, mig: MigrationRecord) -> int | None:
        """The index of the next offer to try: the next one not marked unavailable meanwhile, else simply
        the next one (None: none left)."""
        rest = range(mig.offer_index + 1, len(mig.offers))
        if not rest:
            return None
        if self.unavailable is not None:
            out = self.unavailable.unavailable_set(at=self.now())
            for i in rest:
                if mig.offers[i] not in out:
                    return i
        return rest[0]

    # launching: launch with the stored token; on failure back off and try the next offer.
    def _step_launching(self, mig: MigrationRecord) -> MigrationRecord:
        job = self._job(mig.job_id)
        assert mig.token is not None
        offer = mig.offers[mig.offer_index]
        try:
            inst = self.provider.launch(self._spec(job, mig, offer), mig.token)
        except (CloudError, ProviderConfigError) as exc:  # a config error: this offer is outside the provider's area
            reason = f"launch on {offer} failed: {type(exc).__name__}: {exc}"
            log.warning("migration %d: %s", mig.id, reason)
            why = reason_for_launch_error(exc)
            if why is not None and self.unavailable is not None:
                self.unavailable.mark(offer, why, at=self.now(), detail=f"{type(exc).__name__}: {exc}"[:500])
            # An ambiguous failure may have left an instance: never two copies of one epoch.
            ended = self._terminate_leftovers(job, range(mig.to_epoch, mig.to_epoch + 1), EndReason.FAILED_LAUNCH)
            nxt = self._next_offer(mig)
            if nxt is None:
                all_reason = f"launch failed on all {len(mig.offers)} offer(s); last: {reason}"
                if mig.kind is Kind.MOVE:
                    return self._rollback(
                        mig,
                        all_reason + "; the old copy keeps running",
                        job={"status": JobStatus.RUNNING},
                        ended=ended,
                    )
                return self._rollback(mig, all_reason, job={"status": JobStatus.RECOVERING}, ended=ended)
            self.sleep(min(self.backoff_cap, self.backoff_base * 2**mig.attempts))
            return self._advance(
                mig,
                State.LAUNCHING,
                offer_index=nxt,
                attempts=mig.attempts + 1,
                token=launch_token(mig.job_id, mig.to_epoch, mig.attempts + 1),
                reason=reason,
                ended=ended,
            )
        self.hook("launch:returned")
        started = CopyStart(
            job_id=mig.job_id,
            epoch=mig.to_epoch,
            instance_id=inst.instance_id,
            offer=offer,
            started_at=inst.launched_at or self.now(),
            migration_id=mig.id,
            source_offer=job.offer,  # the job's offer until the new copy takes over (launched -> verifying)
            egress_gb=mig.checkpoint_gb,
        )
        # ``launched`` is passed through, not written: the launch is recorded by its token (a crash before the
        # commit below launches again with it and gets this instance back), and the new copy's id and start
        # are committed with the hand-over, one compare-and-set instead of two.
        self.hook(f"enter:{State.LAUNCHED.value}")
        return self._hand_over(mig, job, inst.instance_id, started=started)

    # launched (a row written before launching and launched were one transition, see _step_launching): fence
    # (claim the new epoch) and hand the job to the new copy, atomically in the row.
    def _step_launched(self, mig: MigrationRecord) -> MigrationRecord:
        return self._hand_over(mig, self._job(mig.job_id), mig.new_instance_id)

    def _hand_over(
        self, mig: MigrationRecord, job: JobRecord, instance_id: str | None, *, started: CopyStart | None = None
    ) -> MigrationRecord:
        """Claim the new epoch (the fence: the old copy can no longer publish a checkpoint), then move the job's
        epoch, instance and offer to the new copy in the transition to ``verifying`` (with the copy's start,
        ``started``, and its id when the row does not hold them yet). A newer epoch owning the job rolls back,
        the new copy stopped."""
        recorded: dict[str, Any] = {} if started is None else {"new_instance_id": instance_id}
        try:
            control.claim_epoch(job.checkpoint_uri, mig.to_epoch, at=self.now().timestamp())
        except StaleEpoch as exc:
            ended = []
            if instance_id:
                ended.append(self._stop(job, mig.to_epoch, instance_id, alive_reason=EndReason.ROLLBACK))
            return self._rollback(
                mig,
                f"a newer epoch owns the job ({exc})",
                job={"status": JobStatus.RECOVERING},
                ended=ended,
                started=started,
                **recorded,
            )
        offer = mig.offers[mig.offer_index]
        return self._advance(
            mig,
            State.VERIFYING,
            deadline_at=self._deadline(self.verify_timeout),
            job={
                "epoch": mig.to_epoch,
                "instance_id": instance_id,
                "offer": json.dumps(offer.to_doc()),
            },
            started=started,
            **recorded,
        )

    # verifying: the new copy restored and is progressing (or finished the job).
    def _step_verifying(self, mig: MigrationRecord) -> MigrationRecord:
        job = self._job(mig.job_id)
        deadline = mig.deadline_at or self._deadline(self.verify_timeout)
        while True:
            prog = control.progress(job.checkpoint_uri, mig.to_epoch)
            if prog.progressing or prog.done:
                return self._advance(mig, State.TERMINATING_OLD, deadline_at=None, verified=mig.new_instance_id)
            gone = not self._alive(mig.new_instance_id)
            if gone or self.now() >= deadline:
                prog = control.progress(job.checkpoint_uri, mig.to_epoch)  # it may have just finished
                if prog.progressing or prog.done:
                    continue
                why = "exited" if gone else f"did not progress within {self.verify_timeout:g} s"
                # The new epoch is claimed: the old copy is fenced and can only waste work (an agent exits by
                # itself once it sees the newer epoch, so it may be gone already: fenced by this migration,
                # not lost). Stop both; the job is recovered from the last checkpoint by a new epoch.
                ended = []
                for iid, epoch in ((mig.new_instance_id, mig.to_epoch), (mig.old_instance_id, mig.from_epoch)):
                    if iid is not None:
                        ended.append(
                            self._stop(
                                job,
                                epoch,
                                iid,
                                alive_reason=EndReason.FAILED_VERIFICATION,
                                dead_reason=EndReason.FAILED_VERIFICATION,
                            )
                        )
                return self._rollback(
                    mig,
                    f"new copy {mig.new_instance_id} (epoch {mig.to_epoch}) {why}; the job needs recovery",
                    job={"status": JobStatus.RECOVERING},
                    ended=ended,
                )
            self.sleep(self.poll_seconds)

    # terminating_old: idempotent.
    def _step_terminating_old(self, mig: MigrationRecord) -> MigrationRecord:
        job = self._job(mig.job_id)
        ended = []
        if mig.old_instance_id is not None and mig.old_instance_id != mig.new_instance_id:
            ended.append(
                self._stop(
                    job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.MOVED, dead_reason=EndReason.MOVED
                )
            )
        # Anything else tagged with an older epoch of this job is an orphan by now.
        ended.extend(self._terminate_leftovers(job, range(1, mig.to_epoch), EndReason.ORPHAN))
        return self._advance(
            mig,
            State.DONE,
            job={"status": JobStatus.RUNNING, "reason": f"{mig.kind.value} {mig.id} done"},
            ended=ended,
        )

    def reconcile(self, job_id: str | None = None) -> ReconcileReport:
        """Reconcile this migrator's provider (see :func:`reconcile`; ``job_id``: that job alone), billing what
        it finds."""
        return reconcile(
            self.engine,
            self.provider,
            ledger=self.ledger,
            unavailable=self.unavailable,
            egress=self.egress,
            job_id=job_id,
        )


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _offer_name(key: OfferKey) -> str:
    zone = f"/{key.zone}" if key.zone else ""
    return f"{key.cloud.value} {key.region}{zone} {key.instance_type} ({key.market.value})"
