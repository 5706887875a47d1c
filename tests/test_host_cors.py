"""The token-less loopback mode's Host and CORS rules (issue 11, README "Limits and timeouts"):
without ``--tokens`` the server answers only loopback ``Host`` names (DNS rebinding) and grants
cross-origin reads only to loopback origins or those ``--cors-origin`` names; with ``--tokens``
any Host is served and every origin is granted unless ``--cors-origin`` narrows it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server

ADMIN = "host-cors-admin-secret"
JSON = {"Content-Type": "application/json"}
ACAO = "Access-Control-Allow-Origin"


def _server(workdir: Path, *args: str) -> Server:
    url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    return Server(url, workdir, ["--long-poll-timeout-ms", "200", *args]).start()


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _server(tmp_path_factory.mktemp("loopback"))
    httpx.put(f"{server.url}/v1/stream/hc", headers=JSON).raise_for_status()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _server(tmp_path_factory.mktemp("configured"), "--cors-origin", "https://app.example/")
    yield server
    server.kill()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("tokens")
    path = workdir / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}]}))
    server = _server(workdir, "--tokens", str(path))
    yield server
    server.kill()


def _get(server: Server, path: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=10)


def _preflight(server: Server, origin: str, **headers: str) -> httpx.Response:
    return httpx.options(
        f"{server.url}/v1/stream/hc",
        headers={"Origin": origin, "Access-Control-Request-Method": "DELETE", **headers},
        timeout=10,
    )


# -- Host ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:4437", "127.0.0.1.evil.example", "10.0.0.1", "[::2]:80"]
)
def test_loopback_mode_refuses_foreign_host_names(loopback: Server, host: str) -> None:
    for path in ("/healthz", "/v1/stream/hc", "/api/stations"):
        r = _get(loopback, path, Host=host)
        assert r.status_code == 403, (host, path, r.status_code)
        error = r.json()["error"]
        assert (error["code"], error["field"]) == ("forbidden_host", "Host")
    # A rebound page cannot write or delete either.
    r = httpx.delete(f"{loopback.url}/v1/stream/hc", headers={"Host": host}, timeout=10)
    assert r.status_code == 403
    assert _get(loopback, "/v1/stream/hc").status_code == 200  # still there


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:4437", "127.0.0.1:9", "127.0.0.2", "[::1]:4437", "LOCALHOST."]
)
def test_loopback_mode_serves_loopback_host_names(loopback: Server, host: str) -> None:
    assert _get(loopback, "/healthz", Host=host).status_code == 200
    assert _get(loopback, "/v1/stream/hc", Host=host).status_code == 200


@pytest.mark.parametrize("host", ["[::1", "a b", "local host:80", "x{y}", "[::1]x"])
def test_a_host_that_is_no_host_is_a_400_in_every_mode(
    loopback: Server, tokens: Server, host: str
) -> None:
    """Neither a loopback name (an unclosed bracket passed as [::1]) nor one to serve in
    tokens mode (a name with a space was served)."""
    for server in (loopback, tokens):
        r = _get(server, "/healthz", Host=host)
        assert r.status_code == 400, (host, r.status_code)
        assert r.json()["error"]["field"] == "Host"


def test_tokens_mode_serves_any_host(tokens: Server) -> None:
    assert _get(tokens, "/healthz", Host="stations.internal.example").status_code == 200
    r = _get(tokens, "/api/stations", Host="stations.internal.example")
    assert r.status_code == 401  # served (then refused for the missing token), not 403
    r = _get(
        tokens, "/api/stations", Host="stations.internal.example", Authorization=f"Bearer {ADMIN}"
    )
    assert r.status_code == 200


# -- CORS ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["https://evil.example", "http://127.0.0.1.evil.example:4437"])
def test_loopback_mode_grants_no_foreign_origin(loopback: Server, origin: str) -> None:
    r = _get(loopback, "/v1/stream/hc", Origin=origin)
    assert r.status_code == 200  # a same-machine tool may still send any Origin...
    assert ACAO not in r.headers, r.headers  # ...but a foreign page's script cannot read it
    r = _preflight(loopback, origin)
    assert ACAO not in r.headers, r.headers
    # Without an Origin no wildcard is granted either (nothing to embed across sites).
    assert ACAO not in _get(loopback, "/v1/stream/hc").headers


@pytest.mark.parametrize(
    "origin", ["http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173"]
)
def test_loopback_mode_grants_loopback_origins(loopback: Server, origin: str) -> None:
    r = _get(loopback, "/v1/stream/hc", Origin=origin)
    assert r.headers.get(ACAO) == origin
    assert "Origin" in r.headers.get("Vary", "")
    r = _preflight(loopback, origin, **{"Access-Control-Request-Headers": "content-type"})
    assert r.status_code == 204
    assert r.headers.get(ACAO) == origin
    assert "DELETE" in r.headers["Access-Control-Allow-Methods"]


@pytest.mark.parametrize("mode", ["loopback", "configured", "tokens"])
def test_every_answer_varies_by_origin(mode: str, request: pytest.FixtureRequest) -> None:
    """The grant depends on Origin, its absence included; a public read is cacheable, so a
    shared cache must not serve the answer to a request without Origin (no grant) to a page
    whose origin is granted, nor one origin's grant to another."""
    server: Server = request.getfixturevalue(mode)
    headers = {"Authorization": f"Bearer {ADMIN}"} if mode == "tokens" else {}
    for extra in ({}, {"Origin": "http://localhost:3000"}):
        r = _get(server, "/healthz", **headers, **extra)
        assert r.status_code == 200
        assert "origin" in r.headers.get("Vary", "").lower(), (extra, r.headers)


