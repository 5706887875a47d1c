"""A floor under a group's new lease deadlines, raised by a seek.

A transaction tells a lease from a later delivery of the same message by its deadline; a seek
revokes leases and delivers their messages again from delivery count 1, so a new lease must
not take a revoked one's deadline (the same clock reading in one writer transaction).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(
            sa.Column("lease_floor", sa.BigInteger, nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("lease_floor")
