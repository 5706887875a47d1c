"""SDK gaps a review listed, against real servers: DLS replay and drop of more ids than one
request takes, a read left by ``break`` holding its connection until garbage collection, a
token revoked while the client runs, and the ``createdAt`` preconditions and ``no_route`` in
both faces of the SDK (async and blocking) and in its blocking transport."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from stations.client import (
    BadRequest,
    Client,
    Conflict,
    NotFound,
    StationsError,
    Unauthorized,
    read_stream,
)
from stations.client.blocking import BlockingHttp
from stations.client.client import Station
from stations.client.retry import RetryPolicy
from stations.client.sync import SyncClient
from tests.harness import Server, wait_for_waiting_readers
from tests.test_sdk import unique

MAX_IDS = 10_000  # ids per DLS replay or drop request (the API's limit)
# Ids of no entry: the server skips them, so a list longer than one request costs no entries.
FILLER = [str(900_000_000_000 + i) for i in range(MAX_IDS)]
FAST_RETRY = RetryPolicy(initial_delay=0.02, max_delay=0.3, give_up_after=30)


def _own_server(workdir: Path, *args: str) -> Server:
    return Server(f"sqlite:///{workdir / 'stations.db'}", workdir, list(args)).start()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """SSE connections live their default minute here: a leaked one stays open for the test."""
    server = _own_server(tmp_path_factory.mktemp("sdk-review5"))
    yield server
    server.kill()


@pytest.fixture
async def client(srv: Server) -> AsyncIterator[Client]:
    async with Client(srv.url) as c:
        yield c


async def _dead_letters(client: Client, group: str, count: int, name: str = "") -> Station:
    """A station whose ``group`` has dead-lettered ``count`` messages."""
    name = name or unique("dls-chunks")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": i} for i in range(count)])
    consumer = station.consumer(group, consumer="w", batch_size=count)
    messages = await consumer.fetch(wait_ms=0)
    assert await consumer.dead_letter([m.offset for m in messages], "bad") == count
    await consumer.close()
    return station


async def _entry_ids(station: Station, group: str | None = None) -> list[str]:
    return [e.id for e in (await station.dead_letters(group=group, limit=1000)).entries]


# -- 1. DLS replay and drop: at most 10,000 ids a request -------------------------------------


async def test_more_ids_than_one_request_takes_are_sent_in_several(client: Client) -> None:
    """One request of 10,002 ids was refused whole (400 naming ``ids``): the SDK sends them
    10,000 at a time and adds up the answers, as ``stations dls replay`` does."""
    station = await _dead_letters(client, "g", 3)
    first, second, third = await _entry_ids(station)
    # one entry in each of the two requests
    assert await station.replay_dead_letters([first, *FILLER, second]) == 2
    assert await _entry_ids(station) == [third]
    assert await station.drop_dead_letters([*FILLER, third]) == 1
    assert await _entry_ids(station) == []


async def test_a_later_request_that_fails_says_what_the_earlier_ones_did(client: Client) -> None:
    """The second request's refusal named ``ids.1``, an index in that request, not in the
    caller's list, and hid that the first request had replayed its entries."""
    station = await _dead_letters(client, "g", 1)
    (entry,) = await _entry_ids(station)
    with pytest.raises(BadRequest) as refused:
        await station.replay_dead_letters([entry, *FILLER[1:], FILLER[0], "not-an-id"])
    assert refused.value.field == f"ids.{MAX_IDS + 1}"
    assert str(refused.value) == (
        f"ids.{MAX_IDS + 1} is not a DLS entry id; 1 of the first {MAX_IDS} ids were handled before"
    )
    assert await _entry_ids(station) == []  # the first request's entry was replayed


async def test_a_replay_of_listed_ids_keeps_to_the_group_named(client: Client) -> None:
    """``group`` went only with ``all=True``: with ids the SDK left it out, and entries of
    every group were replayed."""
    station = await _dead_letters(client, "a", 1)
    await _dead_letters(client, "b", 1, name=station.name)
    ids = await _entry_ids(station)
    assert len(ids) == 2
    assert await station.replay_dead_letters(ids, group="a") == 1
    assert await _entry_ids(station) == await _entry_ids(station, group="b") != []


def test_the_blocking_client_sends_long_id_lists_in_several_requests(srv: Server) -> None:
    with SyncClient(srv.url) as sync:
        name = unique("dls-chunks-sync")
        sync.create_station(name)
        station = sync.station(name)
        station.produce_many([{"n": 1}, {"n": 2}])
        consumer = station.consumer("g", consumer="w")
        assert consumer.dead_letter([m.offset for m in consumer.fetch(wait_ms=0)], "bad") == 2
        consumer.close()
        first, second = [e.id for e in station.dead_letters().entries]
        assert station.drop_dead_letters([first, *FILLER, second]) == 2
        assert station.dead_letters().entries == []


