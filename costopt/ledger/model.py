"""What the ledger records and reports: instance intervals, charges, price segments, cost reports.

Units and conventions
- Times are tz-aware UTC; an interval is half-open, ``[started_at, ended_at)``.
- Money is integer **micro-dollars** (``*_micro_usd``; 1 = USD 0.000001) in storage and sums, shown as
  :class:`~decimal.Decimal` USD (:func:`micro_to_usd`). Never a float.
- Prices are USD per instance-hour, taken as the Decimal of the float's shortest repr (exact).
- ``share`` is the job's share of the instance (per-GPU packing: job GPUs / instance GPUs; 1 = the whole
  instance), a Decimal in ``(0, 1]``.

Rounding: each price segment's amount is rounded once, half-even, to the micro-dollar; every larger
figure (an interval, a report) is an exact sum of such integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Context, Decimal
from enum import StrEnum

from costopt.domain import OfferKey
from costopt.errors import CostoptError

__all__ = [
    "ADDITIVE_KINDS",
    "ChargeKind",
    "ChargeLine",
    "ChargeRecord",
    "CostLine",
    "CostReport",
    "IntervalLine",
    "IntervalRecord",
    "InvalidLedgerRecord",
    "LedgerConflict",
    "LedgerError",
    "NoPriceInEffect",
    "Segment",
    "micro_to_usd",
    "segment_micro_usd",
    "usd_to_micro",
]

_US = timedelta(microseconds=1)
_EXACT = Context(prec=80)  # wide enough that products of µs, prices and shares are exact


class LedgerError(CostoptError):
    """The ledger cannot do what was asked (the message says why)."""


class LedgerConflict(LedgerError):
    """A record reuses a key already stored with different facts (another instance, offer, start or
    end): a bug in the caller, never silently merged."""


class InvalidLedgerRecord(LedgerError, ValueError):
    """A record with an invalid field (naive time, end before start, share outside (0, 1], empty key)."""


class NoPriceInEffect(LedgerError):
    """No price of the offer is in effect at some moment of an interval: it cannot be billed (billing
    it with a price from another time would be wrong)."""


def micro_to_usd(micro: int) -> Decimal:
    """Integer micro-dollars as exact Decimal USD."""
    return Decimal(micro).scaleb(-6)


def usd_to_micro(usd: Decimal) -> int:
    """Decimal USD to integer micro-dollars, rounded half-even."""
    return int(usd.scaleb(6, _EXACT).to_integral_value(rounding=ROUND_HALF_EVEN, context=_EXACT))


def segment_micro_usd(start: datetime, end: datetime, usd_per_hour: Decimal, share: Decimal) -> int:
    """Micro-dollars of ``[start, end)`` at ``usd_per_hour`` for a ``share`` of the instance:
    ``µs x price x share / 3600`` computed exactly, rounded once (half-even) to the micro-dollar."""
    micros = (end - start) // _US
    exact = _EXACT.divide(_EXACT.multiply(_EXACT.multiply(Decimal(micros), usd_per_hour), share), Decimal(3600))
    return int(exact.to_integral_value(rounding=ROUND_HALF_EVEN, context=_EXACT))


def _check_utc(name: str, value: datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() != timedelta(0)):
        raise InvalidLedgerRecord(f"{name} must be a tz-aware UTC time, got {value!r}")


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One instance interval of one job: from launch (``started_at``) to terminate or preemption
    (``ended_at``; None while the instance runs). Boot, checkpoint and restore time are part of it.

    ``interval_key`` identifies it for idempotent recording (e.g. ``"<provider>:<instance_id>"``).
    ``end_reason``: why it ended (``done``, ``moved``, ``preempted``, ``terminated``), informative.
    """

    interval_key: str
    job_id: str
    instance_id: str
    offer: OfferKey
    started_at: datetime
    ended_at: datetime | None = None
    share: Decimal = Decimal(1)
    team: str = ""
    provider: str = "sim"
    end_reason: str | None = None

    def __post_init__(self) -> None:
        for name in ("interval_key", "job_id", "instance_id", "provider"):
            if not getattr(self, name):
                raise InvalidLedgerRecord(f"IntervalRecord.{name} must not be empty")
        _check_utc("started_at", self.started_at)
        _check_utc("ended_at", self.ended_at)
        if self.ended_at is not None and self.ended_at < self.started_at:
            raise InvalidLedgerRecord(f"{self.interval_key}: ends {self.ended_at} before it starts {self.started_at}")
        if not isinstance(self.share, Decimal) or not (Decimal(0) < self.share <= Decimal(1)):
            raise InvalidLedgerRecord(f"{self.interval_key}: share must be a Decimal in (0, 1], got {self.share!r}")

    @property
    def is_open(self) -> bool:
        return self.ended_at is None

    def same_facts(self, other: IntervalRecord) -> bool:
        """True when ``other`` describes the same instance interval (its end aside)."""
        return (
            self.interval_key == other.interval_key
            and self.job_id == other.job_id
            and self.instance_id == other.instance_id
            and self.offer == other.offer
            and self.started_at == other.started_at
            and self.share == other.share
            and self.team == other.team
            and self.provider == other.provider
        )


