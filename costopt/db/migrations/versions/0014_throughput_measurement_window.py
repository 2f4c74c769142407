"""throughput_measurements.window_key: the progress window a running job's measurement was taken over, unique,
so a window is recorded once whatever the restarts and replicas that see it

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("throughput_measurements", sa.Column("window_key", sa.String(300), nullable=True))
    # NULLs are distinct on both backends: registrations and older measurements (no window) are unaffected
    op.create_index("ux_throughput_measurements_window_key", "throughput_measurements", ["window_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_throughput_measurements_window_key", table_name="throughput_measurements")
    with op.batch_alter_table("throughput_measurements", schema=None) as batch_op:
        batch_op.drop_column("window_key")
