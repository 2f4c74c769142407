"""The copies' facts and their sync to the ledger.

Every copy of a job (one instance of one epoch) is an interval in the ledger, keyed
``<provider>:<job>:e<epoch>:<instance>`` (:func:`~costopt.migration.records.interval_key`), opened at
its launch (the provider's launch time) and closed when it is terminated, found preempted or gone (the
provider's end time when it knows it, else now), with an end reason
(:class:`~costopt.migration.records.EndReason`). The facts are first written to ``migration_copies``
(:func:`write_copy_start`, :func:`write_copy_end`, :func:`write_verified`, on the caller's connection:
the migrator and the reconciler write them in the same transaction as what they learned), so a crash
never changes them: the table is the ledger's outbox. :func:`sync_ledger` then copies them to the ledger,
and the copy row's flags record what the ledger holds. Ledger writes are idempotent by key, so a crash
between a ledger write and its flag repeats nothing; with a :class:`~costopt.ledger.sql.SqlLedger` on the
same database the flag is written in the transaction of the ledger write it records (one commit, not two).

A copy given the checkpoint's size (a move's ``checkpoint_gb``) records its egress when it is launched
(an additive charge keyed by the migration id: GB x the ``egress`` rate from the old copy's place to the
new one's; none within a region); each copy's boot-and-restore time (``restart``) and a moved copy's
overlap with its successor (``overlap``) are memo lines. Only facts are recorded here: the ledger prices
an interval when it closes, from its own price view (``SqlLedger(engine, prices)``). A ledger failure
(e.g. no price known for the offer) is logged, kept in ``migration_copies.ledger_error`` and retried at
the next sync.

Also here: how a copy ended from the provider's view (:func:`describe_or_none`, :func:`copy_end`,
:func:`end_reason_of`) and what a preempted copy's end marks (:func:`mark_preempted`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import Engine, and_, bindparam, insert, not_, or_, select, update
from sqlalchemy.engine import Connection

from costopt.agent import control
from costopt.cloud import CloudProvider, Instance, InstanceState, NotFoundError
from costopt.db.inlist import InList
from costopt.db.jobs_schema import jobs
from costopt.db.migration_schema import migration_copies
from costopt.db.upserts import per_dialect
from costopt.ledger.book import Ledger
from costopt.ledger.model import ChargeKind, ChargeRecord, IntervalRecord, LedgerError
from costopt.ledger.sql import SqlLedger
from costopt.migration.records import CopyEnd, CopyRecord, CopyStart, EndReason, interval_key
from costopt.migration.unavailable import REASON_PREEMPTED, UnavailableOffers
from costopt.planning.model import DEFAULT_EGRESS, EgressRates

log = logging.getLogger("costopt.migration.ledger_sync")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def describe_or_none(provider: CloudProvider, instance_id: str) -> Instance | None:
    try:
        return provider.describe(instance_id)
    except NotFoundError:
        return None


def copy_end(
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


def end_reason_of(inst: Instance | None, checkpoint_uri: str | None, epoch: int) -> EndReason:
    """Why a copy that is no longer alive ended: preempted, finished the job, or gone."""
    if inst is not None and inst.state is InstanceState.PREEMPTED:
        return EndReason.PREEMPTED
    if checkpoint_uri is not None and epoch >= 1 and control.progress(checkpoint_uri, epoch).done:
        return EndReason.FINISHED
    return EndReason.GONE


_C = migration_copies.c
# The hot statements, built once (SQLAlchemy then reuses their cache keys; values are parameters).
_KEY_EXISTS = select(_C.interval_key).where(_C.interval_key == bindparam("b_key"))
_INSERT_COPY = insert(migration_copies)
_INSERT_NEW_COPY = per_dialect(
    lambda insert_of: insert_of(migration_copies).on_conflict_do_nothing(index_elements=["interval_key"])
)
"""A copy's row unless its key is recorded already (one statement, no read first), per dialect."""
_COPY_OF = select(_C.interval_key, _C.started_at, _C.ended_at).where(
    _C.job_id == bindparam("b_job_id"),
    _C.instance_id == bindparam("b_instance_id"),
    _C.provider == bindparam("b_provider"),
)
_CLOSE_COPY = (
    update(migration_copies)
    .where(_C.interval_key == bindparam("b_key"), _C.ended_at.is_(None))
    .values(ended_at=bindparam("b_ended_at"), end_reason=bindparam("b_reason"), updated_at=bindparam("b_now"))
)
_VERIFIED = (
    update(migration_copies)
    .where(
        _C.job_id == bindparam("b_job_id"),
        _C.instance_id == bindparam("b_instance_id"),
        _C.provider == bindparam("b_provider"),
        _C.verified_at.is_(None),
    )
    .values(verified_at=bindparam("b_at"), updated_at=bindparam("b_now"))
)
_COPIES_ORDER = (_C.job_id, _C.epoch, _C.started_at, _C.interval_key)
_COPIES_OF = select(migration_copies).where(_C.job_id == bindparam("b_job_id")).order_by(*_COPIES_ORDER)
_COPIES_OF_INSTANCES = InList(
    lambda among: select(migration_copies).where(_C.job_id == bindparam("b_job_id"), among).order_by(*_COPIES_ORDER),
    _C.instance_id,
    "b_ids",
)
"""A job's copies among some instances (a recorded migration's two): a statement per list length."""
_OPEN_COPIES_OF = (
    select(migration_copies).where(_C.job_id == bindparam("b_job_id"), _C.ended_at.is_(None)).order_by(*_COPIES_ORDER)
)
_SET_FLAGS = update(migration_copies).where(_C.interval_key == bindparam("b_key"))
"""Executed with the flags (and ``ledger_error``, ``updated_at``) as parameters: the SET clause."""
_SUCCESSOR = (
    select(_C.started_at, _C.epoch)
    .where(_C.job_id == bindparam("b_job_id"), _C.epoch > bindparam("b_epoch"), _C.migration_id.is_not(None))
    .order_by(_C.epoch, _C.started_at)
)


