"""The ``streams`` table: one row per station (= Durable Streams stream).

Loading, listing, inserting and deleting stream rows, and the fork chain a read follows. What
follows from a row (expiry, the window) is ``stations.records.StreamState``; what to do with it is
the domain's decision (``stations.domain.lifecycle``, ``catalog``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Delete, delete, func, insert, literal_column, select, tuple_

from stations.records import StreamState
from stations.store import db, sql
from stations.store.db import Tx
from stations.store.schema import messages, producers, streams


def load(tx: Tx, name: str, *, lock: bool = False) -> StreamState | None:
    # On PostgreSQL the row lock orders appends to one stream across processes.
    row = sql.one(db.conn_of(tx), "load_lock" if lock else "load", (name,))
    return StreamState.from_tuple(row) if row else None


def load_by_id(tx: Tx, stream_id: int, *, share: bool = False) -> StreamState | None:
    """``share``: the row is read under a shared lock (PostgreSQL), so another process's
    change of it (its retention moving the head) waits for this transaction, or is seen."""
    query = select(streams).where(streams.c.id == stream_id)
    if share:
        query = query.with_for_update(read=True)
    row = db.conn_of(tx).execute(query).first()
    return StreamState.from_row(row) if row else None


def live_of(tx: Tx, stream_ids: list[int]) -> set[int]:
    """Those of ``stream_ids`` whose stream exists and is not deleted."""
    conn = db.conn_of(tx)
    found = sql.query(
        conn,
        f"SELECT id FROM streams WHERE {db.int_list_match(conn, 'id')} AND NOT deleted",
        (db.int_list(conn, stream_ids),),
    )
    return {int(r[0]) for r in found}


def _by_name(tx: Tx) -> Any:
    """The name as lists order and compare it: by code point on both engines (a paged list's
    ``after`` must agree with the order of the pages)."""
    return db.by_code_point(db.conn_of(tx), streams.c.name)


def every(tx: Tx) -> list[StreamState]:
    """Every stream row, deleted and expired ones too, by name."""
    rows = db.conn_of(tx).execute(select(streams).order_by(_by_name(tx))).all()
    # By position, in table order: a dict per row cost twice as much at thousands of stations.
    return [StreamState.from_tuple(tuple(r)) for r in rows]


def page(tx: Tx, after: str | None, prefix: str, contains: str, limit: int) -> list[StreamState]:
    """Up to ``limit`` rows not deleted, by name, after ``after``, starting with ``prefix``
    (exactly) and holding ``contains`` (ignoring case): one page of a list, without
    reading every row (at 10,000 stations that took 100 ms of the 120 a page cost)."""
    conn = db.conn_of(tx)
    query = select(streams).where(streams.c.deleted.is_(False))
    query = db.name_page(conn, query, streams.c.name, after, prefix, contains, limit)
    return [StreamState.from_tuple(tuple(r)) for r in conn.execute(query).all()]


def expiring(tx: Tx, now: int) -> list[str]:
    """The names of the streams not yet deleted whose TTL or Expires-At has passed
    at ``now`` (as read without a lock: the caller decides on each row under its lock): one
    statement over the rows that have either, so idle streams without them cost nothing."""
    ttl_end = streams.c.accessed_at + streams.c.ttl_seconds * 1000
    query = select(streams.c.name).where(
        streams.c.deleted.is_(False),
        ((streams.c.expires_at.is_not(None)) & (streams.c.expires_at <= now))
        | ((streams.c.ttl_seconds.is_not(None)) & (ttl_end <= now)),
    )
    return list(db.conn_of(tx).execute(query).scalars())


Segment = tuple[int, int, int | None]  # (stream id, from position exclusive, to inclusive)


def _sources(tx: Tx, state: StreamState, share: bool = False) -> list[tuple[StreamState, int]]:
    """A fork's sources, nearest first, each with the last position the fork reads from it
    (``share``: see ``load_by_id``)."""
    found: list[tuple[StreamState, int]] = []
    upper = state.fork_offset
    current = state
    while current.fork_of is not None:
        source = load_by_id(tx, current.fork_of, share=share)
        if source is None:
            break
        assert upper is not None
        found.append((source, upper))
        upper = min(upper, source.fork_offset) if source.fork_offset is not None else upper
        current = source
    return found


def segments(tx: Tx, state: StreamState) -> list[Segment]:
    """Where a stream's positions live: a fork reads its source up to the fork offset."""
    chain: list[Segment] = [(state.id, state.fork_offset or 0, None)]
    chain += [(s.id, s.fork_offset or 0, upper) for s, upper in _sources(tx, state)]
    chain.reverse()
    return chain


def inherited_head(tx: Tx, state: StreamState, *, share: bool = False) -> int:
    """A fork's head with its sources': positions it reads from a source that the source's
    retention dropped are gone for the fork too. ``share``: the sources' rows are locked
    shared until the commit (a writer deciding by the head: see ``load_by_id``)."""
    found = _sources(tx, state, share)
    return max([state.head] + [min(s.head, upper) for s, upper in found])


def lock_name(tx: Tx, name: str) -> None:
    """Until the commit, creates of ``name`` in other processes wait for this one."""
    db.lock_name(db.conn_of(tx), name)


def insert_row(tx: Tx, values: dict[str, Any]) -> int:
    """A new stream row; returns its id."""
    stream_id: int = (
        db.conn_of(tx)
        .execute(insert(streams).values(**values).returning(streams.c.id))
        .scalar_one()
    )
    return stream_id


def fork_count(tx: Tx, stream_id: int) -> int:
    count: int = (
        db.conn_of(tx)
        .execute(select(func.count()).select_from(streams).where(streams.c.fork_of == stream_id))
        .scalar_one()
    )
    return count


def mark_deleted(tx: Tx, stream_id: int) -> None:
    db.conn_of(tx).execute(streams.update().where(streams.c.id == stream_id).values(deleted=True))


def delete_data(tx: Tx, stream_id: int) -> None:
    """A stream's messages and producer sessions."""
    conn = db.conn_of(tx)
    for table in (messages, producers):
        conn.execute(delete(table).where(table.c.stream_id == stream_id))


def expire_sessions(tx: Tx, before: int, limit: int) -> int:
    """Delete up to ``limit`` producer sessions last written before ``before`` (store time);
    returns how many."""
    conn = db.conn_of(tx)
    return int(conn.execute(expiry_statement(before, limit, shared=db.shared(conn))).rowcount)


def expiry_statement(before: int, limit: int, *, shared: bool) -> Delete:
    """An index range scan (``ix_producers_updated_at``): the work is what is due, however
    many sessions are live.

    The outer condition on ``updated_at`` again: PostgreSQL (read committed) re-checks only
    it on a row another process's append updated and committed while this statement waited
    for its lock, and deleted the session that append had just written (a retry of it was
    then stored twice). SQLite picks the rows by ``rowid``: a row value ``IN`` was planned on
    the primary key's first column, every session of a station read to delete a few."""
    due = producers.c.updated_at < before
    if shared:
        key: Any = tuple_(producers.c.stream_id, producers.c.producer_id)
        picked: Any = select(producers.c.stream_id, producers.c.producer_id)
    else:
        key = literal_column("rowid")
        picked = select(literal_column("rowid")).select_from(producers)
    return delete(producers).where(key.in_(picked.where(due).limit(limit)), due)


def delete_row(tx: Tx, stream_id: int) -> None:
    db.conn_of(tx).execute(delete(streams).where(streams.c.id == stream_id))
