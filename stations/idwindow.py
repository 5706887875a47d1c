"""The Msg-Id window: each id is remembered for the station's ``idempotencyWindowMs`` from the
moment its message was stored.

Two tiers, as in NATS' dedup table but without its RAM-only limits: a bounded ``cachetools``
TTL cache per station answers hot retries, and the durable ``msg_ids`` table (written in the
append's own transaction) answers everything else, across restarts, retention and processes.
Whether an id is still a duplicate is always decided by ``stored_at + the window in force now``,
so a PATCH of the window applies to ids already stored. Memory is bounded by the cache size,
not by the number of ids in the window.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cachetools import TTLCache
from sqlalchemy import delete, select, tuple_

from stations.schema import msg_ids

if TYPE_CHECKING:
    from stations.streams import StreamState
    from stations.writer import Batch

CACHE_SIZE = 50_000  # ids per station kept in RAM
SWEEP_CHUNK = 5_000


class IdWindow:
    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._cache_size = cache_size
        self._caches: dict[int, TTLCache[str, tuple[int, int]]] = {}

    def _cache(self, state: StreamState) -> TTLCache[str, tuple[int, int]]:
        cache = self._caches.get(state.id)
        ttl = state.window_ms / 1000
        if cache is None or cache.ttl < ttl:
            # A grown window needs a longer-lived cache; entries are re-read from the table.
            cache = TTLCache(maxsize=self._cache_size, ttl=ttl, timer=time.time)
            self._caches[state.id] = cache
        return cache

    def lookup(self, batch: Batch, state: StreamState, msg_id: str) -> int | None:
        """The position of the message stored under ``msg_id`` if it is still in the window."""
        key = (state.id, msg_id)
        if key in batch.pending_ids:
            return batch.pending_ids[key]
        window = state.window_ms
        hit = self._cache(state).get(msg_id)
        if hit is not None and batch.now < hit[1] + window:
            return hit[0]
        row = batch.conn.execute(
            select(msg_ids.c.seq, msg_ids.c.stored_at).where(
                msg_ids.c.stream_id == state.id, msg_ids.c.msg_id == msg_id
            )
        ).first()
        if row is None:
            return None
        if batch.now < row.stored_at + window:
            return row.seq
        # Expired but not yet swept: the id is free again.
        batch.conn.execute(
            delete(msg_ids).where(msg_ids.c.stream_id == state.id, msg_ids.c.msg_id == msg_id)
        )
        return None

    def remember(self, batch: Batch, state: StreamState, msg_id: str, seq: int) -> None:
        batch.pending_ids[(state.id, msg_id)] = seq
        batch.ids.append(
            {"stream_id": state.id, "msg_id": msg_id, "seq": seq, "stored_at": batch.now}
        )
        cache = self._cache(state)
        stored_at = batch.now
        # Only a committed id may answer a retry as a duplicate.
        batch.after_commit.append(lambda: cache.__setitem__(msg_id, (seq, stored_at)))

    def forget_station(self, stream_id: int) -> None:
        self._caches.pop(stream_id, None)

    def sweep(self, batch: Batch, state: StreamState) -> int:
        """Delete one chunk of expired ids of a station; returns how many went."""
        cutoff = batch.now - state.window_ms
        expired = (
            select(msg_ids.c.stream_id, msg_ids.c.msg_id)
            .where(msg_ids.c.stream_id == state.id, msg_ids.c.stored_at <= cutoff)
            .limit(SWEEP_CHUNK)
        )
        result = batch.conn.execute(
            delete(msg_ids).where(tuple_(msg_ids.c.stream_id, msg_ids.c.msg_id).in_(expired))
        )
        cache = self._caches.get(state.id)
        if cache is not None:
            cache.expire()
        return result.rowcount or 0

    def count(self, conn, state: StreamState, now: int) -> int:  # type: ignore[no-untyped-def]
        from sqlalchemy import func

        return conn.execute(
            select(func.count()).where(
                msg_ids.c.stream_id == state.id, msg_ids.c.stored_at > now - state.window_ms
            )
        ).scalar_one()
