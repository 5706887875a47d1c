"""SQL of the dead-letter store (see ``stations.domain.dls`` for what entries mean). Every
function runs inside the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, delete, func, select, update

from stations.store import db, sql
from stations.store.groups import count_by_stream
from stations.store.schema import dls, streams

__all__ = ["Connection", "Selection"]


@dataclass(frozen=True)
class Selection:
    """Entries of one station chosen by a replay or a drop: ``ids``, or every entry
    (``ids`` None), optionally only one group's."""

    stream_id: int
    ids: list[int] | None = None
    group: str | None = None


def _where(sel: Selection) -> ColumnElement[bool]:
    cond = dls.c.stream_id == sel.stream_id
    if sel.group is not None:
        cond = cond & (dls.c.group_name == sel.group)
    if sel.ids is not None:
        cond = cond & dls.c.id.in_(sel.ids)
    return cond


# Entries per INSERT on SQLite: 13 parameters each stay under its 32,766.
INSERT_ROWS = 1000
_COLUMNS = [c for c in dls.columns if c.name != "id"]


def add(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """New entries (dicts of every column but the id) in a statement or a few however many,
    where an executemany runs one per row. PostgreSQL takes one array per column (a VALUES
    list of thousands of placeholders cost its driver more to parse than the insert took);
    SQLite multi-row VALUES."""
    if not rows:
        return
    names = ", ".join(c.name for c in _COLUMNS)
    if db.arrays(conn):
        casts = ", ".join(f"%s::{c.type.compile(dialect=conn.dialect)}[]" for c in _COLUMNS)
        sql.execute(
            conn,
            f"INSERT INTO dls ({names}) SELECT * FROM unnest({casts})",
            tuple([row[c.name] for row in rows] for c in _COLUMNS),
        )
        return
    one = "(" + ", ".join([db.mark(conn)] * len(_COLUMNS)) + ")"
    for k in range(0, len(rows), INSERT_ROWS):
        part = rows[k : k + INSERT_ROWS]
        sql.execute(
            conn,
            f"INSERT INTO dls ({names}) VALUES " + ", ".join([one] * len(part)),
            tuple(row[c.name] for row in part for c in _COLUMNS),
        )


def _delete(conn: Connection, cond: ColumnElement[bool]) -> int:
    """Ids are never reused (an AUTOINCREMENT key on SQLite, a sequence on PostgreSQL):
    clients replay and drop by id and page with ``after``."""
    return conn.execute(delete(dls).where(cond)).rowcount or 0


def drop(conn: Connection, sel: Selection) -> int:
    return _delete(conn, _where(sel))


def drop_ids(conn: Connection, ids: list[int]) -> int:
    if not ids:
        return 0
    # One parameter for the whole list (a replay of every entry: PostgreSQL's driver takes at
    # most 65,535).
    done = conn.exec_driver_sql(
        f"DELETE FROM dls WHERE {db.int_list_match(conn, 'id')}", (db.int_list(conn, ids),)
    )
    return done.rowcount or 0


def drop_group(conn: Connection, group_id: int) -> None:
    _delete(conn, dls.c.group_id == group_id)


def purge_stream(conn: Connection, stream_id: int) -> None:
    _delete(conn, dls.c.stream_id == stream_id)


def expire(conn: Connection, stream_id: int, before: int) -> int:
    return _delete(conn, (dls.c.stream_id == stream_id) & (dls.c.dead_lettered_at <= before))


def lock_selected(conn: Connection, sel: Selection) -> list[tuple[int, int, int, int]]:
    """(id, group id, seq, redrives) of the selected entries, locked (PostgreSQL) for a
    replay."""
    rows = conn.execute(
        select(dls.c.id, dls.c.group_id, dls.c.seq, dls.c.redrives)
        .where(_where(sel))
        .with_for_update()
    ).all()
    return [(i, g, s, r) for i, g, s, r in rows]


def due_redrives(
    conn: Connection, now: int, limit: int, *, lock: bool = True
) -> list[tuple[int, str, int, int, int]]:
    """(id, station, group id, seq, redrives) of up to ``limit`` entries whose automatic
    redrive is due, oldest due first; with ``lock``, locked where the database locks rows
    (entries another process holds are skipped, so several processes share the work instead
    of queueing)."""
    query = (
        select(dls.c.id, streams.c.name, dls.c.group_id, dls.c.seq, dls.c.redrives)
        .join(streams, streams.c.id == dls.c.stream_id)
        .where(dls.c.redrive_at <= now)
        .order_by(dls.c.redrive_at, dls.c.id)
        .limit(limit)
    )
    if lock:
        query = query.with_for_update(of=dls, skip_locked=True)
    return [(i, n, g, s, r) for i, n, g, s, r in conn.execute(query).all()]


def never_redrive(conn: Connection, ids: list[int]) -> None:
    if ids:
        conn.execute(update(dls).where(dls.c.id.in_(ids)).values(redrive_at=None))


def next_redrive(conn: Connection) -> int | None:
    value = conn.execute(select(func.min(dls.c.redrive_at))).scalar()
    return None if value is None else int(value)


def page(
    conn: Connection, stream_id: int, group: str | None, after: int | None, limit: int
) -> list[Any]:
    """Up to ``limit`` entries after entry ``after``, oldest first (rows with attributes)."""
    query = select(dls).where(dls.c.stream_id == stream_id)
    if group is not None:
        query = query.where(dls.c.group_name == group)
    if after is not None:
        query = query.where(dls.c.id > after)
    return list(conn.execute(query.order_by(dls.c.id).limit(limit)).all())


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, int]:
    return count_by_stream(conn, dls, stream_ids)
