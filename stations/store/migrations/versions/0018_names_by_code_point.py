"""Pages of stations, groups and cursors by name read through an index.

A paged list orders and compares names by code point on both engines (``db.by_code_point``):
on PostgreSQL ``name COLLATE "C"``, which an index built under the database's own collation
(``ux_groups_stream_name``, the cursors' primary key) cannot serve, so a page sorted every
group of the station (and a page of stations sorted every station). These indexes hold
(stream_id, name), and the stations' name, in that order. SQLite's indexes already compare by
code point (BINARY): nothing to do there.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

BY_NAME = sa.text('name COLLATE "C"')
INDEXES: dict[str, tuple[str, list[str | sa.TextClause]]] = {
    "ix_groups_stream_name_c": ("groups", ["stream_id", BY_NAME]),
    "ix_cursors_stream_name_c": ("cursors", ["stream_id", BY_NAME]),
    "ix_streams_name_c": ("streams", [BY_NAME]),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index, (table, columns) in INDEXES.items():
        op.create_index(index, table, columns)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index, (table, _columns) in INDEXES.items():
        op.drop_index(index, table_name=table)
