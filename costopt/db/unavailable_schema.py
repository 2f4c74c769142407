"""The unavailable-offers cache (migration ``0005``), declared on the one ``metadata`` of
:mod:`costopt.db.metadata` (:mod:`costopt.db.schema` imports this module).

- ``unavailable_offers``: one row per offer kept out of plans for now: the offer's key (primary key,
  ``zone == ""`` for a regional offer), the reason (``preempted``, ``capacity``, ``quota``, ...),
  since when and until when (tz-aware UTC), and a free-text detail. Expired rows are ignored by
  readers and overwritten by the next mark; they are never needed after ``until``.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, String, Table, Text

from costopt.db.metadata import metadata
from costopt.db.types import UtcDateTime

__all__ = ["unavailable_offers"]

unavailable_offers = Table(
    "unavailable_offers",
    metadata,
    Column("cloud", String(16), primary_key=True),
    Column("region", String(64), primary_key=True),
    Column("zone", String(64), primary_key=True),
    Column("instance_type", String(96), primary_key=True),
    Column("market", String(16), primary_key=True),
    Column("reason", String(32), nullable=False),
    Column("since", UtcDateTime(), nullable=False),
    Column("until", UtcDateTime(), nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    Index("ix_unavailable_offers_until", "until"),
)
"""An offer kept out of plans until ``until`` (see :class:`costopt.migration.unavailable.UnavailableOffers`)."""
