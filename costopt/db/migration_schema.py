"""The migrator's tables (migration ``0004``), declared on the one ``metadata`` of :mod:`costopt.db.schema`.

``costopt/db/schema.py`` should import this module at its end (like ``ledger_schema``), so Alembic and
``compare_metadata`` see these tables.

- ``migration_jobs``: one row per job the migrator runs: its command, checkpoint URI, current fencing
  epoch, current instance and offer, and a status (``running``, ``migrating``, ``recovering``,
  ``finished``) with the reason of the last change.
- ``migrations``: one row per move (or recovery) of a job: the persisted state machine. The row says
  where the move is (``state``), the epochs it goes from and to, the idempotency token stored *before*
  each launch call, the candidate offers and which one is being tried, and why it failed if it did.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, Integer, String, Table, Text

from costopt.db.schema import metadata
from costopt.db.types import UtcDateTime

migration_jobs = Table(
    "migration_jobs",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("provider", String(32), nullable=False),
    Column("command", Text, nullable=False),  # JSON list of argv
    Column("env", Text, nullable=False, server_default="{}"),  # JSON object, besides the job contract
    Column("checkpoint_uri", Text, nullable=False),
    Column("epoch", Integer, nullable=False, server_default="0"),
    Column("instance_id", String(200), nullable=True),
    Column("offer", Text, nullable=True),  # JSON OfferKey
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("updated_at", UtcDateTime(), nullable=False),
)

migrations = Table(
    "migrations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(200), nullable=False),
    Column("kind", String(16), nullable=False),  # move | recover
    Column("state", String(24), nullable=False),
    Column("from_epoch", Integer, nullable=False),
    Column("to_epoch", Integer, nullable=False),
    Column("old_instance_id", String(200), nullable=True),
    Column("new_instance_id", String(200), nullable=True),
    Column("request_id", String(64), nullable=True),
    Column("token", String(255), nullable=True),
    Column("offers", Text, nullable=False),  # JSON list of OfferKey
    Column("offer_index", Integer, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("reason", Text, nullable=False, server_default=""),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("deadline_at", UtcDateTime(), nullable=True),  # of the current waiting step
    Index("ix_migrations_job_state", "job_id", "state"),
)
