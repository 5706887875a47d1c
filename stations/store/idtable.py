"""The ``msg_ids`` table: the durable message-id window where several processes share it
(PostgreSQL). On SQLite the ids live in blocks and runs instead (``stations.store.idruns``).

The statements run on the driver's cursor: the id lookup runs once per append with ids, where
compiling a Core statement with hundreds of bound values would cost more than the lookup.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, delete, func, select, tuple_

from stations.store import db, idruns
from stations.store.schema import msg_ids, streams

LOOKUP_CHUNK = 500  # ids per IN (...) list


def _rows(conn: Connection, text: str, params: Any, **options: Any) -> list[tuple[Any, ...]]:
    cursor = conn.connection.cursor()
    try:
        cursor.execute(text, params, **options)
        return list(cursor.fetchall())
    finally:
        cursor.close()


# One text parameter of the ids joined by newlines (no id holds one): psycopg writes a list
# parameter element by element in Python, which cost more than the lookup itself (the same
# for ``sql.insert_ids``). One primary
# key probe per id: the LATERAL subquery names the whole key. The station comes through an
# InitPlan (``SELECT %s``), so the planner does not know it when planning: given the value, it
# estimated a station created after the last ANALYZE at about no rows and probed the
# (stream_id, stored_at) index instead, reading every id of the station for each id looked up.
LOOKUP_SQL = (
    "SELECT w.msg_id, m.seq, m.stored_at FROM unnest(string_to_array(%s, E'\\n')) AS w(msg_id) "
    "CROSS JOIN LATERAL (SELECT seq, stored_at FROM msg_ids "
    "WHERE stream_id = (SELECT %s::integer) AND msg_id = w.msg_id LIMIT 1) AS m"
)


def lookup(conn: Connection, stream_id: int, wanted: list[str]) -> list[tuple[str, int, int]]:
    """``(msg_id, seq, stored_at)`` of the wanted ids stored in ``msg_ids``."""
    if not wanted:
        return []
    if db.arrays(conn):
        return _rows(
            conn,
            LOOKUP_SQL,
            ("\n".join(wanted), stream_id),
            # Planned afresh each time: a plan prepared while the table was empty (a scan)
            # would be kept as it grows, since without statistics nothing invalidates it.
            prepare=False,
        )
    out: list[tuple[str, int, int]] = []
    for start in range(0, len(wanted), LOOKUP_CHUNK):
        chunk = wanted[start : start + LOOKUP_CHUNK]
        out += _rows(
            conn,
            "SELECT msg_id, seq, stored_at FROM msg_ids WHERE stream_id = ? "
            f"AND msg_id IN ({', '.join('?' * len(chunk))})",
            (stream_id, *chunk),
        )
    return out


def forget(conn: Connection, stream_id: int, expired: list[str]) -> int:
    """Delete ids found expired but not yet swept; returns how many went."""
    result = conn.execute(
        delete(msg_ids).where(msg_ids.c.stream_id == stream_id, msg_ids.c.msg_id.in_(expired))
    )
    return result.rowcount or 0


def sweep(conn: Connection, stream_id: int, cutoff: int, limit: int) -> int:
    """Delete up to ``limit`` ids stored at or before ``cutoff``; returns how many went."""
    expired = (
        select(msg_ids.c.stream_id, msg_ids.c.msg_id)
        .where(msg_ids.c.stream_id == stream_id, msg_ids.c.stored_at <= cutoff)
        .limit(limit)
    )
    result = conn.execute(
        delete(msg_ids).where(tuple_(msg_ids.c.stream_id, msg_ids.c.msg_id).in_(expired))
    )
    return result.rowcount or 0


def counts(conn: Connection, now: int, stream_ids: Collection[int] | None = None) -> dict[int, int]:
    """Ids stored within their station's window (``id_window_ms``, the config's copy), by
    station, in ``msg_ids``, blocks and runs: of every live station, or of ``stream_ids``
    (a page of them). A fixed number of statements however many stations there are."""
    query = (
        select(msg_ids.c.stream_id, func.count())
        .join(streams, streams.c.id == msg_ids.c.stream_id)
        .where(streams.c.deleted.is_(False), msg_ids.c.stored_at > now - streams.c.id_window_ms)
        .group_by(msg_ids.c.stream_id)
    )
    if stream_ids is not None:
        query = query.where(streams.c.id.in_(list(stream_ids)))
    out = idruns.counts(conn, now, stream_ids)
    for sid, n in conn.execute(query):
        out[sid] = out.get(sid, 0) + int(n)
    return out


def purge(conn: Connection, stream_id: int) -> None:
    conn.execute(delete(msg_ids).where(msg_ids.c.stream_id == stream_id))
    idruns.purge(conn, stream_id)
