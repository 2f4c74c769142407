"""migration_jobs.image: the image each managed job's copies launch (the job's own; None: the provider's)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("migration_jobs", sa.Column("image", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("migration_jobs", schema=None) as batch_op:
        batch_op.drop_column("image")
