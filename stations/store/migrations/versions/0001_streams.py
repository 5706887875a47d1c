"""Streams, messages, producer sessions and the message-id table.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "streams",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(1024), nullable=False, unique=True),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("ttl_seconds", sa.BigInteger),
        sa.Column("expires_at", sa.BigInteger),
        sa.Column("accessed_at", sa.BigInteger, nullable=False),
        sa.Column("closed", sa.Boolean, nullable=False),
        sa.Column("closer_id", sa.String(256)),
        sa.Column("closer_epoch", sa.BigInteger),
        sa.Column("closer_seq", sa.BigInteger),
        sa.Column("tail", sa.BigInteger, nullable=False),
        sa.Column("head", sa.BigInteger, nullable=False),
        sa.Column("fork_of", sa.Integer),
        sa.Column("fork_offset", sa.BigInteger),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("stream_seq", sa.String(1024)),
        sa.Column("msg_count", sa.BigInteger, nullable=False),
        sa.Column("byte_count", sa.BigInteger, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("create_spec", sa.Text),
    )
    op.create_table(
        "messages",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("msg_id", sa.String(256)),
        sa.Column("headers", sa.Text),
        sa.Column("stored_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "producers",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("producer_id", sa.String(1024), primary_key=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "msg_ids",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("msg_id", sa.String(256), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("stored_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_msg_ids_stored_at", "msg_ids", ["stream_id", "stored_at"])


def downgrade() -> None:
    op.drop_index("ix_msg_ids_stored_at", "msg_ids")
    for table in ("msg_ids", "producers", "messages", "streams"):
        op.drop_table(table)
