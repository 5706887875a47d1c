"""Retention per station: ``maxAgeMs``, ``maxMessages``, ``maxBytes``.

Dropping messages moves the stream's ``head``; the message ids stay in their table, so dedup
outlives the data. Offsets before the head answer 410 Gone.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select

from stations.domain.isolate import per_station
from stations.domain.streams import StreamState, load
from stations.store.schema import messages, streams
from stations.store.writer import Batch

CHUNK = 10_000


def _new_head(batch: Batch, state: StreamState) -> int:
    """The new head: every position at or below it is dropped. Positions are dense, so a
    message count is a subtraction; age and size go by whole rows."""
    rules = state.config.get("retention") or {}
    head = state.head
    max_messages = rules.get("maxMessages")
    if max_messages is not None:
        head = max(head, state.tail - max_messages)
    max_age = rules.get("maxAgeMs")
    if max_age is not None:
        newest_old = batch.conn.execute(
            select(func.max(messages.c.seq)).where(
                messages.c.stream_id == state.id,
                messages.c.seq > head,
                messages.c.stored_at <= batch.now - max_age,
            )
        ).scalar()
        if newest_old is not None:
            head = max(head, newest_old)
    max_bytes = rules.get("maxBytes")
    if max_bytes is not None and state.byte_count > max_bytes:
        excess = state.byte_count - max_bytes
        dropped = 0
        rows = batch.conn.execute(
            select(messages.c.seq, func.length(messages.c.data))
            .where(messages.c.stream_id == state.id, messages.c.seq > head)
            .order_by(messages.c.seq)
            .limit(CHUNK)
        )
        for seq, size in rows:
            if dropped >= excess:
                break
            dropped += size
            head = max(head, seq)
    return min(head, state.tail)


def enforce(batch: Batch) -> int:
    """Drop what each station's rules no longer keep; returns messages dropped."""
    batch.flush()
    batch.forget()
    total = 0
    rows = batch.conn.execute(select(streams).where(streams.c.deleted.is_(False))).all()
    for row in rows:
        if _has_rules(row):
            with per_station(batch, "retention", row.name):
                total += _enforce_one(batch, row)
    return total


def _has_rules(row: Any) -> bool:
    try:
        rules = StreamState.from_row(row).config.get("retention") or {}
    except Exception:
        return True  # a config that does not load fails in its own station's share
    return any(rules.get(k) is not None for k in ("maxAgeMs", "maxMessages", "maxBytes"))


def _enforce_one(batch: Batch, row: Any) -> int:
    """One station's retention; returns the messages it dropped."""
    # Decide under the station's row lock: on PostgreSQL another process may be appending
    # to it or enforcing the same rules right now, and counting rows it is about to delete
    # would take them off ``msg_count`` twice.
    state = load(batch.conn, row.name, lock=True)
    if state is None or state.deleted:
        return 0
    head = _new_head(batch, state)
    if head <= state.head:
        return 0
    # Rows wholly at or below the head go; a multi-message row the head cuts through stays
    # until its last message goes too (reads start after the head either way).
    dropped_bytes = batch.conn.execute(
        select(func.coalesce(func.sum(func.length(messages.c.data)), 0)).where(
            messages.c.stream_id == state.id, messages.c.seq <= head
        )
    ).scalar_one()
    batch.conn.execute(
        delete(messages).where(messages.c.stream_id == state.id, messages.c.seq <= head)
    )
    # A fork's own messages start after its fork offset; inherited ones are not counted.
    dropped = max(0, head - max(state.head, state.fork_offset or 0))
    batch.conn.execute(
        streams.update()
        .where(streams.c.id == state.id)
        .values(
            head=head,
            msg_count=streams.c.msg_count - dropped,
            byte_count=streams.c.byte_count - dropped_bytes,
        )
    )
    return dropped