class ChargeKind(StrEnum):
    """Charges of moves and preemptions.

    ``egress``: the checkpoint moved between places (GB x USD/GB): money on top of the intervals.
    Memo kinds explain part of an interval's cost and are never added to totals: ``restart`` (boot and
    restore of a new instance, no progress), ``overlap`` (the old instance writing its checkpoint while
    the new one boots), ``lost_work`` (the work since the last checkpoint, lost to a preemption, valued at
    the instance's price over the time it took).
    """

    EGRESS = "egress"
    RESTART = "restart"
    OVERLAP = "overlap"
    LOST_WORK = "lost_work"


ADDITIVE_KINDS = frozenset({ChargeKind.EGRESS})


@dataclass(frozen=True, slots=True)
class ChargeRecord:
    """A charge, recorded once per ``charge_key``.

    Its amount is ``amount_usd`` when given, else ``quantity x rate_usd`` (e.g. GB x USD/GB), else (memo
    kinds) the offer's prices integrated over ``span`` times ``share``. ``at`` places it in time for period
    queries (for a span: its end).
    """

    charge_key: str
    job_id: str
    kind: ChargeKind
    at: datetime
    team: str = ""
    amount_usd: Decimal | None = None
    quantity: Decimal | None = None
    unit: str | None = None
    rate_usd: Decimal | None = None
    offer: OfferKey | None = None
    interval_key: str | None = None
    span: tuple[datetime, datetime] | None = None
    share: Decimal = Decimal(1)
    note: str | None = None

    def __post_init__(self) -> None:
        if not self.charge_key or not self.job_id:
            raise InvalidLedgerRecord("ChargeRecord needs a charge_key and a job_id")
        _check_utc("at", self.at)
        for name in ("amount_usd", "quantity", "rate_usd", "share"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Decimal) or not value.is_finite()):
                raise InvalidLedgerRecord(f"{self.charge_key}: {name} must be a finite Decimal, got {value!r}")
        if self.span is not None:
            _check_utc("span start", self.span[0])
            _check_utc("span end", self.span[1])
            if self.span[1] < self.span[0]:
                raise InvalidLedgerRecord(f"{self.charge_key}: span ends before it starts")
        has_amount = self.amount_usd is not None or (self.quantity is not None and self.rate_usd is not None)
        if not has_amount and (self.span is None or self.offer is None):
            raise InvalidLedgerRecord(
                f"{self.charge_key}: give amount_usd, or quantity and rate_usd, or an offer and a span to value"
            )

    @property
    def additive(self) -> bool:
        return self.kind in ADDITIVE_KINDS


@dataclass(frozen=True, slots=True)
class Segment:
    """``[starts_at, ends_at)`` at ``usd_per_hour`` (instance price), costing ``amount_micro_usd`` for the
    interval's share."""

    starts_at: datetime
    ends_at: datetime
    usd_per_hour: Decimal
    amount_micro_usd: int


