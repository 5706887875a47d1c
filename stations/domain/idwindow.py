"""The Msg-Id window: each id is remembered for the station's ``idempotencyWindowMs`` from the
moment its message was stored.

Whether an id is still a duplicate is always decided here, by ``stored_at + the window in force
now``, so a PATCH of the window applies to ids already stored. Where the ids are kept is the
store's business, and differs by engine:

- SQLite (one process): every recent id is in RAM and in time-ordered blocks, older ones in
  sorted runs behind Bloom filters (``stations.store.idruns``). A lookup of a new id costs a
  dict probe and a filter probe; no SQL unless a filter says "maybe".
- PostgreSQL (several processes share the ids): the durable ``msg_ids`` table
  (``stations.store.idtable``), written in the append's own transaction, with a bounded cache
  of the ids this process committed in front of it.
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import repeat
from typing import TYPE_CHECKING, Any

from stations.store import idtable
from stations.store import streams as stream_rows
from stations.store.idruns import IdRuns

if TYPE_CHECKING:
    from stations.records import StreamState
    from stations.store.writer import Batch

CACHE_SIZE = 50_000  # ids per station kept in RAM in front of msg_ids (PostgreSQL)
SWEEP_CHUNK = 5_000


class _Cache:
    """Two generations of plain dicts: O(1), and at most ``2 * half`` entries. Entries carry
    their ``stored_at``; expiry is decided by the reader, so nothing needs a timer.

    Not cachetools' TTLCache, which the design first named: its bookkeeping per entry (an
    expiry-ordered linked list, a timer read per insert) was 13% of the server's CPU on the
    produce path, filled once per id; here a commit's ids go in with one ``dict.update``, and
    a TTL would not even be right (the window in force *now* decides, PATCH may change it).
    A miss only costs a probe of ``msg_ids``, so the cache needs no exact recency order."""

    __slots__ = ("half", "new", "old")

    def __init__(self, size: int) -> None:
        self.half = max(1, size // 2)
        self.new: dict[str, tuple[int, int]] = {}
        self.old: dict[str, tuple[int, int]] = {}

    def get(self, key: str) -> tuple[int, int] | None:
        hit = self.new.get(key)
        return hit if hit is not None else self.old.get(key)

    def fill(self, stored: dict[str, int], at: int) -> None:
        """Ids committed at ``at``: ``{msg_id: position}``."""
        if len(self.new) + len(stored) > self.half:
            self.old, self.new = self.new, {}
        entries = zip(stored.values(), repeat(at), strict=False)  # repeat() has no end
        self.new.update(zip(stored, entries, strict=True))


def _pending(batch: Batch, sid: int, misses: list[str], found: dict[str, int]) -> list[str]:
    """Ids stored by an earlier request of this batch (not committed yet, so not in RAM) go
    into ``found``; returns the rest."""
    pending = batch.pending_ids.get(sid)
    if not pending or not misses:
        return misses
    rest = []
    for msg_id in misses:
        seq = pending.get(msg_id)
        if seq is None:
            rest.append(msg_id)
        else:
            found[msg_id] = seq
    return rest


class IdWindow:
    def __init__(self, cache_size: int = CACHE_SIZE, runs: IdRuns | None = None) -> None:
        self._cache_size = cache_size
        self._caches: dict[int, _Cache] = {}
        self.runs = runs  # SQLite: the id store; None: msg_ids (PostgreSQL)

    def lookup(self, batch: Batch, state: StreamState, msg_id: str) -> int | None:
        """The position of the message stored under ``msg_id`` if it is still in the window."""
        return self.lookup_many(batch, state, [msg_id]).get(msg_id)

    def lookup_many(self, batch: Batch, state: StreamState, wanted: list[str]) -> dict[str, int]:
        """``lookup`` for many ids at once: RAM first, then one store query for the rest."""
        if self.runs is not None:
            return self._lookup_runs(batch, state, self.runs, wanted)
        found: dict[str, int] = {}
        sid, now, window = state.id, batch.now, state.window_ms
        cache = self._caches.get(sid)
        misses = wanted
        if cache is not None:
            misses = []
            # Stored after this and within the window: a PATCH that shrank the window (in
            # any process) forgot the ids stored up to ``ids_forgotten_at`` for good.
            since = max(now - window, state.ids_forgotten_at or 0)
            new, old = cache.new, cache.old  # cache.get inlined: this runs once per id
            for msg_id in wanted:
                hit = new.get(msg_id) or old.get(msg_id)
                if hit is not None and hit[1] > since:
                    found[msg_id] = hit[0]
                else:
                    misses.append(msg_id)
        misses = _pending(batch, sid, misses, found)
        if not misses:
            return found
        expired: list[str] = []
        for msg_id, seq, stored_at in idtable.lookup(batch.conn, sid, misses):
            if now < stored_at + window:
                found[msg_id] = seq
            else:
                expired.append(msg_id)
        if expired:
            # Expired but not yet swept: the ids are free again.
            idtable.forget(batch.conn, sid, expired)
        return found

    @staticmethod
    def _lookup_runs(
        batch: Batch, state: StreamState, runs: IdRuns, wanted: list[str]
    ) -> dict[str, int]:
        found: dict[str, int] = {}
        sid, now, window = state.id, batch.now, state.window_ms
        hot = runs.hot_ids(sid)
        misses = wanted
        if hot:
            misses = []
            since = runs.hot_since(sid)
            # Usually the oldest hot id is still in the window, and so is every other one.
            all_in = since is not None and now < since + window
            # A grown window's PATCH earlier in this batch swept the blocks that had run out
            # (their ids leave RAM at the commit): measured by the grown window they seemed in.
            swept = sid in batch.swept_blocks
            for msg_id in wanted:
                seq = hot.get(msg_id)
                if (
                    seq is not None
                    and (all_in or now < runs.stored_at(sid, seq) + window)
                    and not (swept and runs.swept(batch, sid, seq))
                ):
                    found[msg_id] = seq
                else:
                    misses.append(msg_id)
        misses = _pending(batch, sid, misses, found)
        if misses:
            # Every committed recent id is in RAM: the rest can only be in the runs.
            for msg_id, (seq, stored_at) in runs.lookup(batch, state, misses).items():
                if now < stored_at + window:
                    found[msg_id] = seq
        return found

    def remember(self, batch: Batch, state: StreamState, stored: dict[str, int]) -> None:
        """Record the ids stored by this batch: ``{msg_id: position}``, in the order stored."""
        if not stored:
            return
        sid = state.id
        pending = batch.pending_ids.get(sid)
        if pending is None:
            pending = batch.pending_ids[sid] = {}
        pending.update(stored)
        if self.runs is not None:
            self.runs.stored(batch, sid, stored)
            return
        cache = self._caches.get(sid)
        if cache is None or cache.half * 2 != self._cache_size:
            cache = self._caches[sid] = _Cache(self._cache_size)
        batch.ids.extend(zip(repeat(sid), stored, stored.values()))
        # Only a committed id may answer a retry as a duplicate: the writer fills the cache
        # after the commit, with the time the batch stamped on its ids as it wrote them.
        batch.after_commit.append(lambda: cache.fill(stored, batch.ids_at))

    def forget_station(self, batch: Batch, stream_id: int) -> None:
        """The station is deleted in this batch: its ids leave RAM at once, and come back
        should the batch roll back (the station is still there then, and its ids in its
        window)."""
        cache = self._caches.pop(stream_id, None)
        # Ids stored earlier in this batch, not in RAM yet, go with it.
        pending = batch.pending_ids.pop(stream_id, None)
        restore_runs = self.runs.forget_station(stream_id) if self.runs is not None else None

        def restore() -> None:
            if cache is not None:
                self._caches[stream_id] = cache
            if pending is not None:
                batch.pending_ids[stream_id] = pending
            if restore_runs is not None:
                restore_runs()

        batch.undo.append(restore)

    def let_go_of_gone(self, batch: Batch) -> None:
        """Drop the caches of stations that no longer exist: deleted (or expired) through
        another process (PostgreSQL), this one never heard of it, and each cache holds up to
        ``cache_size`` ids. One statement, over the stations cached here only."""
        if not self._caches:
            return
        live = stream_rows.live_of(batch.conn, sorted(self._caches))
        for stream_id in [s for s in self._caches if s not in live]:
            del self._caches[stream_id]

    def forget_older(self, batch: Batch, state: StreamState, window_ms: int | None = None) -> None:
        """The station's window just shrank to ``state.window_ms`` (or grew from ``window_ms``):
        forget, for good, the ids older than that window (CONTRACT.md §4), so that growing the
        window later does not bring them back. Done in the PATCH's own transaction, whatever
        the sweep has reached."""
        cutoff = batch.now - (state.window_ms if window_ms is None else window_ms)
        self._caches.pop(state.id, None)  # cached ids would answer by the grown window
        # ... and so would other processes' caches (PostgreSQL): the row tells them. Only ever
        # raised: lowered, it let other processes trust again what an earlier grow told them
        # not to (an id that ran out, answered as a duplicate of its old offset).
        state.ids_forgotten_at = max(state.ids_forgotten_at or 0, cutoff)
        if self.runs is None:
            while idtable.sweep(batch.conn, state.id, cutoff, SWEEP_CHUNK) >= SWEEP_CHUNK:
                pass
            return
        # Blocks are one commit each: the sweep drops exactly those stored at or before the
        # cutoff (and their ids from RAM after the commit); runs that straddle it keep
        # younger ids, so their older entries go one by one.
        self.runs.sweep(batch, state, cutoff)
        self.runs.forget_before(batch, state.id, cutoff)

    def grown(self, batch: Batch, state: StreamState, before_ms: int) -> None:
        """The station's window just grew from ``before_ms``. Ids that window had let run out
        stay forgotten: the grown one would count them again where the sweep had not come
        round yet (a minute, for a window of four), and not where it had. And a cache holds
        expired ids too, one of which may have been stored again since through another
        process (PostgreSQL), which this cache never hears of: the grown window would revive
        the old offset. So no process trusts its cached ids stored until now; ``msg_ids``
        answers for them."""
        self.forget_older(batch, state, before_ms)
        state.ids_forgotten_at = max(state.ids_forgotten_at or 0, batch.now)

    def sweep(self, batch: Batch, state: StreamState) -> int:
        """Delete (a chunk of) the expired ids of a station; returns how many went."""
        if self.runs is not None:
            return self.runs.sweep(batch, state)
        if batch.row_locks:
            # Found due without a lock: another process may have grown the window since. The
            # window in force under the row's lock decides (a PATCH holds that lock).
            locked = batch.stream(state.name)
            if locked is None or locked.id != state.id or locked.deleted:
                return 0
            state = locked
        return idtable.sweep(batch.conn, state.id, batch.now - state.window_ms, SWEEP_CHUNK)


def counts(conn: Any, now: int, stream_ids: Collection[int] | None = None) -> dict[int, int]:
    """Ids still in their station's window (the ``idsInWindow`` stat), by station id: of every
    live station, or of ``stream_ids``; a station without any is left out."""
    return idtable.counts(conn, now, stream_ids)


def purge(conn: Any, stream_id: int) -> None:
    idtable.purge(conn, stream_id)
