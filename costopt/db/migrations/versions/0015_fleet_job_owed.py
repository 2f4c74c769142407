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
    op.add_column("fleet_jobs", sa.Column("owed", sa.Text(), nullable=False, server_default="{}"))
    op.add_column("fleet_jobs", sa.Column("owed_at", costopt.db.types.UtcDateTime(), nullable=True))
    # jobs already in a fleet are taken as owed what they received (their past allocations were not kept):
    # each starts level with its part, instead of ranking as if it had taken everything it ran
    op.execute("UPDATE fleet_jobs SET owed = received")


def downgrade() -> None:
    with op.batch_alter_table("fleet_jobs", schema=None) as batch_op:
        batch_op.drop_column("owed_at")
        batch_op.drop_column("owed")
