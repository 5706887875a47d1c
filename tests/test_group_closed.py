"""A consumer group on a closed station (the review of 2026-11-27): a fetch of a closed station
whose group has delivered and settled everything waited its whole ``waitMs`` for nothing and
said nothing of the close, where a Durable Streams long-poll answers at once. It is answered
at once with ``"closed": true``, and so are fetches already waiting when the station closes;
while a message is leased or waits to be delivered again, nothing changes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.harness import Server


async def _fetch(http: httpx.AsyncClient, wait_ms: int, consumer: str = "c") -> Any:
    answer = await http.post(
        "/api/stations/s/groups/g/fetch",
        json={"max": 10, "waitMs": wait_ms, "consumer": consumer},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def _close(url: str) -> None:
    closed = httpx.post(
        f"{url}/v1/stream/s",
        headers={"Stream-Closed": "true", "Content-Type": "application/json"},
    )
    assert closed.status_code in (200, 204), closed.text


def test_a_drained_group_of_a_closed_station_is_told_at_once(server: Server) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.post("/api/stations", json={"name": "s"})).status_code == 201
            group = {"maxAckTimeMs": 60_000, "maxMsgDeliveries": 3}
            assert (await http.put("/api/stations/s/groups/g", json=group)).status_code == 201
            body = {"messages": [{"data": 1}]}
            assert (await http.post("/api/stations/s/messages", json=body)).status_code == 200
            # Fetches already waiting (one, then three: a round) when the station closes.
            (offset,) = [m["offset"] for m in (await _fetch(http, 0))["messages"]]
            waiting = [asyncio.create_task(_fetch(http, 20_000, f"w{k}")) for k in range(3)]
            await asyncio.sleep(0.5)
            await asyncio.to_thread(_close, server.url)
            # One message is still leased: the group is not done, the fetches go on waiting.
            started = time.monotonic()
            assert await _fetch(http, 800) == {"messages": []}
            assert time.monotonic() - started >= 0.7
            assert not any(task.done() for task in waiting)
            acked = await http.post("/api/stations/s/groups/g/ack", json={"offsets": [offset]})
            assert acked.json()["acked"] == 1
            # Settled: every waiting fetch, and each new one, hears at once that it is over.
            started = time.monotonic()
            answers = await asyncio.wait_for(asyncio.gather(*waiting), 10)
            assert answers == [{"messages": [], "closed": True}] * 3
            assert await _fetch(http, 20_000) == {"messages": [], "closed": True}
            assert time.monotonic() - started < 5

    asyncio.run(run())


def test_the_sdks_consumer_stops_when_a_closed_station_is_drained(server: Server) -> None:
    from stations.client import Client

    async def run() -> None:
        async with Client(server.url) as client:
            await client.create_station("s")
            station = client.station("s")
            await station.produce_many([{"n": n} for n in range(5)])
            await asyncio.to_thread(_close, server.url)
            seen = []
            async with station.consumer("g", consumer="w", wait_ms=20_000) as consumer:
                async with asyncio.timeout(15):  # it waited for ever, 20 s at a time
                    async for message in consumer:
                        seen.append(message.data["n"])
                        await message.ack()
            assert seen == list(range(5))
            assert consumer.station_closed

    asyncio.run(run())
