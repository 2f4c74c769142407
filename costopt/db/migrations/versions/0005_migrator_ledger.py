"""migrator: the unavailable-offers cache, each copy's billed facts (the ledger's outbox), checkpoint size

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.ledger_schema
import costopt.db.migration_schema
import costopt.db.types
import costopt.db.unavailable_schema

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "unavailable_offers",
        sa.Column("cloud", sa.String(length=16), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("zone", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=96), nullable=False),
        sa.Column("market", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("since", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("until", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint(
            "cloud", "region", "zone", "instance_type", "market", name=op.f("pk_unavailable_offers")
        ),
    )
    with op.batch_alter_table("unavailable_offers", schema=None) as batch_op:
        batch_op.create_index("ix_unavailable_offers_until", ["until"], unique=False)

    op.create_table(
        "migration_copies",
        sa.Column("interval_key", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("offer", sa.Text(), nullable=False),
        sa.Column("migration_id", sa.Integer(), nullable=True),
        sa.Column("source_offer", sa.Text(), nullable=True),
        sa.Column("egress_gb", costopt.db.ledger_schema.ExactDecimal(), nullable=True),
        sa.Column("started_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.Column("verified_at", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", costopt.db.types.UtcDateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.Column("ledger_opened", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("ledger_memo", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("ledger_closed", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("ledger_error", sa.Text(), nullable=True),
        sa.Column("updated_at", costopt.db.types.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("interval_key", name=op.f("pk_migration_copies")),
    )
    with op.batch_alter_table("migration_copies", schema=None) as batch_op:
        batch_op.create_index("ix_migration_copies_job_epoch", ["job_id", "epoch"], unique=False)

    with op.batch_alter_table("migrations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_gb", costopt.db.ledger_schema.ExactDecimal(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("migrations", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_gb")
    with op.batch_alter_table("migration_copies", schema=None) as batch_op:
        batch_op.drop_index("ix_migration_copies_job_epoch")
    op.drop_table("migration_copies")
    with op.batch_alter_table("unavailable_offers", schema=None) as batch_op:
        batch_op.drop_index("ix_unavailable_offers_until")
    op.drop_table("unavailable_offers")
