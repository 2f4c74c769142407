"""fleet_jobs.owed / owed_at: the seconds of allocation each fleet job had in force on each worker type over
the rounds credited so far (JSON {worker type: seconds}, decayed to ``owed_at`` when the fleet's mechanism
rule forgets), so a rebuilt round mechanism resumes its allocation integral (issue 12)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # jobs already in a fleet start from nothing owed: the integral counts from the next round on
    op.add_column("fleet_jobs", sa.Column("owed", sa.Text(), nullable=False, server_default="{}"))
    op.add_column("fleet_jobs", sa.Column("owed_at", costopt.db.types.UtcDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fleet_jobs", schema=None) as batch_op:
        batch_op.drop_column("owed_at")
        batch_op.drop_column("owed")
