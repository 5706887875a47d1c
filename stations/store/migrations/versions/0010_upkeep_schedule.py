"""Housekeeping finds what is due without visiting every station.

The id window, the count rules of retention and the next upkeep time are columns of
``streams``, indexed.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as batch:
        batch.add_column(
            sa.Column("id_window_ms", sa.BigInteger, nullable=False, server_default="120000")
        )
        batch.add_column(sa.Column("max_messages", sa.BigInteger))
        batch.add_column(sa.Column("max_bytes", sa.BigInteger))
        batch.add_column(sa.Column("upkeep_at", sa.BigInteger))
    op.create_index("ix_streams_upkeep_at", "streams", ["upkeep_at"])
    op.create_index("ix_streams_max_messages", "streams", ["max_messages"])
    op.create_index("ix_streams_max_bytes", "streams", ["max_bytes"])
    # Fill them from each station's config; a station with rules by time is looked at at once.
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT id, config FROM streams")).all()
    for stream_id, raw in rows:
        config = json.loads(raw)
        retention = config.get("retention") or {}
        timed = retention.get("maxAgeMs") is not None or (
            (config.get("dls") or {}).get("retentionMs") is not None
        )
        bind.execute(
            sa.text(
                "UPDATE streams SET id_window_ms = :w, max_messages = :m, max_bytes = :b, "
                "upkeep_at = :u WHERE id = :id"
            ),
            {
                "w": int(config.get("idempotencyWindowMs", 120_000)),
                "m": retention.get("maxMessages"),
                "b": retention.get("maxBytes"),
                "u": 0 if timed else None,
                "id": stream_id,
            },
        )


def downgrade() -> None:
    op.drop_index("ix_streams_max_bytes", "streams")
    op.drop_index("ix_streams_max_messages", "streams")
    op.drop_index("ix_streams_upkeep_at", "streams")
    with op.batch_alter_table("streams") as batch:
        batch.drop_column("upkeep_at")
        batch.drop_column("max_bytes")
        batch.drop_column("max_messages")
        batch.drop_column("id_window_ms")