@dataclass(frozen=True, slots=True)
class IntervalLine:
    """A stored interval: its record, and when closed its segments and amount (their sum)."""

    record: IntervalRecord
    segments: tuple[Segment, ...] = ()
    amount_micro_usd: int | None = None

    @property
    def amount_usd(self) -> Decimal | None:
        return None if self.amount_micro_usd is None else micro_to_usd(self.amount_micro_usd)


@dataclass(frozen=True, slots=True)
class ChargeLine:
    """A stored charge with its amount."""

    record: ChargeRecord
    amount_micro_usd: int

    @property
    def additive(self) -> bool:
        return self.record.additive

    @property
    def amount_usd(self) -> Decimal:
        return micro_to_usd(self.amount_micro_usd)


@dataclass(frozen=True, slots=True)
class CostLine:
    """One interval clipped to a report's period (and, if ``open`` (still running), to its ``as_of``)."""

    record: IntervalRecord
    starts_at: datetime
    ends_at: datetime
    open: bool
    amount_micro_usd: int

    @property
    def hours(self) -> float:
        return (self.ends_at - self.starts_at).total_seconds() / 3600.0

    @property
    def amount_usd(self) -> Decimal:
        return micro_to_usd(self.amount_micro_usd)


_ATTRIBUTES = ("job_id", "team", "provider", "cloud", "region", "zone", "instance_type", "market")


@dataclass(frozen=True, slots=True)
class CostReport:
    """Costs of the matching intervals within ``[start, end)`` (None: unbounded), open intervals costed
    up to ``as_of``; additive charges (egress) and memo charges dated within the period.

    ``total_micro_usd`` = instance intervals + additive charges. Memo charges are not added.
    """

    start: datetime | None
    end: datetime | None
    as_of: datetime | None
    lines: tuple[CostLine, ...]
    charges: tuple[ChargeLine, ...]

    @property
    def instances_micro_usd(self) -> int:
        return sum(line.amount_micro_usd for line in self.lines)

    @property
    def additive_micro_usd(self) -> int:
        return sum(c.amount_micro_usd for c in self.charges if c.additive)

    @property
    def total_micro_usd(self) -> int:
        return self.instances_micro_usd + self.additive_micro_usd

    @property
    def total_usd(self) -> Decimal:
        return micro_to_usd(self.total_micro_usd)

    @property
    def instance_hours(self) -> float:
        return sum(line.hours for line in self.lines)

    def memo_usd(self, kind: ChargeKind) -> Decimal:
        """Sum of the memo (or additive) charges of one kind within the period."""
        return micro_to_usd(sum(c.amount_micro_usd for c in self.charges if c.record.kind == kind))

    def by(self, attribute: str) -> dict[str, Decimal]:
        """Total USD (intervals + additive charges) per value of ``attribute`` (one of job_id, team,
        provider, cloud, region, zone, instance_type, market). Charges without that attribute count
        under ``""``."""
        if attribute not in _ATTRIBUTES:
            raise LedgerError(f"cannot group by {attribute!r}; choose from {', '.join(_ATTRIBUTES)}")
        out: dict[str, int] = {}
        for line in self.lines:
            k = _attr(line.record.offer, line.record.job_id, line.record.team, line.record.provider, attribute)
            out[k] = out.get(k, 0) + line.amount_micro_usd
        for c in self.charges:
            if c.additive:
                k = _attr(c.record.offer, c.record.job_id, c.record.team, None, attribute)
                out[k] = out.get(k, 0) + c.amount_micro_usd
        return {k: micro_to_usd(v) for k, v in sorted(out.items())}


def _attr(offer: OfferKey | None, job_id: str, team: str, provider: str | None, attribute: str) -> str:
    if attribute == "job_id":
        return job_id
    if attribute == "team":
        return team
    if attribute == "provider":
        return provider or ""
    if offer is None:
        return ""
    value = getattr(offer, attribute)
    return str(value.value if hasattr(value, "value") else value)
