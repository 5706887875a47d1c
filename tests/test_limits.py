"""The server cannot be pinned (issue 11): bounded memory for clients that never read, a
connection cap with a clear 503, head/body/idle timeouts against slow clients, producers and
``/healthz`` served while readers are at their cap, and one shared read per wake-up for many
long-poll readers. Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Server, metric

JSON = {"Content-Type": "application/json"}


def closed_by_reason(url: str) -> dict[str, float]:
    """``stations_connections_closed_total`` by reason, from ``/metrics``."""
    text = httpx.get(f"{url}/metrics").text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "stations_connections_closed"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _raise_own_nofile(need: int) -> None:
    """This test process opens many sockets: raise its own descriptor limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:
        pytest.fail(f"this test needs {need} file descriptors (hard limit {hard})")


class LimitedServer(Server):
    """A server whose process starts with RLIMIT_NOFILE soft = hard = ``nofile``."""

    nofile: int | None = None

    def _spawn(self, log) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
        import sys

        command = [sys.executable, "-m", "stations", "serve", "--port", str(self.port)]
        command += ["--db", self.db_url, *self.args]
        nofile = self.nofile

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        return subprocess.Popen(
            command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit
        )


@pytest.fixture
def spawn(tmp_path: Path):  # type: ignore[no-untyped-def]
    servers: list[Server] = []

    def make(db_url: str, *args: str, nofile: int | None = None) -> Server:
        server = LimitedServer(db_url, tmp_path, list(args))
        server.nofile = nofile
        servers.append(server.start())
        return server

    yield make
    for server in servers:
        server.kill()


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


# -- a minimal HTTP/1.1 client on raw sockets ----------------------------------------------------


class Conn:
    """One keep-alive connection; ``request`` sends and reads one response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        return cls(reader, writer)

    async def send(self, method: str, path: str, body: bytes = b"", **headers: str) -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if body or method in ("POST", "PUT"):
            head += f"Content-Length: {len(body)}\r\n"
        head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
        self.writer.write(head.encode() + b"\r\n" + body)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = b""
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        return status, headers, body

    async def request(
        self, method: str, path: str, body: bytes = b"", **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        await self.send(method, path, body, **headers)
        return await self.response()

    def close(self) -> None:
        self.writer.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> tuple[bool, bytes]:
    """(True, what came) if the server closed the connection within ``seconds``."""
    got = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionError:
        return True, got
    return False, got


def _tail(url: str, name: str) -> str:
    return httpx.head(f"{url}/v1/stream/{name}").headers["Stream-Next-Offset"]


# -- slow and idle clients ------------------------------------------------------------------------


async def test_slowloris_head_body_and_idle_connections_are_closed(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    server = spawn(
        sqlite_url(tmp_path),
        "--head-timeout-s", "1", "--body-timeout-s", "1.5", "--idle-timeout-s", "2",
    )  # fmt: skip
    httpx.put(f"{server.url}/v1/stream/slow", headers=JSON)

    async def head_trickler() -> tuple[bool, bytes]:
        seen = b""
        conn = await Conn.open(server.port)
        conn.writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # One header byte every 0.3 s: the head never completes.
        for i in range(40):
            try:
                conn.writer.write(b"X-Slow-%d: y\r\n" % i)
                await conn.writer.drain()
            except ConnectionError:
                break
            closed, got = await closed_within(conn.reader, 0.3)
            seen += got
            if closed:
                return True, seen
        return False, seen

    async def body_trickler() -> tuple[bool, bytes]:
        seen = b""
        conn = await Conn.open(server.port)
        conn.writer.write(
            b"POST /v1/stream/slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n["
        )
        for _ in range(40):
            try:
                conn.writer.write(b" ")
                await conn.writer.drain()
            except ConnectionError:
                break
            closed, got = await closed_within(conn.reader, 0.3)
            seen += got
            if closed:
                return True, seen
        return False, seen

    async def idler() -> tuple[bool, bytes]:
        conn = await Conn.open(server.port)
        return await closed_within(conn.reader, 8)

    started = time.monotonic()
    heads = [asyncio.create_task(head_trickler()) for _ in range(20)]
    bodies = [asyncio.create_task(body_trickler()) for _ in range(5)]
    idle = [asyncio.create_task(idler()) for _ in range(5)]
    await asyncio.sleep(0.5)
    # The server keeps answering while they hold their connections.
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.url}/healthz")).status_code == 200
    head_results = await asyncio.gather(*heads)
    body_results = await asyncio.gather(*bodies)
    idle_results = await asyncio.gather(*idle)
    assert all(closed for closed, _ in head_results), "slow heads were not closed"
    assert all(b" 408 " in got for _, got in head_results)
    assert all(closed for closed, _ in body_results), "slow bodies were not closed"
    for _, got in body_results:
        assert b" 408 " in got.split(b"\r\n", 1)[0], got[:200]
        assert b'"request_timeout"' in got
    assert all(closed for closed, _ in idle_results), "idle connections were not closed"
    assert time.monotonic() - started < 12
    # Nothing of the unfinished appends was stored.
    assert httpx.get(f"{server.url}/v1/stream/slow?offset=-1").json() == []
    # Each timeout closes its connection cleanly (a head timeout logged an AttributeError).
    assert "Traceback" not in server.log(), server.log()
    # Each is counted by its reason (they were in no request's count). An idle connection
    # closed by the keep-alive timeout is no refusal.
    closed = closed_by_reason(server.url)
    assert closed["head_timeout"] == 20 and closed["body_timeout"] == 5, closed
    assert closed["max_connections"] == closed["malformed"] == closed["send_timeout"] == 0


async def test_a_body_timeout_after_the_answer_closes_the_connection_quietly(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """The review of 2026-11-29: a request answered without its body being read (a 413 for a
    body declared too large, a 404, a long-poll that carried a Content-Length) left aiohttp
    reading the body to drop it; when the body timeout fell meanwhile, the server logged
    "Unhandled exception" at ERROR with a traceback, which any client could fill the log with."""
    server = spawn(sqlite_url(tmp_path), "--body-timeout-s", "1", "--long-poll-timeout-ms", "300")
    httpx.put(f"{server.url}/v1/stream/j", headers=JSON)
    heads = {
        b"413": b"POST /v1/stream/j HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 67108865\r\n",
        b"404": b"POST /no/such/route HTTP/1.1\r\nContent-Length: 10\r\n",
        b"204": b"GET /v1/stream/j?offset=now&live=long-poll HTTP/1.1\r\nContent-Length: 10\r\n",
    }
    for status, head in heads.items():
        conn = await Conn.open(server.port)
        conn.writer.write(head + b"Host: 127.0.0.1\r\n\r\n")
        closed, got = await closed_within(conn.reader, 5)
        conn.writer.close()
        assert closed, got
        assert got.split(b"\r\n", 1)[0].split()[1] == status, got[:300]
    log = server.log()
    assert "Unhandled exception" not in log and "Traceback" not in log, log
    assert httpx.get(f"{server.url}/healthz").status_code == 200


# -- the connection cap and the waiting-reader cap ------------------------------------------------


async def _refused_head(server: Server, head: bytes) -> tuple[bytes, bytes]:
    """Send ``head`` on a connection of its own: the answer's head and body, once the server
    answered 400 and closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(head)
    closed, got = await closed_within(reader, 5)
    writer.close()
    assert closed, got
    status_line, _, body = got.partition(b"\r\n\r\n")
    assert b" 400 " in status_line.split(b"\r\n")[0], got
    return status_line, body


