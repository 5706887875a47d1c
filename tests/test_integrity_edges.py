"""Small data-integrity edges, each failing on the code before its fix: the SQLite one-server
lock under every spelling of the file, SSE text resumed exactly at a control event's offset,
and JSON numbers no double holds refused instead of stored as another value."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine

from stations.store.db import database_file
from tests.harness import Server, free_port
from tests.test_cli import assert_one_line_error, run_cli

# -- the SQLite lock ---------------------------------------------------------------------------


def _spellings(path: Path) -> list[str]:
    """URLs SQLAlchemy and SQLite open as the file ``path`` (absolute, in ``path.parent``)."""
    return [
        f"sqlite:///{path}",
        f"sqlite:///file:{path}?mode=rwc&uri=true",
        f"sqlite:///file:{path}?uri=true",
        f"sqlite:///file://{path}?uri=1",
        f"sqlite:///file://localhost{path}?uri=true&cache=private",
        f"sqlite:///file:{path.parent}/./{path.name}?uri=true",
        f"sqlite:///file:{path.parent}/%2573tations.db?uri=true",  # %25 -> %, %73 -> s
        f"sqlite:///file:{path.name}?uri=true",  # relative to the working directory
    ]


def test_database_file_is_the_file_sqlite_opens(tmp_path: Path) -> None:
    path = tmp_path / "stations.db"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for url in _spellings(path):
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    rows = conn.exec_driver_sql("PRAGMA database_list").fetchall()
            finally:
                engine.dispose()
            opened = next(row[2] for row in rows if row[1] == "main")
            assert opened == str(path), url
            assert database_file(url) == str(path), url
    finally:
        os.chdir(cwd)
    # Files SQLite does not keep: none to lock.
    for url in (
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file:db1?mode=memory&cache=shared&uri=true",
        "sqlite:///file:?uri=true",
    ):
        assert database_file(url) is None, url
    # Without uri=true SQLAlchemy opens a file literally named so, query dropped.
    assert database_file("sqlite:///file:x.db") == os.path.abspath("file:x.db")


def test_a_second_server_is_refused_whatever_spelling_names_the_file(tmp_path: Path) -> None:
    """A ``file:`` URI was not locked at all: a second server on the same file started, and
    each process's id cache would store a retried message id again."""
    path = tmp_path / "stations-data" / "stations.db"
    path.parent.mkdir()
    first = Server(f"sqlite:///file:{path}?mode=rwc&uri=true", tmp_path).start()
    assert first.proc is not None
    try:
        for url in (f"sqlite:///{path}", f"sqlite:///file://localhost{path}?uri=true"):
            proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
            assert_one_line_error(proc, "another process", f"pid {first.proc.pid}")
    finally:
        first.kill()
    assert not (tmp_path / "file:").exists()  # the URI made a directory of its own scheme
    plain = Server(f"sqlite:///{path}", tmp_path).start()
    try:
        url = f"sqlite:///file:{path}?mode=rwc&uri=true"
        proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
        assert_one_line_error(proc, "another process")
    finally:
        plain.kill()


# -- one server for the HTTP cases ---------------------------------------------------------------

SSE_LIFETIME_MS = 400


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("integrity")
    server = Server(
        f"sqlite:///{work / 'db.sqlite'}", work, ["--sse-lifetime-ms", str(SSE_LIFETIME_MS)]
    )
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


# -- SSE text resumed at a control event's offset ------------------------------------------------


