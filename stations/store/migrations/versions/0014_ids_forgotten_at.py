"""When a shrunk id window last forgot ids for good, in the station's row.

A process's cache of ids then answers no retry with an id that another process's PATCH forgot
(PostgreSQL).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as batch:
        batch.add_column(sa.Column("ids_forgotten_at", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("streams") as batch:
        batch.drop_column("ids_forgotten_at")