async def test_malformed_request_heads_get_a_json_400_and_no_traceback(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """aiohttp refuses what it cannot parse before any handler runs: the answer was plain text
    and each one logged a traceback at ERROR, which any client could fill the log with."""
    server = spawn(sqlite_url(tmp_path), "--log-level", "info")
    heads = [
        b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"POST /v1/stream/x HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    ]
    for head in heads:
        status_line, body = await _refused_head(server, head)
        assert b"application/json" in status_line, status_line
        assert json.loads(body)["error"]["code"] == "bad_request"
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log
    assert log.count("refused a malformed request") == len(heads)
    assert closed_by_reason(server.url)["malformed"] == len(heads)


async def test_a_malformed_head_is_refused_without_repeating_its_bytes(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """aiohttp's parse errors quote the line they stopped at: a malformed Authorization line
    (or a bad byte in a query holding a token) came back in the 400's body and in the INFO
    log, bearer token and all (found by a review)."""
    server = spawn(sqlite_url(tmp_path), "--log-level", "info")
    secret = b"s3cret-t0ken-xyz"
    heads = [
        b"GET /api/stations HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer " + secret + b"\r\n\r\n",
        b"GET /api/stations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + secret
        + b"\rX\r\n\r\n",
        b"GET /api/stations?token=" + secret + b"&a=\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/stations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + b"\r\n"
        b" folded\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + b"\r\n"
        b"Content-Length: 1x\r\n\r\n",
        b"GET http://?token=" + secret + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    for head in heads:
        _, body = await _refused_head(server, head)
        message = json.loads(body)["error"]["message"]
        assert message.startswith("malformed request") and secret.decode() not in message, body
    log = server.log()
    assert log.count("refused a malformed request") == len(heads), log
    assert secret.decode() not in log, log


async def test_a_waiting_client_that_leaves_gives_back_its_slot_and_leases_nothing(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """aiohttp does not cancel a handler whose client left unless told: a long-poll, SSE or
    parked fetch kept its waiting-reader slot until its wait ran out (30 s, 60 s, up to 300 s),
    and the fetch leased the next message for no one: with maxMsgDeliveries 1 it went to the
    DLS never received (found by a review)."""
    server = spawn(sqlite_url(tmp_path), "--max-waiting-readers", "3")
    http = httpx.Client(base_url=server.url, timeout=10)
    http.put("/v1/stream/s", headers=JSON)
    tail = _tail(server.url, "s")
    assert http.put("/api/stations/s/groups/g", json={"maxMsgDeliveries": 1}).status_code == 201
    waits = [
        ("GET", f"/v1/stream/s?offset={tail}&live=long-poll", b""),
        ("GET", f"/v1/stream/s?offset={tail}&live=sse", b""),
        ("POST", "/api/stations/s/groups/g/fetch", b'{"max": 1, "waitMs": 60000}'),
    ]
    for method, path, body in waits:
        conn = await Conn.open(server.port)
        extra = {"Content_Type": "application/json"} if body else {}
        await conn.send(method, path, body, **extra)
        await asyncio.sleep(0.3)
        conn.close()
    deadline = time.monotonic() + 3
    while metric(server.url, "stations_waiting_readers") != 0:
        assert time.monotonic() < deadline, "the slots of clients that left are still taken"
        await asyncio.sleep(0.05)
    http.post("/api/stations/s/messages", json={"messages": [{"id": "m1", "data": 1}]})
    got = http.post("/api/stations/s/groups/g/fetch", json={"max": 1}).json()["messages"]
    assert [(m["id"], m["deliveryCount"]) for m in got] == [("m1", 1)]
    assert http.get("/api/stations/s/dls").json()["entries"] == []
    # A client that left is not a server error in the request metrics (it was a 500).
    requests = [
        line for line in http.get("/metrics").text.splitlines()
        if line.startswith("stations_http_requests_total{")
    ]  # fmt: skip
    assert not any('status="500"' in line for line in requests), requests
    assert any('status="499"' in line for line in requests), requests
    http.close()


def test_a_reader_without_a_slot_is_answered_when_what_it_asks_for_is_there(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """A long-poll or a group fetch was refused (503) whenever the waiting-reader slots were
    taken, though its data was ready: readers holding the slots re-asked within milliseconds
    of each answer and kept them, and the others got 503 on every try, for good (found by a
    review with the TS client). Without a slot, one that would not wait is answered; one that
    would wait (and an SSE connection) is still refused."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.harness import wait_for_waiting_readers

    server = spawn(sqlite_url(tmp_path), "--max-waiting-readers", "1")
    http = httpx.Client(base_url=server.url, timeout=20)
    assert http.put("/v1/stream/s", headers=JSON).status_code == 201
    assert http.put("/api/stations/s/groups/g", json={}).status_code == 201
    assert http.post("/v1/stream/s", content=b'{"a":1}', headers=JSON).status_code == 204
    tail = _tail(server.url, "s")
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url, timeout=40) as other:
        parked = pool.submit(other.get, f"/v1/stream/s?offset={tail}&live=long-poll")
        wait_for_waiting_readers(server.url, 1)  # it holds the only slot
        ready = http.get("/v1/stream/s?offset=-1&live=long-poll")
        assert ready.status_code == 200, ready.text
        assert ready.json() == [{"a": 1}]
        fetched = http.post("/api/stations/s/groups/g/fetch", json={"max": 1, "waitMs": 5000})
        assert fetched.status_code == 200, fetched.text
        assert [m["data"] for m in fetched.json()["messages"]] == [{"a": 1}]
        for method, path, body in (
            ("GET", f"/v1/stream/s?offset={tail}&live=long-poll", None),
            ("GET", f"/v1/stream/s?offset={tail}&live=sse", None),
            ("POST", "/api/stations/s/groups/g/fetch", {"max": 1, "waitMs": 5000}),
        ):
            refused = http.request(method, path, json=body)
            assert refused.status_code == 503, (path, refused.text)
            assert refused.json()["error"]["code"] == "overloaded"
        # A fetch that asks for no wait needs no slot: an empty page.
        empty = http.post("/api/stations/s/groups/g/fetch", json={"max": 1})
        assert empty.status_code == 200 and empty.json()["messages"] == []
        # A refused long-poll does not renew a TTL stream (it kept one alive, a write each).
        made = http.put("/v1/stream/t", headers={**JSON, "Stream-TTL": "1"})
        assert made.status_code == 201
        at = made.headers["Stream-Next-Offset"]
        deadline = time.monotonic() + 10
        while (r := http.get(f"/v1/stream/t?offset={at}&live=long-poll")).status_code == 503:
            assert time.monotonic() < deadline, "refused long-polls kept the stream alive"
            time.sleep(0.2)
        assert r.status_code == 404, r.text
        assert http.post("/v1/stream/s", content=b'{"a":2}', headers=JSON).status_code == 204
        assert parked.result(timeout=20).json() == [{"a": 2}]
    http.close()


async def test_a_read_refused_for_want_of_read_budget_is_a_503(tmp_path: Path) -> None:
    """A read that waited in vain for room in the read budget (pages other readers hold, here
    the budget's count set as they would leave it) is refused with 503 and Retry-After: it was
    a 500 "internal", the error middleware catching the refusal before the middleware that
    answers it (found by a review)."""
    from aiohttp.test_utils import TestClient, TestServer

    from stations.api import make_app
    from stations.domain.service import Service

    svc = Service(sqlite_url(tmp_path), read_budget_bytes=1 << 20)
    async with TestClient(TestServer(make_app(svc))) as client:
        r = await client.put("/v1/stream/s", data=b"x", headers={"Content-Type": "text/plain"})
        assert r.status == 201
        svc.budget.wait_s = 0.2
        svc.budget.used = svc.budget.limit  # held by readers that do not read
        r = await client.get("/v1/stream/s", params={"offset": "-1"})
        assert r.status == 503, await r.text()
        assert r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["code"] == "overloaded"
        svc.budget.used = 0


async def test_an_sse_stream_refused_read_budget_midway_ends_cleanly(tmp_path: Path) -> None:
    """Past its headers an SSE response cannot become a 503: a read refused for want of budget
    wrote a second HTTP response into the event stream (found by a review). It ends the stream
    instead; the client reconnects as at the stream's lifetime."""
    from aiohttp.test_utils import TestClient, TestServer

    from stations.api import make_app
    from stations.domain.service import Service

    svc = Service(sqlite_url(tmp_path), read_budget_bytes=1 << 20)
    async with TestClient(TestServer(make_app(svc))) as client:
        r = await client.put("/v1/stream/s", data=b"x", headers={"Content-Type": "text/plain"})
        assert r.status == 201
        sse = await client.get("/v1/stream/s", params={"offset": "-1", "live": "sse"})
        assert sse.status == 200
        assert b"upToDate" in await sse.content.readuntil(b"upToDate")
        svc.budget.wait_s = 0.2
        svc.budget.used = svc.budget.limit  # pages held by readers that do not read
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": "text/plain"})
        assert r.status in (200, 204)
        rest = await asyncio.wait_for(sse.content.read(), 10)  # the stream ends
        assert b"HTTP/1.1" not in rest and b"overloaded" not in rest, rest
        svc.budget.used = 0


async def test_pages_of_messages_larger_than_a_grant_stay_within_the_read_budget(
    tmp_path: Path,
) -> None:
    """A page holds at least one message, so one larger than the read's grant came in whole
    and was charged past the budget: six readers not reading a 30 MiB message held 126 MB of
    a 16 MiB budget (found by a review). Now the rest waits for room like any read; a message
    larger than the whole budget is read only when nothing else is held."""
    import gc

    from stations.domain.budget import Overloaded
    from stations.domain.log import AppendRequest
    from stations.domain.service import Service

    svc = Service(sqlite_url(tmp_path), read_budget_bytes=8 << 20)
    await svc.start()
    try:
        await svc.create_station({"name": "s", "contentType": "text/plain"})
        await svc.append(AppendRequest("s", "text/plain", [b"y" * (12 << 20)]))
        svc.budget.wait_s = 0.3
        # Two readers at once: both get a 4 MiB grant before either page is read.
        tasks = [asyncio.ensure_future(svc.read("s", 0, max_bytes=4 << 20)) for _ in range(2)]
        await asyncio.wait(tasks)
        failed = [t.exception() for t in tasks if t.exception() is not None]
        assert [type(e) for e in failed] == [Overloaded]
        (page,) = [t.result() for t in tasks if t.exception() is None]
        assert sum(map(len, page.parts)) == 12 << 20
        assert svc.budget.used == 12 << 20  # alone: allowed past the budget, once
        del page, tasks, failed
        gc.collect()
        assert svc.budget.used == 0
        again = await svc.read("s", 0, max_bytes=4 << 20)
        assert sum(map(len, again.parts)) == 12 << 20
    finally:
        await svc.close()


async def test_a_read_waiting_for_a_whole_large_message_holds_back_no_other_read() -> None:
    """A read that needs room for all of a large message may wait its whole time; the reads
    queued behind it waited with it, and were refused too (found by a review)."""
    from stations.domain.budget import ByteBudget

    budget = ByteBudget(8 << 20, wait_s=2)
    budget.used = 6 << 20  # pages others hold
    large = asyncio.ensure_future(budget.take(12 << 20, whole=True))
    await asyncio.sleep(0.05)
    assert not large.done()
    small = await asyncio.wait_for(budget.take(1 << 20), 0.5)  # room for it: at once
    assert small == 1 << 20
    budget.give(small)
    budget.give(6 << 20)  # the others' pages go: the large read gets all it needs
    assert await asyncio.wait_for(large, 1) == 12 << 20
    assert budget.used == 12 << 20


async def test_an_idle_sse_reader_holds_no_page_of_the_read_budget(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """A caught-up SSE reader waits for minutes: its last page (and the events built from it)
    stayed charged to the read budget for the whole SSE lifetime, so a few idle readers of
    big streams left no budget for anyone (found by a review)."""
    server = spawn(sqlite_url(tmp_path), "--read-budget-mb", "16")
    headers = {"Content-Type": "text/plain"}
    r = httpx.put(f"{server.url}/v1/stream/big", content=b"y" * (3 << 20), headers=headers)
    assert r.status_code == 201
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v1/stream/big?offset=-1&live=sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    got = b""
    while b'"upToDate":true' not in got:
        got += await asyncio.wait_for(reader.read(1 << 20), 10)
    await asyncio.sleep(0.3)
    assert metric(server.url, "stations_waiting_readers") == 1  # still there, waiting
    assert metric(server.url, "stations_read_budget_used_bytes") == 0
    writer.close()


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_a_stream_with_a_live_reader_does_not_expire(
    spawn: Callable[..., Server], tmp_path: Path, live: str
) -> None:
    """PROTOCOL.md §5.1: a live read resets the TTL when it begins, so a stream with active
    live readers does not expire. The TTL was reset only when the wait ended: a 2 s stream
    expired under a 4 s long-poll, which then answered 404 (found by a review)."""
    server = spawn(
        sqlite_url(tmp_path), "--long-poll-timeout-ms", "4000", "--sse-lifetime-ms", "4000"
    )
    url = f"{server.url}/v1/stream/short"
    assert httpx.put(url, headers={**JSON, "Stream-TTL": "2"}).status_code == 201
    tail = _tail(server.url, "short")
    began = time.monotonic()
    r = await asyncio.to_thread(httpx.get, url, params={"offset": tail, "live": live}, timeout=15)
    assert r.status_code in (200, 204), r.text
    assert time.monotonic() - began >= 3.5  # it waited out its whole time
    assert httpx.head(url).status_code == 200  # and the stream lives on


async def test_connection_cap_answers_503_and_readers_leave_room(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    server = spawn(
        sqlite_url(tmp_path),
        "--max-connections", "30", "--max-waiting-readers", "10",
        "--long-poll-timeout-ms", "10000",
    )  # fmt: skip
    httpx.put(f"{server.url}/v1/stream/cap", headers=JSON)
    tail = _tail(server.url, "cap")
    readers = [await Conn.open(server.port) for _ in range(15)]
    for conn in readers:
        await conn.send("GET", f"/v1/stream/cap?offset={tail}&live=long-poll")
    await asyncio.sleep(1)
    # Readers beyond the waiting-reader cap get a JSON 503 with Retry-After, at once.
    refused = []
    for conn in readers:
        with contextlib.suppress(TimeoutError):
            refused.append(await asyncio.wait_for(conn.response(), 0.2))
    assert len(refused) == 5, refused
    for status, headers, body in refused:
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(body)["error"]["code"] == "overloaded"
    # A producer and /healthz still get through while the readers wait.
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.url}/healthz")).status_code == 200
        posted = await client.post(f"{server.url}/v1/stream/cap", json={"n": 1})
        assert posted.status_code in (200, 204)
    # Fill the connections: beyond 30, a new one is answered 503 (JSON) and closed.
    idle = [await Conn.open(server.port) for _ in range(30)]
    beyond = await Conn.open(server.port)
    status, headers, body = await asyncio.wait_for(beyond.request("GET", "/healthz"), 5)
    assert status == 503
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    assert headers["connection"] == "close"
    for conn in idle + readers + [beyond]:
        conn.close()
    # The waiting readers that were served saw the message.
    await asyncio.sleep(0.5)
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert closed_by_reason(server.url)["max_connections"] == 1


async def test_1000_readers_at_nofile_1024_leave_producer_and_health_through(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    _raise_own_nofile(4096)
    server = spawn(sqlite_url(tmp_path), "--long-poll-timeout-ms", "30000", nofile=1024)
    httpx.put(f"{server.url}/v1/stream/many", headers=JSON)
    tail = _tail(server.url, "many")

    async def reader() -> tuple[int, bytes]:
        try:
            conn = await Conn.open(server.port)
            status, _, body = await asyncio.wait_for(
                conn.request("GET", f"/v1/stream/many?offset={tail}&live=long-poll"), 45
            )
            conn.close()
            return status, body
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            return -1, repr(exc).encode()

    tasks = []
    for _ in range(20):  # 50 at a time: a burst beyond the cap is refused 64 at a time
        tasks += [asyncio.create_task(reader()) for _ in range(50)]
        await asyncio.sleep(0.1)
    await asyncio.sleep(3)  # every reader connected (or refused)
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(f"{server.url}/healthz")
        assert health.status_code == 200
        for i in range(3):
            posted = await client.post(f"{server.url}/v1/stream/many", json={"i": i})
            assert posted.status_code in (200, 204)
    results = await asyncio.gather(*tasks)
    served = [body for status, body in results if status == 200]
    refused = [body for status, body in results if status == 503]
    assert len(served) + len(refused) == 1000, [r for r in results if r[0] not in (200, 503)][:3]
    for body in served:
        assert json.loads(body)[0] == {"i": 0}
    for body in refused:
        assert json.loads(body)["error"]["code"] in ("overloaded", "too_many_connections")
    assert len(served) >= 700, (len(served), len(refused))


# -- memory: clients that ask for pages and never read ---------------------------------------------


async def test_200_non_reading_clients_keep_rss_bounded(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """Each asks for a 4 MB catch-up page and reads nothing: RSS stays under 300 MB."""
    _raise_own_nofile(1024)
    server = spawn(sqlite_url(tmp_path))
    assert server.proc is not None
    pid = server.proc.pid
    httpx.put(f"{server.url}/v1/stream/big", headers=JSON)
    value = "x" * (64 * 1024)
    with httpx.Client(timeout=30) as client:
        for _ in range(8):
            batch = json.dumps([value] * 16)  # 1 MB per append, 8 MB in all
            assert client.post(
                f"{server.url}/v1/stream/big", content=batch, headers=JSON
            ).is_success
    baseline = rss_mb(pid)

    socks = []
    loop = asyncio.get_running_loop()
    for _ in range(200):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that never reads
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", server.port))
        await loop.sock_sendall(
            sock, b"GET /v1/stream/big?offset=-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        socks.append(sock)
    peak = baseline
    for _ in range(60):  # 15 s
        await asyncio.sleep(0.25)
        peak = max(peak, rss_mb(pid))
    peak = max(peak, rss_mb(pid, "VmHWM"))
    # Meanwhile the server serves others.
    async with httpx.AsyncClient(timeout=15) as client:
        assert (await client.get(f"{server.url}/healthz")).status_code == 200
    for sock in socks:
        sock.close()
    await asyncio.sleep(2)
    after = rss_mb(pid)
    print(f"RSS baseline {baseline:.0f} MB, peak {peak:.0f} MB, after close {after:.0f} MB")
    assert peak < 300, f"peak RSS {peak:.0f} MB (baseline {baseline:.0f} MB)"
    assert after < 300
    # A reader that reads gets the whole stream.
    with httpx.Client(timeout=30) as client:
        got, offset = 0, "-1"
        while True:
            r = client.get(f"{server.url}/v1/stream/big?offset={offset}")
            assert r.status_code == 200, (r.status_code, r.text[:300])
            got += len(r.json())
            offset = r.headers["Stream-Next-Offset"]
            if r.headers.get("Stream-Up-To-Date") == "true":
                break
        assert got == 128


# -- wake-ups: 1,000 long-poll readers on PostgreSQL ------------------------------------------------


PRODUCER = """
import json, sys, time
import httpx
url, count, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
latencies = []
with httpx.Client(timeout=30) as client:
    began = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, began + i / rate - time.monotonic()))
        sent = time.monotonic()
        r = client.post(url, json={"i": i})
        latencies.append(time.monotonic() - sent)
        assert r.status_code in (200, 204), r.status_code
    achieved = count / (time.monotonic() - began)
print(json.dumps([achieved, latencies]))
"""


@pytest.mark.parametrize("read", ["browse", "fetch", "dls"])
async def test_management_reads_that_are_not_read_keep_to_the_read_budget(
    spawn: Callable[..., Server], tmp_path: Path, read: str
) -> None:
    """60 clients ask for a page of 256 kB messages through the management API (browse, a
    group fetch, the DLS list) and read nothing. Only stream reads counted in the read budget:
    each of these answers (up to 8 MB) was held, uncounted, until the send timeout (a review
    saw 1.5 GB of RSS for 60, with an 8 MB budget). Now they are counted, and the pages of
    the next ones shrink or wait (and the stalled connections are closed) while it is spent."""
    _raise_own_nofile(1024)
    server = spawn(sqlite_url(tmp_path), "--read-budget-mb", "8")
    assert server.proc is not None
    pid = server.proc.pid
    value = "x" * (256 * 1024)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/api/stations", json={"name": "big"}).status_code == 201
        for _ in range(40):  # 10 MB in all: more than one page of any of the three
            message = {"data": value}
            produced = client.post("/api/stations/big/messages", json={"messages": [message]})
            assert produced.status_code in (200, 201), produced.text
        if read == "dls":
            assert client.put("/api/stations/big/groups/g", json={}).status_code == 201
            offsets: list[str] = []
            while len(offsets) < 40:  # a fetch carries up to 8 MB
                got = client.post("/api/stations/big/groups/g/fetch", json={"max": 40}).json()
                assert got["messages"], offsets
                offsets += [m["offset"] for m in got["messages"]]
            dead = client.post("/api/stations/big/groups/g/dead-letter", json={"offsets": offsets})
            assert dead.status_code == 200, dead.text
        if read == "fetch":  # a group each: every fetch finds the whole station waiting
            for k in range(60):
                assert client.put(f"/api/stations/big/groups/f{k}", json={}).status_code == 201
    baseline = rss_mb(pid)

    def request(k: int) -> bytes:
        host = b"Host: 127.0.0.1\r\n"
        if read == "browse":
            return b"GET /api/stations/big/messages?offset=-1&limit=1000 HTTP/1.1\r\n%s\r\n" % host
        if read == "dls":
            return b"GET /api/stations/big/dls?limit=1000 HTTP/1.1\r\n%s\r\n" % host
        body = b'{"max": 1000}'
        head = f"POST /api/stations/big/groups/f{k}/fetch HTTP/1.1\r\n".encode() + host
        head += b"Content-Type: application/json\r\n"
        return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    socks = []
    loop = asyncio.get_running_loop()
    held = 0.0
    try:
        for k in range(60):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that never reads
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", server.port))
            await loop.sock_sendall(sock, request(k))
            socks.append(sock)
        peak = baseline
        for _ in range(24):  # 6 s
            await asyncio.sleep(0.25)
            peak = max(peak, rss_mb(pid))
            held = max(held, metric(server.url, "stations_read_budget_used_bytes"))
        peak = max(peak, rss_mb(pid, "VmHWM"))
        async with httpx.AsyncClient(timeout=15) as client:
            assert (await client.get(f"{server.url}/healthz")).status_code == 200
    finally:
        for sock in socks:
            sock.close()
    print(f"{read}: RSS baseline {baseline:.0f} MB, peak {peak:.0f} MB, budget held {held:.0f}")
    assert held > 0, "the answers were not counted in the read budget"
    assert peak - baseline < 150, f"RSS grew {peak - baseline:.0f} MB (baseline {baseline:.0f})"


async def test_a_burst_of_fetches_within_the_read_budget_each_get_their_whole_page(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """20 consumers fetch at once, 2 MB each, with 64 MB of budget: every answer is whole.
    (Reserving the most an answer may take, 8 MB, as each lease was queued left the later
    fetches of such a burst one message each, the budget far from used.)"""
    server = spawn(sqlite_url(tmp_path), "--read-budget-mb", "64")
    value = "x" * (100 * 1024)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.post("/api/stations", json={"name": "burst"})).status_code == 201
        messages = [{"data": value} for _ in range(20)]
        produced = await client.post("/api/stations/burst/messages", json={"messages": messages})
        assert produced.status_code in (200, 201), produced.text
        for k in range(20):
            assert (await client.put(f"/api/stations/burst/groups/b{k}", json={})).is_success

        async def fetch(k: int) -> int:
            answer = await client.post(f"/api/stations/burst/groups/b{k}/fetch", json={"max": 20})
            return len(answer.json()["messages"])

        assert await asyncio.gather(*(fetch(k) for k in range(20))) == [20] * 20


async def test_1000_long_poll_readers_on_postgresql_see_every_message_at_50_per_s(
    spawn: Callable[..., Server], pg_url: str
) -> None:
    """A producer offering 50 msg/s beside 1,000 long-poll readers keeps that rate, and every
    reader sees every message (before: about 2 msg/s, each append answering all 1,000 readers)."""
    _raise_own_nofile(4096)
    server = spawn(pg_url, "--long-poll-timeout-ms", "20000")
    httpx.put(f"{server.url}/v1/stream/fan", headers=JSON)
    start = _tail(server.url, "fan")
    count, rate = 400, 50.0  # 8 s of producing
    answers = 0
    # Readers read until they have everything, or until 10 s after the producer ended: a
    # deadline from their own start ran out once while a loaded box held the producer to
    # 16 msg/s (25 s), and the readers' prefixes were reported as missed messages.
    stop_at = time.monotonic() + 300

    async def reader() -> list[int]:
        nonlocal answers
        seen: list[int] = []
        conn = await Conn.open(server.port)
        offset = start
        while len(seen) < count and time.monotonic() < stop_at:
            status, headers, body = await conn.request(
                "GET", f"/v1/stream/fan?offset={offset}&live=long-poll"
            )
            assert status in (200, 204), (status, body[:200])
            if status == 200:
                seen += [m["i"] for m in json.loads(body)]
                answers += 1
            offset = headers["stream-next-offset"]
        conn.close()
        return seen

    readers = []
    for _ in range(10):
        readers += [asyncio.create_task(reader()) for _ in range(100)]
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)
    reads_before = metric(server.url, "stations_read_transactions_total")

    # The producer runs in a process of its own: in this one it would wait for the GIL behind
    # the 1,000 readers' loop, and measure the test client rather than the server.
    producer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PRODUCER,
        f"{server.url}/v1/stream/fan",
        str(count),
        str(rate),
        stdout=subprocess.PIPE,
    )
    out, _ = await producer.communicate()
    stop_at = time.monotonic() + 10
    assert producer.returncode == 0, out
    achieved, latencies = json.loads(out)
    latencies.sort()
    p50, p99 = (1000 * latencies[int(q * (len(latencies) - 1))] for q in (0.5, 0.99))
    results = await asyncio.gather(*readers)
    reads = metric(server.url, "stations_read_transactions_total") - reads_before
    print(
        f"producer {achieved:.1f} msg/s offered {rate} (append p50 {p50:.0f} ms, p99 {p99:.0f} "
        f"ms); {answers} answers with data, {reads:.0f} read transactions"
    )
    assert all(seen == list(range(len(seen))) for seen in results), "a reader missed messages"
    assert all(len(seen) == count for seen in results), "a reader was still behind after 10 s"
    # The producer is paced to 50 msg/s; with every reader's read its own it fell to about 2.
    # Half the rate is the floor here: the suite's three workers on two cores held it to 34 at
    # times (the producer alone reached only 65 msg/s on such a box, see the README).
    assert achieved >= 0.5 * rate, f"producer reached {achieved:.1f} msg/s of {rate}"
    # One append wakes 1,000 readers: their reads are shared, not one each (before: at least
    # one per reader and message).
    assert reads < count * 10, f"{reads:.0f} read transactions for {count} messages"


async def test_many_sse_readers_get_every_message_in_fewer_events(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """Beyond 64 readers of a station, answers are paced: 150 SSE readers each receive every
    message, in order, in fewer data events than appends (before: one event per append each)."""
    _raise_own_nofile(1024)
    server = spawn(sqlite_url(tmp_path), "--long-poll-timeout-ms", "20000")
    httpx.put(f"{server.url}/v1/stream/sse", headers=JSON)
    start = _tail(server.url, "sse")
    count, readers_n = 60, 150

    async def reader() -> tuple[list[int], int]:
        seen: list[int] = []
        events = 0
        conn = await Conn.open(server.port)
        await conn.send("GET", f"/v1/stream/sse?offset={start}&live=sse")
        head = await conn.reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0], head
        kind = ""
        deadline = time.monotonic() + 20
        while len(seen) < count and time.monotonic() < deadline:
            line = await asyncio.wait_for(conn.reader.readline(), deadline - time.monotonic())
            text = line.decode().rstrip("\r\n")
            if text.startswith("event:"):
                kind = text.split(":", 1)[1].strip()
            elif text.startswith("data:") and kind == "data":
                seen += [m["i"] for m in json.loads(text.split(":", 1)[1])]
                events += 1
        conn.close()
        return seen, events

    tasks = [asyncio.create_task(reader()) for _ in range(readers_n)]
    await asyncio.sleep(1.5)

    def produce() -> None:
        with httpx.Client(timeout=30) as client:
            for i in range(count):
                r = client.post(f"{server.url}/v1/stream/sse", json={"i": i})
                assert r.status_code in (200, 204)
                time.sleep(0.02)

    await asyncio.to_thread(produce)
    results = await asyncio.gather(*tasks)
    events = sum(e for _, e in results)
    print(f"{readers_n} SSE readers, {count} appends: {events} data events")
    assert all(seen == list(range(count)) for seen, _ in results), "an SSE reader missed messages"
    assert events < readers_n * count / 2, f"{events} data events for {count} appends"
