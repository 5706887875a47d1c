"""kill -9 under consume-transform-produce: a worker moves N messages from station A to station
B through transactions (no msg-ids on B: the transaction alone must make it exactly-once) while
the server is killed and restarted several times. At the end B holds exactly N messages, one per
input, and every input was acked exactly once: nothing is pending, in flight or dead-lettered."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from stations.client import Client, RetryPolicy, StationsError
from tests.harness import Server

N = 300
KILLS = 4


async def worker(url: str, source: str, target: str, stop: asyncio.Event, name: str = "w1") -> int:
    """Moves messages until ``stop``; returns how many transactions it saw fail."""
    failed = 0
    retry = RetryPolicy(max_delay=0.3, give_up_after=None)
    async with Client(url, timeout=5) as client:
        consumer = client.station(source).consumer(
            "move",
            consumer=name,
            batch_size=5,
            wait_ms=100,
            retry=retry,
            max_ack_time_ms=1000,
            max_msg_deliveries=1000,
        )
        while not stop.is_set():
            try:
                batch = await consumer.fetch()
                if not batch:
                    continue
                async with consumer.transaction() as tx:
                    for msg in batch:
                        tx.produce(target, {"from": msg.offset, "n": msg.data["n"]})
                        tx.ack(msg)
                    await asyncio.sleep(0.01)  # "work", so kills land inside transactions too
            except StationsError:
                failed += 1  # lost answer, stale lease or server down: fetch again
                await asyncio.sleep(0.05)
    return failed


def count(server: Server, station: str) -> int:
    try:
        r = httpx.get(f"{server.url}/api/stations/{station}", timeout=2)
    except httpx.HTTPError:
        return -1
    return r.json()["stats"]["messages"] if r.status_code == 200 else -1


async def test_kill9_during_transactions(server: Server) -> None:
    base = server.url
    with httpx.Client(base_url=base, timeout=10) as http:
        for name in ("tx-a", "tx-b"):
            assert http.post("/api/stations", json={"name": name}).status_code == 201
        body = {"messages": [{"data": {"n": i}} for i in range(N)]}
        inputs = [
            r["offset"]
            for r in http.post("/api/stations/tx-a/messages", json=body).json()["results"]
        ]
    stop = asyncio.Event()
    task = asyncio.create_task(worker(base, "tx-a", "tx-b", stop))
    loop = asyncio.get_running_loop()
    try:
        for k in range(1, KILLS + 1):
            deadline = time.monotonic() + 60
            # Kill once the worker has moved another slice of the inputs.
            while await loop.run_in_executor(None, count, server, "tx-b") < k * N // (KILLS + 1):
                assert time.monotonic() < deadline, "the worker made no progress"
                assert not task.done(), task
                await asyncio.sleep(0.02)
            await loop.run_in_executor(None, server.restart)
        deadline = time.monotonic() + 60
        while await loop.run_in_executor(None, count, server, "tx-b") < N:
            assert time.monotonic() < deadline, "the worker did not finish"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        failed = await asyncio.wait_for(task, 30)
    with httpx.Client(base_url=base, timeout=10) as http:
        moved = http.get("/api/stations/tx-b/messages", params={"limit": 1000}).json()["messages"]
        group = http.get("/api/stations/tx-a/groups").json()["groups"][0]
        dls = http.get("/api/stations/tx-a/dls").json()["entries"]
    per_input = Counter(m["data"]["from"] for m in moved)
    assert len(moved) == N, f"{len(moved)} messages in B for {N} inputs"
    assert set(per_input) == set(inputs) and set(per_input.values()) == {1}
    assert (group["pending"], group["inFlight"], group["deadLettered"]) == (0, 0, 0), group
    assert dls == []
    print(f"{KILLS} kills, {failed} transactions failed and were redone")


async def test_two_processes_share_the_work(pg_url: str, make_server) -> None:  # type: ignore[no-untyped-def]
    """Two ``stations serve`` on one PostgreSQL database, a transactional worker on each, one
    group: every input moves exactly once, with leases and row locks across processes."""
    first = make_server(pg_url)
    second = make_server(pg_url)
    n = 200
    with httpx.Client(base_url=first.url, timeout=10) as http:
        for name in ("mp-a", "mp-b"):
            assert http.post("/api/stations", json={"name": name}).status_code == 201
        body = {"messages": [{"data": {"n": i}} for i in range(n)]}
        inputs = [
            r["offset"]
            for r in http.post("/api/stations/mp-a/messages", json=body).json()["results"]
        ]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(worker(s.url, "mp-a", "mp-b", stop, f"w{i}"))
        for i, s in enumerate((first, second))
    ]
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 60
    try:
        while await loop.run_in_executor(None, count, second, "mp-b") < n:
            assert time.monotonic() < deadline, "the workers did not finish"
            assert not any(t.done() for t in tasks), tasks
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    with httpx.Client(base_url=second.url, timeout=10) as http:
        moved = http.get("/api/stations/mp-b/messages", params={"limit": 1000}).json()["messages"]
        group = http.get("/api/stations/mp-a/groups").json()["groups"][0]
    per_input = Counter(m["data"]["from"] for m in moved)
    assert len(moved) == n and set(per_input) == set(inputs) and set(per_input.values()) == {1}
    assert (group["pending"], group["inFlight"], group["deadLettered"]) == (0, 0, 0), group