@pytest.mark.parametrize("mode", ["loopback", "tokens"])
def test_a_405_names_the_methods_allowed(mode: str, request: pytest.FixtureRequest) -> None:
    """With tokens too, and without one: no token would make the request work."""
    server: Server = request.getfixturevalue(mode)
    for path, allowed in (("/livez", "GET"), ("/api/stations", "GET")):
        r = httpx.delete(f"{server.url}{path}", timeout=10)
        assert r.status_code == 405, (path, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed"
        assert allowed in r.headers.get("Allow", "").split(","), r.headers


def test_cors_origin_option_names_the_granted_origins(configured: Server) -> None:
    r = _get(configured, "/healthz", Origin="https://app.example")
    assert r.headers.get(ACAO) == "https://app.example"
    assert _preflight(configured, "https://app.example").headers.get(ACAO) == "https://app.example"
    for origin in ("https://evil.example", "https://app.example.evil.example"):
        assert ACAO not in _get(configured, "/healthz", Origin=origin).headers
        assert ACAO not in _preflight(configured, origin).headers
    # The option widens CORS only: the Host rule of the loopback mode still holds.
    assert _get(configured, "/healthz", Host="evil.example").status_code == 403


def test_tokens_mode_grants_every_origin(tokens: Server) -> None:
    origin = "https://dashboard.example"
    r = _get(tokens, "/api/stations", Origin=origin, Authorization=f"Bearer {ADMIN}")
    assert r.status_code == 200
    assert r.headers.get(ACAO) == origin
    # A page on that origin still needs a token: granted CORS, refused data.
    r = _get(tokens, "/api/stations", Origin=origin)
    assert r.status_code == 401
    assert _preflight(tokens, origin).headers.get(ACAO) == origin


# -- Cross-site writes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "https://127.0.0.1.evil.example"]
)
def test_token_less_modes_refuse_writes_from_foreign_pages(loopback: Server, origin: str) -> None:
    """A page on any site may send a "simple" request (POST, text/plain, no preflight) to a
    loopback server: CORS only keeps it from reading the answer, and a server that trusts
    every request would act on it (create stations, append, drop dead letters). The browser
    names the page's origin; a write from one not granted is refused before anything is done."""
    name = f"csrf-{abs(hash(origin))}"
    simple = {"Origin": origin, "Content-Type": "text/plain"}
    r = httpx.post(f"{loopback.url}/api/stations", headers=simple, json={"name": name}, timeout=10)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["field"] == "Origin"
    assert _get(loopback, f"/api/stations/{name}").status_code == 404
    before = _get(loopback, "/v1/stream/hc?offset=-1").content
    r = httpx.post(f"{loopback.url}/v1/stream/hc", headers=simple, content=b"[1]", timeout=10)
    assert r.status_code == 403, r.text
    assert _get(loopback, "/v1/stream/hc?offset=-1").content == before
    # Reading stays a CORS matter: answered, without a grant the page cannot read it.
    read = _get(loopback, "/api/stations", Origin=origin)
    assert read.status_code == 200 and ACAO not in read.headers


def test_token_less_modes_take_writes_from_their_own_and_loopback_pages(loopback: Server) -> None:
    port = loopback.url.rsplit(":", 1)[1]
    for n, origin in enumerate((loopback.url, f"http://localhost:{port}", "http://[::1]:3000")):
        body = {"name": f"own-{n}"}
        r = httpx.post(f"{loopback.url}/api/stations", headers={"Origin": origin}, json=body)
        assert r.status_code == 201, (origin, r.text)
    # Without Origin (curl, the SDK, another server) nothing changes.
    assert httpx.post(f"{loopback.url}/api/stations", json={"name": "own-x"}).status_code == 201


def test_tokens_mode_takes_writes_from_any_page_with_a_token(tokens: Server) -> None:
    """The bearer token is what a foreign page cannot send by itself."""
    auth = {"Authorization": f"Bearer {ADMIN}", "Origin": "https://dashboard.example"}
    r = httpx.post(f"{tokens.url}/api/stations", headers=auth, json={"name": "from-a-page"})
    assert r.status_code == 201, r.text