def write_copy_start(conn: Connection, provider: str, start: CopyStart, now: datetime) -> bool:
    """Insert the copy's row (idempotent: a copy already recorded is left as it is; on SQLite and PostgreSQL by
    ``ON CONFLICT DO NOTHING``, without a read first). False when it was there."""
    key = interval_key(provider, start.job_id, start.epoch, start.instance_id)
    insert_new = _INSERT_NEW_COPY.get(conn.dialect.name)
    if insert_new is None and conn.execute(_KEY_EXISTS, {"b_key": key}).first():
        return False
    done = conn.execute(
        _INSERT_COPY if insert_new is None else insert_new,
        {
            "interval_key": key,
            "job_id": start.job_id,
            "epoch": start.epoch,
            "instance_id": start.instance_id,
            "provider": provider,
            "offer": json.dumps(start.offer.to_doc()),
            "migration_id": start.migration_id,
            "source_offer": json.dumps(start.source_offer.to_doc()) if start.source_offer else None,
            "egress_gb": start.egress_gb,
            "started_at": start.started_at,
            "ledger_opened": False,
            "ledger_memo": False,
            "ledger_closed": False,
            "updated_at": now,
        },
    )
    return insert_new is None or bool(done.rowcount)


def write_copy_end(conn: Connection, provider: str, end: CopyEnd, now: datetime) -> bool:
    """Close the copy's row (first end wins; never before it started), or insert it closed when nobody
    recorded it (an orphan). False when there was nothing to write."""
    row = conn.execute(
        _COPY_OF, {"b_job_id": end.job_id, "b_instance_id": end.instance_id, "b_provider": provider}
    ).first()
    if row is not None:
        if row.ended_at is not None:
            return False
        conn.execute(
            _CLOSE_COPY,
            {
                "b_key": row.interval_key,
                "b_ended_at": max(end.ended_at, row.started_at),
                "b_reason": end.reason.value,
                "b_now": now,
            },
        )
        return True
    if end.offer is None:
        log.warning(
            "copy %s of %s (epoch %d) ended unseen: no offer known, not billed", end.instance_id, end.job_id, end.epoch
        )
        return False
    started = min(end.launched_at or end.ended_at, end.ended_at)
    write_copy_start(conn, provider, CopyStart(end.job_id, end.epoch, end.instance_id, end.offer, started), now)
    return write_copy_end(conn, provider, end, now)


def write_verified(conn: Connection, provider: str, job_id: str, instance_id: str, at: datetime, now: datetime) -> bool:
    """Record when the copy was first seen progressing (the first time wins). False when it was recorded."""
    done = conn.execute(
        _VERIFIED, {"b_job_id": job_id, "b_instance_id": instance_id, "b_provider": provider, "b_at": at, "b_now": now}
    )
    return bool(done.rowcount)


