"""DLS redrive: redrive counts and automatic redrives.

Each entry counts its redrives and may be due for an automatic one; a redriven delivery carries
its count back into the group's queue.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("redrives", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("dls") as batch:
        batch.add_column(sa.Column("redrives", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("redrive_at", sa.BigInteger))
    op.create_index("ix_dls_redrive_at", "dls", ["redrive_at"])


def downgrade() -> None:
    op.drop_index("ix_dls_redrive_at", "dls")
    with op.batch_alter_table("dls", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("redrive_at")
        batch.drop_column("redrives")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("redrives")
