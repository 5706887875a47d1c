"""Waiting consumer-group fetches served in rounds (``Service._round``), at their edges: a wait
that runs out while a round is under way, a LISTEN connection that PostgreSQL ended while a
fetch waited, a round that fails (from the review of 2026-11-27's change)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from stations.domain.service import Service
from tests.harness import Server


async def _fetch(c: httpx.AsyncClient, base: str, who: str, wait_ms: int) -> Any:
    r = await c.post(
        f"{base}/api/stations/s/groups/g/fetch",
        json={"max": 1, "waitMs": wait_ms, "consumer": who},
    )
    assert r.status_code == 200, r.text
    return r.json()["messages"]


async def _setup(c: httpx.AsyncClient, base: str) -> None:
    assert (await c.post(f"{base}/api/stations", json={"name": "s"})).status_code == 201
    r = await c.put(f"{base}/api/stations/s/groups/g", json={"maxAckTimeMs": 60_000})
    assert r.status_code == 201


def test_a_wait_that_runs_out_during_a_round_still_gets_what_the_round_leased(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """Two fetches wait; an append's round is held up (another connection holds the group's
    row, as another process's fetch would) past their waitMs: the round's lease reaches a
    fetch. It answered both empty and left the message leased to nobody for maxAckTimeMs."""
    srv = make_server(pg_url)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            await _setup(c, srv.url)
            waits = [asyncio.ensure_future(_fetch(c, srv.url, f"c{k}", 1500)) for k in (1, 2)]
            await asyncio.sleep(0.7)  # both parked
            with psycopg.connect(pg_url) as lock:
                lock.execute("SELECT 1 FROM groups WHERE name = 'g' FOR UPDATE")
                append = asyncio.ensure_future(
                    c.post(f"{srv.url}/api/stations/s/messages", json={"messages": [{"data": 1}]})
                )
                await asyncio.sleep(2.0)  # their waits run out while the round waits
                lock.rollback()
            got = [m for w in waits for m in await w]
            assert (await append).status_code == 200
            assert [m["data"] for m in got] == [1]

    asyncio.run(run())


def test_a_fetch_hears_of_what_came_while_postgresql_listen_was_down(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """A fetch that sat through one change unserved, then PostgreSQL ends the LISTEN
    connections and another process appends: when LISTEN is back, the parked fetches look
    again. It waited out its whole waitMs and answered empty."""
    a, b = make_server(pg_url), make_server(pg_url)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            await _setup(c, a.url)
            waits = [asyncio.ensure_future(_fetch(c, a.url, f"c{k}", 15_000)) for k in (1, 2)]
            await asyncio.sleep(1.0)
            r = await c.post(f"{a.url}/api/stations/s/messages", json={"messages": [{"data": 1}]})
            assert r.status_code == 200
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1 and len(pending) == 1
            with psycopg.connect(pg_url, autocommit=True) as admin:
                ended = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'stations listen' AND datname = current_database()"
                ).fetchone()
                assert ended is not None and ended[0] >= 1
            r = await c.post(f"{b.url}/api/stations/s/messages", json={"messages": [{"data": 2}]})
            assert r.status_code == 200
            got = await asyncio.wait_for(pending.pop(), 8)
            assert [m["data"] for m in got] == [2]

    asyncio.run(run())


def test_a_failed_round_leaves_nothing_behind(tmp_path: Any) -> None:
    """A round that failed (its group deleted under it) while a change asked for another left
    that request behind for ever."""

    async def run() -> None:
        svc = Service(f"sqlite:///{tmp_path}/rounds.db")
        await svc.start()
        try:
            for k in range(5):
                station = f"s{k}"
                await svc.create_station({"name": station})
                await svc.ensure_group(station, "g", {})
                waits = [
                    asyncio.ensure_future(svc.fetch(station, "g", 1, 30, f"c{n}")) for n in (1, 2)
                ]
                while len(svc._parked.get(station, ())) < 2:
                    await asyncio.sleep(0.01)
                deleted = asyncio.ensure_future(svc.delete_group(station, "g"))
                produced = asyncio.ensure_future(svc.produce(station, {"messages": [{"data": k}]}))
                await asyncio.gather(deleted, produced, *waits, return_exceptions=True)
            await asyncio.sleep(0.2)
            assert not svc._rounds and not svc._rounds_again and not svc._parked
        finally:
            await svc.close()

    asyncio.run(run())
