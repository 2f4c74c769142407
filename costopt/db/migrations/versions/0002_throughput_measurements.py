"""throughput measurements registered by users and reported by running jobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "throughput_measurements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_type", sa.String(length=200), nullable=False),
        sa.Column("accelerator", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("placement", sa.String(length=16), nullable=False),
        sa.Column("steps_per_s", sa.Float(), nullable=False),
        sa.Column("n_measurements", sa.Integer(), server_default="1", nullable=False),
        sa.Column("provenance", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("measured_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_throughput_measurements")),
    )
    with op.batch_alter_table("throughput_measurements", schema=None) as batch_op:
        batch_op.create_index("ix_throughput_measurements_job_type", ["job_type"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("throughput_measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_throughput_measurements_job_type")
    op.drop_table("throughput_measurements")
