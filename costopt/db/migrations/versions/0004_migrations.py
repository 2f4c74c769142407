"""migrator: jobs it runs and the persisted state machine of each move

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.migration_schema  # noqa: F401  (declares these tables on the shared metadata)
import costopt.db.types

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "migration_jobs",
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("env", sa.Text(), server_default="{}", nullable=False),
        sa.Column("checkpoint_uri", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=True),
        sa.Column("offer", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("updated_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_migration_jobs")),
    )
    op.create_table(
        "migrations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("from_epoch", sa.Integer(), nullable=False),
        sa.Column("to_epoch", sa.Integer(), nullable=False),
        sa.Column("old_instance_id", sa.String(length=200), nullable=True),
        sa.Column("new_instance_id", sa.String(length=200), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("token", sa.String(length=255), nullable=True),
        sa.Column("offers", sa.Text(), nullable=False),
        sa.Column("offer_index", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_migrations")),
    )
    with op.batch_alter_table("migrations", schema=None) as batch_op:
        batch_op.create_index("ix_migrations_job_state", ["job_id", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("migrations", schema=None) as batch_op:
        batch_op.drop_index("ix_migrations_job_state")
    op.drop_table("migrations")
    op.drop_table("migration_jobs")
