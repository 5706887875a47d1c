"""Older message ids in sorted runs, so a window of millions of ids costs what a small one does.

Why: ``msg_ids`` is keyed by the ids themselves, which are random. Once its index outgrows the
page cache, every new id dirties a leaf page of its own, which is written to the WAL at commit
and again into the database file at checkpoint: 4 KB, twice, per 40-byte id. So ``msg_ids``
only keeps a station's recent ids (up to ``SPILL_AT``). Beyond that, the oldest ``SPILL_CHUNK``
of them move in one transaction, sorted, into an immutable run: a stretch of ``id_run_entries``
written sequentially. A run is deleted whole once its newest id has left the window.

A lookup that ``msg_ids`` cannot answer asks each *epoch* (a Bloom filter over the ids of up to
``EPOCH_IDS`` consecutive runs, 1.8 bytes per id it has room for) and probes only the runs of epochs that
may hold the id. Filters live in RAM under ``FILTER_BUDGET`` bytes per process; a run without
one (after a restart until a background thread has rebuilt it, or over the budget) is probed
for every lookup, which is slower but exact: a filter only ever decides which runs to read.

SQLite only: on PostgreSQL several processes share the ids, and one process's filters cannot
see the runs another wrote, so there the ids stay in ``msg_ids``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rbloom import Bloom
from sqlalchemy import Connection, Engine, delete, func, select

from stations.store.schema import id_run_entries, id_runs

if TYPE_CHECKING:
    from stations.domain.streams import StreamState
    from stations.store.writer import Batch

log = logging.getLogger("stations.store.idruns")

SPILL_AT = 100_000  # recent ids a station keeps in msg_ids (about 8 MB of its index)
SPILL_CHUNK = 50_000  # ids moved per run
EPOCH_IDS = 4_000_000  # ids per Bloom filter, at most
FALSE_POSITIVES = 0.001
FILTER_BUDGET = 64 * 1024 * 1024  # bytes of Bloom filters per process


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
class StationRuns:
    runs: dict[int, Run] = field(default_factory=dict)
    epochs: list[Epoch] = field(default_factory=list)
    unfiltered: set[int] = field(default_factory=set)  # runs no filter covers: always probed
    hot: int | None = None  # ids in msg_ids, once counted (approximate: it only triggers spills)
    last_run: int = 0  # run numbers are never reused while the process lives


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

    # -- start-up ----------------------------------------------------------------------------

    def load(self, engine: Engine) -> None:
        """Read the runs' table of contents; their filters are rebuilt in the background."""
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT stream_id, run, ids, oldest, newest FROM id_runs ORDER BY stream_id, run"
            ).all()
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
                todo = {sid: sorted(s.unfiltered) for sid, s in self._stations.items()}
                sizes = {
                    (sid, r.run): r.ids
                    for sid, s in self._stations.items()
                    for r in s.runs.values()
                }
            for stream_id, runs in todo.items():
                group: list[int] = []
                ids = 0
                for run in runs:
                    if group and ids + sizes.get((stream_id, run), 0) > self.epoch_ids:
                        self._build_epoch(engine, stream_id, group, ids)
                        group, ids = [], 0
                    group.append(run)
                    ids += sizes.get((stream_id, run), 0)
                if group:
                    self._build_epoch(engine, stream_id, group, ids)
        except Exception:  # the runs stay unfiltered: lookups stay exact, only slower
            log.exception("rebuilding the message-id filters failed")

    def _build_epoch(self, engine: Engine, stream_id: int, runs: list[int], size: int) -> None:
        bloom = self._new_bloom(max(size, 1))
        if bloom is None:
            return
        ids = 0
        for run in runs:
            # One short read per run, so no snapshot holds back checkpoints for long.
            with engine.connect() as conn:
                found = (
                    conn.exec_driver_sql(
                        "SELECT msg_id FROM id_run_entries WHERE stream_id = ? AND run = ?",
                        (stream_id, run),
                    )
                    .scalars()
                    .all()
                )
            bloom.update(found)
            ids += len(found)
        with self._lock:
            station = self._stations.get(stream_id)
            live = {r for r in runs if station is not None and r in station.runs}
            if station is None or not live:
                self._filter_bytes -= bloom.size_in_bits // 8
                return
            station.epochs.append(Epoch(bloom, max(size, 1), live, ids, open=False))
            station.unfiltered -= live

    def _new_bloom(self, capacity: int) -> Bloom | None:
        bloom = Bloom(capacity, FALSE_POSITIVES)
        with self._lock:
            if self._filter_bytes + bloom.size_in_bits // 8 > FILTER_BUDGET:
                return None
            self._filter_bytes += bloom.size_in_bits // 8
        return bloom

    # -- lookups -----------------------------------------------------------------------------

    def lookup(
        self, batch: Batch, state: StreamState, wanted: list[str]
    ) -> dict[str, tuple[int, int]]:
        """``{msg_id: (seq, stored_at)}`` for the wanted ids found in the station's runs (the
        newest copy of each; whether it is still in the window is the caller's decision)."""
        with self._lock:
            station = self._stations.get(state.id)
            if station is None or not station.runs:
                return {}
            # (runs, ids that may be in them): each epoch's ids against only its own runs.
            probes: list[tuple[list[int], list[str]]] = []
            if station.unfiltered:
                probes.append((sorted(station.unfiltered), wanted))
            for epoch in station.epochs:
                contains = epoch.bloom.__contains__
                maybe = [msg_id for msg_id in wanted if contains(msg_id)]
                if maybe:
                    probes.append((sorted(epoch.runs), maybe))
        found: dict[str, tuple[int, int]] = {}
        for runs, ids in probes:
            # Within SQLite's bound-parameter limit: at most 400 runs x 400 ids per query.
            for r in range(0, len(runs), 400):
                some_runs = runs[r : r + 400]
                for i in range(0, len(ids), 400):
                    some_ids = ids[i : i + 400]
                    rows = batch.conn.exec_driver_sql(
                        "SELECT msg_id, seq, stored_at FROM id_run_entries WHERE stream_id = ? "
                        f"AND run IN ({', '.join('?' * len(some_runs))}) "
                        f"AND msg_id IN ({', '.join('?' * len(some_ids))})",
                        (state.id, *some_runs, *some_ids),
                    )
                    for msg_id, seq, stored_at in rows:
                        if msg_id not in found or stored_at > found[msg_id][1]:
                            found[msg_id] = (seq, stored_at)
        return found

    # -- spilling ----------------------------------------------------------------------------

    def stored(self, batch: Batch, state: StreamState, n: int) -> None:
        """``n`` new ids go into msg_ids with this batch; move older ones out when it is full."""
        with self._lock:
            station = self._stations.setdefault(state.id, StationRuns())
            if station.hot is None:
                station.hot = batch.conn.exec_driver_sql(
                    "SELECT count(*) FROM msg_ids WHERE stream_id = ?", (state.id,)
                ).scalar_one()
            station.hot += n
            if station.hot < self.spill_at:
                return
        # At the end of the batch, after its own ids are written: a run moved earlier would be
        # invisible to the batch's later lookups until its filter exists.
        stream_id = state.id
        batch.before_commit[("spill ids", stream_id)] = lambda b: self._spill(b, stream_id)

    def _spill(self, batch: Batch, stream_id: int) -> None:
        # In a savepoint: should moving fail, the ids stay where they are and the batch's
        # appends still commit.
        try:
            with batch.conn.begin_nested():
                self._move(batch, stream_id)
        except Exception:
            log.exception("moving message ids into a run failed; they stay in msg_ids")

    def _move(self, batch: Batch, stream_id: int) -> None:
        """Move the oldest ids of msg_ids, down to ``spill_at - chunk`` left, into a new run."""
        conn = batch.conn
        with self._lock:
            hot = self._stations[stream_id].hot or 0
        move = max(self.chunk, hot - (self.spill_at - self.chunk))
        cutoff = conn.exec_driver_sql(
            "SELECT stored_at FROM msg_ids WHERE stream_id = ? ORDER BY stored_at LIMIT 1 OFFSET ?",
            (stream_id, move - 1),
        ).scalar()
        if cutoff is None:  # fewer ids than counted (swept meanwhile): count again
            recount = conn.exec_driver_sql(
                "SELECT count(*) FROM msg_ids WHERE stream_id = ?", (stream_id,)
            ).scalar_one()
            with self._lock:
                self._stations[stream_id].hot = recount
            return
        rows = conn.exec_driver_sql(
            "SELECT msg_id, seq, stored_at FROM msg_ids WHERE stream_id = ? AND stored_at <= ? "
            "ORDER BY msg_id",
            (stream_id, cutoff),
        ).all()
        last = conn.exec_driver_sql(
            "SELECT max(run) FROM id_runs WHERE stream_id = ?", (stream_id,)
        ).scalar()
        with self._lock:
            last = max(last or 0, self._stations[stream_id].last_run)
        run = Run(last + 1, len(rows), min(r[2] for r in rows), max(r[2] for r in rows))
        conn.exec_driver_sql(
            "INSERT INTO id_run_entries (stream_id, run, msg_id, seq, stored_at) "
            "VALUES (?, ?, ?, ?, ?)",
            [(stream_id, run.run, msg_id, seq, at) for msg_id, seq, at in rows],
        )
        conn.exec_driver_sql(
            "INSERT INTO id_runs (stream_id, run, ids, oldest, newest) VALUES (?, ?, ?, ?, ?)",
            (stream_id, run.run, run.ids, run.oldest, run.newest),
        )
        conn.exec_driver_sql(
            "DELETE FROM msg_ids WHERE stream_id = ? AND stored_at <= ?", (stream_id, cutoff)
        )
        ids = [r[0] for r in rows]
        # The batch's lookups are over; the next batch's must see the run.
        batch.after_commit.append(lambda: self._add_run(stream_id, run, ids))

    def _add_run(self, stream_id: int, run: Run, ids: list[str]) -> None:
        with self._lock:
            station = self._stations.setdefault(stream_id, StationRuns())
            station.runs[run.run] = run
            station.last_run = max(station.last_run, run.run)
            if station.hot is not None:
                station.hot = max(0, station.hot - run.ids)
            epoch = next((e for e in reversed(station.epochs) if e.open), None)
            if epoch is not None and epoch.ids + run.ids <= epoch.capacity:
                epoch.bloom.update(ids)
                epoch.runs.add(run.run)
                epoch.ids += run.ids
                return
            if epoch is not None:
                epoch.open = False
            # Filters grow with the station: a small one does not hold megabytes of bits.
            in_runs = sum(r.ids for r in station.runs.values())
        capacity = min(self.epoch_ids, max(4 * self.chunk, 2 * in_runs))
        bloom = self._new_bloom(capacity)
        with self._lock:
            if bloom is None:
                station.unfiltered.add(run.run)
                return
            bloom.update(ids)
            station.epochs.append(Epoch(bloom, capacity, {run.run}, run.ids))

    # -- expiry ------------------------------------------------------------------------------

    def sweep(self, batch: Batch, state: StreamState) -> int:
        """Delete the station's runs whose newest id has left the window."""
        cutoff = batch.now - state.window_ms
        with self._lock:
            station = self._stations.get(state.id)
            gone = [r for r in station.runs.values() if r.newest <= cutoff] if station else []
        if not gone:
            return 0
        for run in gone:
            batch.conn.execute(
                delete(id_run_entries).where(
                    id_run_entries.c.stream_id == state.id, id_run_entries.c.run == run.run
                )
            )
            batch.conn.execute(
                delete(id_runs).where(id_runs.c.stream_id == state.id, id_runs.c.run == run.run)
            )
        batch.after_commit.append(lambda: self._drop_runs(state.id, {r.run for r in gone}))
        return sum(r.ids for r in gone)

    def _drop_runs(self, stream_id: int, runs: set[int]) -> None:
        with self._lock:
            station = self._stations.get(stream_id)
            if station is None:
                return
            for run in runs:
                station.runs.pop(run, None)
            station.unfiltered -= runs
            for epoch in list(station.epochs):
                epoch.runs -= runs
                if not epoch.runs and not epoch.open:
                    station.epochs.remove(epoch)
                    self._filter_bytes -= epoch.nbytes

    def swept_hot(self, stream_id: int, n: int) -> None:
        with self._lock:
            station = self._stations.get(stream_id)
            if station is not None and station.hot is not None:
                station.hot = max(0, station.hot - n)

    def forget_station(self, stream_id: int) -> None:
        with self._lock:
            station = self._stations.pop(stream_id, None)
            if station is not None:
                self._filter_bytes -= sum(e.nbytes for e in station.epochs)


def purge(conn: Connection, stream_id: int) -> None:
    for table in (id_run_entries, id_runs):
        conn.execute(delete(table).where(table.c.stream_id == stream_id))


def count(conn: Connection, stream_id: int, cutoff: int) -> int:
    """Ids of the station's runs stored after ``cutoff``."""
    whole = conn.execute(
        select(id_runs.c.run, id_runs.c.ids, id_runs.c.oldest, id_runs.c.newest).where(
            id_runs.c.stream_id == stream_id, id_runs.c.newest > cutoff
        )
    ).all()
    n = 0
    for run, ids, oldest, _newest in whole:
        if oldest > cutoff:
            n += ids
        else:  # partly expired: count what is left
            n += conn.execute(
                select(func.count()).where(
                    id_run_entries.c.stream_id == stream_id,
                    id_run_entries.c.run == run,
                    id_run_entries.c.stored_at > cutoff,
                )
            ).scalar_one()
    return n
