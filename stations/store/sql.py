"""Hand-written SQL for the few statements on the append path.

Everything else goes through SQLAlchemy Core. These run once or more per append, where building
and caching a Core statement costs more than executing it, so they go to the driver as plain
text with positional parameters in the driver's own style (``db.mark``). The schema they name
is the one in ``stations.store.schema``; both engines accept them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Connection, Table

from stations.store import db
from stations.store.schema import msg_ids, streams

STREAM_COLUMNS = ", ".join(c.name for c in streams.columns)
# The columns an append, close, touch or PATCH can change; structure (head, deletion, expiry)
# is written by the ops that own it.
STREAM_UPDATES = (
    "tail",
    "msg_count",
    "byte_count",
    "accessed_at",
    "closed",
    "closer_id",
    "closer_epoch",
    "closer_seq",
    "stream_seq",
    "config",
    "ids_forgotten_at",
)


FEW_ROWS = 16


@cache
def _statements(mark: str, lock: str) -> dict[str, str]:
    return {
        "load": f"SELECT {STREAM_COLUMNS} FROM streams WHERE name = {mark}",
        "load_lock": f"SELECT {STREAM_COLUMNS} FROM streams WHERE name = {mark}{lock}",
        "update": "UPDATE streams SET "
        + ", ".join(f"{c} = {mark}" for c in STREAM_UPDATES)
        + f" WHERE id = {mark}",
        "session": "SELECT epoch, last_seq FROM producers "
        f"WHERE stream_id = {mark} AND producer_id = {mark}",
        "upsert_session": "INSERT INTO producers (stream_id, producer_id, epoch, last_seq, "
        f"updated_at) VALUES ({mark}, {mark}, {mark}, {mark}, {mark}) "
        "ON CONFLICT (stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, "
        "last_seq = excluded.last_seq, updated_at = excluded.updated_at",
    }


def statement(conn: Connection, name: str) -> str:
    return _statements(db.mark(conn), db.row_lock(conn))[name]


@cache
def _insert(mark: str, table: Table) -> str:
    columns = ", ".join(c.name for c in table.columns)
    return f"INSERT INTO {table.name} ({columns}) VALUES ({', '.join([mark] * len(table.columns))})"


def insert(conn: Connection, table: Table) -> str:
    """INSERT of every column, in table order."""
    return _insert(db.mark(conn), table)


def execute(conn: Connection, text: str, params: Any) -> None:
    """Run on the driver's cursor, inside the connection's transaction; a list of parameter
    tuples runs as executemany."""
    cursor = conn.connection.cursor()
    try:
        if isinstance(params, list):
            cursor.executemany(text, params)
        else:
            cursor.execute(text, params)
    finally:
        cursor.close()


def query(conn: Connection, text: str, params: Any) -> list[tuple[Any, ...]]:
    """Run on the driver's cursor and return every row."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(text, params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def run(conn: Connection, name: str, params: Any) -> None:
    execute(conn, statement(conn, name), params)


def one(conn: Connection, name: str, params: Any) -> tuple[Any, ...] | None:
    cursor = conn.connection.cursor()
    try:
        cursor.execute(statement(conn, name), params)
        return cursor.fetchone()
    finally:
        cursor.close()


def session(conn: Connection, stream_id: int, producer_id: str) -> tuple[int, int] | None:
    """``(epoch, last_seq)`` of a producer's session on a stream, if it has one."""
    row = one(conn, "session", (stream_id, producer_id))
    return None if row is None else (row[0], row[1])


def insert_rows(conn: Connection, table: Table, rows: list[tuple[Any, ...]]) -> None:
    """Insert rows (tuples in column order): one statement of column arrays where the driver
    takes arrays, else executemany."""
    # A few rows (a produce or append is one row per request) go by executemany, which
    # psycopg pipelines into one round trip: as arrays, every value (a row's data too) would
    # be written element by element in Python.
    text = db.insert_many_sql(conn, table) if len(rows) > FEW_ROWS else None
    if text is None:
        execute(conn, insert(conn, table), rows)
    else:
        execute(conn, text, tuple(map(list, zip(*rows, strict=True))))


# msg_ids rows as three text parameters, each column's values joined (ids hold no newline):
# psycopg writes a list parameter element by element in Python.
_INSERT_IDS = (
    "INSERT INTO msg_ids (stream_id, msg_id, seq, stored_at) SELECT t.s, t.m, t.q, %s::bigint "
    "FROM unnest(string_to_array(%s, ',')::integer[], string_to_array(%s, E'\\n'), "
    "string_to_array(%s, ',')::bigint[]) AS t(s, m, q)"
)


def insert_ids(conn: Connection, rows: list[tuple[int, str, int]], stored_at: int) -> None:
    """Store ``(stream_id, msg_id, seq)`` rows in ``msg_ids``, all stored at ``stored_at``."""
    if not db.arrays(conn):
        insert_rows(conn, msg_ids, [(*row, stored_at) for row in rows])
        return
    sids, ids, seqs = zip(*rows, strict=True)
    params = (",".join(map(str, sids)), "\n".join(ids), ",".join(map(str, seqs)))
    execute(conn, _INSERT_IDS, (stored_at, *params))
