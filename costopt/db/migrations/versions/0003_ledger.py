"""ledger: instance intervals, their price segments, and the charges of moves and preemptions

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.ledger_schema
import costopt.db.types

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _offer_columns(nullable: bool) -> list[sa.Column[str]]:
    return [
        sa.Column("cloud", sa.String(length=16), nullable=nullable),
        sa.Column("region", sa.String(length=64), nullable=nullable),
        sa.Column("zone", sa.String(length=64), nullable=nullable),
        sa.Column("instance_type", sa.String(length=96), nullable=nullable),
        sa.Column("market", sa.String(length=16), nullable=nullable),
    ]


def upgrade() -> None:
    op.create_table(
        "ledger_intervals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("interval_key", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=200), server_default="", nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=False),
        *_offer_columns(nullable=False),
        sa.Column("share", costopt.db.ledger_schema.ExactDecimal(), nullable=False),
        sa.Column("started_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.Column("amount_micro_usd", sa.BigInteger(), nullable=True),
        sa.Column("recorded_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_intervals")),
        sa.UniqueConstraint("interval_key", name="uq_ledger_intervals_interval_key"),
    )
    with op.batch_alter_table("ledger_intervals", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_intervals_job_started", ["job_id", "started_at"], unique=False)
        batch_op.create_index("ix_ledger_intervals_team_started", ["team", "started_at"], unique=False)
        batch_op.create_index("ix_ledger_intervals_started", ["started_at"], unique=False)

    op.create_table(
        "ledger_segments",
        sa.Column("interval_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("starts_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("ends_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("usd_per_hour", costopt.db.ledger_schema.ExactDecimal(), nullable=False),
        sa.Column("amount_micro_usd", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["interval_id"], ["ledger_intervals.id"], name="fk_ledger_segments_interval_id_ledger_intervals"
        ),
        sa.PrimaryKeyConstraint("interval_id", "seq", name=op.f("pk_ledger_segments")),
    )

    op.create_table(
        "ledger_charges",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("charge_key", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=200), server_default="", nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("additive", sa.Boolean(), nullable=False),
        sa.Column("at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("amount_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("interval_key", sa.String(length=255), nullable=True),
        *_offer_columns(nullable=True),
        sa.Column("quantity", costopt.db.ledger_schema.ExactDecimal(), nullable=True),
        sa.Column("unit", sa.String(length=16), nullable=True),
        sa.Column("rate_usd", costopt.db.ledger_schema.ExactDecimal(), nullable=True),
        sa.Column("span_start", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.Column("span_end", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("recorded_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_charges")),
        sa.UniqueConstraint("charge_key", name="uq_ledger_charges_charge_key"),
    )
    with op.batch_alter_table("ledger_charges", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_charges_job_at", ["job_id", "at"], unique=False)
        batch_op.create_index("ix_ledger_charges_team_at", ["team", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ledger_charges", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_charges_team_at")
        batch_op.drop_index("ix_ledger_charges_job_at")
    op.drop_table("ledger_charges")
    op.drop_table("ledger_segments")
    with op.batch_alter_table("ledger_intervals", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_intervals_started")
        batch_op.drop_index("ix_ledger_intervals_team_started")
        batch_op.drop_index("ix_ledger_intervals_job_started")
    op.drop_table("ledger_intervals")
