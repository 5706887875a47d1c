"""Older message ids in sorted runs (stations/idruns.py), over HTTP against a live SQLite server.

The server keeps only ``--recent-ids`` ids per station in ``msg_ids`` and answers from RAM for
``--id-cache-size`` ids, both set tiny here, so every retry below is decided by the runs: their
Bloom filters while the server runs, and a plain probe of every run right after a restart until
the filters are rebuilt. The database file is read directly to show where the ids are.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from stations.store import idruns
from tests.harness import Server

RECENT = 100  # ids per station in msg_ids before older ones move to a run (50 per run)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    url = f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"
    srv = Server(url, tmp_path, ["--id-cache-size", "5", "--recent-ids", str(RECENT)]).start()
    try:
        yield srv
    finally:
        srv.kill()


def db_path(server: Server) -> Path:
    return server.workdir / "stations-data" / "stations.db"


def query(server: Server, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db_path(server))) as conn:
        return conn.execute(sql, params).fetchall()


def station(client: httpx.Client, window_ms: int = 600_000) -> str:
    name = f"runs-{uuid.uuid4().hex[:8]}"
    r = client.post("/api/stations", json={"name": name, "idempotencyWindowMs": window_ms})
    assert r.status_code == 201, r.text
    return name


def produce(client: httpx.Client, name: str, ids: list[str]) -> list[dict[str, Any]]:
    body = {"messages": [{"id": i, "data": {"id": i}} for i in ids]}
    r = client.post(f"/api/stations/{name}/messages", json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def fill(
    client: httpx.Client, name: str, n: int, per: int = 50, prefix: str = ""
) -> dict[str, str]:
    """``n`` new ids; their offsets."""
    offsets: dict[str, str] = {}
    for start in range(0, n, per):
        ids = [f"{prefix}{name}-{k}" for k in range(start, min(n, start + per))]
        for msg_id, result in zip(ids, produce(client, name, ids), strict=True):
            assert result["duplicate"] is False
            offsets[msg_id] = result["offset"]
    return offsets


def stats(client: httpx.Client, name: str) -> dict[str, Any]:
    return client.get(f"/api/stations/{name}").json()["stats"]


def assert_all_duplicates(client: httpx.Client, name: str, offsets: dict[str, str]) -> None:
    ids = list(offsets)
    before = stats(client, name)["messages"]
    for start in range(0, len(ids), 70):
        chunk = ids[start : start + 70]
        for msg_id, result in zip(chunk, produce(client, name, chunk), strict=True):
            assert result == {"offset": offsets[msg_id], "duplicate": True}, msg_id
    assert stats(client, name)["messages"] == before


def test_ids_moved_to_runs_stay_duplicates(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        name = station(client)
        offsets = fill(client, name, 1000)
        sid = query(server, "SELECT id FROM streams WHERE name = ?", name)[0][0]
        (recent,) = query(
            server, "SELECT coalesce(sum(ids), 0) FROM id_blocks WHERE stream_id = ?", sid
        )[0]
        runs = query(server, "SELECT run, ids FROM id_runs WHERE stream_id = ?", sid)
        # msg_ids stays small; the rest sits in runs, every id exactly once.
        assert recent <= RECENT
        assert len(runs) >= (1000 - RECENT) // (RECENT // 2)
        assert recent + sum(n for _, n in runs) == 1000
        assert stats(client, name)["idsInWindow"] == 1000

        assert_all_duplicates(client, name, offsets)
        # A new id beside old ones in one request; an id repeated inside the request.
        first = next(iter(offsets))
        results = produce(client, name, [first, "fresh-1", "fresh-1"])
        assert results[0] == {"offset": offsets[first], "duplicate": True}
        assert results[1]["duplicate"] is False
        assert results[2] == {"offset": results[1]["offset"], "duplicate": True}


def test_runs_answer_after_kill_and_restart(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        name = station(client)
        offsets = fill(client, name, 600)
    server.restart(hard=True)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # At once (filters may still be rebuilding: every run is probed), and again later.
        assert_all_duplicates(client, name, offsets)
        more = fill(client, name, 300, per=30, prefix="more-")  # new runs beside the rebuilt ones
        assert_all_duplicates(client, name, offsets | more)
        assert stats(client, name)["idsInWindow"] == 900


def test_runs_leave_with_the_window(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # 4 s: the 8 POSTs and the look at id_runs must come before the first ids run out.
        name = station(client, window_ms=4000)
        fill(client, name, 400)
        sid = query(server, "SELECT id FROM streams WHERE name = ?", name)[0][0]
        assert query(server, "SELECT count(*) FROM id_runs WHERE stream_id = ?", sid)[0][0] > 0
        time.sleep(4.3)
        # Out of the window: the ids are free again, swept or not.
        again = produce(client, name, [f"{name}-0", f"{name}-150"])
        assert [r["duplicate"] for r in again] == [False, False]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = query(server, "SELECT count(*) FROM id_run_chunks WHERE stream_id = ?", sid)
            if left[0][0] == 0:
                break
            time.sleep(0.2)
        assert query(server, "SELECT count(*) FROM id_runs WHERE stream_id = ?", sid) == [(0,)]
        assert left == [(0,)]
        assert stats(client, name)["idsInWindow"] == 2


def test_window_patch_applies_to_ids_in_runs(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        name = station(client)
        offsets = fill(client, name, 400)
        time.sleep(2.3)
        # 2 s: the copies stored below must still be inside it when the window grows again.
        r = client.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 2000})
        assert r.status_code == 200, r.text
        old = list(offsets)[:150]  # all of these were moved to runs
        assert all(not r["duplicate"] for r in produce(client, name, old))
        r = client.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 600_000})
        assert r.status_code == 200, r.text
        # The copies just stored are duplicates again; nothing was stored twice.
        assert all(r["duplicate"] for r in produce(client, name, old))


def test_a_window_shrunk_and_grown_again_counts_only_the_ids_left(server: Server) -> None:
    """A shrink forgets run entries stored before the new window; runs holding ids from both
    sides keep the younger ones, and their rows must count only those: growing the window
    again made ``idsInWindow`` count the forgotten ids too (390 of 330 here)."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        name = station(client)
        fill(client, name, 330, per=30, prefix="old-")
        time.sleep(3.3)
        # 3 s: the 11 POSTs of the new ids and both PATCHes must fit inside it.
        new = fill(client, name, 330, per=30, prefix="new-")
        for window in (3000, 600_000):
            r = client.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": window})
            assert r.status_code == 200, r.text
        assert stats(client, name)["idsInWindow"] == 330
        sid = query(server, "SELECT id FROM streams WHERE name = ?", name)[0][0]
        (in_rows,) = query(
            server,
            "SELECT (SELECT coalesce(sum(ids), 0) FROM id_runs WHERE stream_id = ?) + "
            "(SELECT coalesce(sum(ids), 0) FROM id_blocks WHERE stream_id = ?)",
            sid,
            sid,
        )[0]
        assert in_rows == 330
        assert_all_duplicates(client, name, new)
    server.restart(hard=True)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert stats(client, name)["idsInWindow"] == 330
        assert_all_duplicates(client, name, new)
        again = produce(client, name, [f"old-{name}-{k}" for k in range(0, 330, 33)])
        assert not any(r["duplicate"] for r in again)


