"""price store

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 15:19:21.666933
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import costopt.db.types


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    
    op.create_table('instance_types',
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=96), nullable=False),
    sa.Column('accelerator', sa.String(length=32), nullable=False),
    sa.Column('gpu_count', sa.Float(), nullable=False),
    sa.Column('vcpus', sa.Integer(), nullable=True),
    sa.Column('memory_gib', sa.Float(), nullable=True),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('updated_at', costopt.db.types.UtcDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('cloud', 'name', name=op.f('pk_instance_types'))
    )
    with op.batch_alter_table('instance_types', schema=None) as batch_op:
        batch_op.create_index('ix_instance_types_accelerator', ['accelerator'], unique=False)

    op.create_table('offers',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('zone', sa.String(length=64), server_default='', nullable=False),
    sa.Column('instance_type', sa.String(length=96), nullable=False),
    sa.Column('market', sa.String(length=16), nullable=False),
    sa.Column('current_valid_from', costopt.db.types.UtcDateTime(timezone=True), nullable=True),
    sa.Column('current_usd_per_hour', sa.Float(), nullable=True),
    sa.Column('current_source', sa.String(length=64), nullable=True),
    sa.Column('last_confirmed_at', costopt.db.types.UtcDateTime(timezone=True), nullable=True),
    sa.Column('last_source', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_offers')),
    sa.UniqueConstraint('cloud', 'region', 'zone', 'instance_type', 'market', name='uq_offers_key')
    )
    op.create_table('source_status',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('last_attempt_at', costopt.db.types.UtcDateTime(timezone=True), nullable=True),
    sa.Column('last_success_at', costopt.db.types.UtcDateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('last_error_at', costopt.db.types.UtcDateTime(timezone=True), nullable=True),
    sa.Column('consecutive_failures', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_points', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_bad_records', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_skipped', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_partial', sa.Boolean(), server_default='0', nullable=False),
    sa.Column('total_points', sa.Integer(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_source_status'))
    )
    op.create_table('price_points',
    sa.Column('offer_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('valid_from', costopt.db.types.UtcDateTime(timezone=True), nullable=False),
    sa.Column('usd_per_hour', sa.Float(), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('offer_id', 'valid_from', name=op.f('pk_price_points')),
    sqlite_with_rowid=False,
    )
    


    op.create_table('store_meta',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_store_meta'))
    )
    op.execute("INSERT INTO store_meta (name, value) VALUES ('price_version', 0)")


def downgrade() -> None:
    
    op.drop_table('store_meta')
    op.drop_table('price_points')
    op.drop_table('source_status')
    op.drop_table('offers')
    with op.batch_alter_table('instance_types', schema=None) as batch_op:
        batch_op.drop_index('ix_instance_types_accelerator')

    op.drop_table('instance_types')
    
