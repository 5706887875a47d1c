"""Consumer groups, their deliveries (leases) and the dead-letter store.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("stream_id", sa.Integer, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("max_ack_time_ms", sa.BigInteger, nullable=False),
        sa.Column("max_msg_deliveries", sa.Integer, nullable=False),
        sa.Column("cursor", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ux_groups_stream_name", "groups", ["stream_id", "name"], unique=True)
    op.create_table(
        "deliveries",
        sa.Column("group_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("delivery_count", sa.Integer, nullable=False),
        sa.Column("consumer", sa.String(256)),
        sa.Column("due", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_deliveries_due", "deliveries", ["group_id", "due"])
    op.create_table(
        "dls",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("stream_id", sa.Integer, nullable=False),
        sa.Column("group_id", sa.Integer, nullable=False),
        sa.Column("group_name", sa.String(256), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("msg_id", sa.String(256)),
        sa.Column("headers", sa.Text),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("delivery_count", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("dead_lettered_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_dls_stream", "dls", ["stream_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_dls_stream", "dls")
    op.drop_table("dls")
    op.drop_index("ix_deliveries_due", "deliveries")
    op.drop_table("deliveries")
    op.drop_index("ux_groups_stream_name", "groups")
    op.drop_table("groups")
