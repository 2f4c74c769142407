"""fleet_instances.billed_to: where the ledger has an ended fleet instance's life to (its end), so a bill
completed before a restart is not looked for again and one cut short by a crash is finished after it

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("fleet_instances", sa.Column("billed_to", costopt.db.types.UtcDateTime(), nullable=True))
    # a released instance was billed to its end (its release said so); a lost one is looked at again by the
    # next pass (its lines are idempotent per key: what was recorded is not recorded twice)
    op.execute("UPDATE fleet_instances SET billed_to = ended_at WHERE state = 'released' AND ended_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("fleet_instances", schema=None) as batch_op:
        batch_op.drop_column("billed_to")
