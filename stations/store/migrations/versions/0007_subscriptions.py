"""Durable Streams subscriptions: definitions with wake state, per-stream cursors, signing keys.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ds_subscriptions",
        sa.Column("id", sa.String(256), primary_key=True),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("pattern", sa.String(1024)),
        sa.Column("webhook_url", sa.Text),
        sa.Column("wake_stream", sa.String(1024)),
        sa.Column("lease_ttl_ms", sa.BigInteger, nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("base_url", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("wake_id", sa.String(64)),
        sa.Column("snapshot", sa.Text),
        sa.Column("holder", sa.String(256)),
        sa.Column("lease_expires_at", sa.BigInteger),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.BigInteger),
    )
    op.create_table(
        "ds_subscription_streams",
        sa.Column("subscription_id", sa.String(256), primary_key=True),
        sa.Column("path", sa.String(1024), primary_key=True),
        sa.Column("explicit", sa.Boolean, nullable=False),
        sa.Column("glob", sa.Boolean, nullable=False),
        sa.Column("acked", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_ds_subscription_streams_path", "ds_subscription_streams", ["path"])
    op.create_table(
        "ds_signing_keys",
        sa.Column("kid", sa.String(128), primary_key=True),
        sa.Column("private_pem", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ds_signing_keys")
    op.drop_index("ix_ds_subscription_streams_path", "ds_subscription_streams")
    op.drop_table("ds_subscription_streams")
    op.drop_table("ds_subscriptions")
