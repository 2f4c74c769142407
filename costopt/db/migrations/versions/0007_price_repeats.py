"""price store: observations that repeat the price in effect, and each offer's newest observation

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_UTC = costopt.db.types.UtcDateTime


def upgrade() -> None:
    op.create_table(
        "price_repeats",
        sa.Column("offer_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("valid_from", _UTC(timezone=True), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("offer_id", "valid_from", name=op.f("pk_price_repeats")),
        sqlite_with_rowid=False,
    )
    op.add_column("offers", sa.Column("newest_valid_from", _UTC(timezone=True), nullable=True))
    # Stores written before 0007 hold change points only: the newest observation is the current point.
    op.execute("UPDATE offers SET newest_valid_from = current_valid_from")


def downgrade() -> None:
    with op.batch_alter_table("offers", schema=None) as batch_op:
        batch_op.drop_column("newest_valid_from")
    op.drop_table("price_repeats")
