"""A multi-message row carries its messages' ids and headers: messages.msg_id becomes TEXT.

A JSON produce with message ids stores one row per request, the ids (and headers) joined by
newlines. SQLite does not enforce a VARCHAR's length, so only PostgreSQL's column type changes
(from VARCHAR(256) to TEXT, which rewrites nothing). The downgrade first splits every row that
holds the ids or headers of several messages into one row per message, as older code reads them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("messages", "msg_id", type_=sa.Text, existing_type=sa.String(256))


def _split(value: str | None, span: int) -> list[str | None]:
    if value is None:
        return [None] * span
    return [v or None for v in value.split("\n")]


def downgrade() -> None:
    bind = op.get_bind()
    packed = bind.execute(
        sa.text(
            "SELECT stream_id, seq, span, data, msg_id, headers, stored_at FROM messages "
            "WHERE span > 1 AND (msg_id IS NOT NULL OR headers IS NOT NULL)"
        )
    ).all()
    for stream_id, seq, span, data, msg_id, headers, stored_at in packed:
        bind.execute(
            sa.text("DELETE FROM messages WHERE stream_id = :s AND seq = :q"),
            {"s": stream_id, "q": seq},
        )
        first = seq - span
        rows = zip(
            bytes(data).split(b"\n"), _split(msg_id, span), _split(headers, span), strict=True
        )
        bind.execute(
            sa.text(
                "INSERT INTO messages (stream_id, seq, data, msg_id, headers, stored_at, span) "
                "VALUES (:s, :q, :d, :m, :h, :t, 1)"
            ),
            [
                {"s": stream_id, "q": first + k, "d": d, "m": m, "h": h, "t": stored_at}
                for k, (d, m, h) in enumerate(rows, 1)
            ],
        )
    if bind.dialect.name == "postgresql":
        op.alter_column("messages", "msg_id", type_=sa.String(256), existing_type=sa.Text)
