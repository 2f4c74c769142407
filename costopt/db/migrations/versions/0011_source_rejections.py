"""source_status: rejections of bad price pages and records (totals, refused pages, the last reason)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_UTC = costopt.db.types.UtcDateTime


def upgrade() -> None:
    op.add_column("source_status", sa.Column("total_bad_records", sa.Integer(), server_default="0", nullable=False))
    op.add_column("source_status", sa.Column("last_refused_pages", sa.Integer(), server_default="0", nullable=False))
    op.add_column("source_status", sa.Column("total_refused_pages", sa.Integer(), server_default="0", nullable=False))
    op.add_column("source_status", sa.Column("last_rejection", sa.Text(), nullable=True))
    op.add_column("source_status", sa.Column("last_rejection_at", _UTC(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("source_status", schema=None) as batch_op:
        for name in ("last_rejection_at", "last_rejection", "total_refused_pages", "last_refused_pages"):
            batch_op.drop_column(name)
        batch_op.drop_column("total_bad_records")
