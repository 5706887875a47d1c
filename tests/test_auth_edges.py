"""Token scopes at their edges (CONTRACT.md §5: a token reaches only the stations its scope
names), from an adversarial review: what a shared HTTP cache does with a scoped read, tokens
files whose entries look scoped and are not, and odd spellings of an out-of-scope station's
path. Each case below the first failed on the code before its fix."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import Server, free_port

ADMIN, SCOPED_CONSUMER = "admin-secret-e", "a-consumer-secret-e"
SECRET = "b1-only-data"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work: Path = tmp_path_factory.mktemp("auth-edges")
    tokens = [
        {"token": ADMIN, "role": "admin"},
        {"token": SCOPED_CONSUMER, "role": "consumer", "stations": ["a*"]},
    ]
    (work / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    args = ["--tokens", str(work / "tokens.json"), "--long-poll-timeout-ms", "300"]
    server = Server(f"sqlite:///{work / 'db.sqlite'}", work, args).start()
    with _client(server, ADMIN) as admin:
        for name, data in (("a1", "a1-data"), ("b1", SECRET)):
            assert admin.post("/api/stations", json={"name": name}).status_code == 201
            body = {"messages": [{"data": data}]}
            assert admin.post(f"/api/stations/{name}/messages", json=body).status_code == 200
    try:
        yield server
    finally:
        server.kill()


def _client(server: Server, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=10)


# -- odd spellings of an out-of-scope station (these held: kept so they keep holding) ----------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/stream/b1?offset=-1"),
        ("GET", "/v1/stream/%62%31?offset=-1"),  # b1, percent-encoded
        ("GET", "/v1/stream//b1?offset=-1"),
        ("GET", "/v1/stream/a1/../b1?offset=-1"),  # sent as is: one name, not b1
        ("GET", "/v1/stream/a1%2F..%2Fb1?offset=-1"),
        ("GET", "/v1/stream/a1/%2e%2e/b1?offset=-1"),
        ("GET", "/v1/stream/b1%2F?offset=-1"),
        ("GET", "/v1/stream/B1?offset=-1"),
        ("GET", "/v1/stream/b1?offset=-1&live=long-poll"),
        ("GET", "/v1/stream/b1?offset=-1&live=sse"),
        ("HEAD", "/v1/stream/b1"),
        ("GET", "/api/stations/b1"),
        ("HEAD", "/api/stations/b1/messages"),
        ("GET", "/api/stations/a1%2F..%2Fb1/messages"),
        ("GET", "/api/stations/a1/../b1/messages"),
        ("GET", "/metrics"),
    ],
)
def test_odd_paths_never_reach_an_out_of_scope_station(srv: Server, method: str, path: str) -> None:
    # httpx would resolve "..": send the target exactly as written.
    with _client(srv, SCOPED_CONSUMER) as http:
        request = http.build_request(method, path)
        request.url = request.url.copy_with(raw_path=path.encode())
        response = http.send(request)
    assert response.status_code in (400, 403, 404), (path, response.status_code)
    assert SECRET not in response.text
    if method != "HEAD":
        # A 403 names no station, a 404 only the name the path spelt: neither says b1 exists.
        message = response.json()["error"]["message"]
        assert "station b1 " not in message and "stream b1 " not in message, message


# -- a scoped read must not be stored by a shared cache -----------------------------------------


@pytest.mark.parametrize("live", ["", "&live=long-poll"])
def test_a_read_with_a_token_is_not_stored_for_other_tokens(srv: Server, live: str) -> None:
    """A read answered ``Cache-Control: public`` may be stored by a shared cache (a CDN, a
    proxy) although the request carried ``Authorization`` (RFC 9111 §3.5), and is then served to
    whoever asks for the same URL: any other token, or none. With tokens a read is private."""
    with _client(srv, ADMIN) as admin:
        response = admin.get(f"/v1/stream/b1?offset=-1{live}")
    assert response.status_code == 200 and SECRET in response.text
    directives = {d.strip().split("=")[0] for d in response.headers["Cache-Control"].split(",")}
    assert "public" not in directives and "s-maxage" not in directives, directives
    assert "private" in directives or "no-store" in directives, directives


def test_without_tokens_reads_stay_cacheable_by_cdns(tmp_path: Path) -> None:
    """The loopback mode has no tokens: its reads stay shareable, as Durable Streams asks."""
    server = Server(f"sqlite:///{tmp_path / 'open.db'}", tmp_path).start()
    try:
        with _client(server, None) as http:
            assert http.post("/api/stations", json={"name": "s"}).status_code == 201
            produced = http.post("/api/stations/s/messages", json={"messages": [{"data": 1}]})
            assert produced.status_code == 200
            response = http.get("/v1/stream/s?offset=-1")
        assert response.status_code == 200
        assert response.headers["Cache-Control"].startswith("public")
    finally:
        server.kill()


# -- tokens files whose entries look scoped but are not -----------------------------------------


def _serve_with(tmp_path: Path, entries: list[dict[str, Any]]) -> tuple[int | None, str]:
    """Start ``stations serve`` with these tokens: (exit code, stderr) if it refused to start,
    (None, "") if it came up (then it is stopped)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": entries}))
    port = free_port()
    command = [sys.executable, "-m", "stations", "serve", "--port", str(port)]
    command += ["--db", f"sqlite:///{tmp_path / 'db.sqlite'}", "--tokens", str(tokens)]
    proc = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/livez", timeout=0.5)
                return None, ""  # it serves
            except httpx.TransportError:
                time.sleep(0.05)
        assert proc.poll() is not None, "stations serve neither served nor exited"
        _, err = proc.communicate(timeout=10)
        return proc.returncode, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


