"""Pipelined idempotent producers: requests of one producer that arrive out of order.

Durable Streams §5.2.1 asks the server to serialize validation + append per producer because
"HTTP requests can arrive out-of-order". Stations holds a request that is ahead of its turn for up
to ``GAP_HOLD_S`` (stations/service.py) waiting for the missing ones; a gap that never fills is
answered 409 once the hold is over (and a new epoch that never gets its seq 0, 400). Both engines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from stations.domain.service import GAP_HOLD_S
from tests.harness import Server
from tests.module_server import ENGINES, module_server

JSON = {"Content-Type": "application/json"}
ARRIVAL_GAP_S = 0.05


@pytest.fixture(scope="module", params=ENGINES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One server per engine for the module (each test uses its own streams)."""
    yield from module_server(request.param, tmp_path_factory)


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def create(client: httpx.AsyncClient, path: str) -> None:
    r = await client.put(path, headers=JSON)
    assert r.status_code == 201, r.text


async def read_all(client: httpx.AsyncClient, path: str) -> list[object]:
    r = await client.get(path, params={"offset": "-1"})
    assert r.status_code == 200 and r.headers["Stream-Up-To-Date"] == "true", r.text
    return r.json()  # type: ignore[no-any-return]


async def send_at(
    client: httpx.AsyncClient, path: str, delay: float, headers: dict[str, str], body: object
) -> tuple[httpx.Response, float]:
    """POST after ``delay`` seconds; the response and when it came (since the batch started)."""
    start = time.monotonic()
    await asyncio.sleep(delay)
    r = await client.post(path, headers={**JSON, **headers}, content=json.dumps(body))
    return r, time.monotonic() - start


async def test_reversed_arrival_is_applied_in_seq_order(server: Server) -> None:
    path = "/v1/stream/pipelined"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        # seq 3 goes out first, seq 0 last, 50 ms apart: they reach the server reversed.
        order = [3, 2, 1, 0]
        sends = [
            send_at(client, path, k * ARRIVAL_GAP_S, producer("p", 0, seq), f"m{seq}")
            for k, seq in enumerate(order)
        ]
        results = dict(zip(order, await asyncio.gather(*sends), strict=True))

        for seq, (r, _) in results.items():
            assert r.status_code == 200, (seq, r.status_code, r.text)
            assert r.headers["Producer-Epoch"] == "0"
            assert r.headers["Producer-Seq"] == str(seq)
        # seq 3 was held until seq 0 had arrived (it was not answered early).
        assert results[3][1] >= 3 * ARRIVAL_GAP_S
        # Applied in seq order, each once.
        assert await read_all(client, path) == ["m0", "m1", "m2", "m3"]
        offsets = [results[seq][0].headers["Stream-Next-Offset"] for seq in range(4)]
        assert offsets == sorted(offsets) and len(set(offsets)) == 4

        # The session is at seq 3: a retry is a duplicate, seq 4 is next.
        r, _ = await send_at(client, path, 0, producer("p", 0, 3), "again")
        assert r.status_code == 204 and r.headers["Producer-Seq"] == "3"
        r, _ = await send_at(client, path, 0, producer("p", 0, 4), "m4")
        assert r.status_code == 200
        assert await read_all(client, path) == ["m0", "m1", "m2", "m3", "m4"]


async def test_reversed_arrival_on_a_new_epoch(server: Server) -> None:
    """A producer restarts (epoch + 1, seq from 0) and pipelines at once: seq 2 of the new
    epoch may reach the server before its seq 0. It is held like any gap, not refused."""
    path = "/v1/stream/pipelined-epoch"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        r, _ = await send_at(client, path, 0, producer("p", 0, 0), "old")
        assert r.status_code == 200
        order = [2, 1, 0]
        sends = [
            send_at(client, path, k * ARRIVAL_GAP_S, producer("p", 1, seq), f"new{seq}")
            for k, seq in enumerate(order)
        ]
        responses = [r for r, _ in await asyncio.gather(*sends)]
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        assert all(r.headers["Producer-Epoch"] == "1" for r in responses)
        assert await read_all(client, path) == ["old", "new0", "new1", "new2"]
        # The old epoch is fenced now.
        r, _ = await send_at(client, path, 0, producer("p", 0, 1), "zombie")
        assert r.status_code == 403 and r.headers["Producer-Epoch"] == "1"

        # A new epoch that never gets its seq 0 is refused (400) once the hold is over.
        r, elapsed = await send_at(client, path, 0, producer("p", 2, 1), "lost")
        assert r.status_code == 400, r.text
        assert r.json()["error"]["field"] == "Producer-Seq"
        assert GAP_HOLD_S * 0.75 <= elapsed <= GAP_HOLD_S + 3, elapsed
        assert await read_all(client, path) == ["old", "new0", "new1", "new2"]


