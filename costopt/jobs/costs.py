"""What a managed job cost, from the ledger: so far, and per move or preemption.

Everything here reads the ledger (:class:`costopt.ledger.book.Ledger`, the service's
:class:`~costopt.ledger.sql.SqlLedger`), which the migrator fills for every copy of every job (one
interval per copy, egress charges per move, restart and overlap memo lines); nothing is re-derived.
Money is exact Decimal USD (the ledger's integer micro-dollars); times are tz-aware UTC.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol

from sqlalchemy.engine import Connection

from costopt.ledger.book import Ledger
from costopt.ledger.model import ChargeKind, ChargeLine, LedgerError, micro_to_usd
from costopt.ledger.sql import SqlLedger

__all__ = [
    "CopyKeys",
    "MigrationCost",
    "job_charges",
    "job_cost",
    "migration_charge_keys",
    "migration_cost",
    "page_costs",
]


class _HasLedger(Protocol):
    @property
    def ledger(self) -> Ledger | None: ...


def _ledger_of(source: Ledger | _HasLedger) -> Ledger:
    ledger: Ledger | None = source.ledger if hasattr(source, "ledger") else source
    if ledger is None:
        raise ValueError("no ledger: the engine's migrators are not billed (give them the service's SqlLedger)")
    return ledger


def job_cost(source: Ledger | _HasLedger, job_id: str, at: datetime, *, conn: Connection | None = None) -> Decimal:
    """The job's cost up to ``at`` (tz-aware UTC) in USD, exact: its closed intervals, its open ones
    priced up to ``at`` (both clipped at ``at``), plus its additive charges (egress) dated before ``at``.
    Memo lines (restart, overlap, lost work) explain part of the intervals and are not added.

    ``source`` is a ledger, or anything with a ``ledger`` attribute (a :class:`~costopt.jobs.engine.JobEngine`).
    ``conn``: read a :class:`~costopt.ledger.sql.SqlLedger` on this connection (a request's; ignored by
    other ledgers). Raises :class:`~costopt.ledger.model.LedgerError` when an open interval's offer has
    no price in effect.
    """
    if at.tzinfo is None:
        raise ValueError(f"at must be tz-aware UTC, got {at!r}")
    ledger = _ledger_of(source)
    if conn is not None and isinstance(ledger, SqlLedger):
        return ledger.costs(job_id=job_id, end=at, as_of=at, conn=conn).total_usd
    return ledger.costs(job_id=job_id, end=at, as_of=at).total_usd


def page_costs(
    source: Ledger | _HasLedger, job_ids: Collection[str], at: datetime, *, conn: Connection | None = None
) -> dict[str, Decimal] | None:
    """The costs up to ``at`` of several jobs read at once (a page of a listing), each what :func:`job_cost`
    gives it: job id -> USD for the jobs with ledger lines (a job absent has none: 0). None when an open
    interval of one of them has no price in effect: then price each alone (:func:`job_cost`), so that one
    job's missing price leaves the others' figures."""
    if at.tzinfo is None:
        raise ValueError(f"at must be tz-aware UTC, got {at!r}")
    ledger = _ledger_of(source)
    try:
        if conn is not None and isinstance(ledger, SqlLedger):
            report = ledger.costs(job_ids=job_ids, end=at, as_of=at, conn=conn)
        else:
            report = ledger.costs(job_ids=job_ids, end=at, as_of=at)
    except LedgerError:
        return None
    return report.by("job_id")


def job_charges(source: Ledger | _HasLedger, job_id: str) -> tuple[ChargeLine, ...]:
    """Every charge line of the job (egress, restart, overlap, lost work), oldest first."""
    ledger = _ledger_of(source)
    read = getattr(ledger, "charges", None)
    if read is None:
        raise TypeError(f"{type(ledger).__name__} cannot list charges: use SqlLedger or MemoryLedger")
    return tuple(read(job_id=job_id))


@dataclass(frozen=True, slots=True)
class CopyKeys:
    """The ledger interval keys of a migration's two copies (None: no such copy, e.g. a recovery whose
    old copy was never recorded, or a move that launched nothing)."""

    old: str | None
    new: str | None


@dataclass(frozen=True, slots=True)
class MigrationCost:
    """What one move or recovery cost beyond the job's useful work, from the ledger (Decimal USD):

    - ``egress``: the checkpoint shipped to another region or cloud (money on top of the intervals);
    - ``overlap``: the old copy billed while the new one booted and was verified (part of its interval);
    - ``restart``: the new copy billed while it booted and restored, before it progressed;
    - ``known``: False when the ledger holds none of these lines yet (e.g. no price known for the offer).
    """

    egress: Decimal
    overlap: Decimal
    restart: Decimal
    known: bool

    @property
    def total(self) -> Decimal:
        return self.egress + self.overlap + self.restart


def migration_charge_keys(job_id: str, migration_id: int, keys: CopyKeys) -> tuple[str, ...]:
    """The keys of the charge lines :func:`migration_cost` reads (a ledger may read just these)."""
    out = [f"{job_id}:m{migration_id}:egress"]
    if keys.old:
        out.append(f"{keys.old}:overlap")
    if keys.new:
        out.append(f"{keys.new}:restart")
    return tuple(out)


def migration_cost(charges: Sequence[ChargeLine], job_id: str, migration_id: int, keys: CopyKeys) -> MigrationCost:
    """The cost of migration ``migration_id`` of ``job_id`` (see :class:`MigrationCost`) from the job's
    charge lines (:func:`job_charges`, or only those of :func:`migration_charge_keys`): its egress charge
    (keyed by the migration), the overlap memo of its old copy and the restart memo of its new copy."""
    lines = tuple(charges)
    by_key = {c.record.charge_key: c for c in lines}
    egress = by_key.get(f"{job_id}:m{migration_id}:egress")
    overlap = by_key.get(f"{keys.old}:overlap") if keys.old else None
    restart = by_key.get(f"{keys.new}:restart") if keys.new else None

    def usd(line: ChargeLine | None, kind: ChargeKind) -> Decimal:
        if line is None or line.record.kind != kind:
            return Decimal(0)
        return micro_to_usd(line.amount_micro_usd)

    return MigrationCost(
        egress=usd(egress, ChargeKind.EGRESS),
        overlap=usd(overlap, ChargeKind.OVERLAP),
        restart=usd(restart, ChargeKind.RESTART),
        known=any(x is not None for x in (egress, overlap, restart)),
    )
