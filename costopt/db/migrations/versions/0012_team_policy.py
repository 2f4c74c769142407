"""teams: each team's policy (the local provider allowed, checkpoint and image prefixes)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    local = sa.Boolean(create_constraint=False)
    op.add_column("teams", sa.Column("allow_local_provider", local, server_default=sa.false(), nullable=False))
    op.add_column("teams", sa.Column("checkpoint_prefixes", sa.Text(), nullable=True))
    op.add_column("teams", sa.Column("image_prefixes", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.drop_column("image_prefixes")
        batch_op.drop_column("checkpoint_prefixes")
        batch_op.drop_column("allow_local_provider")
