"""ledger: the team of a managed job's lines (intervals and charges billed before the migrator's sync
looked the team up are given their job's ``jobs.team_id``; no schema change)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Before 0008 the migrator's sync (costopt/migration/ledger_sync.py) billed every copy to team "".
    # An open interval must be closed with the same facts it was opened with (team included), so the lines
    # already written take their job's team now.
    for table in ("ledger_intervals", "ledger_charges"):
        op.execute(
            f"UPDATE {table} SET team = (SELECT jobs.team_id FROM jobs WHERE jobs.id = {table}.job_id) "
            f"WHERE team = '' AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = {table}.job_id)"
        )


def downgrade() -> None:
    # The backfilled teams are facts of the jobs; nothing to undo (the schema did not change).
    pass
