"""Several ``stations serve`` processes on one PostgreSQL database behind one public address: a
reverse proxy that mounts them under a path prefix (``/stations/``) and strips it, as nginx's
``location /stations/ { proxy_pass http://backends/; }`` does. Every address the server hands
out must be one a client reaches through the proxy, whichever process answered: a create's
``Location``, the console's redirect, the API document's server. And behind a TLS proxy the
public URL's origin (and host name) are the server's own, not a foreign page's (review)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urljoin

import aiohttp
import httpx
import pytest
import yaml
from aiohttp import web

from stations.client import BadRequest, Client
from tests.harness import Server, free_port

MakeServer = Callable[..., Server]
PREFIX = "/stations"
# Hop-by-hop and length headers: the proxy's own response sets them anew.
_NOT_FORWARDED = {"connection", "content-length", "transfer-encoding", "content-encoding"}


class Proxy:
    """Round-robin over the backends, each request to the next: a client never knows which
    process answers it, nor whether its next request reaches the same one."""

    def __init__(self, backends: list[str]) -> None:
        self._next = itertools.cycle(backends)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.answered_by: list[str] = []

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", PREFIX + "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        backend = next(self._next)
        self.answered_by.append(backend)
        target = backend + request.raw_path[len(PREFIX) :]
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._session.request(
            request.method,
            target,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_FORWARDED}
            return web.Response(status=answer.status, body=body, headers=kept)


@pytest.fixture
async def behind_proxy(pg_url: str, make_server: MakeServer) -> AsyncIterator[Proxy]:
    # The proxy's port is known before the servers start: --public-url names it.
    proxy = Proxy([])
    public = proxy.url + "/"  # a trailing slash, as an operator may well write it
    one = make_server(pg_url, "--public-url", public)
    two = make_server(pg_url, "--public-url", public)
    proxy._next = itertools.cycle([one.url, two.url])
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_a_created_streams_location_is_reached_through_the_proxy(
    behind_proxy: Proxy,
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        for name in ("a", "b", "c/d"):
            r = await http.put(f"{behind_proxy.url}/v1/stream/{name}", json=[{"n": name}])
            assert r.status_code == 201, r.text
            # The public URL, not the process's own loopback address nor the path without
            # the prefix, whichever of the two processes answered.
            assert r.headers["Location"] == f"{behind_proxy.url}/v1/stream/{name}"
            read = await http.get(r.headers["Location"], params={"offset": "-1"})
            assert read.status_code == 200 and read.json() == [{"n": name}], read.text
    assert len(set(behind_proxy.answered_by)) == 2  # both processes answered creates


async def test_the_console_redirects_stay_under_the_prefix(behind_proxy: Proxy) -> None:
    async with httpx.AsyncClient(timeout=30, follow_redirects=True) as http:
        for start in ("/", "/ui"):
            r = await http.get(behind_proxy.url + start)
            assert r.status_code == 200, (start, r.url, r.text[:200])
            assert str(r.url) == f"{behind_proxy.url}/ui/"
            assert "<title>Stations</title>" in r.text


async def test_the_api_document_names_the_public_url(behind_proxy: Proxy) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{behind_proxy.url}/api/openapi.yaml")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/yaml")
    document = yaml.safe_load(r.text)
    assert [server["url"] for server in document["servers"]] == [behind_proxy.url]
    assert "/api/stations" in document["paths"]


async def test_a_path_nothing_serves_is_named_as_the_client_asked_for_it(
    behind_proxy: Proxy,
) -> None:
    """The 404 named the path without the proxy's prefix (``/api/stationz``): not the URL the
    user typed, so a wrong prefix could not be told from a wrong path."""
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{behind_proxy.url}/api/stationz")
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "no_route"
    assert f"; {PREFIX}/api/stationz through --public-url " in error["message"], error


async def test_without_a_public_url_the_api_document_names_the_server_that_served_it(
    tmp_path: Path, make_server: MakeServer
) -> None:
    """It named http://127.0.0.1:4437 whatever the port, and no prefix: a tool that took the
    document's server sent its requests elsewhere. Now "..": relative to the document, the
    server that served it, directly or under a proxy's prefix."""
    server = make_server(f"sqlite:///{tmp_path / 'stations.db'}")
    proxy = Proxy([server.url])
    await proxy.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            for base in (server.url, proxy.url):
                r = await http.get(f"{base}/api/openapi.yaml")
                assert r.status_code == 200
                assert r.headers["Content-Type"].startswith("application/yaml")
                [entry] = yaml.safe_load(r.text)["servers"]
                assert urljoin(str(r.url), entry["url"]) == f"{base}/", (base, entry)
                # And a request made at that address reaches the API.
                stations = await http.get(urljoin(str(r.url), entry["url"]) + "api/stations")
                assert stations.status_code == 200, stations.text
                # Asked again with its tag, it is not sent again (it was a file with one).
                tag = r.headers["ETag"]
                again = await http.get(r.url, headers={"If-None-Match": tag})
                assert (again.status_code, again.content) == (304, b""), again.text
                assert again.headers["ETag"] == tag
    finally:
        await proxy.stop()


