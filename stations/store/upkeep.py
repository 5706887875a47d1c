"""The housekeeping schedule: set-based statements that find the stations whose id sweep,
retention or DLS expiry is due, so the scheduler's work follows what is due, not how many
stations exist.

The stream row keeps copies of what these statements need (``id_window_ms``, the count rules
``max_messages``/``max_bytes`` and ``upkeep_at``, when a rule by time next needs a look); the
domain (``stations.domain.retention``) decides their values.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, func, select, update

from stations.records import StreamState
from stations.store import db
from stations.store.db import Tx
from stations.store.schema import dls, id_blocks, id_runs, msg_ids, streams


def retention_due(
    tx: Tx, now: int, after: str | None = None, limit: int | None = None
) -> list[str]:
    """Stations whose time rules need a look or whose count rules are exceeded, in the
    database's order of names, at most ``limit`` of them after ``after`` (a chunk; the caller
    sorts it for its lock order). Each term can use its own index: ``upkeep_at``, and the count
    rules' columns, which are NULL on stations without the rule."""
    s = streams.c
    query = (
        select(s.name)
        .where(
            s.deleted.is_(False),
            (s.upkeep_at <= now)
            | ((s.max_messages >= 0) & (s.tail - s.head > s.max_messages))
            | ((s.max_bytes >= 0) & (s.byte_count > s.max_bytes)),
        )
        .order_by(s.name)
    )
    if after is not None:
        query = query.where(s.name > after)
    if limit is not None:
        query = query.limit(limit)
    return list(db.conn_of(tx).execute(query).scalars())


def set_upkeep_at(tx: Tx, stream_id: int, at: int | None) -> None:
    db.conn_of(tx).execute(update(streams).where(streams.c.id == stream_id).values(upkeep_at=at))


def set_rules(tx: Tx, stream_id: int, columns: dict[str, Any]) -> None:
    """The config's copies after a change of the config (``stations.domain.streams.upkeep_columns``)."""
    db.conn_of(tx).execute(update(streams).where(streams.c.id == stream_id).values(**columns))


def ids_due(tx: Tx, now: int) -> list[StreamState]:
    """Stations with ids that have left their window, in ``msg_ids``, a block or a run: a few
    key probes per station inside one statement."""
    s = streams.c
    cutoff = now - s.id_window_ms
    hot = exists().where(msg_ids.c.stream_id == s.id, msg_ids.c.stored_at <= cutoff)
    runs = exists().where(id_runs.c.stream_id == s.id, id_runs.c.newest <= cutoff)
    # SQLite's recent ids, one block per commit in position order: the first one is the oldest.
    oldest_block = (
        select(id_blocks.c.stored_at)
        .where(id_blocks.c.stream_id == s.id)
        .order_by(id_blocks.c.seq0)
        .limit(1)
        .scalar_subquery()
    )
    rows = db.conn_of(tx).execute(
        select(streams)
        .where(s.deleted.is_(False), hot | runs | (oldest_block <= cutoff))
        .order_by(s.name)
    )
    return [StreamState.from_row(r) for r in rows]


def smallest_window(tx: Tx) -> int | None:
    smallest: int | None = (
        db.conn_of(tx)
        .execute(select(func.min(streams.c.id_window_ms)).where(streams.c.deleted.is_(False)))
        .scalar()
    )
    return smallest


def oldest_dead_letter(tx: Tx, stream_id: int) -> int | None:
    oldest: int | None = (
        db.conn_of(tx)
        .execute(select(func.min(dls.c.dead_lettered_at)).where(dls.c.stream_id == stream_id))
        .scalar()
    )
    return oldest
