"""Sorted runs of older message ids (stations/idruns.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "id_runs",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("run", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ids", sa.BigInteger, nullable=False),
        sa.Column("oldest", sa.BigInteger, nullable=False),
        sa.Column("newest", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "id_run_entries",
        sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("run", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("msg_id", sa.String(256), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("stored_at", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    # Put the runs' ids back into msg_ids first, so no id still in its window is forgotten.
    # An id stored again after it expired sits in two runs: the newest copy is the one.
    op.execute(
        "INSERT INTO msg_ids (stream_id, msg_id, seq, stored_at) "
        "SELECT stream_id, msg_id, seq, stored_at FROM id_run_entries e "
        "WHERE NOT EXISTS (SELECT 1 FROM msg_ids m "
        "WHERE m.stream_id = e.stream_id AND m.msg_id = e.msg_id) "
        "AND NOT EXISTS (SELECT 1 FROM id_run_entries f WHERE f.stream_id = e.stream_id "
        "AND f.msg_id = e.msg_id AND (f.stored_at, f.run) > (e.stored_at, e.run))"
    )
    op.drop_table("id_run_entries")
    op.drop_table("id_runs")
