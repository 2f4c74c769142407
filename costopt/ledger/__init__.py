"""The ledger: what every instance interval of every job cost, integrated across price changes.

- :mod:`.model`: records (intervals, charges), stored lines, cost reports, errors; money in integer
  micro-dollars, shown as Decimal USD.
- :mod:`.prices`: the price protocols the ledger and the simulated cloud read (:class:`PriceSteps`,
  :class:`PriceView`) and :class:`StepPrices` (change points in memory).
- :mod:`.book`: the rules (pricing, idempotency, period reports) and :class:`MemoryLedger`.
- :mod:`.sql`: :class:`SqlLedger`, the same in the database (migration ``0003``).

See docs/ledger.md.
"""

from costopt.ledger.book import Ledger, MemoryLedger, clip_interval, price_interval
from costopt.ledger.model import (
    ADDITIVE_KINDS,
    ChargeKind,
    ChargeLine,
    ChargeRecord,
    CostLine,
    CostReport,
    IntervalLine,
    IntervalRecord,
    InvalidLedgerRecord,
    LedgerConflict,
    LedgerError,
    NoPriceInEffect,
    Segment,
    micro_to_usd,
    segment_micro_usd,
    usd_to_micro,
)
from costopt.ledger.prices import PriceStep, PriceSteps, PriceView, StepPrices, StorePriceView, price_segments

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
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "MemoryLedger",
    "NoPriceInEffect",
    "PriceStep",
    "PriceSteps",
    "PriceView",
    "Segment",
    "StepPrices",
    "StorePriceView",
    "clip_interval",
    "micro_to_usd",
    "price_interval",
    "price_segments",
    "segment_micro_usd",
    "usd_to_micro",
]
