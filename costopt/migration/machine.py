"""The migration execution state machine: move one job, or recover it, persisted and crash-safe.

A move goes through::

    planned -> checkpointing -> checkpointed -> launching -> launched -> verifying -> terminating_old -> done

and a failure ends it in ``rolled_back`` with a reason (the job keeps running on its old copy, or is
marked ``recovering`` when the old copy can no longer run). A recovery (after a preemption: the old
copy is gone) skips the checkpoint request: ``planned`` terminates whatever is left of the old copy
(idempotent) and goes straight to ``checkpointed``: the new epoch restores the last checkpoint.

Every state is a row in ``migrations`` (:mod:`costopt.db.migration_schema`); every transition is a
compare-and-set on that row, committed *before* the next side effect, and every side effect is
idempotent, so :meth:`Migrator.resume` continues from whatever state a crash left:

- ``planned``: the checkpoint request id is stored in the row; repeating the request is a no-op for
  the agent;
- ``launching``: the idempotency token (job id + epoch + attempt) is stored before ``launch`` is
  called; a crash after ``launch`` returned but before the instance id was saved calls ``launch``
  again with the same token, and the provider returns the same instance. Before a new attempt (next
  offer) every instance left by an earlier attempt of the same epoch is terminated, so an ambiguous
  failure never leaves two copies of one epoch;
- ``launched``: :func:`costopt.agent.control.claim_epoch` (idempotent) raises the fencing marker, in
  the same transaction the job's epoch and instance move to the new copy. From then on the old copy
  cannot publish a checkpoint (the agent's fencing), so two copies never both write;
- ``verifying``: the new copy restored and is progressing (``control.progress(uri, epoch)``);
- ``terminating_old``: ``terminate`` is idempotent.

The epoch is claimed only *after* a successful launch, so a move whose launches all fail leaves the
old copy running, unfenced: that is the rollback. A new copy that does not progress is terminated and
the job is marked ``recovering`` (its old copy is fenced by then).

Billing (optional ``ledger``): every copy of a job (one instance of one epoch) is an interval in the
ledger, keyed ``<provider>:<job>:e<epoch>:<instance>``, opened at its launch (the provider's launch time)
and closed when it is terminated, found preempted or gone (the provider's end time when it knows it,
else now), with an end reason (:class:`EndReason`). The facts are first written to ``migration_copies``
in the same transaction as the transition that learned them, so a crash never changes them; they are
then copied to the ledger (:func:`sync_ledger`, after every transition, on :meth:`Migrator.resume` and
by the reconciler), and the copy row's flags record what the ledger holds. Ledger writes are idempotent
by key, so a crash between a ledger write and its flag repeats nothing. A migration given the checkpoint's
size (``checkpoint_gb``) records its egress when its new copy is launched (an additive charge keyed by the
migration id: GB x the ``egress`` rate from the old copy's place to the new one's; none within a region);
each copy's boot-and-restore time (``restart``) and a moved copy's overlap with its successor
(``overlap``) are memo lines. The migrator records facts only: the ledger prices an interval when it
closes, from its own price view (``SqlLedger(engine, prices)``). A ledger failure (e.g. no price known
for the offer) never stops a migration: it is logged, kept in ``migration_copies.ledger_error`` and
retried at the next sync.

Unavailable offers (optional ``unavailable``, :mod:`costopt.migration.unavailable`): a launch refused
for capacity or quota marks its offer; a copy found preempted marks its offer. A plan skips offers
marked unavailable (a recovery keeps them at the end as a last resort); when every candidate is
marked, they are all tried anyway, in order, and the migration's reason says so.

Fault injection: ``hook(point)`` is called after each committed transition (``"enter:<state>"``),
right after ``launch`` returned (``"launch:returned"``), and right after each ledger write, before its
flag is committed (``"ledger:opened"``, ``"ledger:closed"``). The default hook SIGKILLs this process
when ``COSTOPT_MIGRATOR_KILL_AT`` names the point (the crash tests run the migrator in a subprocess).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, and_, insert, not_, or_, select, update
from sqlalchemy.engine import Connection

from costopt.agent import control
from costopt.agent.contract import contract_env
from costopt.agent.errors import StaleEpoch
from costopt.cloud import (
    ACTIVE_STATES,
    HELD_STATES,
    CloudError,
    CloudProvider,
    Instance,
    InstanceState,
    LaunchSpec,
    NotFoundError,
    ProviderConfigError,
)
from costopt.db.migration_schema import migration_copies, migration_jobs, migrations
from costopt.domain import OfferKey
from costopt.errors import CostoptError
from costopt.ledger.book import Ledger
from costopt.ledger.model import ChargeKind, ChargeRecord, IntervalRecord, LedgerError
from costopt.migration.unavailable import REASON_PREEMPTED, UnavailableOffers, reason_for_launch_error
from costopt.planning.model import DEFAULT_EGRESS, EgressRates

log = logging.getLogger("costopt.migration.machine")

ENV_KILL_AT = "COSTOPT_MIGRATOR_KILL_AT"

TAG_MANAGED = "costopt-managed"
TAG_JOB = "costopt-job"
TAG_EPOCH = "costopt-epoch"

ALIVE_STATES = ACTIVE_STATES
"""A copy in these states may still run (and write): see :data:`costopt.cloud.ACTIVE_STATES`. A STOPPED
copy is not alive (the job is recovered elsewhere) but is still terminated as a leftover or an orphan
(:data:`costopt.cloud.HELD_STATES`): it bills for its disks."""


class State(StrEnum):
    PLANNED = "planned"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"
    LAUNCHING = "launching"
    LAUNCHED = "launched"
    VERIFYING = "verifying"
    TERMINATING_OLD = "terminating_old"
    DONE = "done"
    ROLLED_BACK = "rolled_back"


TERMINAL = (State.DONE, State.ROLLED_BACK)
TRANSITIONS: tuple[State, ...] = tuple(s for s in State if s is not State.ROLLED_BACK)
"""The states a successful move goes through, in order (the fault-injection points)."""


class Kind(StrEnum):
    MOVE = "move"
    RECOVER = "recover"


class JobStatus(StrEnum):
    PENDING = "pending"  # registered, never launched
    RUNNING = "running"
    MIGRATING = "migrating"
    RECOVERING = "recovering"  # needs a new copy from the last checkpoint
    FINISHED = "finished"


class MigrationError(CostoptError):
    """A move cannot be planned (unknown job, wrong status) or another migrator advanced it."""


class ConcurrentTransition(MigrationError):
    """The row was not in the expected state: another migrator advanced it."""


class EndReason(StrEnum):
    """Why a copy's interval ended (the ledger's ``end_reason``)."""

    MOVED = "moved"  # terminated once its successor was verified
    PREEMPTED = "preempted"  # taken back by the cloud
    GONE = "gone"  # exited or vanished without a preemption, the job not done
    FINISHED = "finished"  # exited after finishing the job
    FAILED_VERIFICATION = "failed_verification"  # stopped because a move's new copy did not progress
    ROLLBACK = "rollback"  # a new copy stopped because its move rolled back (a newer epoch owns the job)
    REPLACED = "replaced"  # still alive when a recovery replaced it
    FAILED_LAUNCH = "failed_launch"  # left by a launch attempt that failed
    ORPHAN = "orphan"  # a stale epoch's copy, or one of no job, terminated by the reconciler


# -- records ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    provider: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    checkpoint_uri: str
    epoch: int
    instance_id: str | None
    offer: OfferKey | None
    status: JobStatus
    reason: str

    @classmethod
    def of(cls, row: Any) -> JobRecord:
        return cls(
            job_id=row.job_id,
            provider=row.provider,
            command=tuple(json.loads(row.command)),
            env=json.loads(row.env or "{}"),
            checkpoint_uri=row.checkpoint_uri,
            epoch=int(row.epoch),
            instance_id=row.instance_id,
            offer=OfferKey.from_doc(json.loads(row.offer)) if row.offer else None,
            status=JobStatus(row.status),
            reason=row.reason or "",
        )


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    id: int
    job_id: str
    kind: Kind
    state: State
    from_epoch: int
    to_epoch: int
    old_instance_id: str | None
    new_instance_id: str | None
    request_id: str | None
    token: str | None
    offers: tuple[OfferKey, ...]
    offer_index: int
    attempts: int
    reason: str
    deadline_at: datetime | None
    checkpoint_gb: Decimal | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def of(cls, row: Any) -> MigrationRecord:
        return cls(
            id=int(row.id),
            job_id=row.job_id,
            kind=Kind(row.kind),
            state=State(row.state),
            from_epoch=int(row.from_epoch),
            to_epoch=int(row.to_epoch),
            old_instance_id=row.old_instance_id,
            new_instance_id=row.new_instance_id,
            request_id=row.request_id,
            token=row.token,
            offers=tuple(OfferKey.from_doc(d) for d in json.loads(row.offers)),
            offer_index=int(row.offer_index),
            attempts=int(row.attempts),
            reason=row.reason or "",
            deadline_at=row.deadline_at,
            checkpoint_gb=row.checkpoint_gb,
        )


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """One copy of a job (an instance of one epoch) with the facts the ledger bills (``migration_copies``).

    ``[started_at, ended_at)`` is the ledger interval ``interval_key`` (open while ``ended_at`` is None);
    ``verified_at``: when it was first seen progressing; ``source_offer``/``egress_gb``: where the
    checkpoint it restores came from and its size (the move's egress). ``ledger_*``: what the ledger
    already holds (opened, the restart memo, closed) and the last error recording it.
    """

    interval_key: str
    job_id: str
    epoch: int
    instance_id: str
    provider: str
    offer: OfferKey
    migration_id: int | None
    source_offer: OfferKey | None
    egress_gb: Decimal | None
    started_at: datetime
    verified_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    ledger_opened: bool
    ledger_memo: bool
    ledger_closed: bool
    ledger_error: str | None

    @property
    def synced(self) -> bool:
        """True when the ledger holds everything known about this copy."""
        memo_due = self.verified_at is not None or self.ended_at is not None
        return (
            self.ledger_opened and (self.ledger_memo or not memo_due) and (self.ledger_closed or self.ended_at is None)
        )

    @classmethod
    def of(cls, row: Any) -> CopyRecord:
        return cls(
            interval_key=row.interval_key,
            job_id=row.job_id,
            epoch=int(row.epoch),
            instance_id=row.instance_id,
            provider=row.provider,
            offer=OfferKey.from_doc(json.loads(row.offer)),
            migration_id=None if row.migration_id is None else int(row.migration_id),
            source_offer=OfferKey.from_doc(json.loads(row.source_offer)) if row.source_offer else None,
            egress_gb=row.egress_gb,
            started_at=row.started_at,
            verified_at=row.verified_at,
            ended_at=row.ended_at,
            end_reason=row.end_reason,
            ledger_opened=bool(row.ledger_opened),
            ledger_memo=bool(row.ledger_memo),
            ledger_closed=bool(row.ledger_closed),
            ledger_error=row.ledger_error,
        )


@dataclass(frozen=True, slots=True)
class CopyStart:
    """A copy just launched (written with the transition to ``launched``)."""

    job_id: str
    epoch: int
    instance_id: str
    offer: OfferKey
    started_at: datetime
    migration_id: int | None = None
    source_offer: OfferKey | None = None
    egress_gb: Decimal | None = None


@dataclass(frozen=True, slots=True)
class CopyEnd:
    """A copy found ended (written with the transition that ended it). ``offer``/``launched_at`` (from
    the provider) are only used when no row of the copy exists yet (an orphan nobody recorded)."""

    job_id: str
    epoch: int
    instance_id: str
    offer: OfferKey | None
    launched_at: datetime | None
    ended_at: datetime
    reason: EndReason


def launch_token(job_id: str, epoch: int, attempt: int) -> str:
    """The idempotency token of one launch attempt: derived from job id, epoch and attempt number
    (at most 64 characters, AWS's ClientToken limit)."""
    raw = f"costopt:{job_id}:e{epoch}:a{attempt}"
    if len(raw) <= 64:
        return raw
    return f"costopt:{hashlib.sha256(raw.encode()).hexdigest()[:40]}:e{epoch}:a{attempt}"[:64]


def request_id(job_id: str, epoch: int) -> str:
    """The id of the checkpoint request of the move to ``epoch`` (stored before it is sent)."""
    raw = f"mig-{job_id}-e{epoch}"
    return raw if len(raw) <= 64 else f"mig-{hashlib.sha256(raw.encode()).hexdigest()[:40]}-e{epoch}"


def interval_key(provider: str, job_id: str, epoch: int, instance_id: str) -> str:
    """The ledger key of one copy: provider, job, epoch and instance (at most 255 characters)."""
    raw = f"{provider}:{job_id}:e{epoch}:{instance_id}"
    if len(raw) <= 255:
        return raw
    return f"{provider[:32]}:{hashlib.sha256(raw.encode()).hexdigest()[:40]}:e{epoch}:{instance_id}"[:255]


def job_tags(job_id: str, epoch: int) -> dict[str, str]:
    return {TAG_MANAGED: "true", TAG_JOB: job_id, TAG_EPOCH: str(epoch)}


def env_kill_hook(point: str) -> None:
    """SIGKILL this process at the point named by ``COSTOPT_MIGRATOR_KILL_AT`` (fault injection)."""
    if os.environ.get(ENV_KILL_AT) == point:
        log.warning("fault injection: SIGKILL at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# -- copies: the facts the ledger bills ---------------------------------------------------------------


def _describe(provider: CloudProvider, instance_id: str) -> Instance | None:
    try:
        return provider.describe(instance_id)
    except NotFoundError:
        return None


def _copy_end(
    inst: Instance | None, job_id: str, epoch: int, instance_id: str, reason: EndReason, now: datetime
) -> CopyEnd:
    """The end of a copy from the provider's view: its end time when the provider knows it, else ``now``."""
    ended = inst.terminated_at if inst is not None and inst.terminated_at is not None else now
    return CopyEnd(
        job_id=job_id,
        epoch=epoch,
        instance_id=instance_id,
        offer=inst.offer if inst is not None else None,
        launched_at=inst.launched_at if inst is not None else None,
        ended_at=ended,
        reason=reason,
    )


def _dead_reason(inst: Instance | None, checkpoint_uri: str | None, epoch: int) -> EndReason:
    """Why a copy that is no longer alive ended: preempted, finished the job, or gone."""
    if inst is not None and inst.state is InstanceState.PREEMPTED:
        return EndReason.PREEMPTED
    if checkpoint_uri is not None and epoch >= 1 and control.progress(checkpoint_uri, epoch).done:
        return EndReason.FINISHED
    return EndReason.GONE


def _write_copy_start(conn: Connection, provider: str, start: CopyStart, now: datetime) -> None:
    key = interval_key(provider, start.job_id, start.epoch, start.instance_id)
    if conn.execute(select(migration_copies.c.interval_key).where(migration_copies.c.interval_key == key)).first():
        return
    conn.execute(
        insert(migration_copies).values(
            interval_key=key,
            job_id=start.job_id,
            epoch=start.epoch,
            instance_id=start.instance_id,
            provider=provider,
            offer=json.dumps(start.offer.to_doc()),
            migration_id=start.migration_id,
            source_offer=json.dumps(start.source_offer.to_doc()) if start.source_offer else None,
            egress_gb=start.egress_gb,
            started_at=start.started_at,
            ledger_opened=False,
            ledger_memo=False,
            ledger_closed=False,
            updated_at=now,
        )
    )


def _write_copy_end(conn: Connection, provider: str, end: CopyEnd, now: datetime) -> bool:
    """Close the copy's row (first end wins; never before it started), or insert it closed when nobody
    recorded it (an orphan). False when there was nothing to write."""
    c = migration_copies.c
    row = conn.execute(
        select(c.interval_key, c.started_at, c.ended_at).where(
            c.job_id == end.job_id, c.instance_id == end.instance_id, c.provider == provider
        )
    ).first()
    if row is not None:
        if row.ended_at is not None:
            return False
        conn.execute(
            update(migration_copies)
            .where(c.interval_key == row.interval_key, c.ended_at.is_(None))
            .values(ended_at=max(end.ended_at, row.started_at), end_reason=end.reason.value, updated_at=now)
        )
        return True
    if end.offer is None:
        log.warning(
            "copy %s of %s (epoch %d) ended unseen: no offer known, not billed", end.instance_id, end.job_id, end.epoch
        )
        return False
    started = min(end.launched_at or end.ended_at, end.ended_at)
    _write_copy_start(conn, provider, CopyStart(end.job_id, end.epoch, end.instance_id, end.offer, started), now)
    return _write_copy_end(conn, provider, end, now)


def _write_verified(
    conn: Connection, provider: str, job_id: str, instance_id: str, at: datetime, now: datetime
) -> None:
    c = migration_copies.c
    conn.execute(
        update(migration_copies)
        .where(c.job_id == job_id, c.instance_id == instance_id, c.provider == provider, c.verified_at.is_(None))
        .values(verified_at=at, updated_at=now)
    )


def copies(engine: Engine, job_id: str | None = None, *, open_only: bool = False) -> list[CopyRecord]:
    """The copies of ``job_id`` (or of every job), by job, epoch and launch time; only those not known
    to have ended with ``open_only``."""
    c = migration_copies.c
    query = select(migration_copies).order_by(c.job_id, c.epoch, c.started_at, c.interval_key)
    if job_id is not None:
        query = query.where(c.job_id == job_id)
    if open_only:
        query = query.where(c.ended_at.is_(None))
    with engine.connect() as conn:
        return [CopyRecord.of(r) for r in conn.execute(query).all()]


@dataclass(frozen=True, slots=True)
class LedgerSync:
    """What one :func:`sync_ledger` pass did: ledger writes made, copies still pending, errors met."""

    written: int
    pending: int
    errors: tuple[str, ...]


def _pending_condition() -> Any:
    c = migration_copies.c
    return or_(
        not_(c.ledger_opened),
        and_(not_(c.ledger_memo), or_(c.verified_at.is_not(None), c.ended_at.is_not(None))),
        and_(not_(c.ledger_closed), c.ended_at.is_not(None)),
    )


def sync_ledger(
    engine: Engine,
    ledger: Ledger,
    *,
    job_id: str | None = None,
    egress: EgressRates = DEFAULT_EGRESS,
    hook: Callable[[str], None] | None = None,
) -> LedgerSync:
    """Copy the facts of ``migration_copies`` the ledger does not hold yet into ``ledger`` (idempotent).

    Per copy: open its interval (and record its move's egress), record its restart memo once it
    progressed or ended, close its interval once it ended (and record a moved copy's overlap memo).
    A :class:`~costopt.ledger.model.LedgerError` (no price, a conflict) is logged and kept on the row;
    the copy stays pending and is retried by the next pass. ``hook`` gets ``"ledger:opened"`` and
    ``"ledger:closed"`` right after those writes, before their flags are committed (fault injection).
    """
    c = migration_copies.c
    query = select(migration_copies).where(_pending_condition()).order_by(c.started_at, c.interval_key)
    if job_id is not None:
        query = query.where(c.job_id == job_id)
    with engine.connect() as conn:
        pending = [CopyRecord.of(r) for r in conn.execute(query).all()]
    written = 0
    errors: list[str] = []
    left = 0
    for copy in pending:
        try:
            written += _sync_copy(engine, ledger, copy, egress, hook)
        except LedgerError as exc:
            left += 1
            msg = f"{copy.interval_key}: {type(exc).__name__}: {exc}"
            errors.append(msg)
            if copy.ledger_error != str(exc):
                log.warning("ledger: cannot record copy %s yet (retried at the next sync)", msg)
            with engine.begin() as conn:
                conn.execute(
                    update(migration_copies).where(c.interval_key == copy.interval_key).values(ledger_error=str(exc))
                )
    return LedgerSync(written, left, tuple(errors))


def _set_flags(engine: Engine, key: str, **flags: bool) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(migration_copies)
            .where(migration_copies.c.interval_key == key)
            .values(ledger_error=None, updated_at=_utcnow(), **flags)
        )


def _sync_copy(
    engine: Engine, ledger: Ledger, copy: CopyRecord, egress: EgressRates, hook: Callable[[str], None] | None
) -> int:
    written = 0
    interval = IntervalRecord(
        interval_key=copy.interval_key,
        job_id=copy.job_id,
        instance_id=copy.instance_id,
        offer=copy.offer,
        started_at=copy.started_at,
        provider=copy.provider,
    )
    if not copy.ledger_opened:
        ledger.record_interval(interval)
        charge = _egress_charge(copy, egress)
        if charge is not None:
            ledger.record_charge(charge)
        written += 1
        if hook is not None:
            hook("ledger:opened")
        _set_flags(engine, copy.interval_key, ledger_opened=True)
    memo_end = copy.verified_at or copy.ended_at
    if not copy.ledger_memo and memo_end is not None:
        if memo_end > copy.started_at:
            progressed = copy.verified_at is not None
            ledger.record_charge(
                ChargeRecord(
                    charge_key=f"{copy.interval_key}:restart",
                    job_id=copy.job_id,
                    kind=ChargeKind.RESTART,
                    at=memo_end,
                    offer=copy.offer,
                    interval_key=copy.interval_key,
                    span=(copy.started_at, memo_end),
                    note="boot and restore, before the copy progressed"
                    if progressed
                    else "boot, the copy never progressed",
                )
            )
            written += 1
        _set_flags(engine, copy.interval_key, ledger_memo=True)
    if not copy.ledger_closed and copy.ended_at is not None:
        ledger.record_interval(replace(interval, ended_at=copy.ended_at, end_reason=copy.end_reason))
        overlap = _overlap_charge(engine, copy)
        if overlap is not None:
            ledger.record_charge(overlap)
        written += 1
        if hook is not None:
            hook("ledger:closed")
        _set_flags(engine, copy.interval_key, ledger_closed=True)
    return written


def _egress_charge(copy: CopyRecord, egress: EgressRates) -> ChargeRecord | None:
    """The move's egress: the checkpoint shipped from the source place to the copy's (None: same place,
    or no size given)."""
    src, dst = copy.source_offer, copy.offer
    if copy.egress_gb is None or copy.egress_gb <= 0 or src is None or copy.migration_id is None:
        return None
    if (src.cloud, src.region) == (dst.cloud, dst.region):
        return None
    rate = egress.rate(src.cloud, src.region, dst.cloud, dst.region)
    return ChargeRecord(
        charge_key=f"{copy.job_id}:m{copy.migration_id}:egress",
        job_id=copy.job_id,
        kind=ChargeKind.EGRESS,
        at=copy.started_at,
        quantity=copy.egress_gb,
        unit="GB",
        rate_usd=Decimal(repr(rate)),
        offer=src,
        interval_key=copy.interval_key,
        note=f"checkpoint {src.cloud.value} {src.region} -> {dst.cloud.value} {dst.region}"
        f" (migration {copy.migration_id})",
    )


def _overlap_charge(engine: Engine, copy: CopyRecord) -> ChargeRecord | None:
    """A moved copy billed while its successor booted and was verified: ``[successor start, its end)``."""
    if copy.end_reason != EndReason.MOVED.value or copy.ended_at is None:
        return None
    c = migration_copies.c
    with engine.connect() as conn:
        succ = conn.execute(
            select(c.started_at, c.epoch)
            .where(c.job_id == copy.job_id, c.epoch > copy.epoch, c.migration_id.is_not(None))
            .order_by(c.epoch, c.started_at)
        ).first()
    if succ is None or succ.started_at >= copy.ended_at:
        return None
    start = max(succ.started_at, copy.started_at)
    return ChargeRecord(
        charge_key=f"{copy.interval_key}:overlap",
        job_id=copy.job_id,
        kind=ChargeKind.OVERLAP,
        at=copy.ended_at,
        offer=copy.offer,
        interval_key=copy.interval_key,
        span=(start, copy.ended_at),
        note=f"billed while epoch {succ.epoch} booted and was verified",
    )


# -- the migrator -------------------------------------------------------------------------------------


def _active_condition() -> Any:
    """The migrations not finished yet (done or rolled back)."""
    return migrations.c.state.notin_([s.value for s in TERMINAL])


def _mark_preempted(unavailable: UnavailableOffers | None, end: CopyEnd) -> None:
    """Mark the offer of a copy found preempted unavailable (when there is a cache)."""
    if unavailable is None or end.reason is not EndReason.PREEMPTED or end.offer is None:
        return
    unavailable.mark(end.offer, REASON_PREEMPTED, at=end.ended_at, detail=f"{end.instance_id} preempted")


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

    # -- jobs ------------------------------------------------------------------------------------------

    def register_job(
        self, job_id: str, command: Sequence[str], checkpoint_uri: str, *, env: Mapping[str, str] | None = None
    ) -> JobRecord:
        """Register a job (idempotent: an existing job is returned unchanged)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
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
                    )
                )
        return self.job(job_id)

    def job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
        if row is None:
            raise MigrationError(f"unknown job {job_id!r}")
        return JobRecord.of(row)

    def jobs(self) -> list[JobRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(migration_jobs).order_by(migration_jobs.c.job_id)).all()
        return [JobRecord.of(r) for r in rows]

    def copies(self, job_id: str | None = None) -> list[CopyRecord]:
        """The job's copies as billed (every job's with None), by epoch."""
        return copies(self.engine, job_id)

    def _set_job(self, conn: Any, job_id: str, **values: Any) -> None:
        values["updated_at"] = self.now()
        if isinstance(values.get("status"), JobStatus):
            values["status"] = values["status"].value
        conn.execute(update(migration_jobs).where(migration_jobs.c.job_id == job_id).values(**values))

    # -- migrations ------------------------------------------------------------------------------------

    def migration(self, migration_id: int) -> MigrationRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(migrations).where(migrations.c.id == migration_id)).first()
        if row is None:
            raise MigrationError(f"unknown migration {migration_id}")
        return MigrationRecord.of(row)

    def active_migration(self, job_id: str) -> MigrationRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(migrations).where(migrations.c.job_id == job_id, _active_condition()).order_by(migrations.c.id)
            ).first()
        return MigrationRecord.of(row) if row is not None else None

    def active_migrations(self) -> list[MigrationRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(migrations).where(_active_condition()).order_by(migrations.c.id)).all()
        return [MigrationRecord.of(r) for r in rows]

    def history(self, job_id: str) -> list[MigrationRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(migrations).where(migrations.c.job_id == job_id).order_by(migrations.c.id)).all()
        return [MigrationRecord.of(r) for r in rows]

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
        if not offers:
            raise MigrationError("a migration needs at least one candidate offer")
        gb = _gb(checkpoint_gb)
        ordered, note = self._order_offers(offers, kind)
        with self.engine.begin() as conn:
            active = conn.execute(select(migrations).where(migrations.c.job_id == job_id, _active_condition())).first()
            if active is not None:
                return MigrationRecord.of(active)
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
            if row is None:
                raise MigrationError(f"unknown job {job_id!r}")
            job = JobRecord.of(row)
            if job.status is JobStatus.FINISHED:
                raise MigrationError(f"job {job_id!r} has finished")
            if kind is Kind.MOVE and (job.status is not JobStatus.RUNNING or job.instance_id is None):
                raise MigrationError(f"job {job_id!r} is {job.status.value}, not running: recover it instead")
            marker = control.current_epoch(job.checkpoint_uri)
            to_epoch = max(job.epoch, marker) + 1
            now = self.now()
            result = conn.execute(
                insert(migrations).values(
                    job_id=job_id,
                    kind=kind.value,
                    state=State.PLANNED.value,
                    from_epoch=job.epoch,
                    to_epoch=to_epoch,
                    old_instance_id=job.instance_id,
                    request_id=request_id(job_id, to_epoch),
                    offers=json.dumps([o.to_doc() for o in ordered]),
                    offer_index=0,
                    attempts=0,
                    reason=note,
                    checkpoint_gb=gb,
                    created_at=now,
                    updated_at=now,
                )
            )
            pk = result.inserted_primary_key
            assert pk is not None
            mid = int(pk[0])
            self._set_job(conn, job_id, status=JobStatus.MIGRATING if kind is Kind.MOVE else JobStatus.RECOVERING)
        if note:
            log.warning("migration %d (%s): %s", mid, job_id, note)
        self.hook(f"enter:{State.PLANNED.value}")
        return self.migration(mid)

    def move(
        self, job_id: str, offers: Sequence[OfferKey], *, checkpoint_gb: float | Decimal | None = None
    ) -> MigrationRecord:
        """Plan and run a move of a running job; returns the finished migration (done or rolled back)."""
        return self.run(self.plan(job_id, offers, Kind.MOVE, checkpoint_gb=checkpoint_gb).id)

    def recover(
        self, job_id: str, offers: Sequence[OfferKey], *, checkpoint_gb: float | Decimal | None = None
    ) -> MigrationRecord:
        """Launch a new epoch from the last checkpoint at once (the old copy is gone, e.g. preempted).
        Also starts a registered job that never ran (epoch 1, from scratch)."""
        return self.run(self.plan(job_id, offers, Kind.RECOVER, checkpoint_gb=checkpoint_gb).id)

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
        mig = self.migration(migration_id)
        while not mig.finished:
            step = getattr(self, f"_step_{mig.state.value}")
            mig = step(mig)
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
        **values: Any,
    ) -> MigrationRecord:
        """Compare-and-set the row from ``mig.state`` to ``state``; in the same transaction update the job
        and write the copies' facts (``started``, ``ended``, ``verified``: the instance seen progressing).
        Then the hook, then the ledger sync."""
        values = {k: (v.value if isinstance(v, StrEnum) else v) for k, v in values.items()}
        pname = self.provider.name
        with self.engine.begin() as conn:
            now = self.now()
            res = conn.execute(
                update(migrations)
                .where(migrations.c.id == mig.id, migrations.c.state == mig.state.value)
                .values(state=state.value, updated_at=now, **values)
            )
            if res.rowcount != 1:
                raise ConcurrentTransition(f"migration {mig.id} is no longer {mig.state.value}")
            if job:
                self._set_job(conn, mig.job_id, **job)
            if started is not None:
                _write_copy_start(conn, pname, started, now)
            for end in ended:
                _write_copy_end(conn, pname, end, now)
            if verified is not None:
                _write_verified(conn, pname, mig.job_id, verified, now, now)
        log.info("migration %d (%s): %s -> %s %s", mig.id, mig.job_id, mig.state.value, state.value, values or "")
        if state is not mig.state:
            self.hook(f"enter:{state.value}")
        if started is not None or ended or verified is not None:
            self.sync_ledger(mig.job_id)
        return self.migration(mig.id)

    def _rollback(
        self, mig: MigrationRecord, reason: str, *, job: Mapping[str, Any], ended: Sequence[CopyEnd] = ()
    ) -> MigrationRecord:
        log.warning("migration %d (%s) rolled back: %s", mig.id, mig.job_id, reason)
        return self._advance(mig, State.ROLLED_BACK, reason=reason, job={**job, "reason": reason}, ended=ended)

    def _deadline(self, seconds: float) -> datetime:
        return self.now() + timedelta(seconds=seconds)

    def _alive(self, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        inst = _describe(self.provider, instance_id)
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
        inst = _describe(self.provider, instance_id)
        was_alive = inst is not None and inst.state in ALIVE_STATES
        if terminate:
            self.provider.terminate(instance_id)
            if was_alive:
                inst = _describe(self.provider, instance_id)
        if inst is not None and inst.state is InstanceState.PREEMPTED:
            reason = EndReason.PREEMPTED
        elif was_alive:
            reason = alive_reason
        else:
            reason = dead_reason or _dead_reason(inst, job.checkpoint_uri, epoch)
        end = _copy_end(inst, job.job_id, epoch, instance_id, reason, self.now())
        _mark_preempted(self.unavailable, end)
        return end

    # planned: ask the old copy for a checkpoint (move) or make sure it is gone (recover).
    def _step_planned(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        if mig.kind is Kind.RECOVER:
            ended = []
            if mig.old_instance_id is not None:
                ended.append(self._stop(job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.REPLACED))
            return self._advance(
                mig, State.CHECKPOINTED, reason=_join(mig.reason, "recovery: old copy gone"), ended=ended
            )
        assert mig.request_id is not None
        control.request_checkpoint(
            job.checkpoint_uri, epoch=mig.from_epoch, request_id=mig.request_id, reason=f"migration {mig.id}"
        )
        return self._advance(mig, State.CHECKPOINTING, deadline_at=self._deadline(self.checkpoint_timeout))

    # checkpointing: wait until the old copy has answered the request.
    def _step_checkpointing(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        assert mig.request_id is not None
        deadline = mig.deadline_at or self._deadline(self.checkpoint_timeout)
        while True:
            if control.request_served(job.checkpoint_uri, mig.request_id):
                return self._advance(mig, State.CHECKPOINTED, deadline_at=None)
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
                return self._advance(
                    mig, State.CHECKPOINTED, deadline_at=None, reason="old copy gone while checkpointing", ended=ended
                )
            if self.now() >= deadline:
                return self._rollback(
                    mig,
                    f"checkpoint request {mig.request_id} not served within {self.checkpoint_timeout:g} s; "
                    "the old copy keeps running",
                    job={"status": JobStatus.RUNNING},
                )
            self.sleep(self.poll_seconds)

    # checkpointed: choose the attempt's token and store it before any launch call.
    def _step_checkpointed(self, mig: MigrationRecord) -> MigrationRecord:
        return self._advance(
            mig, State.LAUNCHING, token=launch_token(mig.job_id, mig.to_epoch, mig.attempts), deadline_at=None
        )

    def _spec(self, job: JobRecord, mig: MigrationRecord, offer: OfferKey) -> LaunchSpec:
        env = {**job.env, **contract_env(job.job_id, job.checkpoint_uri, mig.to_epoch)}
        return LaunchSpec(
            offer=offer, command=job.command, env=env, tags=job_tags(job.job_id, mig.to_epoch), image=self.image
        )

    def _terminate_epoch_leftovers(
        self, job: JobRecord, epoch: int, reason: EndReason, keep: str | None = None
    ) -> list[CopyEnd]:
        gone = []
        for inst in self.provider.list({TAG_JOB: job.job_id, TAG_EPOCH: str(epoch)}):
            if inst.instance_id != keep and inst.state in HELD_STATES:
                gone.append(self._stop(job, epoch, inst.instance_id, alive_reason=reason))
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
        job = self.job(mig.job_id)
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
            ended = self._terminate_epoch_leftovers(job, mig.to_epoch, EndReason.FAILED_LAUNCH)
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
        return self._advance(mig, State.LAUNCHED, new_instance_id=inst.instance_id, started=started)

    # launched: fence (claim the new epoch) and hand the job to the new copy, atomically in the row.
    def _step_launched(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        try:
            control.claim_epoch(job.checkpoint_uri, mig.to_epoch)
        except StaleEpoch as exc:
            ended = []
            if mig.new_instance_id:
                ended.append(self._stop(job, mig.to_epoch, mig.new_instance_id, alive_reason=EndReason.ROLLBACK))
            return self._rollback(
                mig, f"a newer epoch owns the job ({exc})", job={"status": JobStatus.RECOVERING}, ended=ended
            )
        offer = mig.offers[mig.offer_index]
        return self._advance(
            mig,
            State.VERIFYING,
            deadline_at=self._deadline(self.verify_timeout),
            job={
                "epoch": mig.to_epoch,
                "instance_id": mig.new_instance_id,
                "offer": json.dumps(offer.to_doc()),
            },
        )

    # verifying: the new copy restored and is progressing (or finished the job).
    def _step_verifying(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
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
                # The new epoch is claimed: the old copy is fenced and can only waste work. Stop both;
                # the job is recovered from the last checkpoint by a new epoch.
                ended = []
                for iid, epoch in ((mig.new_instance_id, mig.to_epoch), (mig.old_instance_id, mig.from_epoch)):
                    if iid is not None:
                        ended.append(
                            self._stop(
                                job,
                                epoch,
                                iid,
                                alive_reason=EndReason.FAILED_VERIFICATION,
                                dead_reason=EndReason.FAILED_VERIFICATION if iid == mig.new_instance_id else None,
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
        job = self.job(mig.job_id)
        ended = []
        if mig.old_instance_id is not None and mig.old_instance_id != mig.new_instance_id:
            ended.append(
                self._stop(
                    job, mig.from_epoch, mig.old_instance_id, alive_reason=EndReason.MOVED, dead_reason=EndReason.MOVED
                )
            )
        # Anything else tagged with an older epoch of this job is an orphan by now.
        for epoch in range(1, mig.to_epoch):
            ended.extend(self._terminate_epoch_leftovers(job, epoch, EndReason.ORPHAN))
        return self._advance(
            mig,
            State.DONE,
            job={"status": JobStatus.RUNNING, "reason": f"{mig.kind.value} {mig.id} done"},
            ended=ended,
        )

    def reconcile(self) -> ReconcileReport:
        """Reconcile this migrator's provider (see :func:`reconcile`), billing what it finds."""
        return reconcile(
            self.engine, self.provider, ledger=self.ledger, unavailable=self.unavailable, egress=self.egress
        )


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _offer_name(key: OfferKey) -> str:
    zone = f"/{key.zone}" if key.zone else ""
    return f"{key.cloud.value} {key.region}{zone} {key.instance_type} ({key.market.value})"


# -- the reconciler -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a reconciler pass did. ``copies_closed``: interval keys of copies it found ended (orphans
    included); ``ledger``: the ledger sync after it (None without a ledger)."""

    orphans_terminated: tuple[str, ...]
    marked_for_recovery: tuple[str, ...]
    finished: tuple[str, ...]
    copies_closed: tuple[str, ...] = ()
    ledger: LedgerSync | None = None


def reconcile(
    engine: Engine,
    provider: CloudProvider,
    *,
    dry_run: bool = False,
    ledger: Ledger | None = None,
    unavailable: UnavailableOffers | None = None,
    egress: EgressRates = DEFAULT_EGRESS,
) -> ReconcileReport:
    """List the instances carrying costopt's tags on ``provider``; terminate orphans (no job, an epoch
    below the job's, or an epoch no active migration launched); mark this provider's jobs (registered
    with its name) whose instance vanished for recovery (or finished, when the copy wrote its ``done``
    record).

    Billing: every copy it finds ended (orphans it terminated, a job's vanished instance, any recorded
    copy of a job without an active migration that is no longer alive) is closed in
    ``migration_copies`` with the provider's end time, then the ledger is synced (when given). A copy
    found preempted marks its offer in ``unavailable`` (when given)."""
    now = _utcnow()
    pname = provider.name
    with engine.connect() as conn:
        jobs = {r.job_id: JobRecord.of(r) for r in conn.execute(select(migration_jobs)).all()}
        active = {
            r.job_id: MigrationRecord.of(r) for r in conn.execute(select(migrations).where(_active_condition())).all()
        }
    ends: list[CopyEnd] = []
    orphans: list[str] = []
    for inst in provider.list({TAG_MANAGED: "true"}):
        if inst.state not in HELD_STATES:
            continue  # ended (a preempted copy is the cloud's to remove); a STOPPED one still bills
        job = jobs.get(inst.tags.get(TAG_JOB, ""))
        try:
            epoch = int(inst.tags.get(TAG_EPOCH, "-1"))
        except ValueError:
            epoch = -1
        mig = active.get(job.job_id) if job else None
        if job is None:
            why = "no such job"
        elif epoch < job.epoch:
            why = f"stale epoch {epoch} < {job.epoch}"
        elif mig is not None and epoch in (mig.from_epoch, mig.to_epoch):
            continue  # in flight: the migrator owns it
        elif epoch > job.epoch:
            why = f"epoch {epoch} launched by no active migration"
        elif inst.instance_id != job.instance_id:
            why = f"a second copy of epoch {epoch}"
        else:
            continue
        log.warning("orphan %s (%s): terminating", inst.instance_id, why)
        orphans.append(inst.instance_id)
        if not dry_run:
            provider.terminate(inst.instance_id)
            gone = _describe(provider, inst.instance_id) or inst
            job_id = inst.tags.get(TAG_JOB) or "(untagged)"
            ends.append(_copy_end(gone, job_id, epoch, inst.instance_id, EndReason.ORPHAN, _utcnow()))

    recover: list[str] = []
    finished: list[str] = []
    for job in jobs.values():
        if job.status is not JobStatus.RUNNING or job.job_id in active or job.instance_id is None:
            continue
        if job.provider != pname:
            continue  # another provider's job: its instance is not this provider's to describe
        found = _describe(provider, job.instance_id)
        state = found.state if found is not None else None
        if state in ALIVE_STATES:
            continue
        end_reason = _dead_reason(found, job.checkpoint_uri, job.epoch)
        if end_reason is EndReason.FINISHED:
            finished.append(job.job_id)
            status, reason = JobStatus.FINISHED, f"instance {job.instance_id} finished the job"
        else:
            recover.append(job.job_id)
            status, reason = JobStatus.RECOVERING, f"instance {job.instance_id} vanished ({state or 'not found'})"
        if not dry_run:
            ends.append(_copy_end(found, job.job_id, job.epoch, job.instance_id, end_reason, _utcnow()))
            with engine.begin() as conn:
                conn.execute(
                    update(migration_jobs)
                    .where(migration_jobs.c.job_id == job.job_id, migration_jobs.c.status == JobStatus.RUNNING.value)
                    .values(status=status.value, reason=reason, updated_at=_utcnow())
                )

    # Any other recorded copy still open whose instance is gone (jobs in flight are their migrator's).
    seen = {e.instance_id for e in ends}
    for copy in copies(engine, open_only=True):
        if copy.job_id in active or copy.instance_id in seen or copy.provider != pname:
            continue
        found = _describe(provider, copy.instance_id)
        if found is not None and found.state in ALIVE_STATES:
            continue
        job = jobs.get(copy.job_id)
        reason = _dead_reason(found, job.checkpoint_uri if job else None, copy.epoch)
        ends.append(_copy_end(found, copy.job_id, copy.epoch, copy.instance_id, reason, now))

    closed: list[str] = []
    if not dry_run:
        for end in ends:
            _mark_preempted(unavailable, end)
            with engine.begin() as conn:
                if _write_copy_end(conn, pname, end, _utcnow()):
                    closed.append(interval_key(pname, end.job_id, end.epoch, end.instance_id))
    synced = sync_ledger(engine, ledger, egress=egress) if ledger is not None and not dry_run else None
    return ReconcileReport(tuple(orphans), tuple(recover), tuple(finished), tuple(closed), synced)