PRODUCER = {"token": "producer-secret-e", "role": "producer"}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        # An empty list read as "no patterns": every station.
        ({**PRODUCER, "stations": []}, "tokens[1].stations"),
        # A misspelt key left the token without patterns: every station.
        ({**PRODUCER, "station": ["a*"]}, "tokens[1].station"),
        ({**PRODUCER, "scope": ["a*"]}, "tokens[1].scope"),
    ],
    ids=["empty-stations", "station-typo", "scope-key"],
)
def test_an_entry_that_looks_scoped_but_is_not_is_refused(
    tmp_path: Path, entry: dict[str, Any], field: str
) -> None:
    code, err = _serve_with(tmp_path, [{"token": ADMIN, "role": "admin"}, entry])
    assert code is not None, f"the server started: {entry} would reach every station"
    assert code != 0
    assert field in err, err
    assert entry["token"] not in err  # the secret is never echoed


def test_one_secret_twice_is_refused(tmp_path: Path) -> None:
    """The same secret as a scoped consumer and as an unscoped admin: the last entry won, so
    the scope written first was silently not what the token got."""
    entries = [
        {"token": ADMIN, "role": "admin"},
        {"token": "shared-secret-e", "role": "consumer", "stations": ["a*"]},
        {"token": "shared-secret-e", "role": "admin"},
    ]
    code, err = _serve_with(tmp_path, entries)
    assert code is not None, "the server started with one secret for two scopes"
    assert code != 0
    assert "tokens[2].token" in err and "tokens[1]" in err, err
    assert "shared-secret-e" not in err


def test_scoped_entries_that_are_right_still_serve(tmp_path: Path) -> None:
    entries = [
        {"token": ADMIN, "role": "admin"},
        {"token": "producer-secret-e", "role": "producer", "stations": ["a*", "orders/*"]},
        {"token": "consumer-secret-e", "role": "consumer"},
    ]
    assert _serve_with(tmp_path, entries) == (None, "")


@pytest.mark.parametrize(("token", "status"), [(None, b"401"), (SCOPED_CONSUMER, b"403")])
def test_a_request_refused_for_its_token_is_not_asked_for_its_body(
    srv: Server, token: str | None, status: bytes
) -> None:
    """The review of 2026-11-29: ``Expect: 100-continue`` was answered before the token was
    checked, so a client without one, or out of its scope, was asked for its body (up to
    64 MiB) and only then refused."""
    import socket

    head = b"POST /v1/stream/b1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 10\r\nExpect: 100-continue\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {token}\r\n".encode() if token else b""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    assert got.split()[1] == status, got[:300]
