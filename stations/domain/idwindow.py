"""The Msg-Id window: each id is remembered for the station's ``idempotencyWindowMs`` from the
moment its message was stored.

Two tiers, as in NATS' dedup table but without its RAM-only limits: a bounded ``cachetools``
TTL cache per station answers hot retries, and the durable ``msg_ids`` table (written in the
append's own transaction) answers everything else, across restarts, retention and processes.
Whether an id is still a duplicate is always decided by ``stored_at + the window in force now``,
so a PATCH of the window applies to ids already stored. Memory is bounded by the cache size,
not by the number of ids in the window. On SQLite, ``msg_ids`` holds a station's recent ids
only and older ones move to sorted runs (``stations.store.idruns``), so a window of millions of ids
costs about what a small one does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cachetools import TTLCache
from sqlalchemy import Connection, delete, func, select, tuple_

from stations.store import idruns
from stations.store.idruns import IdRuns
from stations.store.schema import msg_ids

if TYPE_CHECKING:
    from stations.domain.streams import StreamState
    from stations.store.writer import Batch

CACHE_SIZE = 50_000  # ids per station kept in RAM
SWEEP_CHUNK = 5_000
LOOKUP_CHUNK = 500  # ids per IN (...) query


class IdWindow:
    def __init__(self, cache_size: int = CACHE_SIZE, runs: IdRuns | None = None) -> None:
        self._cache_size = cache_size
        self._caches: dict[int, TTLCache[str, tuple[int, int]]] = {}
        self.runs = runs

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
        return self.lookup_many(batch, state, [msg_id]).get(msg_id)

    def lookup_many(self, batch: Batch, state: StreamState, wanted: list[str]) -> dict[str, int]:
        """``lookup`` for many ids at once: one query for all that the cache cannot answer."""
        found: dict[str, int] = {}
        window = state.window_ms
        cache = self._cache(state)
        misses = []
        for msg_id in dict.fromkeys(wanted):
            pending = batch.pending_ids.get((state.id, msg_id))
            if pending is not None:
                found[msg_id] = pending
                continue
            hit = cache.get(msg_id)
            if hit is not None and batch.now < hit[1] + window:
                found[msg_id] = hit[0]
            else:
                misses.append(msg_id)
        expired: list[str] = []
        mark = "?" if batch.conn.dialect.paramstyle == "qmark" else "%s"
        for start in range(0, len(misses), LOOKUP_CHUNK):
            chunk = misses[start : start + LOOKUP_CHUNK]
            # Driver-level SQL: compiling an IN list of hundreds of bound parameters through
            # SQLAlchemy would cost more than the lookup itself.
            rows = batch.conn.exec_driver_sql(
                f"SELECT msg_id, seq, stored_at FROM msg_ids WHERE stream_id = {mark} "
                f"AND msg_id IN ({', '.join([mark] * len(chunk))})",
                (state.id, *chunk),
            )
            for msg_id, seq, stored_at in rows:
                if batch.now < stored_at + window:
                    found[msg_id] = seq
                else:
                    expired.append(msg_id)
        if self.runs is not None and len(found) < len(misses):
            older = self.runs.lookup(batch, state, [m for m in misses if m not in found])
            for msg_id, (seq, stored_at) in older.items():
                if batch.now < stored_at + window:
                    found[msg_id] = seq
        if expired:
            # Expired but not yet swept: the ids are free again.
            gone = batch.conn.execute(
                delete(msg_ids).where(
                    msg_ids.c.stream_id == state.id, msg_ids.c.msg_id.in_(expired)
                )
            ).rowcount
            if self.runs is not None:
                self.runs.swept_hot(state.id, gone or 0)
        return found

    def remember(self, batch: Batch, state: StreamState, stored: list[tuple[str, int]]) -> None:
        """Record ``(msg_id, position)`` pairs stored by this batch."""
        cache, now = self._cache(state), batch.now
        for msg_id, seq in stored:
            batch.pending_ids[(state.id, msg_id)] = seq
            batch.ids.append((state.id, msg_id, seq, now))
            # Only a committed id may answer a retry as a duplicate: the writer fills the
            # cache after the commit.
            batch.cache_fills.append((cache, msg_id, (seq, now)))
        if self.runs is not None and stored:
            self.runs.stored(batch, state, len(stored))

    def forget_station(self, stream_id: int) -> None:
        self._caches.pop(stream_id, None)
        if self.runs is not None:
            self.runs.forget_station(stream_id)

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
        gone = result.rowcount or 0
        if self.runs is not None:
            self.runs.swept_hot(state.id, gone)
            gone += self.runs.sweep(batch, state)
        return gone


def count(conn: Connection, state: StreamState, now: int) -> int:
    """Ids of the station still in its window (the ``idsInWindow`` stat)."""
    cutoff = now - state.window_ms
    recent = conn.execute(
        select(func.count()).where(msg_ids.c.stream_id == state.id, msg_ids.c.stored_at > cutoff)
    ).scalar_one()
    return recent + idruns.count(conn, state.id, cutoff)


def purge(conn: Connection, stream_id: int) -> None:
    conn.execute(delete(msg_ids).where(msg_ids.c.stream_id == stream_id))
    idruns.purge(conn, stream_id)