# -- 2. leaving a read with ``break`` releases its connection -----------------------------------


def _server_connections(server: Server) -> int:
    """TCP connections the server has established (its side: the local port is its own)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server.port and fields[3] == "01":
                count += 1
    return count


async def _eventually(condition: Callable[[], bool], what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["station.read", "read_stream"])
async def test_breaking_out_of_an_sse_read_closes_its_connection(
    srv: Server, client: Client, no_gc: None, how: str
) -> None:
    """``async for batch in station.read(live="sse"): break`` left the SSE response open
    (reader and generator held each other) until the garbage collector ran."""
    name = unique("break-sse")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": 1}, {"n": 2}])
    reader = (
        station.read(live="sse")
        if how == "station.read"
        else read_stream(station.url, live="sse", retry=FAST_RETRY)
    )
    during = 0
    async for batch in reader:
        assert batch.items == [{"n": 1}, {"n": 2}]
        during = _server_connections(srv)
        break
    del reader
    await _eventually(lambda: _server_connections(srv) < during, "the SSE connection is open")


async def test_a_connector_of_one_connection_is_free_again_after_a_break(
    srv: Server, no_gc: None
) -> None:
    """The same from the client's side: the one connection a session may have stayed taken,
    and the next request waited for it for ever."""
    connector = aiohttp.TCPConnector(limit=1)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        Client(srv.url, session=session) as client,
    ):
        name = unique("break-one")
        await client.create_station(name)
        station = client.station(name)
        await station.produce({"n": 1})
        async for _batch in station.read(live="sse"):
            break
        info = await asyncio.wait_for(client.get_station(name), 5)
        assert info.stats.messages == 1


def test_breaking_out_of_a_blocking_sse_read_closes_its_connection(
    srv: Server, no_gc: None
) -> None:
    with SyncClient(srv.url) as sync:
        name = unique("break-sync")
        sync.create_station(name)
        station = sync.station(name)
        station.produce({"n": 1})
        during = 0
        for _batch in station.read(live="sse"):
            during = _server_connections(srv)
            break
        deadline = time.monotonic() + 5
        while _server_connections(srv) >= during:
            assert time.monotonic() < deadline, "the SSE connection is open"
            time.sleep(0.02)


# -- 3. a token revoked while the client runs -------------------------------------------------


class _Tokens:
    """A server with ``--tokens`` (an admin token ``admin`` and another, ``worker``);
    ``revoke`` rewrites the file without a token and sends SIGHUP, returning once the server
    says it read the file again."""

    def __init__(self, workdir: Path) -> None:
        self.file = workdir / "tokens.json"
        self.admin, self.worker = (f"{who}-{uuid.uuid4().hex}" for who in ("admin", "worker"))
        self.secrets = {self.admin: "admin", self.worker: "admin"}
        self._write()
        self.server = _own_server(workdir, "--tokens", str(self.file), "--log-level", "info")

    def _write(self) -> None:
        listed = [{"token": t, "role": r} for t, r in self.secrets.items()]
        self.file.write_text(json.dumps({"tokens": listed}))

    def revoke(self, token: str) -> None:
        del self.secrets[token]
        self._write()
        line = f"SIGHUP: {len(self.secrets)} token(s) read from"
        before = self.server.log().count(line)
        assert self.server.proc is not None
        self.server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while self.server.log().count(line) == before:
            assert time.monotonic() < deadline, self.server.log()
            time.sleep(0.05)


async def _refused_at_once(call: Awaitable[object]) -> Unauthorized:
    """A 401 is no outage: retried, it would take the client's whole ``give_up_after``."""
    started = time.monotonic()
    with pytest.raises(Unauthorized) as refused:
        await asyncio.wait_for(call, 20)
    assert time.monotonic() - started < 5
    assert refused.value.status == 401
    return refused.value