def _sse_until_it_ends(client: httpx.Client, path: str, offset: str) -> tuple[str, str]:
    """Read one SSE response to its end (the server's lifetime for it), as a client does:
    the text of its data events and the offset of its last control event."""
    text: list[str] = []
    kind, data, last = "", [], offset
    with client.stream("GET", path, params={"offset": offset, "live": "sse"}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data.append(line[5:])
            elif not line and kind:
                payload = "\n".join(data)
                if kind == "data":
                    text.append(payload)
                else:
                    last = httpx.Response(200, content=payload).json()["streamNextOffset"]
                kind, data = "", []
    return "".join(text), last


@pytest.mark.parametrize(
    "appends",
    [
        [b"price \xe2\x82", b"\xac 5"],  # a euro sign split 2 + 1
        [b"\xf0", b"\x9f", b"\x98", b"\x80!"],  # an emoji split over four appends
        [b"a\xc3", b"\xa9\xe2\x82", b"\xac"],  # two characters split in a row
    ],
)
def test_sse_text_resumed_at_its_offset_keeps_a_split_character(
    client: httpx.Client, appends: list[bytes]
) -> None:
    """An SSE response ending (its lifetime) while it held the first bytes of a character
    dropped them: the client, resuming at the offset it was given, got the rest as U+FFFD."""
    path = f"/v1/stream/sse-{uuid.uuid4().hex[:8]}"
    assert client.put(path, headers={"Content-Type": "text/plain"}).status_code == 201
    received, offset = "", "-1"
    for part in appends:
        r = client.post(path, content=part, headers={"Content-Type": "text/plain"})
        assert r.status_code in (200, 204), r.text
        text, offset = _sse_until_it_ends(client, path, offset)
        received += text
    assert received == b"".join(appends).decode(), received


def test_sse_from_inside_a_character_on_a_fresh_connection(client: httpx.Client) -> None:
    """The same at a reconnect that finds nothing new yet: the bytes that complete the
    character arrive while it waits."""
    path = f"/v1/stream/sse-{uuid.uuid4().hex[:8]}"
    assert client.put(path, headers={"Content-Type": "text/plain"}).status_code == 201
    client.post(path, content=b"x\xe2\x82", headers={"Content-Type": "text/plain"})
    text, offset = _sse_until_it_ends(client, path, "-1")
    assert text == "x"
    with client.stream("GET", path, params={"offset": offset, "live": "sse"}) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: control"
        client.post(path, content=b"\xac.", headers={"Content-Type": "text/plain"})
        seen = []
        for line in lines:
            seen.append(line)
            if line == "event: control":
                break
    assert "data:\u20ac." in seen, seen


# -- JSON numbers a double does not hold ---------------------------------------------------------


def _refused(answer: httpx.Response, field: str, number: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["field"] == field, error
    assert number in error["message"] and "range" in error["message"], error


@pytest.mark.parametrize("number", ["1e-99999", "-0.1e-400", "0." + "0" * 400 + "1", "1e99999"])
def test_a_json_stream_refuses_a_number_it_would_alter(client: httpx.Client, number: str) -> None:
    """``1e-99999`` was stored as 0.0 (an overflow was refused, as not valid JSON)."""
    path = f"/v1/stream/num-{uuid.uuid4().hex[:8]}"
    json_type = {"Content-Type": "application/json"}
    assert client.put(path, headers=json_type).status_code == 201
    body = f'[1, {{"x": [{number}]}}]'
    _refused(client.post(path, content=body, headers=json_type), "body", number[:40])
    other = f"/v1/stream/num-{uuid.uuid4().hex[:8]}"
    _refused(client.put(other, content=body, headers=json_type), "body", number[:40])
    assert client.get(path, params={"offset": "-1"}).json() == []
    # Numbers a double holds, and strings that merely look like the refused ones, are stored.
    body = '[1.5e-300, 0e-500, "1e-99999", 2.5e-308]'
    assert client.post(path, content=body, headers=json_type).status_code in (200, 204)
    assert client.get(path, params={"offset": "-1"}).json() == [1.5e-300, 0.0, "1e-99999", 2.5e-308]


@pytest.mark.parametrize("number", ["1e-99999", "1e99999"])
def test_produce_and_transactions_refuse_a_number_naming_its_field(
    client: httpx.Client, number: str
) -> None:
    name = f"num-{uuid.uuid4().hex[:8]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    produce = f'{{"messages": [{{"id": "m1", "data": {{"x": [0, {number}]}}}}]}}'
    answer = client.post(
        f"/api/stations/{name}/messages",
        content=produce,
        headers={"Content-Type": "application/json"},
    )
    _refused(answer, "messages.0.data.x.1", number)
    encoded = base64.b64encode(number.encode()).decode()
    answer = client.post(
        f"/api/stations/{name}/messages",
        json={"messages": [{"id": "m2", "dataBase64": encoded}]},
    )
    _refused(answer, "messages.0.dataBase64", "")
    transaction = f'{{"produce": [{{"station": "{name}", "id": "m3", "data": {number}}}]}}'
    answer = client.post(
        "/api/transactions", content=transaction, headers={"Content-Type": "application/json"}
    )
    _refused(answer, "produce.0.data", number)
    stored = client.get(f"/api/stations/{name}/messages", params={"offset": "-1"})
    assert stored.status_code == 200, stored.text
    assert stored.json()["messages"] == []
    # The ids were not taken: the same ids with numbers a double holds are stored.
    answer = client.post(
        f"/api/stations/{name}/messages",
        json={"messages": [{"id": "m1", "data": {"x": [0, 1.5e-300]}}]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["duplicate"] is False


# -- the SDK producer: a request whose answer was lost -------------------------------------------


class _LosingProxy:
    """A TCP proxy to the server that, ``lose`` times, forwards a POST but drops the
    connection instead of relaying its answer: the request was stored, the client never
    hears so."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lose = 0
        self.lost = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        losing = False

        async def upstream() -> None:
            nonlocal losing
            while data := await reader.read(65536):
                if self.lose and b"POST " in data:
                    self.lose -= 1
                    losing = True  # before the server can answer
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if losing:
                    self.lost += 1
                    break
                writer.write(data)
                await writer.drain()
            writer.transport.abort()
            up_writer.transport.abort()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


async def test_a_producer_whose_answer_was_lost_takes_the_retry_204_as_its_own(
    srv: Server,
) -> None:
    """A batch or a close whose answer was lost may have been stored: the retry's 204
    (duplicate) is then its own answer, not another instance's use of the epoch. This pins
    the rule both paths of the SDK producer share (``_maybe_stored``)."""
    from stations.client import Client

    proxy = _LosingProxy(srv.port)
    url = await proxy.start()
    name = f"lost-{uuid.uuid4().hex[:8]}"
    try:
        async with Client(url) as client:
            await client.create_station(name)
            producer = client.station(name).producer("job", epoch=1)
            proxy.lose = 1
            producer.append("a")
            await producer.flush()
            proxy.lose = 1
            await producer.close("last")
    finally:
        await proxy.close()
    assert proxy.lost == 2
    async with httpx.AsyncClient(base_url=srv.url) as http:
        answer = await http.get(f"/v1/stream/{name}", params={"offset": "-1"})
    assert answer.json() == ["a", "last"]
    assert answer.headers.get("Stream-Closed") == "true"