def copies(
    engine: Engine,
    job_id: str | None = None,
    *,
    open_only: bool = False,
    instance_ids: Collection[str] | None = None,
) -> list[CopyRecord]:
    """The copies of ``job_id`` (or of every job), by job, epoch and launch time; only those not known
    to have ended with ``open_only``; only those of ``instance_ids`` when given (with ``job_id``)."""
    if job_id is not None and instance_ids is not None:
        if not instance_ids:
            return []
        query, params = _COPIES_OF_INSTANCES.bind(sorted(instance_ids))
        if open_only:
            query = query.where(_C.ended_at.is_(None))
        with engine.connect() as conn:
            rows = conn.execute(query, {**params, "b_job_id": job_id}).all()
        return [CopyRecord.of(r) for r in rows]
    if job_id is not None:
        with engine.connect() as conn:
            rows = conn.execute(_OPEN_COPIES_OF if open_only else _COPIES_OF, {"b_job_id": job_id}).all()
        return [CopyRecord.of(r) for r in rows]
    query = select(migration_copies).order_by(*_COPIES_ORDER)
    if open_only:
        query = query.where(_C.ended_at.is_(None))
    with engine.connect() as conn:
        return [CopyRecord.of(r) for r in conn.execute(query).all()]


@dataclass(frozen=True, slots=True)
class LedgerSync:
    """What one :func:`sync_ledger` pass did: ledger writes made, copies still pending, errors met."""

    written: int
    pending: int
    errors: tuple[str, ...]


_PENDING = or_(
    not_(migration_copies.c.ledger_opened),
    and_(
        not_(migration_copies.c.ledger_memo),
        or_(migration_copies.c.verified_at.is_not(None), migration_copies.c.ended_at.is_not(None)),
    ),
    and_(not_(migration_copies.c.ledger_closed), migration_copies.c.ended_at.is_not(None)),
)
"""The copies whose facts the ledger does not hold yet (:attr:`CopyRecord.synced` in SQL), built once."""
_PENDING_ALL = (
    select(migration_copies, jobs.c.team_id.label("b_team"))
    .select_from(migration_copies.outerjoin(jobs, jobs.c.id == _C.job_id))
    .where(_PENDING)
    .order_by(_C.started_at, _C.interval_key)
)
"""Every pending copy with its job's team (``jobs.team_id``, in the same read)."""
_PENDING_OF = _PENDING_ALL.where(_C.job_id == bindparam("b_job_id"))


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
    with engine.connect() as conn:
        if job_id is None:
            rows = conn.execute(_PENDING_ALL).all()
        else:
            rows = conn.execute(_PENDING_OF, {"b_job_id": job_id}).all()
    pending = [CopyRecord.of(r) for r in rows]
    # a job the migrator runs without a ``jobs`` row (a drill, a backtest) has no team: billed to ""
    teams = {str(r.job_id): r.b_team for r in rows if r.b_team is not None}
    written = 0
    errors: list[str] = []
    left = 0
    for copy in pending:
        try:
            written += _sync_copy(engine, ledger, copy, teams.get(copy.job_id, ""), egress, hook)
        except LedgerError as exc:
            left += 1
            msg = f"{copy.interval_key}: {type(exc).__name__}: {exc}"
            errors.append(msg)
            if copy.ledger_error != str(exc):
                log.warning("ledger: cannot record copy %s yet (retried at the next sync)", msg)
            with engine.begin() as conn:
                conn.execute(_SET_FLAGS, {"b_key": copy.interval_key, "ledger_error": str(exc)})
    return LedgerSync(written, left, tuple(errors))


def _set_flags(engine: Engine, key: str, **flags: bool) -> None:
    with engine.begin() as conn:
        _flags_on(conn, key, flags)


def _flags_on(conn: Connection, key: str, flags: dict[str, bool]) -> None:
    conn.execute(_SET_FLAGS, {"b_key": key, "ledger_error": None, "updated_at": _utcnow(), **flags})


@dataclass(frozen=True, slots=True)
class _Flag:
    """A copy's ledger flag, committed after its ledger write(s): in the transaction of the last write when the
    ledger is a :class:`SqlLedger` on the copies' database (one commit instead of two; a crash loses both,
    and the next sync writes both), else in one of its own. ``point``: the hook's fault-injection point,
    called right after the write(s), before the flag."""

    engine: Engine
    key: str
    flags: dict[str, bool]
    point: str | None
    hook: Callable[[str], None] | None
    inline: bool

    def then(self) -> Callable[[Connection], None] | None:
        """What the last ledger write runs in its transaction (None: not inline, see :meth:`after`)."""
        return self._write if self.inline else None

    def after(self) -> None:
        """After the last ledger write returned: the hook and the flag's own transaction (not inline)."""
        if not self.inline:
            if self.point is not None and self.hook is not None:
                self.hook(self.point)
            _set_flags(self.engine, self.key, **self.flags)

    def _write(self, conn: Connection) -> None:
        if self.point is not None and self.hook is not None:
            self.hook(self.point)
        _flags_on(conn, self.key, self.flags)