async def test_pipelined_batch_with_a_retry_in_flight(server: Server) -> None:
    """A retry of a request that is itself still held: stored once, answered 200 and 204."""
    path = "/v1/stream/pipelined-retry"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        plan = [(2, "m2"), (1, "m1"), (1, "m1-retry"), (0, "m0")]
        sends = [
            send_at(client, path, k * ARRIVAL_GAP_S, producer("p", 0, seq), body)
            for k, (seq, body) in enumerate(plan)
        ]
        responses = [r for r, _ in await asyncio.gather(*sends)]
        statuses = [r.status_code for r in responses]
        assert statuses[0] == 200 and statuses[3] == 200, statuses
        assert sorted(statuses[1:3]) == [200, 204], statuses
        assert all(r.headers["Producer-Seq"] in ("1", "2") for r in responses[1:3])
        stored = await read_all(client, path)
        assert stored in (["m0", "m1", "m2"], ["m0", "m1-retry", "m2"]), stored


async def test_two_pipelining_producers_do_not_mix(server: Server) -> None:
    path = "/v1/stream/pipelined-two"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        sends = []
        for k, seq in enumerate([2, 1, 0]):
            for pid in ("a", "b"):
                delay = k * ARRIVAL_GAP_S + (0.01 if pid == "b" else 0)
                sends.append(send_at(client, path, delay, producer(pid, 0, seq), f"{pid}{seq}"))
        responses = [r for r, _ in await asyncio.gather(*sends)]
        assert [r.status_code for r in responses] == [200] * 6, [r.text for r in responses]
        stored = await read_all(client, path)
        assert sorted(stored) == ["a0", "a1", "a2", "b0", "b1", "b2"]  # type: ignore[type-var]
        for pid in ("a", "b"):
            assert [m for m in stored if str(m).startswith(pid)] == [
                f"{pid}0",
                f"{pid}1",
                f"{pid}2",
            ]


async def test_gap_that_fills_late_within_the_hold(server: Server) -> None:
    path = "/v1/stream/pipelined-late"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        late = GAP_HOLD_S / 2
        (r1, t1), (r0, _) = await asyncio.gather(
            send_at(client, path, 0, producer("p", 0, 1), "m1"),
            send_at(client, path, late, producer("p", 0, 0), "m0"),
        )
        assert (r0.status_code, r1.status_code) == (200, 200), (r0.text, r1.text)
        assert t1 >= late  # seq 1 waited for seq 0
        assert await read_all(client, path) == ["m0", "m1"]


async def test_gap_that_never_fills_is_409_after_a_bounded_hold(server: Server) -> None:
    path = "/v1/stream/pipelined-gap"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await create(client, path)
        r, _ = await send_at(client, path, 0, producer("p", 0, 0), "m0")
        assert r.status_code == 200

        async def other_producer() -> tuple[httpx.Response, float]:
            return await send_at(client, path, 0.2, producer("q", 0, 0), "q0")

        # p skips seq 1; a producer the server has never seen starts at seq 2; meanwhile an
        # unrelated producer writes and must not wait behind the held requests.
        (gap, t_gap), (fresh, t_fresh), (other, t_other) = await asyncio.gather(
            send_at(client, path, 0, producer("p", 0, 2), "m2"),
            send_at(client, path, 0, producer("new", 0, 2), "n2"),
            other_producer(),
        )
        assert gap.status_code == 409, gap.text
        assert gap.headers["Producer-Expected-Seq"] == "1"
        assert gap.headers["Producer-Received-Seq"] == "2"
        assert gap.json()["error"]["field"] == "Producer-Seq"
        assert fresh.status_code == 409, fresh.text
        assert fresh.headers["Producer-Expected-Seq"] == "0"
        assert fresh.headers["Producer-Received-Seq"] == "2"
        # Held, but not for ever.
        for elapsed in (t_gap, t_fresh):
            assert GAP_HOLD_S * 0.75 <= elapsed <= GAP_HOLD_S + 3, elapsed
        assert other.status_code == 200, other.text
        assert t_other < 0.2 + GAP_HOLD_S * 0.75, t_other  # it did not wait for the hold

        # Nothing of the rejected requests was stored, and p's session did not move.
        assert await read_all(client, path) == ["m0", "q0"]
        r, _ = await send_at(client, path, 0, producer("p", 0, 1), "m1")
        assert r.status_code == 200
        r, _ = await send_at(client, path, 0, producer("p", 0, 2), "m2")
        assert r.status_code == 200
        assert await read_all(client, path) == ["m0", "q0", "m1", "m2"]


async def test_pipelining_across_two_servers_on_one_database(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """Two ``stations serve`` processes share one PostgreSQL database: a request held by one
    is released by the other's commit (LISTEN/NOTIFY), not by the end of the hold."""
    first = make_server(pg_url)
    second = make_server(pg_url)
    path = "/v1/stream/pipelined-shared"
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=30) as a,
        httpx.AsyncClient(base_url=second.url, timeout=30) as b,
    ):
        await create(a, path)
        (r2, t2), (r1, t1), (r0, _) = await asyncio.gather(
            send_at(a, path, 0, producer("p", 0, 2), "m2"),
            send_at(b, path, ARRIVAL_GAP_S, producer("p", 0, 1), "m1"),
            send_at(a, path, 2 * ARRIVAL_GAP_S, producer("p", 0, 0), "m0"),
        )
        assert [r.status_code for r in (r0, r1, r2)] == [200, 200, 200], [r0.text, r1.text]
        assert max(t1, t2) < GAP_HOLD_S * 0.75, (t1, t2)  # released by a commit, not a timeout
        assert await read_all(b, path) == ["m0", "m1", "m2"]
