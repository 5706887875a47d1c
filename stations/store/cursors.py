"""The SQL of reader cursors (``stations.domain.cursors``): one row per (stream, name)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, String, Table, delete, select

from stations.store import db
from stations.store.db import Tx
from stations.store.schema import messages, metadata, streams

cursors = Table(
    "cursors",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("name", String(256), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)


def upsert(tx: Tx, stream_id: int, name: str, position: int, now: int) -> None:
    conn = db.conn_of(tx)
    values = {"stream_id": stream_id, "name": name, "position": position, "updated_at": now}
    changes = {"position": position, "updated_at": now}
    conn.execute(db.upsert(conn, cursors, values, [cursors.c.stream_id, cursors.c.name], changes))


def rows(tx: Tx, stream_id: int, name: str | None = None) -> list[tuple[str, int, int]]:
    """(name, position, updated_at) of the stream's cursors (or of the one named), by name."""
    query = select(cursors.c.name, cursors.c.position, cursors.c.updated_at).where(
        cursors.c.stream_id == stream_id
    )
    if name is not None:
        query = query.where(cursors.c.name == name)
    return [(r[0], r[1], r[2]) for r in db.conn_of(tx).execute(query.order_by(cursors.c.name))]


def page(
    tx: Tx, stream_id: int, after: str | None, prefix: str, contains: str, limit: int
) -> list[tuple[str, int, int]]:
    """(name, position, updated_at) of one page of the stream's cursors by name (see
    ``db.name_page``), read through the (stream_id, name) key: the primary key, on PostgreSQL
    its code point twin ``ix_cursors_stream_name_c``."""
    conn = db.conn_of(tx)
    query = select(cursors.c.name, cursors.c.position, cursors.c.updated_at).where(
        cursors.c.stream_id == stream_id
    )
    query = db.name_page(conn, query, cursors.c.name, after, prefix, contains, limit)
    return [(r[0], r[1], r[2]) for r in conn.execute(query)]


def remove(tx: Tx, stream_id: int, name: str | None = None) -> int:
    stmt = delete(cursors).where(cursors.c.stream_id == stream_id)
    if name is not None:
        stmt = stmt.where(cursors.c.name == name)
    return db.conn_of(tx).execute(stmt).rowcount


def with_streams(tx: Tx, limit: int) -> list[tuple[str, str, int, int, int]]:
    """(station, cursor, position, tail, head) of cursors on live streams, at most ``limit``."""
    query = (
        select(streams.c.name, cursors.c.name, cursors.c.position, streams.c.tail, streams.c.head)
        .join(streams, streams.c.id == cursors.c.stream_id)
        .where(streams.c.deleted.is_(False))
        .order_by(streams.c.name, cursors.c.name)
        .limit(limit)
    )
    return [(r[0], r[1], r[2], r[3], r[4]) for r in db.conn_of(tx).execute(query)]


def row_after(tx: Tx, stream_id: int, position: int) -> tuple[int, int, int] | None:
    """(seq, span, stored_at) of the row holding the message right after ``position``."""
    query = (
        select(messages.c.seq, messages.c.span, messages.c.stored_at)
        .where(messages.c.stream_id == stream_id, messages.c.seq > position)
        .order_by(messages.c.seq)
        .limit(1)
    )
    found = db.conn_of(tx).execute(query).first()
    return None if found is None else (found[0], found[1], found[2])
