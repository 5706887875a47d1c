"""SQLite keeps a station's recent message ids in RAM only (``stations.store.idruns``): RAM must
stay in step with what committed, whatever rolls back, retries or races, or a retry is stored
twice (or a message taken for a duplicate). Each case here was found by a review and failed on
the code before its fix."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stations.domain import catalog, lifecycle, messages
from stations.domain.service import Service
from stations.store import db, idruns
from stations.store.writer import Batch

ONE_X = {"messages": [{"id": "X", "data": 1}]}


def _service(tmp_path: Path) -> Service:
    # A tiny id cache and ten recent ids: lookups go past the cache, spills come quickly.
    return Service(f"sqlite:///{tmp_path / 's.db'}", id_cache_size=1, recent_ids=10)


def test_ops_retried_one_by_one_see_the_ids_the_earlier_ones_committed(tmp_path: Path) -> None:
    """A batch that fails is run again op by op, one transaction each: the ids one of them
    committed must be in RAM before the next runs (the hooks that put them there used to run
    only after the last)."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "st"})

            def trips(batch: Batch) -> None:
                raise RuntimeError("an op trips the database")

            answers = await asyncio.gather(
                svc.produce("st", ONE_X),
                svc.produce("st", ONE_X),
                svc.db.enqueue(trips),  # one batch with the two produces: it fails
                return_exceptions=True,
            )
            assert isinstance(answers[2], RuntimeError)
            results = [answer[0].results for answer in answers[:2]]  # type: ignore[index]
            assert results == [[(0, False)], [(0, True)]]
            assert (await svc.station("st"))["stats"]["messages"] == 1
        finally:
            await svc.close()

    asyncio.run(run())


def test_ids_a_shrunk_window_forgot_stay_forgotten_through_a_spill_in_its_batch(
    tmp_path: Path,
) -> None:
    """PATCH shrinks the window (its ids leave for good, CONTRACT.md §4) in the batch of a
    produce that spills the oldest blocks into a run: the blocks the PATCH deleted, still in
    RAM until the commit, must not move into the run (grown again, the window found them)."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "st", "idempotencyWindowMs": 600_000})
            await svc.produce("st", {"messages": [{"id": f"a{k}", "data": k} for k in range(6)]})
            await svc.produce(
                "st", {"messages": [{"id": f"a{k}", "data": k} for k in range(6, 10)]}
            )
            await asyncio.sleep(0.3)
            await asyncio.gather(
                svc.patch_station("st", {"idempotencyWindowMs": 100}),
                svc.produce("st", {"messages": [{"id": f"b{k}", "data": k} for k in range(4)]}),
            )
            await svc.patch_station("st", {"idempotencyWindowMs": 600_000})
            again, _ = await svc.produce("st", {"messages": [{"id": "a0", "data": "new"}]})
            assert again.results == [(14, False)]
        finally:
            await svc.close()

    asyncio.run(run())


def test_an_id_that_ran_out_stays_out_when_a_grow_shares_its_retrys_batch(
    tmp_path: Path,
) -> None:
    """PATCH grows the window in the batch of a retry whose id had run out: the grow's sweep
    deleted the id's block, but its ids leave RAM only at the commit, and the retry found the
    id there, measured by the grown window: answered as a duplicate, it was not stored (a
    review reproduced it under load, 25 times in 60)."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "st", "idempotencyWindowMs": 100})
            first, _ = await svc.produce("st", ONE_X)
            assert first.results == [(0, False)]
            # X runs out; the scheduler's sweep (every 25 ms for this window) must not reach
            # it first, as it did in most runs: the PATCH's own sweep is the case.
            svc.ids.sweep = lambda batch, state: 0  # type: ignore[method-assign]
            await asyncio.sleep(0.2)
            # The writer held in a transaction of its own while the two are queued: the next
            # one holds them both, the PATCH first.
            started, release = threading.Event(), threading.Event()

            def hold(batch: Batch) -> None:
                started.set()
                release.wait(10)

            held = svc.db.enqueue(hold)
            await asyncio.to_thread(started.wait, 10)
            grown = svc.db.enqueue(
                partial(
                    catalog.patch_station,
                    window=svc.ids,
                    name="st",
                    raw={"idempotencyWindowMs": 60_000},
                )
            )
            retried = svc.db.enqueue(
                partial(messages.produce, window=svc.ids, name="st", body=ONE_X)
            )
            release.set()
            await held
            await grown
            again, _ = await retried
            assert again.results == [(1, False)]
            retry, _ = await svc.produce("st", ONE_X)  # in the grown window now
            assert retry.results == [(1, True)]
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_deletion_that_rolls_back_leaves_the_stations_ids_in_ram(tmp_path: Path) -> None:
    """Deleting a station drops its ids from RAM inside the transaction (a station created later
    in the batch may get its id); should the transaction roll back (a failed COMMIT), the
    station is still there and so must its ids be."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "st"})
            await svc.produce("st", ONE_X)

            def delete_then_fail(batch: Batch) -> None:
                lifecycle.remove(batch, svc.ids, "st")
                raise RuntimeError("COMMIT failed (disk full)")

            with pytest.raises(RuntimeError):
                await svc.db.write(delete_then_fail)
            assert (await svc.station("st"))["stats"]["messages"] == 1
            retry, _ = await svc.produce("st", ONE_X)
            assert retry.results == [(0, True)]
        finally:
            await svc.close()

    asyncio.run(run())


def _spill(runs: idruns.IdRuns, engine: Any, sid: int, ids: list[str], seq0: int, at: int) -> None:
    """A block of ``ids`` committed, then moved into a run (as a spill does)."""
    station = runs._stations.setdefault(sid, idruns.StationRuns())
    seqs = list(range(seq0, seq0 + len(ids)))
    runs._add_block(station, idruns.Block(seq0, at, ids, seqs))  # type: ignore[arg-type]
    with engine.begin() as conn:
        batch = Batch(conn, at)
        runs._move(batch, sid)
    for hook in batch.after_commit:
        hook()


def test_filters_rebuilt_after_a_restart_never_go_to_a_new_station_with_the_old_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart a thread rebuilds the runs' filters. Should the station be deleted
    meanwhile and a new one get its id (SQLite reused the highest before 0015) and spill its own run 1,
    the old run 1's filter must not be installed for it: its ids would never be looked for."""
    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    db.upgrade(engine)
    try:
        before = idruns.IdRuns(spill_at=4, chunk=4)
        _spill(before, engine, 1, [f"old{k}" for k in range(4)], 1, 100)
        runs = idruns.IdRuns(spill_at=4, chunk=4)  # the restart; its builder runs below
        monkeypatch.setattr(threading, "Thread", lambda **kw: SimpleNamespace(start=lambda: None))
        runs.load(engine)
        monkeypatch.undo()
        new_bloom, raced = runs._new_bloom, []

        def meanwhile(capacity: int, rate: float = idruns.FALSE_POSITIVES) -> Any:
            if rate == idruns.RUN_FALSE_POSITIVES and not raced:  # old run 1 was just read
                raced.append(True)
                with engine.begin() as conn:  # the station deleted ...
                    idruns.purge(conn, 1)
                runs.forget_station(1)
                for k in range(idruns.WARM_RUNS + 1):  # ... a new one with its id spills
                    ids = [f"new{k}-{j}" for j in range(4)]
                    _spill(runs, engine, 1, ids, 10 + 4 * k, 200 + k)
            return new_bloom(capacity, rate)

        runs._new_bloom = meanwhile  # type: ignore[method-assign]
        runs._build(engine)
        assert raced
        wanted = [f"new0-{j}" for j in range(4)]  # run 1 of the new station, no longer warm
        assert 1 not in runs._stations[1].warm
        with engine.connect() as conn:
            state = SimpleNamespace(id=1, window_ms=10**9)
            found = runs.lookup(Batch(conn, 300), state, wanted)  # type: ignore[arg-type]
        assert sorted(found) == wanted
    finally:
        engine.dispose()


