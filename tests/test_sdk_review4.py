"""The SDK consumer's edges a review found: closing gives back only its own deliveries (by
lease, not by offset), a seek waits for ack requests already under way, and the blocking
client's objects reached as attributes block too. Real servers."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import aiohttp
import pytest
from aiohttp import web

from stations.client import Client
from stations.client.client import Station
from stations.client.sync import SyncClient
from tests.harness import Server
from tests.test_sdk import client, stations, unique  # noqa: F401

__all__ = ["client", "stations"]


@pytest.mark.parametrize("max_deliveries", [5, 2])
async def test_closing_gives_back_only_its_own_deliveries(
    client: Client,  # noqa: F811
    max_deliveries: int,
) -> None:
    """A's prefetched leases expire and B fetches the messages again; A's close must not take
    B's deliveries away (by offset it did: a third consumer got them while B processed them,
    or, at their last delivery, they went to the DLS)."""
    name = unique("giveback")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": i} for i in range(3)])
    options: dict[str, Any] = {"max_msg_deliveries": max_deliveries}
    a = station.consumer("g", consumer="A", batch_size=3, max_ack_time_ms=500, **options)
    first = await a.__anext__()  # A leases 3, hands out 1, keeps 2
    assert await first.ack(wait=True)
    await asyncio.sleep(0.8)  # the 2 kept leases expire
    b = station.consumer("g", consumer="B", max_ack_time_ms=60_000, **options)
    held = await b.fetch(10, wait_ms=0)
    assert sorted(m.data["n"] for m in held) == [1, 2]
    await a.close()
    c = station.consumer("g", consumer="C")
    assert await c.fetch(10, wait_ms=0) == []
    assert (await station.dead_letters(group="g")).entries == []
    assert [await m.ack(wait=True) for m in held] == [True, True]
    await b.close()
    await c.close()


async def _closed_after_one(client: Client, prefix: str) -> Station:  # noqa: F811
    """A station of 3 messages whose consumer A took all 3, handed out and acked one, and
    closed (giving back the 2 it kept, leased for a minute)."""
    name = unique(prefix)
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": i} for i in range(3)])
    a = station.consumer("g", consumer="A", batch_size=3, max_ack_time_ms=60_000)
    first = await a.__anext__()
    assert await first.ack(wait=True)
    await a.close()
    return station


async def test_closing_gives_back_what_it_holds(client: Client) -> None:  # noqa: F811
    """Its own unexpired prefetched leases still come back at once on close."""
    station = await _closed_after_one(client, "giveback-own")
    b = station.consumer("g", consumer="B")
    again = await b.fetch(10, wait_ms=0)
    assert sorted((m.data["n"], m.delivery_count) for m in again) == [(1, 2), (2, 2)]
    await b.close()


async def test_a_seek_waits_for_an_ack_already_under_way(client: Client) -> None:  # noqa: F811
    """An ack the consumer's timer already sent, answered after the seek, settled the replayed
    delivery of its message: after a crash, the message the seek asked for never came."""
    name = unique("seek-ack")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": i} for i in range(3)])
    real = client.http.request

    async def slow(method: str, url: str, **kw: Any) -> Any:
        if url.endswith("/ack"):
            await asyncio.sleep(0.5)  # a slow network
        return await real(method, url, **kw)

    client.http.request = slow  # type: ignore[method-assign]
    consumer = station.consumer("g", consumer="w", batch_size=1, wait_ms=0, max_ack_time_ms=500)
    m = await consumer.__anext__()
    await m.ack()  # queued: the timer sends it 50 ms later
    await asyncio.sleep(0.1)  # under way
    await consumer.seek("earliest")
    again = await consumer.fetch(1)
    assert [(x.data["n"], x.delivery_count) for x in again] == [(0, 1)]
    await asyncio.sleep(1.0)  # the worker "crashed": the replayed delivery's lease expires
    client.http.request = real  # type: ignore[method-assign]
    other = station.consumer("g", consumer="w2", wait_ms=0)
    rest = await other.fetch(10)
    assert 0 in [x.data["n"] for x in rest]
    await consumer.close()
    await other.close()


def test_blocking_objects_reached_as_attributes_block(stations: Server) -> None:  # noqa: F811
    with SyncClient(stations.url) as sync:
        name = unique("sync-attr")
        sync.create_station(name)
        station = sync.station(name)
        consumer = station.consumer("g", consumer="w", wait_ms=0)
        # consumer.station gave the async station: produce() made a coroutine nobody awaited.
        consumer.station.produce({"x": 1}, msg_id="m-1")
        assert len(station.browse().messages) == 1
        got = consumer.fetch()
        assert consumer.extend(tuple(got)) == 1  # a tuple of views, as a list of them
        consumer.close()


class _OlderServer:
    """The server in front of a proxy that answers a nack naming ``leases`` as a server from
    before that field did: 400 ``unknown field leases`` (everything else goes through)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.refused = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path.endswith("/nack") and b'"leases"' in body:
            self.refused += 1
            error = {"code": "bad_request", "message": "unknown field leases", "field": "leases"}
            return web.json_response({"error": error}, status=400)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=body,
                headers={"Content-Type": request.headers.get("Content-Type", "")},
            ) as r,
        ):
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def __aenter__(self) -> _OlderServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_closing_gives_back_by_offset_to_an_older_server(stations: Server) -> None:  # noqa: F811
    """A server from before nack took leases refuses them (a rolling upgrade that updated the
    clients first): the prefetched messages are given back by offset, as before."""
    async with _OlderServer(stations.url) as older, Client(older.url) as client:
        station = await _closed_after_one(client, "giveback-older")
        assert older.refused == 1
        b = station.consumer("g", consumer="B")
        again = await b.fetch(10, wait_ms=0)
        assert sorted(m.data["n"] for m in again) == [1, 2]
        await b.close()


class Point(NamedTuple):
    x: int
    y: int


def test_blocking_calls_take_named_tuples(stations: Server) -> None:  # noqa: F811
    with SyncClient(stations.url) as sync:
        name = unique("sync-namedtuple")
        sync.create_station(name)
        station = sync.station(name)
        station.produce(Point(1, 2))
        assert [m.data for m in station.browse().messages] == [[1, 2]]
