"""Retention per station: ``maxAgeMs``, ``maxMessages``, ``maxBytes``, and the DLS's
``retentionMs``.

Dropping messages moves the stream's ``head``; the message ids stay in their table, so dedup
outlives the data. Offsets before the head answer 410 Gone.

Only stations that are due are visited (``stations.store.upkeep``): those over a count rule, and
those whose ``upkeep_at`` has come, the moment decided here after each visit: when the oldest
retained message or the oldest DLS entry leaves its rule. A station holding nothing a rule by
time could drop has no next look until something is stored (``look_by``, called by the append
and the dead letter that store it). An idle station costs nothing, and a visit is made in
chunks of stations, each its own writer transaction, so that appends get in between.
"""

from __future__ import annotations

from stations.domain.isolate import per_station
from stations.records import StreamState
from stations.store import dls as dead_letters
from stations.store import messages, upkeep
from stations.store import streams as rows
from stations.store.writer import Batch


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
        newest_old = messages.newest_stored_by(batch.conn, state.id, head, batch.now - max_age)
        if newest_old is not None:
            head = max(head, newest_old)
    max_bytes = rules.get("maxBytes")
    if max_bytes is not None and state.byte_count > max_bytes:
        # Its own head, counted from the stored head: ``byte_count`` covers every message
        # after it, those the rules above drop included (counted from their head, it dropped
        # their bytes a second time).
        excess = state.byte_count - max_bytes
        dropped = 0
        by_size = state.head
        for seq, span, size in messages.sizes(batch.conn, state.id, state.head):
            if dropped >= excess:
                break
            first = seq - span  # the position before the row's first message
            if span == 1 or (first >= by_size and dropped + size <= excess):
                dropped += size
                by_size = max(by_size, seq)
                continue
            # A row of several messages (one produce with ids, say) that the limit cuts
            # through, or that an earlier drop did: message by message.
            for position, n in enumerate(messages.message_sizes(batch.conn, state.id, seq)):
                if first + position + 1 <= by_size:
                    continue
                if dropped >= excess:
                    break
                dropped += n
                by_size = first + position + 1
        head = max(head, by_size)
    return min(head, state.tail)


def max_age_ms(state: StreamState) -> int | None:
    age: int | None = (state.config.get("retention") or {}).get("maxAgeMs")
    return age


def dls_retention_ms(state: StreamState) -> int | None:
    keep: int | None = (state.config.get("dls") or {}).get("retentionMs")
    return keep


def look_by(batch: Batch, state: StreamState, keep_ms: int | None) -> None:
    """Something was just stored that a rule by time keeping ``keep_ms`` will drop (a message
    under ``maxAgeMs``, a dead letter under ``dls.retentionMs``): make sure the station is
    looked at by then. Usually a look is planned already, no later: nothing to write."""
    if keep_ms is None:
        return
    at = batch.now + keep_ms
    if state.upkeep_at is None or state.upkeep_at > at:
        state.upkeep_at = at
        upkeep.set_upkeep_at(batch.conn, state.id, at)


def _next_look(batch: Batch, state: StreamState, head: int) -> int | None:
    """When a rule by time next drops something; None when nothing kept is under such a rule
    (``look_by`` plans the look when something is). Data stored later leaves its rule later
    still, so a look then is never too late."""
    at: int | None = None
    max_age = max_age_ms(state)
    if max_age is not None:
        oldest = messages.oldest_stored_after(batch.conn, state.id, head)
        if oldest is not None:
            at = oldest + max_age
    keep = dls_retention_ms(state)
    if keep is not None:
        oldest = upkeep.oldest_dead_letter(batch.conn, state.id)
        if oldest is not None:
            at = oldest + keep if at is None else min(at, oldest + keep)
    return at


# Stations visited in one writer transaction: thousands due at once (a rule by time falling due
# on many stations together) held every append behind them for seconds.
CHUNK = 100


def enforce_chunk(batch: Batch, after: str | None = None) -> tuple[int, str | None]:
    """Drop what the rules of up to ``CHUNK`` due stations (named after ``after``) no longer
    keep; returns the messages dropped and, when more may be due, where the next chunk starts."""
    batch.flush()
    batch.forget()
    total = 0
    names = upkeep.retention_due(batch.conn, batch.now, after, CHUNK)
    for name in sorted(names):  # the lock order every process uses
        # One station's failure (a bad stored setting, an error on its rows) stays its own.
        with per_station(batch, "retention", name):
            total += _enforce_one(batch, name)
    return total, (names[-1] if len(names) == CHUNK else None)


def enforce(batch: Batch) -> int:
    """Every due station's retention in this one transaction (tests, tools); returns messages
    dropped. The scheduler runs ``enforce_chunk``, a transaction each."""
    total, after = enforce_chunk(batch)
    while after is not None:
        dropped, after = enforce_chunk(batch, after)
        total += dropped
    return total


def _enforce_one(batch: Batch, name: str) -> int:
    """One due station's retention and DLS expiry; returns the messages it dropped."""
    # Decide under the station's row lock: on PostgreSQL another process may be appending to it
    # or enforcing the same rules right now, and counting rows it is about to delete would take
    # them off ``msg_count`` twice.
    state = rows.load(batch.conn, name, lock=True)
    if state is None or state.deleted:
        return 0
    dropped = 0
    head = _new_head(batch, state)
    if head > state.head:
        # Rows wholly at or below the head go; a multi-message row the head cuts through stays
        # until its last message goes too (reads start after the head either way). A fork's own
        # messages start after its fork offset; inherited ones are not counted.
        after = max(state.head, state.fork_offset or 0)
        dropped = max(0, head - after)
        messages.drop_through(batch.conn, state.id, after, head, dropped)
    keep = dls_retention_ms(state)
    if keep is not None:
        dead_letters.expire(batch.conn, state.id, batch.now - keep)
    upkeep.set_upkeep_at(batch.conn, state.id, _next_look(batch, state, max(head, state.head)))
    return dropped