def _sync_copy(
    engine: Engine,
    ledger: Ledger,
    copy: CopyRecord,
    team: str,
    egress: EgressRates,
    hook: Callable[[str], None] | None,
) -> int:
    written = 0
    inline = isinstance(ledger, SqlLedger) and ledger.engine is engine

    def flag(point: str | None, **flags: bool) -> _Flag:
        return _Flag(engine, copy.interval_key, flags, point, hook, inline)

    interval = IntervalRecord(
        interval_key=copy.interval_key,
        job_id=copy.job_id,
        instance_id=copy.instance_id,
        offer=copy.offer,
        started_at=copy.started_at,
        team=team,
        provider=copy.provider,
    )
    if not copy.ledger_opened:
        _record_flagged(ledger, interval, _egress_charge(copy, egress, team), flag("ledger:opened", ledger_opened=True))
        written += 1
    memo_end = copy.verified_at or copy.ended_at
    if not copy.ledger_memo and memo_end is not None:
        memo = flag(None, ledger_memo=True)
        if memo_end > copy.started_at:
            progressed = copy.verified_at is not None
            _record_charge(
                ledger,
                ChargeRecord(
                    charge_key=f"{copy.interval_key}:restart",
                    job_id=copy.job_id,
                    kind=ChargeKind.RESTART,
                    at=memo_end,
                    team=team,
                    offer=copy.offer,
                    interval_key=copy.interval_key,
                    span=(copy.started_at, memo_end),
                    note="boot and restore, before the copy progressed"
                    if progressed
                    else "boot, the copy never progressed",
                ),
                memo.then(),
            )
            memo.after()
            written += 1
        else:
            _set_flags(engine, copy.interval_key, ledger_memo=True)
    if not copy.ledger_closed and copy.ended_at is not None:
        final = replace(interval, ended_at=copy.ended_at, end_reason=copy.end_reason)
        _record_flagged(ledger, final, _overlap_charge(engine, copy, team), flag("ledger:closed", ledger_closed=True))
        written += 1
    return written


def _record_flagged(ledger: Ledger, interval: IntervalRecord, charge: ChargeRecord | None, flag: _Flag) -> None:
    """The interval, then the charge when there is one; the flag commits with the last of them (or after)."""
    if charge is None:
        _record_interval(ledger, interval, flag.then())
    else:
        ledger.record_interval(interval)
        _record_charge(ledger, charge, flag.then())
    flag.after()


def _record_interval(ledger: Ledger, record: IntervalRecord, then: Callable[[Connection], None] | None) -> None:
    if then is None:
        ledger.record_interval(record)
    else:
        assert isinstance(ledger, SqlLedger)
        ledger.record_interval(record, then=then)


def _record_charge(ledger: Ledger, record: ChargeRecord, then: Callable[[Connection], None] | None) -> None:
    if then is None:
        ledger.record_charge(record)
    else:
        assert isinstance(ledger, SqlLedger)
        ledger.record_charge(record, then=then)


def _egress_charge(copy: CopyRecord, egress: EgressRates, team: str) -> ChargeRecord | None:
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
        team=team,
        quantity=copy.egress_gb,
        unit="GB",
        rate_usd=Decimal(repr(rate)),
        offer=src,
        interval_key=copy.interval_key,
        note=f"checkpoint {src.cloud.value} {src.region} -> {dst.cloud.value} {dst.region}"
        f" (migration {copy.migration_id})",
    )


def _overlap_charge(engine: Engine, copy: CopyRecord, team: str) -> ChargeRecord | None:
    """A moved copy billed while its successor booted and was verified: ``[successor start, its end)``."""
    if copy.end_reason != EndReason.MOVED.value or copy.ended_at is None:
        return None
    with engine.connect() as conn:
        succ = conn.execute(_SUCCESSOR, {"b_job_id": copy.job_id, "b_epoch": copy.epoch}).first()
    if succ is None or succ.started_at >= copy.ended_at:
        return None
    start = max(succ.started_at, copy.started_at)
    return ChargeRecord(
        charge_key=f"{copy.interval_key}:overlap",
        job_id=copy.job_id,
        kind=ChargeKind.OVERLAP,
        at=copy.ended_at,
        team=team,
        offer=copy.offer,
        interval_key=copy.interval_key,
        span=(start, copy.ended_at),
        note=f"billed while epoch {succ.epoch} booted and was verified",
    )


def mark_preempted(unavailable: UnavailableOffers | None, end: CopyEnd) -> None:
    """Mark the offer of a copy found preempted unavailable (when there is a cache)."""
    if unavailable is None or end.reason is not EndReason.PREEMPTED or end.offer is None:
        return
    unavailable.mark(end.offer, REASON_PREEMPTED, at=end.ended_at, detail=f"{end.instance_id} preempted")
