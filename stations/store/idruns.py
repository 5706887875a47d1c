"""Message ids on SQLite: the recent ones in RAM and in time-ordered blocks, older ones in
sorted runs, so a window of millions of ids costs what a small one does.

Why: a table keyed by the ids themselves (``msg_ids``) is random-keyed. Every new id dirties a
leaf page of its own, written to the WAL at commit and again into the database file at
checkpoint: 4 KB, twice, per 40-byte id. So on SQLite the ids of one commit go into one
``id_blocks`` row per station (the ids joined by newlines, their positions packed as 64-bit
integers), appended in time order: a commit's ids cost about their own bytes on disk. The
*hot* ids, those in blocks, are all held in a dict per station (``hot_ids``), which answers
every lookup of a recent id without SQL; the blocks exist to rebuild it after a restart.

Once a station holds ``SPILL_AT`` hot ids, its oldest blocks (at least ``SPILL_CHUNK`` ids)
move in one transaction, sorted, into an immutable run, and they leave RAM. A run is stored as
``id_run_chunks`` rows of ``RUN_CHUNK`` consecutive ids each (joined by newlines, their
positions and times packed), keyed by the chunk's first id: a row per id cost SQLite about two
microseconds per id moved, a third of the server's time with millions of ids in the window. A
run is deleted whole once its newest id has left the window.

A lookup that the hot ids cannot answer asks each *epoch* (a Bloom filter over the ids of up to
``EPOCH_IDS`` consecutive runs, 1.8 bytes per id it has room for) and probes only the runs of
epochs that may hold the id, narrowed by each run's own smaller filter (1.2 bytes per id).
The newest ``WARM_RUNS`` runs of a station also stay in RAM as they were written (their ids
packed, about 50 bytes per id against ~200 for a hot id), so a retry of an id that has just
left the hot ids is answered without reading the database: a station taking 50,000 new ids a
second spills them about once a second, and a retry a few seconds late would otherwise cost a
random read of the database file.

Filters live in RAM under ``FILTER_BUDGET`` bytes per process; a run without one (after a
restart until a background thread has rebuilt it, or over the budget) is probed for every
lookup, which is slower but exact: a filter only ever decides which runs to read.

SQLite only: on PostgreSQL several processes share the ids, and one process's RAM cannot see
the ids another stored, so there the ids stay in ``msg_ids`` (``stations.store.idtable``).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

from rbloom import Bloom
from sqlalchemy import ColumnElement, Connection, Engine, delete, func, select

from stations.store.schema import id_blocks, id_run_chunks, id_runs, streams

if TYPE_CHECKING:
    from stations.records import StreamState
    from stations.store.writer import Batch

log = logging.getLogger("stations.store.idruns")

SPILL_AT = 100_000  # recent ids a station keeps in RAM and blocks (about 20 MB of RAM)
SPILL_CHUNK = 50_000  # ids moved per run
RUN_CHUNK = 64  # ids per id_run_chunks row: a lookup reads one such row per run it probes
# Ids per Bloom filter, at most. Every new id is looked up in every filter of its station (a
# cache miss or two each, ~0.3-0.9 us under load): 10M ids take three filters of up to 8M (0.4M,
# 3.6M, 8M: 21.6 MB) where filters of up to 4M took four of the same total size. (A filter's
# "maybe" is narrowed by the filters of its runs, more of them in a larger filter; that costs
# little since an id found in a warm run, as most retries are, skips them.)
EPOCH_IDS = 8_000_000
FALSE_POSITIVES = 0.001
# Each run also has a small filter of its own: when an epoch's filter says "maybe", only the
# runs whose own filter agrees are read (a false positive of an epoch read all of its runs,
# 160 of them per 8M ids). Small enough to stay in the CPU's cache; 1.2 bytes per id.
RUN_FALSE_POSITIVES = 0.01
FILTER_BUDGET = 64 * 1024 * 1024  # bytes of Bloom filters per process
WARM_RUNS = 4  # a station's newest runs kept in RAM (about 2.5 MB each)
WARM_BUDGET = 64 * 1024 * 1024  # bytes of warm runs per process
GROWTH = 8  # a station's next filter has room for this many times the ids in its runs


@dataclass
class Run:
    run: int
    ids: int
    oldest: int
    newest: int


@dataclass
class Epoch:
    bloom: Bloom
    capacity: int
    runs: set[int]
    ids: int = 0
    open: bool = True  # the writer may still add runs to it

    @property
    def nbytes(self) -> int:
        return self.bloom.size_in_bits // 8


@dataclass
class Warm:
    """A run's chunks as stored: each chunk's first id, its ids joined by newlines, their
    positions and store times packed (see ``_chunks``)."""

    first_ids: list[str]
    chunks: list[tuple[bytes, bytes, bytes]]
    nbytes: int

    def find(self, msg_id: str) -> tuple[int, int] | None:
        """``(seq, stored_at)`` of ``msg_id`` in this run, if it holds it."""
        k = bisect_right(self.first_ids, msg_id) - 1
        return _entry(*self.chunks[k], msg_id) if k >= 0 else None


@dataclass
class Block:
    """The ids one commit stored in one station, in the order they were stored."""

    seq0: int  # position of the first: the block's key
    stored_at: int
    ids: list[str]
    seqs: Sequence[int]  # ascending


@dataclass
class StationRuns:
    runs: dict[int, Run] = field(default_factory=dict)
    epochs: list[Epoch] = field(default_factory=list)
    unfiltered: set[int] = field(default_factory=set)  # runs no filter covers: always probed
    run_filters: dict[int, Bloom] = field(default_factory=dict)  # a run without: always read
    # Every id of the station's committed blocks: msg_id -> position (when it was stored is its
    # block's, see ``stored_at``: no tuple per id). An id stored again after it expired is in
    # two blocks; the dict holds the newer copy.
    hot_ids: dict[str, int] = field(default_factory=dict)
    blocks: deque[Block] = field(default_factory=deque)  # oldest first
    hot: int = 0  # ids in blocks (a re-stored id counts twice)
    last_run: int = 0  # run numbers are never reused while the process lives
    warm: dict[int, Warm] = field(default_factory=dict)  # the newest runs, oldest first


class IdRuns:
    def __init__(
        self, spill_at: int = SPILL_AT, chunk: int = SPILL_CHUNK, epoch_ids: int = EPOCH_IDS
    ) -> None:
        self.spill_at, self.chunk, self.epoch_ids = (
            spill_at,
            max(1, min(chunk, spill_at)),
            epoch_ids,
        )
        self._stations: dict[int, StationRuns] = {}
        self._lock = threading.Lock()  # the writer thread and the filter builder
        self._filter_bytes = 0
        self._warm_bytes = 0

    # -- start-up ----------------------------------------------------------------------------

    def load(self, engine: Engine) -> None:
        """Read the hot ids and the runs' table of contents; the runs' filters are rebuilt in
        the background."""
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT stream_id, run, ids, oldest, newest FROM id_runs ORDER BY stream_id, run"
            ).all()
            cursor = conn.connection.cursor()
            try:
                cursor.execute(
                    "SELECT stream_id, seq0, stored_at, msg_ids, seqs FROM id_blocks "
                    "ORDER BY stream_id, seq0"
                )
                for stream_id, seq0, stored_at, text, packed in cursor.fetchall():
                    seqs = array("q")
                    seqs.frombytes(packed)
                    block = Block(seq0, stored_at, text.decode().split("\n"), seqs)
                    self._add_block(self._stations.setdefault(stream_id, StationRuns()), block)
            finally:
                cursor.close()
        with self._lock:
            for stream_id, run, ids, oldest, newest in rows:
                station = self._stations.setdefault(stream_id, StationRuns())
                station.runs[run] = Run(run, ids, oldest, newest)
                station.last_run = max(station.last_run, run)
                station.unfiltered.add(run)
        if rows:
            threading.Thread(
                target=self._build, args=(engine,), name="stations-id-filters", daemon=True
            ).start()

    def _build(self, engine: Engine) -> None:
        try:
            with self._lock:
                # Each station's runs as they are now, taken under the lock; the filters
                # are built from the database outside it.
                todo = {sid: (s, sorted(s.unfiltered)) for sid, s in self._stations.items()}
                sizes = {
                    (sid, r.run): r.ids
                    for sid, s in self._stations.items()
                    for r in s.runs.values()
                }
            for stream_id, (station, runs) in todo.items():
                group: list[int] = []
                ids = 0
                for run in runs:
                    if group and ids + sizes.get((stream_id, run), 0) > self.epoch_ids:
                        self._build_epoch(engine, stream_id, station, group, ids)
                        group, ids = [], 0
                    group.append(run)
                    ids += sizes.get((stream_id, run), 0)
                if group:
                    self._build_epoch(engine, stream_id, station, group, ids)
        except Exception:  # the runs stay unfiltered: lookups stay exact, only slower
            log.exception("rebuilding the message-id filters failed")

    def _build_epoch(
        self, engine: Engine, stream_id: int, station: StationRuns, runs: list[int], size: int
    ) -> None:
        bloom = self._new_bloom(max(size, 1))
        if bloom is None:
            return
        ids = 0
        own: dict[int, Bloom] = {}
        for run in runs:
            # One short read per run, so no snapshot holds back checkpoints for long.
            with engine.connect() as conn:
                chunks = (
                    conn.exec_driver_sql(
                        "SELECT msg_ids FROM id_run_chunks WHERE stream_id = ? AND run = ?",
                        (stream_id, run),
                    )
                    .scalars()
                    .all()
                )
            found = [msg_id for packed in chunks for msg_id in packed.decode().split("\n")]
            bloom.update(found)
            ids += len(found)
            run_bloom = self._new_bloom(max(len(found), 1), RUN_FALSE_POSITIVES)
            if run_bloom is not None:
                run_bloom.update(found)
                own[run] = run_bloom
        with self._lock:
            # Only runs of the same station that are still there and still unfiltered.
            same = self._stations.get(stream_id) is station
            live = {r for r in runs if same and r in station.runs and r in station.unfiltered}
            self._filter_bytes -= sum(_nbytes(b) for r, b in own.items() if r not in live)
            if not live:
                self._filter_bytes -= _nbytes(bloom)
                return
            station.epochs.append(Epoch(bloom, max(size, 1), live, ids, open=False))
            station.run_filters.update((r, b) for r, b in own.items() if r in live)
            station.unfiltered -= live

    def _new_bloom(self, capacity: int, rate: float = FALSE_POSITIVES) -> Bloom | None:
        bloom = Bloom(capacity, rate)
        with self._lock:
            if self._filter_bytes + _nbytes(bloom) > FILTER_BUDGET:
                return None
            self._filter_bytes += _nbytes(bloom)
        return bloom

    # -- lookups -----------------------------------------------------------------------------

    def hot_ids(self, stream_id: int) -> dict[str, int]:
        """The station's committed recent ids: ``{msg_id: position}``. Read-only for the
        caller; the writer thread and its after-commit hooks are its only writers."""
        station = self._stations.get(stream_id)
        if station is None:
            station = self._stations[stream_id] = StationRuns()
        return station.hot_ids

    def hot_since(self, stream_id: int) -> int | None:
        """When the station's oldest hot id was stored (None: it has none): every hot id is at
        least that young, so one comparison tells whether all are still in the window."""
        station = self._stations.get(stream_id)
        return station.blocks[0].stored_at if station is not None and station.blocks else None

    def stored_at(self, stream_id: int, seq: int) -> int:
        """When the hot id at position ``seq`` was stored: its block's time."""
        return self._block_of(stream_id, seq).stored_at

    def swept(self, batch: Batch, stream_id: int, seq: int) -> bool:
        """Whether the hot id at position ``seq`` is in a block a sweep of this batch deleted:
        it is in RAM until the commit, but out of the window for good (a window grown in the
        same batch must not bring it back)."""
        through = batch.swept_blocks.get(stream_id)
        return through is not None and self._block_of(stream_id, seq).seq0 <= through

    def _block_of(self, stream_id: int, seq: int) -> Block:
        blocks = self._stations[stream_id].blocks
        return blocks[bisect_right(blocks, seq, key=lambda b: b.seq0) - 1]

    def lookup(
        self, batch: Batch, state: StreamState, wanted: list[str]
    ) -> dict[str, tuple[int, int]]:
        """``{msg_id: (seq, stored_at)}`` for the wanted ids found in the station's runs (the
        newest copy of each; whether it is still in the window is the caller's decision)."""
        with self._lock:
            station = self._stations.get(state.id)
            if station is None or not station.runs:
                return {}
            # The newest runs are in RAM (``warm``, newest first): an id found there needs no
            # other run, as every other run is older (the warm runs are always the station's
            # newest) and the newest copy is the one that counts.
            warm = [w for _, w in sorted(station.warm.items(), reverse=True)]
            found: dict[str, tuple[int, int]] = {}
            searched: set[str] = set()

            def in_warm(msg_id: str) -> bool:
                if msg_id not in searched:
                    searched.add(msg_id)
                    for run in warm:
                        if (hit := run.find(msg_id)) is not None:
                            found[msg_id] = hit
                            break
                return msg_id in found

            # (run, id) pairs to read from the database: an epoch's "maybe" narrowed by its
            # runs' own filters; runs without a filter are read for every id.
            cold: list[tuple[int, str]] = []
            if station.unfiltered:
                everywhere = sorted(station.unfiltered - station.warm.keys())
                cold += [(run, m) for m in wanted if not in_warm(m) for run in everywhere]
            own = station.run_filters
            for epoch in station.epochs:
                contains = epoch.bloom.__contains__
                for msg_id in [msg_id for msg_id in wanted if contains(msg_id)]:
                    if in_warm(msg_id):
                        continue
                    cold += [
                        (run, msg_id)
                        for run in epoch.runs
                        if run not in station.warm
                        and ((bloom := own.get(run)) is None or msg_id in bloom)
                    ]
        if cold:
            cursor = batch.conn.connection.cursor()
            try:
                for msg_id, hit in _find(cursor, state.id, cold).items():
                    _newest(found, msg_id, hit)
            finally:
                cursor.close()
        return found

    # -- storing and spilling -----------------------------------------------------------------

    def stored(self, batch: Batch, stream_id: int, stored: dict[str, int]) -> None:
        """New ``{msg_id: position}`` go into this batch's block of the station."""
        draft = batch.id_blocks.get(stream_id)
        if draft is None:
            draft = batch.id_blocks[stream_id] = {}
            batch.block_writer = self.write_blocks
            batch.before_commit[("spill ids", stream_id)] = lambda b: self._spill(b, stream_id)
        draft.update(stored)

    def write_blocks(self, batch: Batch) -> None:
        """Write the batch's blocks (one row per station); RAM learns them after the commit."""
        rows = []
        for stream_id, draft in batch.id_blocks.items():
            ids, seqs = list(draft), list(draft.values())
            rows.append(
                (
                    stream_id,
                    seqs[0],
                    batch.now,
                    len(seqs),
                    "\n".join(ids).encode(),
                    array("q", seqs).tobytes(),
                )
            )
            block = Block(seqs[0], batch.now, ids, seqs)
            station = self._stations.setdefault(stream_id, StationRuns())
            batch.after_commit.append(partial(self._add_block, station, block))
        batch.id_blocks = {}
        cursor = batch.conn.connection.cursor()
        try:
            cursor.executemany(
                "INSERT INTO id_blocks (stream_id, seq0, stored_at, ids, msg_ids, seqs) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        finally:
            cursor.close()

    @staticmethod
    def _add_block(station: StationRuns, block: Block) -> None:
        station.hot_ids.update(zip(block.ids, block.seqs, strict=True))
        station.blocks.append(block)
        station.hot += len(block.ids)

    def _spill(self, batch: Batch, stream_id: int) -> None:
        # The batch's own block is written but joins RAM after the commit: it stays hot.
        station = self._stations.get(stream_id)
        if station is None or station.hot < self.spill_at or not station.blocks:
            return
        # In a savepoint: should moving fail, the ids stay where they are and the batch's
        # appends still commit. What the move queued for after the commit (publishing a run
        # the database no longer holds, dropping the blocks it came from) and did in RAM goes
        # with it: else the ids were in neither place once the run left RAM.
        hooks, undone = len(batch.after_commit), len(batch.undo)
        try:
            with batch.conn.begin_nested():
                self._move(batch, stream_id)
        except Exception:
            del batch.after_commit[hooks:]
            batch.undo_since(undone)
            log.exception("moving message ids into a run failed; they stay in id_blocks")

    def _move(self, batch: Batch, stream_id: int) -> None:
        """Move the oldest committed blocks, down to ``spill_at - chunk`` hot ids left (at
        least ``chunk`` ids), into a new run."""
        station = self._stations[stream_id]
        target = max(self.chunk, station.hot - (self.spill_at - self.chunk))
        # Blocks a sweep of this batch deleted are still in RAM until the commit: their ids
        # left the window for good (a shrunk window must not bring them back).
        swept = batch.swept_blocks.get(stream_id)
        moving: list[Block] = []
        n = 0
        for block in station.blocks:
            if n >= target:
                break
            if swept is not None and block.seq0 <= swept:
                continue
            moving.append(block)
            n += len(block.ids)
        if not moving:
            return
        ids, seqs, stored = _sorted_newest(moving)
        last = batch.conn.exec_driver_sql(
            "SELECT max(run) FROM id_runs WHERE stream_id = ?", (stream_id,)
        ).scalar()
        with self._lock:
            last = max(last or 0, station.last_run)
        ats = [b.stored_at for b in moving]
        run = Run(last + 1, len(ids), min(ats), max(ats))
        chunks = _chunks(ids, seqs, stored)
        cursor = batch.conn.connection.cursor()
        try:
            cursor.executemany(
                "INSERT INTO id_run_chunks (stream_id, run, first_id, ids, msg_ids, seqs, "
                "stored_ats) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(stream_id, run.run, *chunk) for chunk in chunks],
            )
            cursor.execute(
                "INSERT INTO id_runs (stream_id, run, ids, oldest, newest) VALUES (?, ?, ?, ?, ?)",
                (stream_id, run.run, run.ids, run.oldest, run.newest),
            )
            cursor.execute(
                "DELETE FROM id_blocks WHERE stream_id = ? AND seq0 <= ?",
                (stream_id, moving[-1].seq0),
            )
        finally:
            cursor.close()
        # The batch's lookups are over; the next batch's must see the run, not the blocks.
        batch.after_commit.append(self._prepare_run(batch, stream_id, run, ids, chunks))
        batch.after_commit.append(lambda: self._drop_blocks(station, moving))

    @staticmethod
    def _drop_blocks(station: StationRuns, gone: list[Block]) -> None:
        """The oldest blocks left RAM (moved to a run, or expired; a sweep and a move in one
        batch may both name a block)."""
        hot, leaving = station.hot_ids, {id(block) for block in gone}
        while station.blocks and id(station.blocks[0]) in leaving:
            block = station.blocks.popleft()
            station.hot -= len(block.ids)
            if list(map(hot.get, block.ids)) == list(block.seqs):
                # The usual case, every id's copy in RAM this block's: no loop in Python.
                deque(map(hot.__delitem__, block.ids), maxlen=0)
                continue
            for msg_id, seq in zip(block.ids, block.seqs, strict=True):
                if hot.get(msg_id) == seq:
                    del hot[msg_id]

    def _prepare_run(
        self,
        batch: Batch,
        stream_id: int,
        run: Run,
        ids: list[str],
        chunks: list[tuple[str, int, bytes, bytes, bytes]],
    ) -> Callable[[], None]:
        """Build a new run's filters and RAM copy on the writer's thread, before the commit,
        and return what publishes them after it. Built after the commit, on the event loop,
        they held it up 50-90 ms per run of 50,000 ids on a station of millions (adding them to
        a filter of 14 MB sets bits all over it), and the writer waited for the loop.

        The ids go into the station's open filter now: should the transaction roll back, or
        the run go elsewhere, the extra bits only make that filter say "maybe" where it need
        not, and a lookup reads the run it names; until the run is published its ids are hot
        (``_drop_blocks`` runs after ``publish``), so no id is ever in neither place."""
        own = self._new_bloom(max(len(ids), 1), RUN_FALSE_POSITIVES)
        if own is not None:
            own.update(ids)
        warm = Warm(
            [c[0] for c in chunks],
            [(c[2], c[3], c[4]) for c in chunks],
            sum(len(c[2]) + len(c[3]) + len(c[4]) for c in chunks),
        )
        with self._lock:
            station = self._stations.setdefault(stream_id, StationRuns())
            current = next((e for e in reversed(station.epochs) if e.open), None)
            fits = current is not None and current.ids + run.ids <= current.capacity
            if fits:
                assert current is not None
                current.bloom.update(ids)
            # Filters grow with the station: a small one does not hold megabytes of bits. They
            # grow eightfold, not twofold: every lookup of a new id probes every filter of the
            # station (a few cache misses each), so fewer and larger filters cost less (see
            # EPOCH_IDS).
            in_runs = sum(r.ids for r in station.runs.values()) + run.ids
        new: Epoch | None = None
        if not fits:
            capacity = min(self.epoch_ids, max(4 * self.chunk, GROWTH * in_runs))
            bloom = self._new_bloom(capacity)
            if bloom is not None:
                bloom.update(ids)
                new = Epoch(bloom, capacity, {run.run}, run.ids)

        def unaccount() -> None:  # rolled back: the filters built go
            with self._lock:
                self._filter_bytes -= sum(
                    _nbytes(b) for b in (own, new.bloom if new else None) if b is not None
                )

        batch.undo.append(unaccount)

        def publish() -> None:
            with self._lock:
                station = self._stations.setdefault(stream_id, StationRuns())
                if own is not None:
                    station.run_filters[run.run] = own
                self._warm_up(station, run.run, warm)
                station.runs[run.run] = run
                station.last_run = max(station.last_run, run.run)
                if (
                    fits
                    and current is not None
                    and current.open
                    and any(e is current for e in station.epochs)
                    and current.ids + run.ids <= current.capacity
                ):
                    current.runs.add(run.run)
                    current.ids += run.ids
                    return
                if new is None:  # over the filters' budget (or the station changed meanwhile)
                    station.unfiltered.add(run.run)
                    return
                if current is not None:
                    current.open = False
                station.epochs.append(new)

        return publish

    # -- expiry ------------------------------------------------------------------------------

    def sweep(self, batch: Batch, state: StreamState, cutoff: int | None = None) -> int:
        """Delete the station's blocks and runs whose newest id has left the window (or was
        stored at or before ``cutoff``)."""
        if cutoff is None:
            cutoff = batch.now - state.window_ms
        station = self._stations.get(state.id)
        hot_gone = 0
        if station is not None and station.blocks and station.blocks[0].stored_at <= cutoff:
            expired: list[Block] = []
            for block in station.blocks:
                if block.stored_at > cutoff:
                    break
                expired.append(block)
                hot_gone += len(block.ids)
            batch.conn.exec_driver_sql(
                "DELETE FROM id_blocks WHERE stream_id = ? AND seq0 <= ?",
                (state.id, expired[-1].seq0),
            )
            swept = batch.swept_blocks
            swept[state.id] = max(swept.get(state.id, expired[-1].seq0), expired[-1].seq0)
            batch.after_commit.append(lambda: self._drop_blocks(station, expired))
        return hot_gone + self._sweep_runs(batch, state, cutoff)

    def _sweep_runs(self, batch: Batch, state: StreamState, cutoff: int) -> int:
        with self._lock:
            station = self._stations.get(state.id)
            gone = [r for r in station.runs.values() if r.newest <= cutoff] if station else []
        if not gone:
            return 0
        for run in gone:
            batch.conn.execute(
                delete(id_run_chunks).where(
                    id_run_chunks.c.stream_id == state.id, id_run_chunks.c.run == run.run
                )
            )
            batch.conn.execute(
                delete(id_runs).where(id_runs.c.stream_id == state.id, id_runs.c.run == run.run)
            )
        batch.after_commit.append(lambda: self._drop_runs(state.id, {r.run for r in gone}))
        return sum(r.ids for r in gone)

    def _warm_up(self, station: StationRuns, run: int, warm: Warm) -> None:
        """Keep the new ``run`` in RAM, the station's oldest warm run leaving (under the lock).
        The warm runs are always the station's newest (``lookup`` relies on it): if the new
        one does not fit in the budget, none of the station's stays."""
        while station.warm and (
            len(station.warm) >= WARM_RUNS or self._warm_bytes + warm.nbytes > WARM_BUDGET
        ):
            self._cool(station, min(station.warm))
        if self._warm_bytes + warm.nbytes <= WARM_BUDGET:
            station.warm[run] = warm
            self._warm_bytes += warm.nbytes

    def _cool(self, station: StationRuns, run: int) -> None:
        gone = station.warm.pop(run, None)
        if gone is not None:
            self._warm_bytes -= gone.nbytes

    def cool(self, stream_id: int) -> None:
        """Drop the station's runs from RAM: their entries are about to change in the database
        (``forget_before``), and the database's copy is the one that counts."""
        with self._lock:
            station = self._stations.get(stream_id)
            if station is not None:
                for run in list(station.warm):
                    self._cool(station, run)

    def forget_before(self, batch: Batch, stream_id: int, cutoff: int) -> None:
        """A shrunk window forgets the station's run entries stored at or before ``cutoff``
        for good (``IdWindow.forget_older``); RAM follows the rows once they are committed."""
        self.cool(stream_id)
        left = forget_before(batch.conn, stream_id, cutoff)

        def follow() -> None:
            with self._lock:
                station = self._stations.get(stream_id)
                for run, (n, oldest, newest) in left.items():
                    known = station.runs.get(run) if station is not None else None
                    if known is not None and n:
                        known.ids, known.oldest, known.newest = n, oldest, newest
            self._drop_runs(stream_id, {run for run, (n, _, _) in left.items() if not n})

        batch.after_commit.append(follow)

    def _drop_runs(self, stream_id: int, runs: set[int]) -> None:
        with self._lock:
            station = self._stations.get(stream_id)
            if station is None:
                return
            for run in runs:
                self._cool(station, run)
                station.runs.pop(run, None)
                own = station.run_filters.pop(run, None)
                if own is not None:
                    self._filter_bytes -= _nbytes(own)
            station.unfiltered -= runs
            for epoch in list(station.epochs):
                epoch.runs -= runs
                if not epoch.runs and not epoch.open:
                    station.epochs.remove(epoch)
                    self._filter_bytes -= epoch.nbytes

    def forget_station(self, stream_id: int) -> Callable[[], None]:
        """Drop the station's ids from RAM; returns what puts them back (its deletion rolled
        back)."""
        with self._lock:
            station = self._stations.pop(stream_id, None)
            if station is not None:
                self._account(station, -1)

        def restore() -> None:
            if station is None:
                return
            with self._lock:
                # A station created later in the rolled-back batch (given the same id) left
                # only an empty entry: what it stored joins RAM after a commit.
                current = self._stations.get(stream_id)
                if current is not None:
                    self._account(current, -1)
                self._stations[stream_id] = station
                self._account(station, 1)

        return restore

    def _account(self, station: StationRuns, sign: int) -> None:
        self._warm_bytes += sign * sum(w.nbytes for w in station.warm.values())
        self._filter_bytes += sign * sum(e.nbytes for e in station.epochs)
        self._filter_bytes += sign * sum(map(_nbytes, station.run_filters.values()))


def _nbytes(bloom: Bloom) -> int:
    return int(bloom.size_in_bits // 8)


def _sorted_newest(blocks: list[Block]) -> tuple[list[str], array[int], array[int]]:
    """The blocks' ids sorted, each with its position and store time; of an id stored again
    after it expired (in two blocks, oldest first) only the newest copy."""
    ids: list[str] = []
    seqs: array[int] = array("q")
    ats: array[int] = array("q")
    for block in blocks:
        ids += block.ids
        seqs.extend(block.seqs)
        ats.extend(repeat(block.stored_at, len(block.ids)))
    # Each id's index, the newest copy's (blocks go oldest first, a later key wins), then the
    # ids sorted as strings in C: a quarter less time than sorting indexes by id and looking
    # for repeats beside them (a move of 50,000 ids spent most of its time here).
    index = dict(zip(ids, range(len(ids)), strict=True))
    ordered = sorted(index)
    order = list(map(index.__getitem__, ordered))
    return (
        ordered,
        array("q", map(seqs.__getitem__, order)),
        array("q", map(ats.__getitem__, order)),
    )


def _chunks(
    ids: list[str], seqs: array[int], ats: array[int]
) -> list[tuple[str, int, bytes, bytes, bytes]]:
    """``id_run_chunks`` rows' values after (stream_id, run): sorted ``ids`` and their
    positions and store times, ``RUN_CHUNK`` at a time."""
    seq_bytes, at_bytes = seqs.tobytes(), ats.tobytes()
    rows = []
    for k in range(0, len(ids), RUN_CHUNK):
        some = ids[k : k + RUN_CHUNK]
        end = 8 * (k + len(some))
        rows.append(
            (
                some[0],
                len(some),
                "\n".join(some).encode(),
                seq_bytes[8 * k : end],
                at_bytes[8 * k : end],
            )
        )
    return rows


def _unpack(packed: bytes, seqs: bytes, ats: bytes) -> tuple[list[str], array[int], array[int]]:
    s, a = array("q"), array("q")
    s.frombytes(seqs)
    a.frombytes(ats)
    return packed.decode().split("\n"), s, a


# For each (run, id) pair of a JSON array, the one chunk of the run that may hold the id: the
# last whose first id is not after it. One statement for all the ids of a lookup (SQLite seeks
# once per pair); the rows come back to be searched as bytes.
_PROBE = (
    "SELECT p.key, c.msg_ids, c.seqs, c.stored_ats FROM json_each(?) AS p "
    "JOIN id_run_chunks AS c ON c.rowid = (SELECT rowid FROM id_run_chunks "
    "WHERE stream_id = ? AND run = json_extract(p.value, '$[0]') "
    "AND first_id <= json_extract(p.value, '$[1]') ORDER BY first_id DESC LIMIT 1)"
)


def _find(cursor: Any, stream_id: int, pairs: list[tuple[int, str]]) -> dict[str, tuple[int, int]]:
    """``{msg_id: (seq, stored_at)}``: the newest copy of each id found in its listed runs."""
    cursor.execute(_PROBE, (json.dumps(pairs), stream_id))
    found: dict[str, tuple[int, int]] = {}
    for key, packed, seqs, ats in cursor.fetchall():
        msg_id = pairs[key][1]
        if (hit := _entry(packed, seqs, ats, msg_id)) is not None:
            _newest(found, msg_id, hit)
    return found


def _entry(packed: bytes, seqs: bytes, ats: bytes, msg_id: str) -> tuple[int, int] | None:
    """``(seq, stored_at)`` of ``msg_id`` in one stored chunk, if it holds it."""
    k = _index(packed, msg_id.encode())
    if k is None:
        return None
    return (
        int.from_bytes(seqs[8 * k : 8 * k + 8], sys.byteorder, signed=True),
        int.from_bytes(ats[8 * k : 8 * k + 8], sys.byteorder, signed=True),
    )


def _newest(found: dict[str, tuple[int, int]], msg_id: str, hit: tuple[int, int]) -> None:
    """Keep the newest copy of an id (one stored again after it expired is in two runs)."""
    if msg_id not in found or hit[1] > found[msg_id][1]:
        found[msg_id] = hit


def _index(packed: bytes, needle: bytes) -> int | None:
    """Where ``needle`` is among the newline-separated ids of ``packed`` (searched as bytes,
    not split: a probe reads a whole chunk to find one id)."""
    if packed == needle or packed.startswith(needle + b"\n"):
        return 0
    at = packed.find(b"\n" + needle + b"\n")
    if at < 0:
        if not packed.endswith(b"\n" + needle):
            return None
        at = len(packed) - len(needle) - 1
    return packed.count(b"\n", 0, at + 1)


def forget_before(conn: Connection, stream_id: int, cutoff: int) -> dict[int, list[int]]:
    """Delete the station's run entries stored at or before ``cutoff``: a shrunk window
    forgets them for good (``IdWindow.forget_older``). Chunks holding some are written again
    with the rest, and each run's row keeps counting what is left (``count`` takes a run younger
    than its cutoff at its row's word: a window grown again must not count forgotten ids)."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(
            "SELECT c.run, c.first_id, c.msg_ids, c.seqs, c.stored_ats FROM id_run_chunks c "
            "JOIN id_runs r ON r.stream_id = c.stream_id AND r.run = c.run "
            "WHERE c.stream_id = ? AND r.oldest <= ?",
            (stream_id, cutoff),
        )
        chunks = cursor.fetchall()
        left: dict[int, list[int]] = {}  # run -> [ids kept, oldest kept, newest kept]
        for run, first_id, packed, seqs, ats in chunks:
            ids, s, a = _unpack(packed, seqs, ats)
            keep = [k for k, at in enumerate(a) if at > cutoff]
            figures = left.setdefault(run, [0, 2**63 - 1, -(2**63)])
            if keep:
                kept_ats = [a[k] for k in keep]
                figures[0] += len(keep)
                figures[1] = min(figures[1], *kept_ats)
                figures[2] = max(figures[2], *kept_ats)
            if len(keep) == len(ids):
                continue
            cursor.execute(
                "DELETE FROM id_run_chunks WHERE stream_id = ? AND run = ? AND first_id = ?",
                (stream_id, run, first_id),
            )
            if keep:
                rest = [ids[k] for k in keep]
                cursor.execute(
                    "INSERT INTO id_run_chunks (stream_id, run, first_id, ids, msg_ids, seqs, "
                    "stored_ats) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        stream_id,
                        run,
                        *_chunks(
                            rest,
                            array("q", (s[k] for k in keep)),
                            array("q", (a[k] for k in keep)),
                        )[0],
                    ),
                )
        for run, (n, oldest, newest) in left.items():
            if n:
                cursor.execute(
                    "UPDATE id_runs SET ids = ?, oldest = ?, newest = ? "
                    "WHERE stream_id = ? AND run = ?",
                    (n, oldest, newest, stream_id, run),
                )
            else:
                cursor.execute(
                    "DELETE FROM id_runs WHERE stream_id = ? AND run = ?", (stream_id, run)
                )
    finally:
        cursor.close()
    return left


def purge(conn: Connection, stream_id: int) -> None:
    for table in (id_blocks, id_run_chunks, id_runs):
        conn.execute(delete(table).where(table.c.stream_id == stream_id))


def counts(conn: Connection, now: int, stream_ids: Collection[int] | None = None) -> dict[int, int]:
    """Ids in blocks and runs stored within their station's window (``id_window_ms``), by
    station: of every live station, or of ``stream_ids``. Three statements however many
    stations there are (one each per station made a list of thousands take seconds)."""
    cutoff = now - streams.c.id_window_ms
    live: list[ColumnElement[bool]] = [streams.c.deleted.is_(False)]
    if stream_ids is not None:
        live.append(streams.c.id.in_(list(stream_ids)))
    out: dict[int, int] = {}
    hot = (
        select(id_blocks.c.stream_id, func.sum(id_blocks.c.ids))
        .join(streams, streams.c.id == id_blocks.c.stream_id)
        .where(*live, id_blocks.c.stored_at > cutoff)
        .group_by(id_blocks.c.stream_id)
    )
    whole = (
        select(id_runs.c.stream_id, func.sum(id_runs.c.ids))
        .join(streams, streams.c.id == id_runs.c.stream_id)
        .where(*live, id_runs.c.oldest > cutoff)
        .group_by(id_runs.c.stream_id)
    )
    for query in (hot, whole):
        for sid, n in conn.execute(query):
            out[sid] = out.get(sid, 0) + int(n)
    # Runs partly out of the window: count what is left in their chunks.
    partly = (
        select(id_run_chunks.c.stream_id, cutoff, id_run_chunks.c.stored_ats)
        .join(
            id_runs,
            (id_runs.c.stream_id == id_run_chunks.c.stream_id)
            & (id_runs.c.run == id_run_chunks.c.run),
        )
        .join(streams, streams.c.id == id_runs.c.stream_id)
        .where(*live, id_runs.c.newest > cutoff, id_runs.c.oldest <= cutoff)
    )
    for sid, until, packed in conn.execute(partly):
        ats = array("q")
        ats.frombytes(packed)
        out[sid] = out.get(sid, 0) + sum(1 for at in ats if at > until)
    return out
