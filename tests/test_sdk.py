"""The Python SDK (``stations.client``) against live servers: ``stations serve`` (mostly on SQLite,
the exactly-once producer test on both engines) and, for interoperability, the Durable Streams
reference server. Faults come from ``FaultProxy``, a loopback TCP proxy that can hold requests,
answer 503 itself, or drop a connection after the server answered."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stations.client import (
    BadRequest,
    BufferFull,
    Client,
    Conflict,
    ConnectionFailed,
    EpochInUse,
    Forbidden,
    GroupNotFound,
    IdempotentProducer,
    NewMessage,
    NotFound,
    ProducerClosed,
    ProducerFenced,
    Retention,
    RetryPolicy,
    ServerError,
    StationNotFound,
    StationsError,
    StreamClosed,
    Unauthorized,
    read_stream,
)
from tests.harness import Server, free_port
from tests.nodekit import reference_server

ROOT = Path(__file__).parent.parent
FAST_RETRY = RetryPolicy(initial_delay=0.02, max_delay=0.3, give_up_after=30)


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- servers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stations(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One SQLite server for the tests that do not restart it (each uses its own stations)."""
    workdir = tmp_path_factory.mktemp("sdk")
    server = Server(
        f"sqlite:///{workdir / 'stations.db'}",
        workdir,
        ["--long-poll-timeout-ms", "1000", "--sse-lifetime-ms", "700"],
    ).start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Durable Streams reference server; yields its base URL."""
    yield from reference_server(tmp_path_factory)


@pytest.fixture
async def client(stations: Server) -> AsyncIterator[Client]:
    async with Client(stations.url) as c:
        yield c


async def create_stream(url: str, content_type: str = "application/json") -> None:
    """A plain Durable Streams PUT (works on both servers)."""
    async with (
        aiohttp.ClientSession() as s,
        s.put(url, headers={"Content-Type": content_type}) as r,
    ):
        assert r.status in (200, 201), r.status


async def read_all(url: str, live: Any = None) -> list[Any]:
    items: list[Any] = []
    async with read_stream(url, live=live, retry=FAST_RETRY) as reader:
        async for batch in reader:
            items += batch.items
    return items


async def eventually(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def stream_head(url: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as s, s.head(url) as r:
        return dict(r.headers)


# -- a fault-injecting TCP proxy --------------------------------------------------------------


class FaultProxy:
    """Forwards HTTP/1.1 to ``upstream`` request by request, counting POSTs (1-based, over all
    connections). ``drop_after`` POSTs are forwarded and answered by the server, then the
    connection is cut before the answer is relayed; ``reject_503`` POSTs are answered 503 by the
    proxy itself (value: the Retry-After header, or None); while ``gate`` is clear, requests wait
    before being forwarded."""

    def __init__(self, upstream: str) -> None:
        host_port = upstream.split("//", 1)[1]
        self.upstream_host, port = host_port.rsplit(":", 1)
        self.upstream_port = int(port)
        self.drop_after: set[int] = set()
        self.reject_503: dict[int, str | None] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.posts = 0
        self.dropped = 0
        self.rejected = 0
        self.requests: list[tuple[str, str]] = []
        self.post_statuses: list[int] = []  # the server's answers to POSTs, dropped ones too
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # handlers end on their own, not by cancellation
            writer.close()
        self.gate.set()
        await asyncio.sleep(0.05)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        self._writers |= {writer, up_writer}
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, path = head.split(b" ", 2)[:2]
                body = await _read_body(reader, head, request=True)
                self.requests.append((method.decode(), path.decode()))
                number = None
                if method == b"POST":
                    self.posts += 1
                    number = self.posts
                await self.gate.wait()
                if number in self.reject_503:
                    self.rejected += 1
                    retry_after = self.reject_503[number]
                    extra = f"Retry-After: {retry_after}\r\n" if retry_after else ""
                    writer.write(
                        f"HTTP/1.1 503 Service Unavailable\r\n{extra}Content-Length: 0\r\n\r\n".encode()
                    )
                    await writer.drain()
                    continue
                up_writer.write(head + body)
                await up_writer.drain()
                answer = await _read_head(up_reader)
                if answer is None:
                    return
                answer_body = await _read_body(up_reader, answer, request=False, method=method)
                if number is not None:
                    self.post_statuses.append(int(answer.split(b" ", 2)[1]))
                if number in self.drop_after:
                    self.dropped += 1
                    return  # the server stored it; the client never hears so
                writer.write(answer + answer_body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            up_writer.close()
            self._writers -= {writer, up_writer}


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


async def _read_body(
    reader: asyncio.StreamReader, head: bytes, *, request: bool, method: bytes = b""
) -> bytes:
    """The raw body bytes (chunk framing kept, so the relay is byte-exact)."""
    if not request:
        status = int(head.split(b" ", 2)[1])
        if method == b"HEAD" or status in (204, 304) or status < 200:
            return b""
    if (_header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        raw = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            raw += size_line
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    line = await reader.readuntil(b"\r\n")
                    raw += line
                    if line == b"\r\n":
                        return bytes(raw)
            raw += await reader.readexactly(size + 2)
    length = _header(head, b"content-length")
    return await reader.readexactly(int(length)) if length else b""


# -- station management and errors ------------------------------------------------------------


async def test_station_management(client: Client) -> None:
    name = unique("mgmt")
    info = await client.create_station(name, idempotency_window_ms=5000)
    assert info.created and info.name == name and info.is_json
    assert info.idempotency_window_ms == 5000 and info.consumer_defaults.max_msg_deliveries == 2
    assert info.stats.messages == 0 and info.created_at is not None
    again = await client.create_station(name, idempotency_window_ms=5000)
    assert not again.created
    with pytest.raises(Conflict):
        await client.create_station(name, idempotency_window_ms=6000)

    got = await client.get_station(name)
    assert got.name == name and got.idempotency_window_ms == 5000
    assert name in [s.name for s in await client.list_stations()]

    patched = await client.patch_station(
        name, retention={"max_age_ms": 60_000}, consumer_defaults={"max_ack_time_ms": 500}
    )
    assert patched.retention == Retention(max_age_ms=60_000)
    assert patched.consumer_defaults.max_ack_time_ms == 500
    assert patched.consumer_defaults.max_msg_deliveries == 2  # a mapping changes only its keys
    station = client.station(name)
    assert (await station.patch(idempotency_window_ms=200)).idempotency_window_ms == 200
    assert (await station.info()).retention.max_age_ms == 60_000

    with pytest.raises(BadRequest) as bad:
        await client.patch_station(name, consumer_defaults={"max_msg_deliveries": 0})
    assert bad.value.field == "consumerDefaults.maxMsgDeliveries" and bad.value.status == 400

    await client.delete_station(name)
    with pytest.raises(StationNotFound) as missing:
        await client.get_station(name)
    assert isinstance(missing.value, NotFound) and isinstance(missing.value, StationsError)
    assert missing.value.status == 404


async def test_slash_names_and_content_types(client: Client) -> None:
    name = f"{unique('ns')}/orders"
    info = await client.create_station(name, content_type="text/plain")
    assert (await client.get_station(name)).content_type == "text/plain" == info.content_type
    station = client.station(name)
    await station.produce("hello ")
    await station.produce(b"\xffraw")
    page = await station.browse()
    assert [m.data for m in page.messages] == ["hello ", b"\xffraw"] and page.up_to_date
    assert [b.items for b in [b async for b in station.read()]] == [[b"hello \xffraw"]]
    await station.delete()
    with pytest.raises(StationNotFound):
        await station.info()


async def test_errors_are_typed(client: Client, stations: Server) -> None:
    missing = client.station(unique("missing"))
    with pytest.raises(StationNotFound):
        await missing.produce({"x": 1})
    with pytest.raises(StationNotFound):
        await missing.info()
    with pytest.raises(StationNotFound):
        async for _ in missing.read():
            pass
    with pytest.raises(BadRequest) as bad:
        await client.create_station("bad name!")
    assert bad.value.field == "name"
    name = unique("err")
    await client.create_station(name)
    with pytest.raises(GroupNotFound):
        await client.station(name).delete_group("nobody")
    with pytest.raises(StationNotFound):  # start() asks the stream for its content type
        async with IdempotentProducer(client.stream_url(unique("nowhere")), "p"):
            pass
    async with Client(f"http://127.0.0.1:{free_port()}") as dead:
        with pytest.raises(ConnectionFailed):
            await dead.list_stations()
        assert not await dead.healthy()
    assert await client.healthy()


# -- producing with message ids ---------------------------------------------------------------


async def test_produce_reports_duplicates(client: Client) -> None:
    name = unique("produce")
    await client.create_station(name)
    station = client.station(name)
    first = await station.produce({"total": 12}, msg_id="order-17", headers={"source": "web"})
    again = await station.produce({"total": 99}, msg_id="order-17")
    assert not first.duplicate and again.duplicate and again.offset == first.offset
    plain = await station.produce([1, 2])
    assert not plain.duplicate and plain.offset > first.offset

    results = await station.produce_many(
        [
            NewMessage({"n": 1}, msg_id="a"),
            NewMessage({"n": 2}, msg_id="a"),  # repeated inside one request
            NewMessage({"n": 3}, msg_id="order-17"),
            {"n": 4},  # plain data
        ]
    )
    assert [r.duplicate for r in results] == [False, True, True, False]
    assert results[1].offset == results[0].offset and results[2].offset == first.offset

    page = await station.browse()
    assert [m.data for m in page.messages] == [{"total": 12}, [1, 2], {"n": 1}, {"n": 4}]
    assert page.messages[0].msg_id == "order-17" and page.messages[0].headers == {"source": "web"}
    assert page.messages[0].offset == first.offset
    assert (await station.info()).stats.ids_in_window == 2


async def test_produce_retries_only_with_ids(stations: Server) -> None:
    name = unique("pretry")
    async with FaultProxy(stations.url) as proxy, Client(proxy.url) as client:
        await client.create_station(name)
        station = client.station(name)
        base = proxy.posts  # create_station was a POST too
        proxy.drop_after = {base + 2}  # stored by the server, then the connection is cut
        stored = await station.produce({"n": 1}, msg_id="once")
        assert stored.duplicate is False and proxy.posts == base + 1
        retried = await station.produce({"n": 2}, msg_id="twice")
        assert proxy.dropped == 1 and proxy.posts == base + 3
        assert retried.duplicate  # the lost attempt stored it: the retry says so honestly
        proxy.drop_after = {base + 4}
        with pytest.raises(ConnectionFailed):  # no id: a retry could store it twice
            await station.produce({"n": 3})
    async with Client(stations.url) as direct:
        data = [m.data for m in (await direct.station(name).browse()).messages]
    assert data == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_produce_with_ids_is_not_retried_once_the_window_may_have_passed(
    stations: Server,
) -> None:
    """A retry the server takes after the ids of the attempt whose answer was lost have left
    the station's window stores the messages again: the defaults (a 2 min window, retries for
    2 min after a first failure that came a 30 s timeout after the sending) did so. The SDK
    now retries only while the server surely still has those ids, and says what may be
    stored when it stops."""
    name = unique("pwindow")
    async with (
        FaultProxy(stations.url) as proxy,
        Client(proxy.url, timeout=0.3, retry=RetryPolicy(give_up_after=30)) as client,
    ):
        await client.create_station(name, idempotency_window_ms=2_000)
        station = client.station(name)
        base = proxy.posts
        # Lost, then retried at once: inside the window, so sent again (a duplicate).
        proxy.drop_after = {base + 1}
        assert (await station.produce({"n": 1}, msg_id="near")).duplicate
        # Lost, then 503 "retry in 3 s": by then the window (2 s) may have passed.
        proxy.drop_after = {base + 3}
        proxy.reject_503 = {base + 4: "3"}
        with pytest.raises(ServerError) as raised:
            await station.produce({"n": 2}, msg_id="far")
        assert proxy.posts == base + 4  # not sent a third time
        notes = " ".join(getattr(raised.value, "__notes__", []))
        assert "outside the station's idempotency window" in notes, notes
        assert "may have been stored" in notes, notes
    async with Client(stations.url) as direct:
        data = [m.data for m in (await direct.station(name).browse()).messages]
    assert data == [{"n": 1}, {"n": 2}]


async def test_produce_without_ids_says_its_messages_may_be_stored(stations: Server) -> None:
    name = unique("punsure")
    async with FaultProxy(stations.url) as proxy, Client(proxy.url) as client:
        await client.create_station(name)
        proxy.drop_after = {proxy.posts + 1}
        with pytest.raises(ConnectionFailed) as raised:
            await client.station(name).produce({"n": 1})
    assert raised.value.sent
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "may have been stored" in notes and "message ids" in notes, notes


# -- the idempotent producer ------------------------------------------------------------------


async def test_producer_batches_pipelines_and_closes(client: Client) -> None:
    name = unique("prod")
    await client.create_station(name)
    station = client.station(name)
    async with FaultProxy(client.url) as proxy:
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}", "p1", max_batch_bytes=300, linger_ms=10_000
        )
        for i in range(200):
            producer.append({"i": i})

        # max_batch_bytes sealed batches without any flush and despite the long linger
        async def sent() -> bool:
            return producer.buffered_bytes < 300

        await eventually(sent)
        assert producer.next_seq >= 5
        await producer.flush()
        assert producer.buffered_bytes == 0
        posts = [r for r in proxy.requests if r[0] == "POST"]
        assert len(posts) == producer.next_seq  # one Producer-Seq per POST
        final = await producer.close({"i": "last"})
        assert final == await producer.close() == (await station.info()).stats.tail_offset
        with pytest.raises(ProducerClosed):
            producer.append({"i": "late"})
    items = await read_all(station.url)
    assert items == [{"i": i} for i in range(200)] + [{"i": "last"}]
    assert (await stream_head(station.url)).get("Stream-Closed") == "true"


async def test_producer_linger_sends_without_flush(client: Client) -> None:
    name = unique("linger")
    await client.create_station(name, content_type="application/octet-stream")
    station = await _station_with_info(client, name)
    producer = station.producer("p", linger_ms=2000)
    producer.append(b"ab")
    producer.append("cd")
    await asyncio.sleep(0.05)
    assert (await station.info()).stats.messages == 0  # still lingering

    async def stored() -> bool:
        return (await station.info()).stats.messages == 1  # one POST, one byte message

    await eventually(stored)
    with pytest.raises(TypeError):
        producer.append({"not": "bytes"})
    await producer.detach()
    assert await read_all(station.url) == [b"abcd"]
    assert (await stream_head(station.url)).get("Stream-Closed") is None  # detach keeps it open
    with pytest.raises(ProducerClosed):
        producer.append(b"x")
    successor = station.producer("p", epoch=1)
    successor.append(b"ef")
    await successor.close()
    assert await read_all(station.url) == [b"abcdef"]


async def _station_with_info(client: Client, name: str):  # type: ignore[no-untyped-def]
    station = client.station(name)
    await station.info()  # learns the content type, so append() can check types at once
    return station


async def test_producer_exactly_once_when_connections_drop(server: Server) -> None:
    """The server stores a batch, the connection is cut before the client hears: the retry (same
    epoch and seq) is a duplicate, so every message is stored once and in order."""
    name = unique("drop")
    url = f"{server.url}/v1/stream/{name}"
    await create_stream(url)
    async with FaultProxy(server.url) as proxy:
        proxy.drop_after = {2, 5, 6, 11}
        errors: list[StationsError] = []
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}",
            "dropper",
            max_batch_bytes=256,
            max_in_flight=5,
            retry=FAST_RETRY,
            on_error=errors.append,
        )
        for i in range(400):
            producer.append({"i": i})
            if i % 50 == 0:
                await asyncio.sleep(0.01)
        await producer.flush()
        await producer.detach()
    assert proxy.dropped == 4 and errors == []
    assert proxy.posts > producer.next_seq  # some batches really went twice
    assert await read_all(url) == [{"i": i} for i in range(400)]


async def test_producer_retries_503_honouring_retry_after(client: Client) -> None:
    name = unique("r503")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy:
        proxy.reject_503 = {1: "1", 2: None}
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}", "p", content_type="application/json"
        )
        started = time.monotonic()
        producer.append("x")
        await producer.flush()
        assert time.monotonic() - started >= 1.0  # Retry-After: 1 was a floor
        assert proxy.rejected == 2 and proxy.posts == 3
        await producer.detach()
    assert await read_all(client.stream_url(name)) == ["x"]


async def test_producer_fenced_by_newer_epoch(client: Client) -> None:
    name = unique("fence")
    await client.create_station(name)
    station = client.station(name)
    errors: list[StationsError] = []
    old = station.producer("writer", epoch=0, on_error=errors.append)
    old.append("a")
    await old.flush()
    newer = station.producer("writer", epoch=1)
    newer.append("b")
    await newer.flush()
    old.append("c")
    with pytest.raises(ProducerFenced) as fenced:
        await old.flush()
    assert fenced.value.current_epoch == 1 and errors == [fenced.value]
    with pytest.raises(ProducerFenced):
        old.append("d")
    await old.detach()

    # auto_claim: the fenced producer takes epoch+1 and goes on, batches renumbered in order
    claimer = station.producer("writer", epoch=0, auto_claim=True, max_batch_bytes=8)
    for i in range(20):
        claimer.append(i)
    await claimer.flush()
    assert claimer.epoch == 2
    newer.append("e")  # newer (epoch 1) is now the zombie
    with pytest.raises(ProducerFenced):
        await newer.flush()
    await newer.detach()
    # fenced while pipelining: every in-flight batch comes back 403 and is resent on epoch+1
    usurper = station.producer("writer", epoch=5)
    usurper.append("u")
    await usurper.detach()
    for i in range(20, 60):
        claimer.append(i)
    await claimer.close()
    assert claimer.epoch == 6
    assert await read_all(station.url) == ["a", "b", *range(20), "u", *range(20, 60)]


async def test_producer_restarted_in_the_same_epoch_is_not_silently_dropped(
    client: Client,
) -> None:
    """A second run under the same producer id and epoch starts again at seq 0: the server
    answers its first batches 204 (it has those seqs from the first run). Taken as success,
    they would be lost; the producer must stop (or, with auto_claim, move to a new epoch)."""
    name = unique("rerun")
    await client.create_station(name)
    station = client.station(name)
    first = station.producer("job", epoch=3)
    for value in ("a", "b", "c"):
        first.append(value)
        await first.flush()
    await first.detach()

    errors: list[StationsError] = []
    rerun = station.producer("job", epoch=3, on_error=errors.append)
    rerun.append("d")
    with pytest.raises(EpochInUse) as in_use:
        await rerun.flush()
    assert isinstance(in_use.value, ProducerFenced) and in_use.value.current_epoch == 3
    assert errors == [in_use.value]
    await rerun.detach()
    assert await read_all(station.url) == ["a", "b", "c"]

    claimer = station.producer("job", epoch=3, auto_claim=True, max_batch_bytes=8)
    for i in range(10):
        claimer.append(i)
    await claimer.flush()
    assert claimer.epoch == 4
    await claimer.detach()
    assert await read_all(station.url) == ["a", "b", "c", *range(10)]

    # The same for a run that only closes the stream with a final message: its close went as
    # seq 0 of a used epoch, and its 204 dropped the final message (and left the stream open).
    closer = station.producer("job", epoch=4)
    with pytest.raises(EpochInUse):
        await closer.close("last")
    assert await read_all(station.url) == ["a", "b", "c", *range(10)]
    closer = station.producer("job", epoch=4, auto_claim=True)
    await closer.close("last")
    assert closer.epoch == 5
    assert await read_all(station.url) == ["a", "b", "c", *range(10), "last"]

    # And one that closes without a final message: the 204 to its seq 0, a duplicate of the
    # first run's, carries no Stream-Closed; taken as success, the stream stayed open.
    station = client.station(unique("rerun-close"))
    await client.create_station(station.name)
    first = station.producer("job")
    first.append("a")
    await first.detach()
    with pytest.raises(EpochInUse):
        await station.producer("job").close()
    assert not (await station.info()).closed
    claimer = station.producer("job", auto_claim=True)
    await claimer.close()
    assert claimer.epoch == 1 and (await station.info()).closed
    assert await read_all(station.url) == ["a"]


async def test_back_pressure(client: Client) -> None:
    name = unique("bp")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy:
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}",
            "bp",
            content_type="application/json",
            max_buffered_bytes=100,
            max_batch_bytes=40,
            linger_ms=1,
        )
        proxy.gate.clear()  # the server "stalls": nothing is acknowledged
        accepted = 0
        with pytest.raises(BufferFull):
            for i in range(1000):
                producer.append(i * 1000)
                accepted += 1
        assert accepted < 30 and producer.buffered_bytes >= 100
        waiter = asyncio.ensure_future(producer.wait_for_capacity())
        await asyncio.sleep(0.3)
        assert not waiter.done()  # still full: wait_for_capacity really waits
        proxy.gate.set()
        await asyncio.wait_for(waiter, 5)
        assert producer.buffered_bytes < 100
        for i in range(accepted, 300):  # the intended loop: wait, then append
            await producer.wait_for_capacity()
            producer.append(i * 1000)
        await producer.close()
    assert await read_all(client.stream_url(name)) == [i * 1000 for i in range(300)]


# -- readers ----------------------------------------------------------------------------------


async def test_reader_modes_offsets_and_closure(client: Client) -> None:
    name = unique("read")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": i} for i in range(5)])

    batches = [b async for b in station.read()]
    assert [i for b in batches for i in b.items] == [{"n": i} for i in range(5)]
    assert batches[-1].up_to_date and not batches[-1].closed
    checkpoint = batches[-1].offset
    assert [b async for b in station.read(offset="now")] == []

    async def follow(live: str, offset: str) -> list[Any]:
        seen: list[Any] = []
        async with station.read(offset=offset, live=live) as reader:  # type: ignore[arg-type]
            async for batch in reader:
                seen += batch.items
        assert reader.closed
        return seen

    long_poll = asyncio.ensure_future(follow("long-poll", checkpoint))
    sse = asyncio.ensure_future(follow("sse", "-1"))  # the server ends SSE every 0.7 s: reconnects
    sse_now = asyncio.ensure_future(follow("sse", "now"))
    await asyncio.sleep(1.5)
    producer = station.producer("live", linger_ms=1)
    for i in range(5, 10):
        producer.append({"n": i})
        await asyncio.sleep(0.1)
    await producer.close({"n": "end"})
    tail = [{"n": i} for i in range(5, 10)] + [{"n": "end"}]
    assert await asyncio.wait_for(long_poll, 10) == tail
    assert await asyncio.wait_for(sse, 10) == [{"n": i} for i in range(5)] + tail
    assert await asyncio.wait_for(sse_now, 10) == tail
    # after closure a catch-up read ends with closed=True and a fresh offset
    async with station.read(offset=checkpoint) as reader:
        last = [b async for b in reader][-1]
    assert last.closed and reader.closed and last.offset > checkpoint


async def test_read_binary_stream_over_sse(client: Client) -> None:
    name = unique("bin")
    await client.create_station(name, content_type="application/octet-stream")
    station = client.station(name)
    await station.produce(bytes(range(256)))
    producer = station.producer("b")
    producer.append(b"\x00\x01")
    await producer.close()
    chunks = await read_all(station.url, live="sse")  # base64 SSE events, decoded
    assert b"".join(chunks) == bytes(range(256)) + b"\x00\x01"


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_reader_resumes_after_restart(make_server, tmp_path: Path, live: str) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(
        f"sqlite:///{tmp_path / 'restart.db'}", "--long-poll-timeout-ms", "1000"
    )
    name = unique("restart")
    url = f"{server.url}/v1/stream/{name}"
    await create_stream(url)
    seen: list[Any] = []

    async def read() -> None:
        async with read_stream(url, live=live, retry=FAST_RETRY) as reader:  # type: ignore[arg-type]
            async for batch in reader:
                seen.extend(batch.items)

    async def produce() -> None:
        producer = IdempotentProducer(url, "steady", linger_ms=1, retry=FAST_RETRY)
        for i in range(150):
            producer.append(i)
            await asyncio.sleep(0.01)
        await producer.close()

    reading = asyncio.ensure_future(read())
    producing = asyncio.ensure_future(produce())

    async def midway() -> bool:
        return len(seen) >= 10

    await eventually(midway)
    assert len(seen) < 150  # the reader is in the middle of the stream
    await asyncio.to_thread(server.restart)  # kill -9, then start again on the same port
    await asyncio.wait_for(producing, 30)
    await asyncio.wait_for(reading, 30)
    assert seen == list(range(150))  # nothing lost, nothing twice, in order


# -- consumer groups --------------------------------------------------------------------------


async def test_consumer_group(client: Client) -> None:
    name = unique("cons")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many(
        [NewMessage({"n": i}, msg_id=f"m{i}", headers={"k": str(i)}) for i in range(25)]
    )
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as via_proxy:
        handled: list[int] = []
        async with via_proxy.station(name).consumer(
            "billing", consumer="w1", batch_size=10, max_msg_deliveries=3, ack_interval_ms=30
        ) as consumer:
            assert consumer.info is not None and consumer.info.created
            async for msg in consumer:
                n = msg.data["n"]
                assert msg.msg_id == f"m{n}" and msg.headers == {"k": str(n)}
                if n == 3 and msg.delivery_count == 1:
                    await msg.nack()  # comes again, delivery_count 2
                    continue
                if n == 4:
                    await msg.dead_letter("bad total")
                    continue
                if n == 5:
                    assert await msg.ack(wait=True) is True
                else:
                    await msg.ack()
                handled.append(n)
                if len(handled) == 24:
                    break
        acks = [p for m, p in proxy.requests if m == "POST" and p.endswith("/ack")]
        assert 1 <= len(acks) <= 10  # 24 acks, batched into a few requests
    assert sorted(handled) == [n for n in range(25) if n != 4]
    assert handled.count(3) == 1
    (group,) = await station.groups()
    assert group.name == "billing" and group.pending == 0 and group.in_flight == 0
    assert group.dead_lettered == 1 and group.max_msg_deliveries == 3

    page = await station.dead_letters(group="billing")
    (entry,) = page.entries
    assert entry.data == {"n": 4} and entry.reason == "dead_letter" and entry.error == "bad total"
    assert entry.msg_id == "m4" and page.next is None
    assert await station.replay_dead_letters([entry.id]) == 1
    async with station.consumer("billing", wait_ms=2000) as consumer:
        msg = await anext(consumer)
        assert msg.data == {"n": 4} and msg.delivery_count == 1
        await msg.dead_letter("still bad")
    assert await station.drop_dead_letters(all=True) == 1
    assert (await station.dead_letters()).entries == []
    changed = await station.ensure_group("billing", max_ack_time_ms=1000)
    assert not changed.created and changed.max_ack_time_ms == 1000
    latest = await station.ensure_group("latecomer", start_from="latest")
    assert latest.created and latest.pending == 0 and latest.lag == 0
    await station.delete_group("billing")
    assert [g.name for g in await station.groups()] == ["latecomer"]


async def test_consumer_close_gives_back_prefetched(client: Client) -> None:
    name = unique("giveback")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many(list(range(10)))
    first = station.consumer("g", consumer="a", batch_size=10)
    msg = await anext(first)
    await msg.ack()
    await first.close()  # flushes the ack, nacks the 9 unread ones
    second = station.consumer("g", consumer="b", batch_size=10, wait_ms=500)
    got = await second.fetch()
    assert sorted(m.data for m in got) == list(range(1, 10))  # long before the 30 s lease ends
    for m in got:
        await m.ack()
    await second.flush_acks()
    assert await got[0].ack(wait=True) is False  # already settled: the server did not know it
    await second.close()
    (group,) = await station.groups()
    assert group.pending == 0 and group.in_flight == 0


# -- interoperability with the reference server -----------------------------------------------


async def _interop_scenario(base: str) -> dict[str, Any]:
    name = unique("interop")
    url = f"{base}/v1/stream/{name}"
    await create_stream(url)
    async with FaultProxy(base) as proxy:
        proxy.drop_after = {3}
        proxy.reject_503 = {5: None}  # never reaches the server: later batches overtake it
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}", "interop", max_batch_bytes=64, retry=FAST_RETRY
        )
        for i in range(100):
            producer.append({"i": i, "s": "x" * (i % 7)})
        await producer.flush()
        fenced = IdempotentProducer(url, "interop", epoch=1)
        fenced.append("from epoch 1")
        await fenced.detach()
        claimer = IdempotentProducer(url, "interop", auto_claim=True)
        claimer.append("claimed")
        await claimer.flush()
        producer.append("zombie")
        with pytest.raises(ProducerFenced):
            await producer.flush()
        await producer.detach()
        final = await claimer.close("bye")
        assert final and final == await claimer.close()
    with pytest.raises(StreamClosed):
        await _append_after_close(url)
    return {
        "gaps": proxy.post_statuses.count(409),
        "dropped": proxy.dropped,
        "epoch": claimer.epoch,
        "catch-up": await read_all(url),
        "long-poll": await read_all(url, "long-poll"),
        "sse": await read_all(url, "sse"),
    }


async def _append_after_close(url: str) -> None:
    late = IdempotentProducer(url, "late")
    late.append("late")
    try:
        await late.flush()
    finally:
        await late.detach()


async def test_interop_with_reference_server(stations: Server, reference: str) -> None:
    ours = await _interop_scenario(stations.url)
    theirs = await _interop_scenario(reference)
    expected: list[Any] = [{"i": i, "s": "x" * (i % 7)} for i in range(100)]
    expected += ["from epoch 1", "claimed", "bye"]
    assert ours["catch-up"] == expected
    # Stations holds a request that is ahead of its turn until the missing one arrives; the
    # reference answers 409 at once, and the producer waits for the earlier batch and resends.
    assert ours.pop("gaps") == 0 and theirs.pop("gaps") > 0
    assert ours == theirs
    assert ours["epoch"] == 2 and ours["dropped"] == 1


# -- packaging --------------------------------------------------------------------------------


def test_import_is_light() -> None:
    code = (
        "import sys, stations.client\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic', "
        "'psycopg', 'apscheduler') or m.split('.')[:2] in (['stations', 'api'], "
        "['stations', 'store'], ['stations', 'domain'])]\n"
        "assert not heavy, heavy\n"
        "assert all(m == 'stations' or m.startswith('stations.client') "
        "for m in sys.modules if m.startswith('stations')), sorted(sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr


async def test_tokens(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        '{"tokens": [{"token": "admin-secret", "role": "admin"},'
        ' {"token": "consumer-secret", "role": "consumer"}]}'
    )
    server: Server = make_server(f"sqlite:///{tmp_path / 'auth.db'}", "--tokens", str(tokens))
    async with Client(server.url) as anonymous:
        with pytest.raises(Unauthorized) as denied:
            await anonymous.list_stations()
        assert denied.value.status == 401
    async with Client(server.url, token="admin-secret") as admin:
        await admin.create_station("secured")
        await admin.station("secured").produce({"n": 1})
    async with Client(server.url, token="consumer-secret") as consumer:
        station = consumer.station("secured")
        with pytest.raises(Forbidden) as forbidden:
            await station.produce({"n": 2})
        assert not isinstance(forbidden.value, ProducerFenced)
        producer = station.producer("p", content_type="application/json")
        producer.append({"n": 3})
        with pytest.raises(Forbidden):  # not retried, not mistaken for fencing
            await producer.flush()
        await producer.detach()
        assert await read_all_with(station) == [{"n": 1}]


async def read_all_with(station: Any) -> list[Any]:
    return [item async for batch in station.read() for item in batch.items]


def test_sync_facade(stations: Server) -> None:
    from stations.client.sync import SyncClient

    name = unique("sync")
    with SyncClient(stations.url) as client:
        assert client.create_station(name).created
        station = client.station(name)
        assert station.produce({"n": 0}, msg_id="zero").duplicate is False
        assert station.produce({"n": 0}, msg_id="zero").duplicate is True
        producer = station.producer("sync-p", max_buffered_bytes=64, max_batch_bytes=64)
        for n in range(1, 50):
            producer.wait_for_capacity()
            producer.append({"n": n})
        with pytest.raises(BufferFull):
            for _ in range(1000):  # without waiting, the bounded buffer fills up
                producer.append({"n": "x" * 10})
        producer.detach()
        with station.read() as reader:
            items = [item for batch in reader for item in batch.items]
        assert items[:50] == [{"n": n} for n in range(50)]
        with station.consumer("g", batch_size=5) as consumer:
            for msg in consumer:
                msg.ack()
                if msg.data == {"n": 49}:
                    break
        assert [g.pending for g in station.groups()] == [len(items) - 50]
        with pytest.raises(StationNotFound):
            client.get_station(unique("nothing"))


async def test_a_nack_whose_answer_was_lost_is_not_sent_again(client: Client) -> None:
    """The server nacked and the answer was lost: sent again, the nack could hit the lease
    another consumer took meanwhile (a review saw that consumer's work thrown away, and the
    message dead-lettered). It fails instead; the message comes again all the same."""
    name = unique("nack-once")
    await client.create_station(name)
    station = client.station(name)
    await station.produce({"n": 1})
    async with (
        FaultProxy(client.url) as proxy,
        Client(proxy.url) as via_proxy,
        via_proxy.station(name).consumer(
            "g", consumer="a", batch_size=1, max_msg_deliveries=5, ack_interval_ms=30
        ) as consumer,
    ):
        msg = await anext(consumer)
        # A message's nack settles its lease, through /api/transactions.
        nacks = [p for m, p in proxy.requests if p.endswith("/api/transactions")]
        proxy.drop_after = {proxy.posts + 1}  # the nack is carried out, its answer lost
        with pytest.raises(ConnectionFailed):
            await msg.nack()
        sent = [p for m, p in proxy.requests if p.endswith("/api/transactions")]
        assert len(sent) == len(nacks) + 1
    (group,) = await station.groups()
    assert group.pending == 1 and group.in_flight == 0  # the nack took: it waits again


async def test_a_message_whose_work_takes_long_extends_its_lease(client: Client) -> None:
    """``Message.extend()`` keeps a message past ``max_ack_time_ms`` (it was delivered again to
    another consumer meanwhile, so processed twice); its ``ack_deadline`` moves, a transaction
    settles it by the new one, and an expired lease is not extended."""
    name = unique("extend")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": 1}, {"n": 2}, {"n": 3}])
    async with (
        station.consumer("g", consumer="a", batch_size=3, max_ack_time_ms=1500) as a,
        station.consumer("g", consumer="b", batch_size=3, max_ack_time_ms=1500) as b,
    ):
        first, second, third = [await anext(a) for _ in range(3)]
        before = first.ack_deadline
        assert await first.extend(8000)
        assert await a.extend([second], 4000) == 1
        assert first.ack_deadline is not None and before is not None
        assert first.ack_deadline > before
        # The unextended third expires and goes to b; the first does not.
        again = await asyncio.wait_for(anext(b), 10)
        assert (again.offset, again.delivery_count) == (third.offset, 2)
        assert not await third.extend()  # a's lease of it expired
        async with a.transaction() as tx:  # by the lease's new deadline
            tx.ack(first)
        await again.ack(wait=True)
        # The second's extended lease runs out: it goes to b.
        late = await asyncio.wait_for(anext(b), 10)
        assert (late.offset, late.delivery_count) == (second.offset, 2)
        await late.ack(wait=True)
    (group,) = await station.groups()
    assert (group.pending, group.in_flight) == (0, 0)


async def test_extend_names_its_delivery_and_a_transaction_outlives_heartbeats(
    client: Client,
) -> None:
    """A worker whose lease expired does not extend the message's next delivery, though both
    consumers have one name (it answered True and moved the live lease's deadline, whose
    transaction was then refused); extensions while a transaction is built (a heartbeat)
    leave it valid (it was refused with 409, the lease still held)."""
    name = unique("extend-name")
    await client.create_station(name)
    station = client.station(name)
    await station.produce({"n": 1})
    async with (
        station.consumer("g", consumer="same", batch_size=1, max_ack_time_ms=1500) as a,
        station.consumer("g", consumer="same", batch_size=1, max_ack_time_ms=1500) as b,
    ):
        stale = await anext(a)
        live = await asyncio.wait_for(anext(b), 10)  # after stale's lease expired
        assert (live.offset, live.delivery_count) == (stale.offset, 2)
        assert not await stale.extend(5000)
        # Both deliveries in one call: the held one is extended, the stale one's deadline
        # stays (one request named both, and its answer could not tell them apart).
        stale_deadline, live_deadline = stale.ack_deadline, live.ack_deadline
        assert await b.extend([stale, live], 2000) == 1
        assert stale.ack_deadline == stale_deadline
        assert live.ack_deadline is not None and live_deadline is not None
        assert live.ack_deadline > live_deadline
        async with b.transaction() as tx:
            tx.ack(live)
            for _ in range(3):  # heartbeats while the work goes on, past the 1.5 s
                assert await live.extend(2000)
                await asyncio.sleep(0.6)
            tx.produce(name, {"done": 1})
    (group,) = await station.groups()
    assert (group.pending, group.in_flight) == (1, 0)  # the produced message waits
