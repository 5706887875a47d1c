"""Runs of older message ids in rows of up to 64 ids (id_run_chunks), not a row per id.

Moving ids into a run cost SQLite a row insert per id (``id_run_entries``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from array import array

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

CHUNK = 64


def upgrade() -> None:
    op.create_table(
        "id_run_chunks",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("run", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("first_id", sa.String(256), primary_key=True),
        sa.Column("ids", sa.Integer, nullable=False),
        sa.Column("msg_ids", sa.LargeBinary, nullable=False),
        sa.Column("seqs", sa.LargeBinary, nullable=False),
        sa.Column("stored_ats", sa.LargeBinary, nullable=False),
    )
    bind = op.get_bind()
    runs = bind.execute(sa.text("SELECT stream_id, run FROM id_runs ORDER BY 1, 2")).all()
    insert = sa.text(
        "INSERT INTO id_run_chunks (stream_id, run, first_id, ids, msg_ids, seqs, stored_ats) "
        "VALUES (:s, :r, :f, :n, :m, :q, :t)"
    )
    for stream_id, run in runs:
        entries = bind.execute(
            sa.text(
                "SELECT msg_id, seq, stored_at FROM id_run_entries "
                "WHERE stream_id = :s AND run = :r ORDER BY msg_id"
            ),
            {"s": stream_id, "r": run},
        ).all()
        for k in range(0, len(entries), CHUNK):
            some = entries[k : k + CHUNK]
            bind.execute(
                insert,
                {
                    "s": stream_id,
                    "r": run,
                    "f": some[0][0],
                    "n": len(some),
                    "m": "\n".join(e[0] for e in some).encode(),
                    "q": array("q", (e[1] for e in some)).tobytes(),
                    "t": array("q", (e[2] for e in some)).tobytes(),
                },
            )
    op.drop_table("id_run_entries")


def downgrade() -> None:
    op.create_table(
        "id_run_entries",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("run", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("msg_id", sa.String(256), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("stored_at", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )
    bind = op.get_bind()
    chunks = bind.execute(
        sa.text("SELECT stream_id, run, msg_ids, seqs, stored_ats FROM id_run_chunks")
    ).all()
    insert = sa.text(
        "INSERT INTO id_run_entries (stream_id, run, msg_id, seq, stored_at) "
        "VALUES (:s, :r, :m, :q, :t)"
    )
    for stream_id, run, packed, seqs, ats in chunks:
        q, t = array("q"), array("q")
        q.frombytes(bytes(seqs))
        t.frombytes(bytes(ats))
        rows = zip(bytes(packed).decode().split("\n"), q, t, strict=True)
        bind.execute(
            insert, [{"s": stream_id, "r": run, "m": m, "q": s, "t": a} for m, s, a in rows]
        )
    op.drop_table("id_run_chunks")
