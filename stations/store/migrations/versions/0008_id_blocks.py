"""Message ids of one commit in one time-ordered row (SQLite's recent ids; stations/store/idruns.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from array import array
from itertools import groupby

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "id_blocks",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq0", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("stored_at", sa.BigInteger, nullable=False),
        sa.Column("ids", sa.Integer, nullable=False),
        sa.Column("msg_ids", sa.LargeBinary, nullable=False),
        sa.Column("seqs", sa.LargeBinary, nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return  # PostgreSQL keeps its ids in msg_ids
    # SQLite's recent ids move from msg_ids into blocks, one per (station, stored_at).
    rows = bind.exec_driver_sql(
        "SELECT stream_id, stored_at, seq, msg_id FROM msg_ids ORDER BY stream_id, stored_at, seq"
    ).all()
    blocks = []
    for (stream_id, stored_at), group in groupby(rows, key=lambda r: (r[0], r[1])):
        members = list(group)
        seqs = array("q", [r[2] for r in members])
        text = "\n".join(r[3] for r in members).encode()
        blocks.append((stream_id, seqs[0], stored_at, len(seqs), text, seqs.tobytes()))
    if blocks:
        bind.exec_driver_sql(
            "INSERT INTO id_blocks (stream_id, seq0, stored_at, ids, msg_ids, seqs) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            blocks,
        )
    bind.exec_driver_sql("DELETE FROM msg_ids")


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.exec_driver_sql(
        "SELECT stream_id, stored_at, msg_ids, seqs FROM id_blocks ORDER BY stream_id, seq0"
    ).all()
    newest: dict[tuple[int, str], tuple[int, int]] = {}
    for stream_id, stored_at, text, packed in rows:
        seqs = array("q")
        seqs.frombytes(bytes(packed))
        for msg_id, seq in zip(bytes(text).decode().split("\n"), seqs, strict=True):
            newest[(stream_id, msg_id)] = (seq, stored_at)
    if newest:
        mark = "?" if bind.dialect.paramstyle == "qmark" else "%s"
        bind.exec_driver_sql(
            f"INSERT INTO msg_ids (stream_id, msg_id, seq, stored_at) VALUES ({mark}, {mark}, "
            f"{mark}, {mark})",
            [(sid, msg_id, seq, at) for (sid, msg_id), (seq, at) in newest.items()],
        )
    op.drop_table("id_blocks")
