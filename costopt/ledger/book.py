"""The ledger's rules, shared by both stores: pricing an interval, valuing a charge, idempotent
recording, and period reports. :class:`MemoryLedger` keeps lines in the process (backtests);
:class:`costopt.ledger.sql.SqlLedger` keeps them in the database (the service).

Recording is idempotent per key:

- an interval recorded again with the same facts changes nothing (never counted twice);
- an open interval recorded again closed is closed (priced then, once);
- a closed interval recorded again open changes nothing (a late replay of the opening);
- the same key with other facts (instance, offer, start, share, job, or another end) raises
  :class:`~costopt.ledger.model.LedgerConflict`. ``end_reason`` is informative: the first one stays.

A charge is recorded once per ``charge_key``; the same key with another amount raises ``LedgerConflict``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from costopt.ledger.model import (
    ChargeLine,
    ChargeRecord,
    CostLine,
    CostReport,
    IntervalLine,
    IntervalRecord,
    LedgerConflict,
    LedgerError,
    Segment,
    segment_micro_usd,
    usd_to_micro,
)
from costopt.ledger.prices import PriceSteps, price_segments

__all__ = [
    "Ledger",
    "MemoryLedger",
    "charge_micro_usd",
    "clip_interval",
    "merge_interval",
    "price_interval",
]


class Ledger(Protocol):
    """What a job runner (the backtest, the migrator) records into and a report reads from."""

    def record_interval(self, record: IntervalRecord) -> IntervalLine: ...

    def record_charge(self, record: ChargeRecord) -> ChargeLine: ...

    def costs(
        self,
        *,
        job_id: str | None = None,
        team: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        as_of: datetime | None = None,
        job_ids: Collection[str] | None = None,
    ) -> CostReport: ...


def price_interval(prices: PriceSteps, record: IntervalRecord) -> IntervalLine:
    """The line of ``record``: when closed, its segments (the price step function over
    ``[started_at, ended_at)``) and their sum; when open, no amount yet."""
    if record.ended_at is None:
        return IntervalLine(record)
    segs = price_segments(prices, record.offer, record.started_at, record.ended_at, record.share)
    return IntervalLine(record, segs, sum(s.amount_micro_usd for s in segs))


def charge_micro_usd(prices: PriceSteps, record: ChargeRecord) -> int:
    """The charge's amount: ``amount_usd``, else ``quantity x rate_usd``, else the offer's prices over
    ``span`` times ``share`` (micro-dollars, rounded half-even once)."""
    if record.amount_usd is not None:
        return usd_to_micro(record.amount_usd)
    if record.quantity is not None and record.rate_usd is not None:
        return usd_to_micro(record.quantity * record.rate_usd)
    if record.span is None or record.offer is None:  # excluded by ChargeRecord's checks
        raise LedgerError(f"{record.charge_key}: nothing to value")
    segs = price_segments(prices, record.offer, record.span[0], record.span[1], record.share)
    return sum(s.amount_micro_usd for s in segs)


def merge_interval(stored: IntervalLine | None, new: IntervalRecord) -> tuple[IntervalRecord | None, bool]:
    """What recording ``new`` over ``stored`` must write: (the record to store, whether it closes a
    stored open interval). ``(None, False)``: nothing to write. Raises ``LedgerConflict``."""
    if stored is None:
        return new, False
    old = stored.record
    if not old.same_facts(new):
        raise LedgerConflict(
            f"interval {new.interval_key!r} is already recorded with other facts: stored {old}, given {new}"
        )
    if new.ended_at is None:
        return None, False
    if old.ended_at is None:
        return replace(old, ended_at=new.ended_at, end_reason=new.end_reason), True
    if old.ended_at != new.ended_at:
        raise LedgerConflict(
            f"interval {new.interval_key!r} is already closed at {old.ended_at.isoformat()}, "
            f"not at {new.ended_at.isoformat()}"
        )
    return None, False


def check_charge(stored: ChargeLine, new: ChargeRecord, amount: int) -> None:
    """Raise ``LedgerConflict`` unless ``new`` repeats ``stored`` (same job, kind, time and amount)."""
    old = stored.record
    if (old.job_id, old.kind, old.at, stored.amount_micro_usd) != (new.job_id, new.kind, new.at, amount):
        raise LedgerConflict(
            f"charge {new.charge_key!r} is already recorded as {old.kind} {stored.amount_usd} USD at {old.at}, "
            f"not {new.kind} at {new.at}"
        )


def clip_interval(
    prices: PriceSteps, line: IntervalLine, start: datetime | None, end: datetime | None, as_of: datetime | None
) -> CostLine | None:
    """``line`` within ``[start, end)`` (None: unbounded); an open line is costed up to ``as_of`` (prices
    read from ``prices``). Stored segments wholly inside keep their amounts; cut ones are re-rounded for
    the part inside. None when nothing of it lies in the period."""
    rec = line.record
    stop = rec.ended_at if rec.ended_at is not None else as_of
    if stop is None:
        raise LedgerError(f"interval {rec.interval_key!r} is open: give as_of (or a period end) to cost it")
    lo = rec.started_at if start is None else max(rec.started_at, start)
    hi = stop if end is None else min(stop, end)
    if hi <= lo:
        return None
    if rec.ended_at is None:
        segs: Iterable[Segment] = price_segments(prices, rec.offer, lo, hi, rec.share)
        amount = sum(s.amount_micro_usd for s in segs)
    else:
        amount = 0
        for s in line.segments:
            a, b = max(s.starts_at, lo), min(s.ends_at, hi)
            if b <= a:
                continue
            if a == s.starts_at and b == s.ends_at:
                amount += s.amount_micro_usd
            else:
                amount += segment_micro_usd(a, b, s.usd_per_hour, rec.share)
    return CostLine(rec, lo, hi, rec.ended_at is None, amount)


def report(
    prices: PriceSteps,
    lines: Iterable[IntervalLine],
    charges: Iterable[ChargeLine],
    start: datetime | None,
    end: datetime | None,
    as_of: datetime | None,
) -> CostReport:
    """A :class:`CostReport` of already-filtered lines and charges (see :meth:`Ledger.costs`)."""
    if start is not None and end is not None and end < start:
        raise LedgerError(f"the period ends {end} before it starts {start}")
    horizon = as_of if as_of is not None else end
    clipped = [c for c in (clip_interval(prices, ln, start, end, horizon) for ln in lines) if c is not None]
    clipped.sort(key=lambda c: (c.starts_at, c.record.interval_key))
    kept = [
        ch
        for ch in charges
        if (start is None or ch.record.at >= start)
        and (end is None or ch.record.at < end)
        and (horizon is None or ch.record.at <= horizon)
    ]
    kept.sort(key=lambda c: (c.record.at, c.record.charge_key))
    return CostReport(start, end, as_of, tuple(clipped), tuple(kept))


def _matches(
    job_id: str | None, team: str | None, rec_job: str, rec_team: str, job_ids: Collection[str] | None = None
) -> bool:
    return (
        (job_id is None or rec_job == job_id)
        and (team is None or rec_team == team)
        and (job_ids is None or rec_job in job_ids)
    )


class MemoryLedger:
    """The ledger in this process (backtests): same rules as the database ledger, no persistence."""

    def __init__(self, prices: PriceSteps) -> None:
        self.prices = prices
        self._intervals: dict[str, IntervalLine] = {}
        self._charges: dict[str, ChargeLine] = {}

    def record_interval(self, record: IntervalRecord) -> IntervalLine:
        """Record (or close) an interval idempotently; returns the stored line."""
        stored = self._intervals.get(record.interval_key)
        to_store, _ = merge_interval(stored, record)
        if to_store is None:
            if stored is None:  # pragma: no cover - merge_interval never returns None without a stored line
                raise LedgerError("nothing stored")
            return stored
        line = price_interval(self.prices, to_store)
        self._intervals[record.interval_key] = line
        return line

    def record_charge(self, record: ChargeRecord) -> ChargeLine:
        """Record a charge once per key; returns the stored line."""
        amount = charge_micro_usd(self.prices, record)
        stored = self._charges.get(record.charge_key)
        if stored is not None:
            check_charge(stored, record, amount)
            return stored
        line = ChargeLine(record, amount)
        self._charges[record.charge_key] = line
        return line

    def intervals(
        self, *, job_id: str | None = None, team: str | None = None, job_ids: Collection[str] | None = None
    ) -> list[IntervalLine]:
        return sorted(
            (
                ln
                for ln in self._intervals.values()
                if _matches(job_id, team, ln.record.job_id, ln.record.team, job_ids)
            ),
            key=lambda ln: (ln.record.started_at, ln.record.interval_key),
        )

    def charges(
        self, *, job_id: str | None = None, team: str | None = None, job_ids: Collection[str] | None = None
    ) -> list[ChargeLine]:
        return sorted(
            (c for c in self._charges.values() if _matches(job_id, team, c.record.job_id, c.record.team, job_ids)),
            key=lambda c: (c.record.at, c.record.charge_key),
        )

    def costs(
        self,
        *,
        job_id: str | None = None,
        team: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        as_of: datetime | None = None,
        job_ids: Collection[str] | None = None,
    ) -> CostReport:
        """Costs of the matching intervals clipped to ``[start, end)`` (open ones up to ``as_of``, by
        default the period end), with the charges dated within it; ``job_ids``: only these jobs' lines
        (None: any job)."""
        return report(
            self.prices,
            self.intervals(job_id=job_id, team=team, job_ids=job_ids),
            self.charges(job_id=job_id, team=team, job_ids=job_ids),
            start,
            end,
            as_of,
        )