TLS_PUBLIC = "https://stations.example.com/stations"


async def test_behind_a_tls_proxy_the_public_origin_is_the_servers_own(
    make_server: MakeServer, tmp_path: Path
) -> None:
    """Token-less: a write whose page names the public origin is the console's own (the
    server sees ``http`` and the proxy's Host, so it took it for a foreign page's); and the
    public host name is one the proxy may forward as ``Host``. Other origins and host names
    stay refused."""
    server = make_server(f"sqlite:///{tmp_path / 'p.db'}", "--public-url", TLS_PUBLIC)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        own = {"Origin": "https://stations.example.com"}
        r = await http.post("/api/stations", json={"name": "o"}, headers=own)
        assert r.status_code == 201, r.text
        for foreign in ("https://evil.example.com", "http://stations.example.com"):
            r = await http.post("/api/stations", json={"name": "f"}, headers={"Origin": foreign})
            assert r.status_code == 403 and r.json()["error"]["field"] == "Origin", foreign
        r = await http.get("/api/stations/o", headers={"Host": "stations.example.com"})
        assert r.status_code == 200, r.text
        r = await http.get("/api/stations/o", headers={"Host": "Stations.Example.com:443"})
        assert r.status_code == 200, r.text
        r = await http.get("/api/stations/o", headers={"Host": "evil.example.com"})
        assert r.status_code == 403 and r.json()["error"]["field"] == "Host"


async def test_the_public_url_is_kept_as_clients_send_it(
    make_server: MakeServer, tmp_path: Path
) -> None:
    """Kept as typed, an international host name and a space in the path went into
    ``Location`` raw (not a URI), and the host was never matched: browsers send its IDNA form
    in ``Host`` and ``Origin`` (review)."""
    server = make_server(
        f"sqlite:///{tmp_path / 'i.db'}", "--public-url", "https://bücher.example/a b"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.put("/v1/stream/x", json=[1])
        assert r.status_code == 201, r.text
        assert r.headers["Location"] == "https://xn--bcher-kva.example/a%20b/v1/stream/x"
        r = await http.get("/api/stations/x", headers={"Host": "xn--bcher-kva.example"})
        assert r.status_code == 200, r.text
        own = {"Origin": "https://xn--bcher-kva.example"}
        r = await http.post("/api/stations", json={"name": "y"}, headers=own)
        assert r.status_code == 201, r.text
        r = await http.get("/api/openapi.yaml")
        [entry] = yaml.safe_load(r.text)["servers"]
        assert entry["url"] == "https://xn--bcher-kva.example/a%20b"
        assert "default address" not in entry["description"]


async def test_dot_names_are_refused_before_a_proxy_resolves_them_away(
    tmp_path: Path, make_server: MakeServer
) -> None:
    """A proxy that resolves dot segments (nginx, or this one: aiohttp's client) turned
    ``DELETE .../orders/cursors/..`` into ``DELETE /api/stations/orders/``: the request reached
    the station's own route (here refused for the trailing slash, a 400 naming ``name``; one
    step of slash-trimming from deleting the station). The SDK refuses ``.`` and ``..`` as
    names before sending, naming the argument."""
    server = make_server(f"sqlite:///{tmp_path / 'stations.db'}")
    proxy = Proxy([server.url])
    await proxy.start()
    try:
        async with Client(proxy.url) as client:
            await client.create_station("orders")
            station = client.station("orders")
            await station.produce({"n": 1})
            await station.ensure_group("workers")
            calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("cursor", lambda: station.delete_cursor("..")),
                ("cursor", lambda: station.commit_cursor(".", "-1")),
                ("group", lambda: station.delete_group("..")),
                ("station", lambda: client.delete_station("..")),
                ("station", lambda: client.station(".").info()),
            ]
            for field, call in calls:
                with pytest.raises(BadRequest) as refused:
                    await call()
                assert refused.value.field == field, refused.value
                assert "relative path segment" in refused.value.message
            info = await station.info()
            assert info.name == "orders"
            assert [g.name for g in await station.groups()] == ["workers"]
        assert proxy.answered_by, "the client's requests went through the proxy"
    finally:
        await proxy.stop()
