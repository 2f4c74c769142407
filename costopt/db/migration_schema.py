"""The migrator's tables (migrations ``0004``, ``0005``), on the one ``metadata`` of :mod:`costopt.db.metadata`.

``costopt/db/schema.py`` imports this module, so Alembic and ``compare_metadata`` see these tables.

- ``migration_jobs``: one row per job the migrator runs: its command, checkpoint URI, current fencing
  epoch, current instance and offer, and a status (``running``, ``migrating``, ``recovering``,
  ``finished``) with the reason of the last change.
- ``migrations``: one row per move (or recovery) of a job: the persisted state machine. The row says
  where the move is (``state``), the epochs it goes from and to, the idempotency token stored *before*
  each launch call, the candidate offers and which one is being tried, and why it failed if it did;
  ``checkpoint_gb`` (``0005``): the size of the checkpoint the move ships, when the decision gave one
  (the egress charge of the move).
- ``migration_copies`` (``0005``): one row per copy of a job (an instance of one epoch) with the facts
  the ledger bills: launch and end times, why it ended, when it was seen progressing. The facts are
  written in the same transaction as the state transition that learned them (so they are stable across
  a crash), then copied to the ledger (an outbox: ``ledger_*`` flags say what the ledger already holds;
  every ledger write is idempotent by key, so a crash between the write and the flag repeats nothing).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Index, Integer, String, Table, Text

from costopt.db.metadata import metadata
from costopt.db.types import ExactDecimal, UtcDateTime

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
    Column("image", Text, nullable=True),  # the image its copies launch (None: the provider's default)
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
    Column("checkpoint_gb", ExactDecimal(), nullable=True),  # 0005: the egress charge's quantity
    Index("ix_migrations_job_state", "job_id", "state"),
)

migration_copies = Table(
    "migration_copies",
    metadata,
    Column("interval_key", String(255), primary_key=True),  # the ledger interval's key
    Column("job_id", String(200), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("instance_id", String(200), nullable=False),
    Column("provider", String(32), nullable=False),
    Column("offer", Text, nullable=False),  # JSON OfferKey
    Column("migration_id", Integer, nullable=True),  # the move/recovery that launched it (None: an orphan)
    Column("source_offer", Text, nullable=True),  # JSON OfferKey the checkpoint came from (egress)
    Column("egress_gb", ExactDecimal(), nullable=True),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("verified_at", UtcDateTime(), nullable=True),  # first seen progressing
    Column("ended_at", UtcDateTime(), nullable=True),
    Column("end_reason", String(32), nullable=True),
    Column("ledger_opened", Boolean, nullable=False, server_default="0"),
    Column("ledger_memo", Boolean, nullable=False, server_default="0"),  # restart memo recorded
    Column("ledger_closed", Boolean, nullable=False, server_default="0"),
    Column("ledger_error", Text, nullable=True),  # the last failure to record it (retried)
    Column("updated_at", UtcDateTime(), nullable=False),
    Index("ix_migration_copies_job_epoch", "job_id", "epoch"),
)
