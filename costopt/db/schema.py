"""The database schema (SQLAlchemy Core). Alembic migrations under ``migrations/`` create it.

Prices are stored as step functions: ``price_points`` holds change points per offer, ``offers``
holds each offer's key, its current price (denormalized for fast snapshots) and when a source last
confirmed it; ``price_repeats`` holds the other observations (repeats of the price in effect).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

# The other tables live in their own modules on the same metadata; importing them here (they import
# only costopt.db.metadata) makes ``schema.metadata`` the whole schema for Alembic and compare_metadata.
import costopt.db.fleets_schema
import costopt.db.jobs_schema
import costopt.db.ledger_schema
import costopt.db.migration_schema
import costopt.db.unavailable_schema  # noqa: F401
from costopt.db.metadata import metadata
from costopt.db.types import UtcDateTime

offers = Table(
    "offers",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cloud", String(16), nullable=False),
    Column("region", String(64), nullable=False),
    Column("zone", String(64), nullable=False, server_default=""),
    Column("instance_type", String(96), nullable=False),
    Column("market", String(16), nullable=False),
    # The latest change point (denormalized from price_points; kept by PriceStore.write).
    Column("current_valid_from", UtcDateTime(), nullable=True),
    Column("current_usd_per_hour", Float, nullable=True),
    Column("current_source", String(64), nullable=True),
    Column("last_confirmed_at", UtcDateTime(), nullable=True),
    Column("last_source", String(64), nullable=True),
    # valid_from of the newest stored observation, a change point or a repeat (migration 0007): a
    # write whose points all come after it only appends (see pricing/ingest.py).
    Column("newest_valid_from", UtcDateTime(), nullable=True),
    UniqueConstraint("cloud", "region", "zone", "instance_type", "market", name="uq_offers_key"),
)

price_points = Table(
    "price_points",
    metadata,
    # No foreign key on purpose: PostgreSQL checks one per row (3x slower bulk loads); offers are
    # only ever created by PriceStore.write in the same transaction and are never deleted.
    Column("offer_id", Integer, primary_key=True, autoincrement=False),
    Column("valid_from", UtcDateTime(), primary_key=True),
    Column("usd_per_hour", Float, nullable=False),
    Column("source", String(64), nullable=False),
    sqlite_with_rowid=False,  # clustered on the primary key: one B-tree, not table + index
)

price_repeats = Table(
    "price_repeats",
    metadata,
    # Observations that repeat the price in effect before them (migration 0007). Not read by
    # queries: they let a write resolve a late, older point against what was observed after it
    # (pricing/ingest.py). A key is in price_points or here, never in both.
    Column("offer_id", Integer, primary_key=True, autoincrement=False),
    Column("valid_from", UtcDateTime(), primary_key=True),
    Column("usd_per_hour", Float, nullable=False),
    Column("source", String(64), nullable=False),
    sqlite_with_rowid=False,
)

instance_types = Table(
    "instance_types",
    metadata,
    Column("cloud", String(16), primary_key=True),
    Column("name", String(96), primary_key=True),
    Column("accelerator", String(32), nullable=False),
    Column("gpu_count", Float, nullable=False),
    Column("vcpus", Integer, nullable=True),
    Column("memory_gib", Float, nullable=True),
    Column("source", String(64), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Index("ix_instance_types_accelerator", "accelerator"),
)

source_status = Table(
    "source_status",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("last_attempt_at", UtcDateTime(), nullable=True),
    Column("last_success_at", UtcDateTime(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("last_error_at", UtcDateTime(), nullable=True),
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("last_points", Integer, nullable=False, server_default="0"),
    Column("last_bad_records", Integer, nullable=False, server_default="0"),
    Column("last_skipped", Integer, nullable=False, server_default="0"),
    Column("last_partial", Boolean, nullable=False, server_default="0"),
    Column("total_points", Integer, nullable=False, server_default="0"),
    # 0011: rejections (bad records refused, pages refused whole) and the last reason, with its time
    Column("total_bad_records", Integer, nullable=False, server_default="0"),
    Column("last_refused_pages", Integer, nullable=False, server_default="0"),
    Column("total_refused_pages", Integer, nullable=False, server_default="0"),
    Column("last_rejection", Text, nullable=True),
    Column("last_rejection_at", UtcDateTime(), nullable=True),
)

store_meta = Table(
    "store_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False, server_default="0"),
)
"""Counters. ``price_version`` grows with every price write, so readers' caches know when to reload."""

throughput_measurements = Table(
    "throughput_measurements",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_type", String(200), nullable=False),
    Column("accelerator", String(32), nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("placement", String(16), nullable=False),
    Column("steps_per_s", Float, nullable=False),
    Column("n_measurements", Integer, nullable=False, server_default="1"),
    Column("provenance", String(16), nullable=False),
    Column("source", String(200), nullable=False),
    Column("measured_at", UtcDateTime(), nullable=False),
    Column("window_key", String(300), nullable=True),
    Index("ix_throughput_measurements_job_type", "job_type"),
    Index("ux_throughput_measurements_window_key", "window_key", unique=True),
)
"""Throughputs users registered or running jobs reported (steps/s); folded over the file's values.
``window_key``: the progress window a running job's measurement covers (unique: recorded once; NULL for
registrations)."""
