"""Leases of a fetch's new messages as one row per fetch.

``lease_ranges`` holds them instead of one ``deliveries`` row per message.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_ranges",
        sa.Column("group_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("first_seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("consumer", sa.String(256), nullable=False),
        sa.Column("due", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_lease_ranges_due", "lease_ranges", ["due"])


def downgrade() -> None:
    # Each range goes back to one deliveries row per message: delivered once, leased as before.
    bind = op.get_bind()
    rows = bind.execute(
        sa.text("SELECT group_id, first_seq, last_seq, consumer, due FROM lease_ranges")
    ).all()
    for group_id, first, last, consumer, due in rows:
        bind.execute(
            sa.text(
                "INSERT INTO deliveries (group_id, seq, delivery_count, consumer, due, redrives)"
                " VALUES (:g, :s, 1, :c, :d, 0)"
            ),
            [{"g": group_id, "s": s, "c": consumer, "d": due} for s in range(first, last + 1)],
        )
    op.drop_index("ix_lease_ranges_due", "lease_ranges")
    op.drop_table("lease_ranges")
