"""service: teams, API keys, jobs and their events, batches, scheduler leases

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.jobs_schema  # noqa: F401  (declares these tables on the shared metadata)
import costopt.db.types

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_UTC = costopt.db.types.UtcDateTime


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("team_id", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), server_default="", nullable=False),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.Column("revoked_at", _UTC(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    op.create_index("ix_api_keys_team", "api_keys", ["team_id"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=200), server_default="", nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("quote", sa.Text(), nullable=True),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("offer", sa.Text(), nullable=True),
        sa.Column("usd_per_hour", costopt.db.types.ExactDecimal(), nullable=True),
        sa.Column("steps_total", sa.BigInteger(), nullable=False),
        sa.Column("steps_done", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.Column("updated_at", _UTC(timezone=True), nullable=False),
        sa.Column("started_at", _UTC(timezone=True), nullable=True),
        sa.Column("finished_at", _UTC(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", _UTC(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency"),
    )
    op.create_index("ix_jobs_team_created", "jobs", ["team_id", "created_at", "id"], unique=False)
    op.create_index("ix_jobs_state", "jobs", ["state"], unique=False)
    op.create_index("ix_jobs_batch", "jobs", ["batch_id"], unique=False)
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("at", _UTC(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("cost_usd", costopt.db.types.ExactDecimal(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job", "job_events", ["job_id", "id"], unique=False)
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=64), nullable=False),
        sa.Column("objective", sa.Text(), nullable=False),
        sa.Column("plan", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_batches_team_idempotency"),
    )
    op.create_index("ix_batches_team", "batches", ["team_id", "created_at"], unique=False)
    op.create_table(
        "scheduler_leases",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("expires_at", _UTC(timezone=True), nullable=True),
        sa.Column("last_tick", _UTC(timezone=True), nullable=True),
        sa.Column("runs", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", _UTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scheduler_leases")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leases")
    op.drop_index("ix_batches_team", table_name="batches")
    op.drop_table("batches")
    op.drop_index("ix_job_events_job", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_jobs_batch", table_name="jobs")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_index("ix_jobs_team_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_api_keys_team", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("teams")