def test_a_station_recreated_in_the_batch_that_deleted_it_starts_with_no_ids(
    tmp_path: Path,
) -> None:
    """Delete and create in one batch: the ids the old station stored earlier in the batch
    (not in RAM yet) are not the new one's. Before migration 0015 SQLite gave the new station
    the old one's id, which is how they became its; now the id is a new one as well."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "st"})
            enqueue = svc.db.enqueue
            answers = await asyncio.gather(
                enqueue(lambda b: messages.produce(b, svc.ids, "st", ONE_X)),
                enqueue(lambda b: lifecycle.remove(b, svc.ids, "st")),
                enqueue(lambda b: catalog.create_station(b, svc.ids, {"name": "st"})),
                enqueue(lambda b: messages.produce(b, svc.ids, "st", ONE_X)),
            )
            assert answers[0][1].id != answers[2].state.id  # ids are not given again
            assert answers[3][0].results == [(0, False)]
            assert (await svc.station("st"))["stats"]["messages"] == 1
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_window_shrunk_by_another_process_forgets_the_ids_this_one_cached(
    pg_url: str,
) -> None:
    """PostgreSQL, two processes (here: two services) on one database: A caches id X; B's
    PATCH shrinks the window (X is forgotten for good, CONTRACT.md §4) and grows it again.
    A's cache must not answer the next X as a duplicate: only B's cache was cleared."""

    async def run() -> None:
        a, b = Service(pg_url), Service(pg_url)
        await a.start()
        await b.start()
        try:
            await a.create_station({"name": "st", "idempotencyWindowMs": 60_000})
            assert (await a.produce("st", ONE_X))[0].results == [(0, False)]
            assert (await a.produce("st", ONE_X))[0].results == [(0, True)]  # A caches X
            await asyncio.sleep(0.3)  # X is older than the shrunk window will be
            await b.patch_station("st", {"idempotencyWindowMs": 100})
            await b.patch_station("st", {"idempotencyWindowMs": 60_000})
            assert (await a.produce("st", ONE_X))[0].results == [(1, False)]
            assert (await a.station("st"))["stats"]["messages"] == 2
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


def test_a_forget_keeps_a_runs_oldest_time_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose first chunk was all forgotten recorded 0 as its oldest time, so every later
    forget and count scanned it again (found by a review; answers stayed right)."""
    monkeypatch.setattr(idruns, "RUN_CHUNK", 4)
    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    db.upgrade(engine)
    try:
        runs = idruns.IdRuns(spill_at=8, chunk=8)
        station = runs._stations.setdefault(1, idruns.StationRuns())
        for seq0, at, prefix in ((1, 10, "a"), (5, 160, "b")):  # sorted: a-ids chunk first
            ids = [f"{prefix}{k}" for k in range(4)]
            block = idruns.Block(seq0, at, ids, list(range(seq0, seq0 + 4)))
            runs._add_block(station, block)  # type: ignore[arg-type]
        with engine.begin() as conn:
            batch = Batch(conn, 200)
            runs._move(batch, 1)
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT ids, oldest FROM id_runs").all() == [(8, 10)]
            idruns.forget_before(conn, 1, 150)
            rows = conn.exec_driver_sql("SELECT ids, oldest, newest FROM id_runs").all()
        assert rows == [(4, 160, 160)]
    finally:
        engine.dispose()
