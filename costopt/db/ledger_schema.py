"""The ledger's tables (migration ``0003``), declared on the one ``metadata`` of :mod:`costopt.db.metadata`.

``costopt/db/schema.py`` imports this module, so Alembic and ``compare_metadata`` see these tables.

Money is stored as **integer micro-dollars** (``BigInteger``, 1 = USD 0.000001): exact on both backends
(SQLite has no decimal type: SQLAlchemy's ``Numeric`` would store floats there) and summable in SQL.
Prices and GPU shares, which need more digits than money, are :class:`ExactDecimal`: ``NUMERIC`` on
PostgreSQL and the decimal's text on SQLite, read back as :class:`~decimal.Decimal` on both.

- ``ledger_intervals``: one row per instance interval (launch to terminate or preemption; boot,
  checkpoint and restore time included), unique on ``interval_key``; ``ended_at``/``amount_micro_usd``
  are NULL while the interval is open.
- ``ledger_segments``: a closed interval's price segments, one per price in effect (the step function
  integrated across price changes); their amounts sum to the interval's amount.
- ``ledger_charges``: charges of moves and preemptions, unique on ``charge_key``: ``additive`` ones
  (egress) are money on top of the intervals; the others (restart, overlap, lost work) are memo lines
  that explain part of an interval's cost and are never added to totals.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from costopt.db.metadata import metadata
from costopt.db.types import ExactDecimal, UtcDateTime

__all__ = ["ExactDecimal", "ledger_charges", "ledger_intervals", "ledger_segments"]  # ExactDecimal: from types


def _offer_columns(nullable: bool) -> list[Column[Any]]:
    return [
        Column("cloud", String(16), nullable=nullable),
        Column("region", String(64), nullable=nullable),
        Column("zone", String(64), nullable=nullable),
        Column("instance_type", String(96), nullable=nullable),
        Column("market", String(16), nullable=nullable),
    ]


ledger_intervals = Table(
    "ledger_intervals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("interval_key", String(255), nullable=False),
    Column("job_id", String(200), nullable=False),
    Column("team", String(200), nullable=False, server_default=""),
    Column("provider", String(32), nullable=False),
    Column("instance_id", String(200), nullable=False),
    *_offer_columns(nullable=False),
    # The job's share of the instance (per-GPU packing: job GPUs / instance GPUs; 1 = the whole instance).
    Column("share", ExactDecimal(), nullable=False),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("ended_at", UtcDateTime(), nullable=True),
    Column("end_reason", String(32), nullable=True),
    Column("amount_micro_usd", BigInteger, nullable=True),
    Column("recorded_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    UniqueConstraint("interval_key", name="uq_ledger_intervals_interval_key"),
    Index("ix_ledger_intervals_job_started", "job_id", "started_at"),
    Index("ix_ledger_intervals_team_started", "team", "started_at"),
    Index("ix_ledger_intervals_started", "started_at"),
)
"""One instance interval. ``amount_micro_usd`` (closed intervals) is the sum of its segments' amounts."""

ledger_segments = Table(
    "ledger_segments",
    metadata,
    Column(
        "interval_id",
        Integer,
        ForeignKey("ledger_intervals.id", name="fk_ledger_segments_interval_id_ledger_intervals"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("starts_at", UtcDateTime(), nullable=False),
    Column("ends_at", UtcDateTime(), nullable=False),
    Column("usd_per_hour", ExactDecimal(), nullable=False),
    Column("amount_micro_usd", BigInteger, nullable=False),
)
"""``[starts_at, ends_at)`` of a closed interval at one instance price (USD per instance-hour, exact)."""

ledger_charges = Table(
    "ledger_charges",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("charge_key", String(255), nullable=False),
    Column("job_id", String(200), nullable=False),
    Column("team", String(200), nullable=False, server_default=""),
    Column("kind", String(32), nullable=False),
    Column("additive", Boolean, nullable=False),
    Column("at", UtcDateTime(), nullable=False),
    Column("amount_micro_usd", BigInteger, nullable=False),
    Column("interval_key", String(255), nullable=True),
    *_offer_columns(nullable=True),
    Column("quantity", ExactDecimal(), nullable=True),
    Column("unit", String(16), nullable=True),
    Column("rate_usd", ExactDecimal(), nullable=True),
    Column("span_start", UtcDateTime(), nullable=True),
    Column("span_end", UtcDateTime(), nullable=True),
    Column("note", Text, nullable=True),
    Column("recorded_at", UtcDateTime(), nullable=False),
    UniqueConstraint("charge_key", name="uq_ledger_charges_charge_key"),
    Index("ix_ledger_charges_job_at", "job_id", "at"),
    Index("ix_ledger_charges_team_at", "team", "at"),
)
"""A charge of a move or a preemption: egress (additive) or a memo line (restart, overlap, lost work)."""