async def test_a_revoked_token_is_refused_at_once_and_said_to_be(
    tmp_path: Path,
) -> None:
    """What waits (a live read) ends with the server's "revoked"; what comes after is not
    retried; and a 401 without a body (the HEAD a producer and an SSE reader send first) said
    only ``HEAD <url>: HTTP 401``, nothing of a token."""
    tokens = _Tokens(tmp_path)
    try:
        async with Client(tokens.server.url, token=tokens.worker, retry=FAST_RETRY) as c:
            name = unique("revoked")
            await c.create_station(name)
            station = c.station(name)
            waiting = asyncio.ensure_future(
                _refused_at_once(_drain(station.read(offset="now", live="long-poll")))
            )
            await asyncio.to_thread(wait_for_waiting_readers, tokens.server.url, 1, tokens.admin)
            await asyncio.to_thread(tokens.revoke, tokens.worker)
            assert "revoked" in str(await waiting)
            await _refused_at_once(c.get_station(name))
            producer = station.producer("p")
            producer.append({"n": 1})
            said = str(await _refused_at_once(producer.flush()))
            assert "token" in said and "refused" in said, said
            await _refused_at_once(_drain(station.read(live="sse")))  # HEAD first
        with BlockingHttp(tokens.server.url, tokens.worker, retry=FAST_RETRY) as http:
            started = time.monotonic()
            with pytest.raises(Unauthorized) as head:
                http.call("HEAD", f"/v1/stream/{name}")
            assert time.monotonic() - started < 5
            assert "token" in str(head.value) and "refused" in str(head.value), head.value
    finally:
        tokens.server.kill()


def test_a_revoked_token_stops_the_blocking_client_at_once(tmp_path: Path) -> None:
    tokens = _Tokens(tmp_path)
    try:
        with SyncClient(tokens.server.url, token=tokens.worker, retry=FAST_RETRY) as sync:
            name = unique("revoked-sync")
            sync.create_station(name)
            tokens.revoke(tokens.worker)
            started = time.monotonic()
            with pytest.raises(Unauthorized):
                sync.station(name).produce({"n": 1}, msg_id="m-1")
            with pytest.raises(Unauthorized):
                sync.get_station(name)
            assert time.monotonic() - started < 5
    finally:
        tokens.server.kill()


async def _drain(reader: AsyncIterator[object]) -> None:
    async for _batch in reader:
        pass


# -- 4. createdAt preconditions and no_route in both faces -----------------------------------


def test_the_blocking_client_sends_the_created_at_preconditions(srv: Server) -> None:
    with SyncClient(srv.url) as sync:
        name = unique("created-sync")
        old = sync.create_station(name)
        new = old
        while new.created_at == old.created_at:  # the same millisecond is the same station
            sync.delete_station(name)
            new = sync.create_station(name)
        with pytest.raises(Conflict) as patched:
            sync.patch_station(name, idempotency_window_ms=5_000, created_at=old.created_at)
        assert patched.value.field == "createdAt"
        with pytest.raises(Conflict) as deleted:
            sync.station(name).delete(created_at=old.created_at)
        assert deleted.value.field == "createdAt"
        assert sync.get_station(name).idempotency_window_ms == new.idempotency_window_ms
        changed = sync.patch_station(name, idempotency_window_ms=5_000, created_at=new.created_at)
        assert changed.idempotency_window_ms == 5_000
        sync.station(name).delete(created_at=new.created_at)
        assert name not in {s.name for s in sync.list_stations()}


def _no_route(exc: StationsError, path: str) -> None:
    assert not isinstance(exc, NotFound), type(exc)
    assert exc.status == 404 and exc.code == "no_route", (exc.status, exc.code)
    assert f"nothing is served at {path}" in str(exc)


async def test_no_route_is_no_missing_station_for_readers_and_consumers(srv: Server) -> None:
    async with Client(srv.url + "/prefix", retry=FAST_RETRY) as wrong:
        station = wrong.station("orders")
        with pytest.raises(StationsError) as read:
            await asyncio.wait_for(_drain(station.read(live="long-poll")), 10)
        _no_route(read.value, "/prefix/v1/stream/orders")
        consumer = station.consumer("g", retry=FAST_RETRY)
        with pytest.raises(StationsError) as fetched:
            await asyncio.wait_for(consumer.fetch(wait_ms=0), 10)
        _no_route(fetched.value, "/prefix/api/stations/orders/groups/g")
        await consumer.close()


def test_no_route_is_no_missing_station_in_the_blocking_face_and_transport(srv: Server) -> None:
    with SyncClient(srv.url + "/prefix") as sync:
        with pytest.raises(StationsError) as got:
            sync.get_station("orders")
        _no_route(got.value, "/prefix/api/stations/orders")
        with pytest.raises(StationsError) as deleted:
            sync.station("orders").delete(created_at="2026-01-01T00:00:00.000Z")
        _no_route(deleted.value, "/prefix/api/stations/orders")
    with BlockingHttp(srv.url + "/prefix", retry=FAST_RETRY) as http:
        with pytest.raises(StationsError) as called:
            http.call("GET", "/api/stations/orders")
        _no_route(called.value, "/prefix/api/stations/orders")
