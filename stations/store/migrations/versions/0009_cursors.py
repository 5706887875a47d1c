"""Reader cursors (stations/domain/cursors.py): committed positions of named readers.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cursors",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(256), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cursors")