def test_station_delete_takes_its_runs(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        name = station(client)
        fill(client, name, 300)
        sid = query(server, "SELECT id FROM streams WHERE name = ?", name)[0][0]
        assert client.delete(f"/api/stations/{name}").status_code == 204
        for table in ("msg_ids", "id_blocks", "id_runs", "id_run_chunks"):
            assert query(server, f"SELECT count(*) FROM {table} WHERE stream_id = ?", sid) == [(0,)]
        # A new station of that name starts with an empty window.
        assert client.post("/api/stations", json={"name": name}).status_code == 201
        assert produce(client, name, [f"{name}-0"])[0]["duplicate"] is False


def test_runs_without_filters_are_still_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the filter budget no run gets a filter; every lookup then probes every run."""
    from stations.domain.service import Service

    monkeypatch.setattr(idruns, "FILTER_BUDGET", 0)

    async def scenario() -> None:
        service = Service(f"sqlite:///{tmp_path / 's.db'}", id_cache_size=1, recent_ids=10)
        await service.start()
        try:
            await service.create_station({"name": "nofilter"})
            bodies = [
                {"messages": [{"id": f"m{k}", "data": k} for k in range(start, start + 5)]}
                for start in range(0, 100, 5)
            ]
            first = [(await service.produce("nofilter", body))[0] for body in bodies]
            assert service.ids.runs is not None
            (station,) = service.ids.runs._stations.values()
            assert len(station.runs) >= 15 and not station.epochs  # runs, none filtered
            for body, before in zip(bodies, first, strict=True):
                again, _ = await service.produce("nofilter", body)
                assert again.results == [(offset, True) for offset, _ in before.results]
        finally:
            await service.close()

    asyncio.run(scenario())


def test_a_failed_move_keeps_ids_and_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moving ids into a run is housekeeping: if it fails, the batch's appends still commit
    and the ids stay in msg_ids, still duplicates."""
    from stations.domain.service import Service

    def broken(self: idruns.IdRuns, batch: Any, stream_id: int) -> None:
        batch.conn.exec_driver_sql(
            "INSERT INTO id_runs (stream_id, run, ids, oldest, newest) VALUES (?, 1, 0, 0, 0)",
            (stream_id,),
        )
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(idruns.IdRuns, "_move", broken)

    async def scenario() -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        service = Service(url, id_cache_size=1, recent_ids=10)
        await service.start()
        try:
            await service.create_station({"name": "broken"})
            bodies = [
                {"messages": [{"id": f"m{k}", "data": k} for k in range(start, start + 5)]}
                for start in range(0, 50, 5)
            ]
            first = [(await service.produce("broken", body))[0] for body in bodies]
            assert all(not dup for r in first for _, dup in r.results)
            for body, before in zip(bodies, first, strict=True):
                again, _ = await service.produce("broken", body)
                assert again.results == [(offset, True) for offset, _ in before.results]
        finally:
            await service.close()
        with closing(sqlite3.connect(tmp_path / "s.db")) as conn:
            # The half-done move was rolled back to its savepoint; every id is in id_blocks.
            assert conn.execute("SELECT count(*) FROM id_runs").fetchone() == (0,)
            assert conn.execute("SELECT sum(ids) FROM id_blocks").fetchone() == (50,)
            assert conn.execute("SELECT sum(span) FROM messages").fetchone() == (50,)

    asyncio.run(scenario())


def test_a_move_that_fails_after_its_work_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move that failed after it had queued its after-commit work (publish the run, drop
    the blocks it came from) was rolled back in the database only: the hooks still ran, RAM
    held a run the database did not, the ids left the hot set, and once the run left RAM
    they were found nowhere: a retry was stored again."""
    from stations.domain.service import Service

    real_move = idruns.IdRuns._move

    def fails_late(self: idruns.IdRuns, batch: Any, stream_id: int) -> None:
        real_move(self, batch, stream_id)
        raise RuntimeError("disk on fire, after the work")

    monkeypatch.setattr(idruns.IdRuns, "_move", fails_late)

    async def scenario() -> None:
        service = Service(f"sqlite:///{tmp_path / 's.db'}", id_cache_size=1, recent_ids=10)
        await service.start()
        try:
            await service.create_station({"name": "late"})
            bodies = [
                {"messages": [{"id": f"m{k}", "data": k} for k in range(start, start + 5)]}
                for start in range(0, 50, 5)
            ]
            for body in bodies:
                await service.produce("late", body)
            for runs in service.ids.runs._stations.values():  # what a restart would leave
                assert not runs.runs and not runs.warm
            for body in bodies:
                again, _ = await service.produce("late", body)
                assert all(duplicate for _, duplicate in again.results)
        finally:
            await service.close()

    asyncio.run(scenario())


def test_a_run_keeps_the_newest_copy_of_an_id_stored_twice(tmp_path: Path) -> None:
    """An id stored again after it expired is in two blocks; the run they move into holds
    its newer copy only."""
    from stations.store import db
    from stations.store.writer import Batch

    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    try:
        db.upgrade(engine)
        runs = idruns.IdRuns(spill_at=4, chunk=4)
        station = runs._stations.setdefault(1, idruns.StationRuns())
        runs._add_block(station, idruns.Block(1, 100, ["a", "b"], [1, 2]))
        runs._add_block(station, idruns.Block(3, 200, ["c", "a"], [3, 4]))
        with engine.begin() as conn:
            batch = Batch(conn, 300)
            runs._move(batch, 1)
        for hook in batch.after_commit:
            hook()
        assert not station.hot_ids and not station.blocks
        with engine.connect() as conn:
            found = runs.lookup(Batch(conn, 300), _state(1), ["a", "b", "c", "d"])
        assert found == {"a": (4, 200), "b": (2, 100), "c": (3, 200)}
    finally:
        engine.dispose()


def test_a_move_rolled_back_leaves_its_ids_hot_and_its_filters_unaccounted(
    tmp_path: Path,
) -> None:
    """A run's filters and RAM copy are built before the commit (after it, on the event loop,
    they held the loop and the writer up for tens of milliseconds per run); a transaction
    that rolls back after the move leaves the ids hot, the run unpublished, and the filters'
    budget as it was."""
    from stations.store import db
    from stations.store.writer import Batch

    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    try:
        db.upgrade(engine)
        runs = idruns.IdRuns(spill_at=4, chunk=4)
        station = runs._stations.setdefault(1, idruns.StationRuns())
        runs._add_block(station, idruns.Block(1, 100, ["a", "b", "c", "d"], [1, 2, 3, 4]))
        budget = runs._filter_bytes
        conn = engine.connect()
        transaction = conn.begin()
        batch = Batch(conn, 300)
        runs._move(batch, 1)
        assert runs._filter_bytes > budget  # built already, published after the commit
        transaction.rollback()
        batch.undo_since(0)  # what the writer does when a transaction does not commit
        conn.close()
        assert runs._filter_bytes == budget
        assert station.hot_ids == {"a": 1, "b": 2, "c": 3, "d": 4} and not station.runs
        # Moved again and committed, the run is published with its filters.
        with engine.begin() as conn:
            batch = Batch(conn, 300)
            runs._move(batch, 1)
        for hook in batch.after_commit:
            hook()
        assert not station.hot_ids and len(station.runs) == 1 and len(station.run_filters) == 1
        assert [e.ids for e in station.epochs] == [4]
        with engine.connect() as conn:
            found = runs.lookup(Batch(conn, 300), _state(1), ["a", "d", "e"])
        assert found == {"a": (1, 100), "d": (4, 100)}
    finally:
        engine.dispose()


def test_the_newest_runs_answer_from_ram(tmp_path: Path) -> None:
    """A station's newest runs stay in RAM as written (``WARM_RUNS``): a lookup of an id in one
    reads no database row, older runs are read, and ``cool`` (before a shrinking window
    rewrites the runs) leaves the database's copy the only one."""
    from stations.store import db
    from stations.store.writer import Batch

    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    try:
        db.upgrade(engine)
        runs = idruns.IdRuns(spill_at=2, chunk=2)
        station = runs._stations.setdefault(1, idruns.StationRuns())
        total = idruns.WARM_RUNS + 2
        for k in range(total):  # one run of two ids each time
            ids = [f"id-{2 * k}", f"id-{2 * k + 1}"]
            runs._add_block(station, idruns.Block(2 * k, 100 + k, ids, [2 * k, 2 * k + 1]))
            with engine.begin() as conn:
                batch = Batch(conn, 1000)
                runs._move(batch, 1)
            for hook in batch.after_commit:
                hook()
        assert len(station.runs) == total
        assert list(station.warm) == sorted(station.runs)[-idruns.WARM_RUNS :]
        everything = [f"id-{k}" for k in range(2 * total)]
        expected = {f"id-{k}": (k, 100 + k // 2) for k in range(2 * total)}
        with engine.connect() as conn:
            assert runs.lookup(Batch(conn, 1000), _state(1), everything) == expected
        # Without the rows in the database only the warm runs still answer: from RAM.
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM id_run_chunks")
        newest = range(2 * (total - idruns.WARM_RUNS), 2 * total)
        warm_ids = {f"id-{k}": expected[f"id-{k}"] for k in newest}
        with engine.connect() as conn:
            assert runs.lookup(Batch(conn, 1000), _state(1), everything) == warm_ids
        runs.cool(1)
        assert not station.warm and runs._warm_bytes == 0
        with engine.connect() as conn:
            assert runs.lookup(Batch(conn, 1000), _state(1), everything) == {}
    finally:
        engine.dispose()


def test_warm_runs_are_always_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the budget a new run pushes out the station's oldest warm runs; when it cannot be
    kept, none of the station's runs stays warm (a warm hit stops a lookup: no run it skips
    may be newer)."""
    runs = idruns.IdRuns()
    station = idruns.StationRuns()

    def warm(nbytes: int) -> idruns.Warm:
        return idruns.Warm([], [], nbytes)

    monkeypatch.setattr(idruns, "WARM_BUDGET", 250)
    for run in (1, 2, 3):
        runs._warm_up(station, run, warm(100))
    assert list(station.warm) == [2, 3] and runs._warm_bytes == 200
    runs._warm_up(station, 4, warm(300))  # does not fit even alone
    assert station.warm == {} and runs._warm_bytes == 0
    runs._warm_up(station, 5, warm(100))
    assert list(station.warm) == [5]


def _state(stream_id: int) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(id=stream_id)
