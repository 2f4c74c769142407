"""fleets: leased fleets shared by a Gavel policy round by round (fleets, their instances, their jobs
and their rounds)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.fleets_schema  # (declares these tables on the shared metadata)
import costopt.db.types

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_UTC = costopt.db.types.UtcDateTime


def upgrade() -> None:
    op.create_table(
        "fleets",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), server_default="", nullable=False),
        sa.Column("policy", sa.String(length=100), nullable=False),
        sa.Column("round_s", sa.Float(), nullable=False),
        sa.Column("resolve_rounds", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("round", sa.Integer(), server_default="0", nullable=False),
        sa.Column("round_started_at", _UTC(timezone=True), nullable=True),
        sa.Column("round_ends_at", _UTC(timezone=True), nullable=True),
        sa.Column("allocation", sa.Text(), nullable=True),
        sa.Column("solved_round", sa.Integer(), nullable=True),
        sa.Column("dirty", sa.Boolean(), server_default="1", nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.Column("updated_at", _UTC(timezone=True), nullable=False),
        sa.Column("released_at", _UTC(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleets")),
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_fleets_team_idempotency"),
    )
    op.create_index("ix_fleets_team_created", "fleets", ["team_id", "created_at", "id"], unique=False)
    op.create_index("ix_fleets_state", "fleets", ["state"], unique=False)
    op.create_table(
        "fleet_instances",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("offer", sa.Text(), nullable=False),
        sa.Column("accelerator", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("usd_per_hour", costopt.db.types.ExactDecimal(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=True),
        sa.Column("launch_token", sa.String(length=200), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=True),
        sa.Column("replaces", sa.String(length=64), nullable=True),
        sa.Column("created_at", _UTC(timezone=True), nullable=False),
        sa.Column("launched_at", _UTC(timezone=True), nullable=True),
        sa.Column("first_seen_at", _UTC(timezone=True), nullable=True),
        sa.Column("last_seen_at", _UTC(timezone=True), nullable=True),
        sa.Column("ended_at", _UTC(timezone=True), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_instances")),
    )
    op.create_index("ix_fleet_instances_fleet", "fleet_instances", ["fleet_id", "created_at"], unique=False)
    op.create_table(
        "fleet_jobs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("slo_s", sa.Float(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("throughput", sa.Text(), nullable=False),
        sa.Column("steps_total", sa.BigInteger(), nullable=False),
        sa.Column("steps_done", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("checkpoint_step", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("arrived_at", _UTC(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=True),
        sa.Column("holder_epoch", sa.Integer(), nullable=True),
        sa.Column("target", sa.String(length=64), nullable=True),
        sa.Column("target_gpus", sa.Text(), nullable=True),
        sa.Column("target_round", sa.Integer(), nullable=True),
        sa.Column("received", sa.Text(), server_default="{}", nullable=False),
        sa.Column("ever_ran", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("started_at", _UTC(timezone=True), nullable=True),
        sa.Column("finished_at", _UTC(timezone=True), nullable=True),
        sa.Column("updated_at", _UTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_fleet_jobs")),
    )
    op.create_index("ix_fleet_jobs_fleet", "fleet_jobs", ["fleet_id", "arrived_at"], unique=False)
    op.create_table(
        "fleet_rounds",
        sa.Column("fleet_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("started_at", _UTC(timezone=True), nullable=False),
        sa.Column("ends_at", _UTC(timezone=True), nullable=False),
        sa.Column("ended_at", _UTC(timezone=True), nullable=True),
        sa.Column("capacity", sa.Text(), nullable=False),
        sa.Column("assignment", sa.Text(), nullable=False),
        sa.Column("solved", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("billed", sa.Boolean(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "round", name="pk_fleet_rounds"),
    )


def downgrade() -> None:
    op.drop_table("fleet_rounds")
    op.drop_index("ix_fleet_jobs_fleet", table_name="fleet_jobs")
    op.drop_table("fleet_jobs")
    op.drop_index("ix_fleet_instances_fleet", table_name="fleet_instances")
    op.drop_table("fleet_instances")
    op.drop_index("ix_fleets_state", table_name="fleets")
    op.drop_index("ix_fleets_team_created", table_name="fleets")
    op.drop_table("fleets")
