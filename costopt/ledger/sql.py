"""The ledger in the database (SQLite or PostgreSQL; tables of migration ``0003``).

Same rules as :class:`costopt.ledger.book.MemoryLedger` (see that module): idempotent per key, an
interval priced once when it closes (its segments written in the same transaction as the close, so a
retry after a crash never writes them twice), period reports clipped and integrated in Decimal.

Concurrency: an insert that loses a race on the unique key (``ON CONFLICT DO NOTHING``), or a close
that finds the interval already closed (``UPDATE ... WHERE ended_at IS NULL`` touching no row), re-reads
the stored line and applies the rules again, so two writers recording the same interval store it once.
Prices are read (``prices.steps``) before the write transaction opens, never inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Row, and_, bindparam, func, or_, select, update
from sqlalchemy.engine import Connection

from costopt.db.inlist import InList
from costopt.db.ledger_schema import ledger_charges, ledger_intervals, ledger_segments
from costopt.db.upserts import CONFLICT_INSERTS
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.book import charge_micro_usd, check_charge, merge_interval, price_interval, report
from costopt.ledger.model import (
    ChargeKind,
    ChargeLine,
    ChargeRecord,
    CostReport,
    IntervalLine,
    IntervalRecord,
    LedgerConflict,
    LedgerError,
    Segment,
    micro_to_usd,
)
from costopt.ledger.prices import PriceSteps

__all__ = ["SqlLedger"]

log = logging.getLogger(__name__)

_ATTEMPTS = 3
_IN_CHUNK = 500


def _now() -> datetime:
    return datetime.now(UTC)


Then = Callable[[Connection], None]
"""What a caller writes with a ledger line (``then=`` of :meth:`SqlLedger.record_interval` and
:meth:`SqlLedger.record_charge`): run on the transaction that wrote the line, before its commit, or, when the
line was stored already (nothing written), in a transaction of its own; never when the call raises."""


# The hot statements, built once (SQLAlchemy then reuses their cache keys; values are parameters).
_INTERVAL = select(ledger_intervals).where(ledger_intervals.c.interval_key == bindparam("b_key"))
_CLOSING: dict[str, Any] = {
    "ended_at": bindparam("b_ended_at"),
    "end_reason": bindparam("b_end_reason"),
    "amount_micro_usd": bindparam("b_amount"),
    "updated_at": bindparam("b_now"),
}
_CLOSE = (
    update(ledger_intervals)
    .where(ledger_intervals.c.id == bindparam("b_id"), ledger_intervals.c.ended_at.is_(None))
    .values(**_CLOSING)
)
_CLOSE_OPEN = (
    update(ledger_intervals)
    .where(ledger_intervals.c.interval_key == bindparam("b_key"), ledger_intervals.c.ended_at.is_(None))
    .values(**_CLOSING)
    .returning(*ledger_intervals.c)
)
_INSERT_SEGMENTS = ledger_segments.insert()
_CHARGE = select(ledger_charges).where(ledger_charges.c.charge_key == bindparam("b_key"))
_CHARGES_BY_KEY = InList(
    lambda among: select(ledger_charges).where(among).order_by(ledger_charges.c.at, ledger_charges.c.charge_key),
    ledger_charges.c.charge_key,
    "b_keys",
)
"""The charges among some keys (a migration's few): a statement per list length."""
_JOB_CHARGES = (
    select(ledger_charges)
    .where(ledger_charges.c.job_id == bindparam("b_job_id"))
    .order_by(ledger_charges.c.at, ledger_charges.c.charge_key)
)


def _offer(row: Row[Any]) -> OfferKey:
    return OfferKey(Cloud(row.cloud), row.region, row.zone or "", row.instance_type, Market(row.market))


def _interval_record(row: Row[Any]) -> IntervalRecord:
    return IntervalRecord(
        interval_key=row.interval_key,
        job_id=row.job_id,
        instance_id=row.instance_id,
        offer=_offer(row),
        started_at=row.started_at,
        ended_at=row.ended_at,
        share=row.share,
        team=row.team,
        provider=row.provider,
        end_reason=row.end_reason,
    )


def _interval_line(row: Row[Any], segments: Mapping[int, Sequence[Segment]]) -> IntervalLine:
    """A stored interval as a line: open, or closed with its segments (``segments``: by interval id)."""
    rec = _interval_record(row)
    if row.ended_at is None:
        return IntervalLine(rec)
    return IntervalLine(rec, tuple(segments.get(row.id, ())), int(row.amount_micro_usd))


def _charge_record(row: Row[Any]) -> ChargeRecord:
    """A stored charge as a record; its amount is the stored one (it was valued when recorded)."""
    return ChargeRecord(
        charge_key=row.charge_key,
        job_id=row.job_id,
        kind=ChargeKind(row.kind),
        at=row.at,
        team=row.team,
        amount_usd=micro_to_usd(int(row.amount_micro_usd)),
        quantity=row.quantity,
        unit=row.unit,
        rate_usd=row.rate_usd,
        offer=None if row.cloud is None else _offer(row),
        interval_key=row.interval_key,
        span=None if row.span_start is None else (row.span_start, row.span_end),
        note=row.note,
    )


def _job_conds(column: Any, job_id: str | None, job_ids: Collection[str] | None) -> list[Any]:
    """The job filters of a ledger read: ``job_id`` equal, ``job_ids`` (non-empty) an ``IN`` list."""
    conds: list[Any] = []
    if job_id is not None:
        conds.append(column == job_id)
    if job_ids:
        conds.append(column.in_(sorted(set(job_ids))))
    return conds


class SqlLedger:
    """The ledger on ``engine`` (migrated to ``0003`` or later); open intervals and memo charges are
    priced from ``prices``."""

    def __init__(self, engine: Engine, prices: PriceSteps) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise LedgerError(f"the ledger runs on SQLite or PostgreSQL, not {engine.dialect.name}")
        self.engine = engine
        self.prices = prices
        # the inserts that keep the first writer's line, built once per dialect (values are parameters)
        self._insert_interval = (
            self._insert(ledger_intervals)
            .on_conflict_do_nothing(index_elements=["interval_key"])
            .returning(ledger_intervals.c.id)
        )
        self._insert_charge = (
            self._insert(ledger_charges)
            .on_conflict_do_nothing(index_elements=["charge_key"])
            .returning(ledger_charges.c.id)
        )

    def _insert(self, table: Any) -> Any:
        return CONFLICT_INSERTS.get(self.engine.dialect.name, CONFLICT_INSERTS["sqlite"])(table)

    # --- intervals ------------------------------------------------------------------------------------

    def _load_interval(self, conn: Connection, key: str) -> tuple[int, IntervalLine] | None:
        row = conn.execute(_INTERVAL, {"b_key": key}).first()
        if row is None:
            return None
        segs = self._segments(conn, [] if row.ended_at is None else [row.id])
        return row.id, _interval_line(row, segs)

    def _then_alone(self, then: Then | None) -> None:
        if then is not None:
            with self.engine.begin() as conn:
                then(conn)

    def record_interval(self, record: IntervalRecord, *, then: Then | None = None) -> IntervalLine:
        """Record (or close) an interval idempotently (module docstring); returns the stored line.

        Neither an open interval nor the close of a stored open one reads first (a copy's interval is
        opened once, at its launch, and closed once): an open one is inserted, a closed one closes the stored
        open line by its key in one statement (its facts compared in the same transaction); only when the key
        is taken (open) or no open line has it (closed) is the stored line read and merged. ``then``: what
        the caller writes with the line, in the same transaction (:data:`Then`)."""
        if record.ended_at is not None:
            closed = self._close_open(record, then)
            if closed is not None:
                return closed
        first = record.ended_at is None
        for _ in range(_ATTEMPTS + first):
            if first:
                first = False
                found = None
            else:
                with self.engine.connect() as conn:
                    found = self._load_interval(conn, record.interval_key)
            stored = None if found is None else found[1]
            to_store, closes = merge_interval(stored, record)
            if to_store is None:
                if stored is None:  # pragma: no cover - merge_interval never returns None without a stored line
                    raise LedgerError("nothing stored")
                self._then_alone(then)
                return stored
            line = price_interval(self.prices, to_store)  # prices read outside the write transaction
            now = _now()
            with self.engine.begin() as conn:
                if found is None:
                    rec = line.record
                    values = {
                        "interval_key": rec.interval_key,
                        "job_id": rec.job_id,
                        "team": rec.team,
                        "provider": rec.provider,
                        "instance_id": rec.instance_id,
                        "cloud": rec.offer.cloud.value,
                        "region": rec.offer.region,
                        "zone": rec.offer.zone,
                        "instance_type": rec.offer.instance_type,
                        "market": rec.offer.market.value,
                        "share": rec.share,
                        "started_at": rec.started_at,
                        "ended_at": rec.ended_at,
                        "end_reason": rec.end_reason,
                        "amount_micro_usd": line.amount_micro_usd,
                        "recorded_at": now,
                        "updated_at": now,
                    }
                    new_id = conn.execute(self._insert_interval, values).scalar_one_or_none()
                    if new_id is None:
                        continue  # another writer inserted it first: re-read and merge again
                    self._write_segments(conn, int(new_id), line)
                    if then is not None:
                        then(conn)
                    return line
                interval_id = found[0]
                if not closes:  # pragma: no cover - merge_interval only writes a stored line to close it
                    raise LedgerError("unexpected rewrite of a stored interval")
                res = conn.execute(
                    _CLOSE,
                    {
                        "b_id": interval_id,
                        "b_ended_at": line.record.ended_at,
                        "b_end_reason": line.record.end_reason,
                        "b_amount": line.amount_micro_usd,
                        "b_now": now,
                    },
                )
                if res.rowcount != 1:
                    continue  # closed meanwhile by another writer: re-read and compare
                self._write_segments(conn, interval_id, line)
                if then is not None:
                    then(conn)
                return line
        raise LedgerError(f"interval {record.interval_key!r}: could not record it after {_ATTEMPTS} attempts")

    def _close_open(self, record: IntervalRecord, then: Then | None) -> IntervalLine | None:
        """Close the stored open interval of ``record``'s key (``UPDATE ... RETURNING``, its segments in the
        same transaction); a stored line with other facts is a :class:`LedgerConflict` (nothing written).
        None: no open line has the key, or no price is known (the read-and-merge path decides: a line
        closed already needs none)."""
        try:
            line = price_interval(self.prices, record)  # prices read outside the write transaction
        except LedgerError:
            return None
        now = _now()
        with self.engine.begin() as conn:
            row = conn.execute(
                _CLOSE_OPEN,
                {
                    "b_key": record.interval_key,
                    "b_ended_at": record.ended_at,
                    "b_end_reason": record.end_reason,
                    "b_amount": line.amount_micro_usd,
                    "b_now": now,
                },
            ).first()
            if row is None:
                return None
            old = replace(_interval_record(row), ended_at=None, end_reason=None)
            if not old.same_facts(record):  # raised inside the transaction: the close is rolled back
                raise LedgerConflict(
                    f"interval {record.interval_key!r} is already recorded with other facts: stored {old}, "
                    f"given {record}"
                )
            self._write_segments(conn, int(row.id), line)
            if then is not None:
                then(conn)
        return line

    @staticmethod
    def _write_segments(conn: Connection, interval_id: int, line: IntervalLine) -> None:
        if not line.segments:
            return
        conn.execute(
            _INSERT_SEGMENTS,
            [
                {
                    "interval_id": interval_id,
                    "seq": i,
                    "starts_at": s.starts_at,
                    "ends_at": s.ends_at,
                    "usd_per_hour": s.usd_per_hour,
                    "amount_micro_usd": s.amount_micro_usd,
                }
                for i, s in enumerate(line.segments)
            ],
        )

    # --- charges --------------------------------------------------------------------------------------

    def record_charge(self, record: ChargeRecord, *, then: Then | None = None) -> ChargeLine:
        """Record a charge once per key (module docstring); returns the stored line. ``then``: what the caller
        writes with the line, in the same transaction (:data:`Then`)."""
        amount = charge_micro_usd(self.prices, record)
        offer = record.offer
        span = record.span
        values = {
            "charge_key": record.charge_key,
            "job_id": record.job_id,
            "team": record.team,
            "kind": record.kind.value,
            "additive": record.additive,
            "at": record.at,
            "amount_micro_usd": amount,
            "interval_key": record.interval_key,
            "cloud": None if offer is None else offer.cloud.value,
            "region": None if offer is None else offer.region,
            "zone": None if offer is None else offer.zone,
            "instance_type": None if offer is None else offer.instance_type,
            "market": None if offer is None else offer.market.value,
            "quantity": record.quantity,
            "unit": record.unit,
            "rate_usd": record.rate_usd,
            "span_start": None if span is None else span[0],
            "span_end": None if span is None else span[1],
            "note": record.note,
            "recorded_at": _now(),
        }
        with self.engine.begin() as conn:
            inserted = conn.execute(self._insert_charge, values).scalar_one_or_none()
            if inserted is not None:
                if then is not None:
                    then(conn)
                return ChargeLine(record, amount)
            row = conn.execute(_CHARGE, {"b_key": record.charge_key}).one()
        stored = ChargeLine(_charge_record(row), int(row.amount_micro_usd))
        check_charge(stored, record, amount)
        self._then_alone(then)
        return stored

    # --- reads ----------------------------------------------------------------------------------------

    def intervals(
        self,
        *,
        job_id: str | None = None,
        team: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        job_ids: Collection[str] | None = None,
        conn: Connection | None = None,
    ) -> list[IntervalLine]:
        """Stored intervals of a job and/or team overlapping ``[start, end)`` (None: unbounded); ``job_ids``:
        of these jobs only (None: any; empty: none); ``conn``: read on that connection (a request's), else
        on one of its own."""
        if conn is not None:
            return self._intervals(conn, job_id=job_id, team=team, start=start, end=end, job_ids=job_ids)
        with self.engine.connect() as own:
            return self._intervals(own, job_id=job_id, team=team, start=start, end=end, job_ids=job_ids)

    def _intervals(
        self,
        conn: Connection,
        *,
        job_id: str | None,
        team: str | None,
        start: datetime | None,
        end: datetime | None,
        job_ids: Collection[str] | None = None,
    ) -> list[IntervalLine]:
        t = ledger_intervals.c
        conds: list[Any] = _job_conds(t.job_id, job_id, job_ids)
        if job_ids is not None and not job_ids:
            return []
        if team is not None:
            conds.append(t.team == team)
        if end is not None:
            conds.append(t.started_at < end)
        if start is not None:
            conds.append(or_(t.ended_at.is_(None), t.ended_at > start))
        rows = conn.execute(
            select(ledger_intervals).where(and_(True, *conds)).order_by(t.started_at, t.interval_key)
        ).fetchall()
        segs = self._segments(conn, [r.id for r in rows if r.ended_at is not None])
        return [_interval_line(r, segs) for r in rows]

    @staticmethod
    def _segments(conn: Connection, ids: Sequence[int]) -> dict[int, list[Segment]]:
        out: dict[int, list[Segment]] = {}
        for lo in range(0, len(ids), _IN_CHUNK):
            chunk = list(ids[lo : lo + _IN_CHUNK])
            rows = conn.execute(
                select(ledger_segments)
                .where(ledger_segments.c.interval_id.in_(chunk))
                .order_by(ledger_segments.c.interval_id, ledger_segments.c.seq)
            ).fetchall()
            for s in rows:
                out.setdefault(int(s.interval_id), []).append(
                    Segment(s.starts_at, s.ends_at, s.usd_per_hour, int(s.amount_micro_usd))
                )
        return out

    def charges(
        self,
        *,
        job_id: str | None = None,
        team: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        job_ids: Collection[str] | None = None,
        conn: Connection | None = None,
    ) -> list[ChargeLine]:
        """Stored charges of a job and/or team dated within ``[start, end)`` (``job_ids``, ``conn``: as
        :meth:`intervals`)."""
        if conn is not None:
            return self._charges(conn, job_id=job_id, team=team, start=start, end=end, job_ids=job_ids)
        with self.engine.connect() as own:
            return self._charges(own, job_id=job_id, team=team, start=start, end=end, job_ids=job_ids)

    def billed_jobs(self, *, team: str | None = None) -> tuple[list[str], datetime | None, datetime | None]:
        """The ids of the jobs with a stored line billed to ``team`` (None: any), sorted, and the first and
        last start of their intervals (None: no interval): what a report over them reads, without the lines."""
        iv, ch = ledger_intervals.c, ledger_charges.c
        jobs_iv = select(iv.job_id).distinct()
        jobs_ch = select(ch.job_id).distinct()
        span = select(func.min(iv.started_at), func.max(iv.started_at))
        if team is not None:
            jobs_iv, jobs_ch, span = (
                jobs_iv.where(iv.team == team),
                jobs_ch.where(ch.team == team),
                span.where(iv.team == team),
            )
        with self.engine.connect() as conn:
            ids = {str(r[0]) for r in conn.execute(jobs_iv)} | {str(r[0]) for r in conn.execute(jobs_ch)}
            first, last = conn.execute(span).one()
        return sorted(ids), first, last  # min/max keep the column type: tz-aware UTC

    def charges_by_key(self, keys: Sequence[str], *, conn: Connection | None = None) -> list[ChargeLine]:
        """The stored charges among ``keys`` (a migration's lines, without reading the job's whole bill),
        oldest first."""
        if not keys:
            return []
        query, params = _CHARGES_BY_KEY.bind(list(keys))
        if conn is not None:
            rows = conn.execute(query, params).fetchall()
        else:
            with self.engine.connect() as own:
                rows = own.execute(query, params).fetchall()
        return [ChargeLine(_charge_record(r), int(r.amount_micro_usd)) for r in rows]

    @staticmethod
    def _charges(
        conn: Connection,
        *,
        job_id: str | None,
        team: str | None,
        start: datetime | None,
        end: datetime | None,
        job_ids: Collection[str] | None = None,
    ) -> list[ChargeLine]:
        if job_id is not None and team is None and start is None and end is None and job_ids is None:
            rows = conn.execute(_JOB_CHARGES, {"b_job_id": job_id}).fetchall()  # a job's bill: the hot read
            return [ChargeLine(_charge_record(r), int(r.amount_micro_usd)) for r in rows]
        if job_ids is not None and not job_ids:
            return []
        t = ledger_charges.c
        conds: list[Any] = _job_conds(t.job_id, job_id, job_ids)
        if team is not None:
            conds.append(t.team == team)
        if start is not None:
            conds.append(t.at >= start)
        if end is not None:
            conds.append(t.at < end)
        rows = conn.execute(select(ledger_charges).where(and_(True, *conds)).order_by(t.at, t.charge_key)).fetchall()
        return [ChargeLine(_charge_record(r), int(r.amount_micro_usd)) for r in rows]

    def costs(
        self,
        *,
        job_id: str | None = None,
        team: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        as_of: datetime | None = None,
        conn: Connection | None = None,
        job_ids: Collection[str] | None = None,
    ) -> CostReport:
        """Costs of a job and/or team within ``[start, end)``: intervals clipped to the period and
        integrated across price changes, open ones up to ``as_of`` (default: the period end), and the
        charges dated within it; ``job_ids``: only these jobs' lines (None: any job; a fleet's page reads
        its own jobs' and idle lines, not its team's whole history). Intervals and charges are read on one
        connection (``conn`` when given: a request's, which read the job on it too)."""
        kw: dict[str, Any] = {"job_id": job_id, "team": team, "start": start, "end": end, "job_ids": job_ids}
        if conn is not None:
            intervals = self._intervals(conn, **kw)
            charges = self._charges(conn, **kw)
        else:
            with self.engine.connect() as own:
                intervals = self._intervals(own, **kw)
                charges = self._charges(own, **kw)
        return report(
            self.prices,
            intervals,
            charges,
            start,
            end,
            as_of,
        )
