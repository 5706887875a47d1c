"""The edges hold like the core (an adversarial review of limits and timeouts): a coded request
body is refused, never stored coded, truncated or answered with a 500; a JSON append of many
small messages does not cost the server kilobytes of memory per message; a timeout or read budget
that is no number is refused at start. SQLite servers on loopback; every loop is bounded.
"""

from __future__ import annotations

import base64
import gzip
import socket
import subprocess
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server, free_port
from tests.module_server import ENGINES, module_server

JSON = {"Content-Type": "application/json"}
BINARY = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_server("sqlite", tmp_path_factory, "--log-level", "info")


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def new_stream(http: httpx.Client, headers: dict[str, str]) -> str:
    path = f"/v1/stream/edge-{uuid.uuid4().hex[:8]}"
    assert http.put(path, headers=headers).status_code == 201
    return path


def raw_post(srv: Server, path: str, body: bytes, *headers: str) -> tuple[int, bytes]:
    """One POST as sent (httpx would not send a Content-Encoding it did not apply)."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    head += "".join(h + "\r\n" for h in headers) + "Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    status_line, _, rest = got.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


# -- Content-Encoding -----------------------------------------------------------------------------

GZ = gzip.compress(b"hello world")
CODED = [
    ("gzip", GZ),  # decoded, it was stored; refused like the others so no coding is half-taken
    ("gzip", b"not gzip at all"),  # a 500
    ("deflate", b"not deflate"),  # a 500
    ("gzip", GZ[:20]),  # truncated: "hello wor" was stored
    ("br", b"\x0b\x02\x80hello"),  # aiohttp's parser refused it without the Brotli package
    ("x-gzip", GZ),  # stored still coded
    ("compress", b"hello"),  # stored as is, as if it were the data
    ("gzip, gzip", gzip.compress(GZ)),  # stored as is
    ("identity, gzip", GZ),
]


@pytest.mark.parametrize(
    ("coding", "body"), CODED, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CODED)]
)
def test_a_coded_body_is_refused_with_415_and_nothing_is_stored(
    srv: Server, http: httpx.Client, coding: str, body: bytes
) -> None:
    path = new_stream(http, BINARY)
    status, answer = raw_post(
        srv, path, body, "Content-Type: application/octet-stream", f"Content-Encoding: {coding}"
    )
    assert status == 415, answer
    error = httpx.Response(200, content=answer).json()["error"]
    assert (error["code"], error["field"]) == ("unsupported_content_encoding", "Content-Encoding")
    assert http.get(f"{path}?offset=-1").content == b""
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/stations", b'{"name": "coded"}'),
        ("/api/stations/coded/messages", b'{"messages": [{"data": 1}]}'),
        ("/api/stations/coded/groups/g/fetch", b"{}"),
    ],
)
def test_the_management_api_refuses_coded_bodies_too(
    srv: Server, http: httpx.Client, path: str, body: bytes
) -> None:
    http.post("/api/stations", json={"name": "coded"})
    http.put("/api/stations/coded/groups/g", json={})
    coded = zlib.compress(body)
    status, answer = raw_post(
        srv, path, coded, "Content-Type: application/json", "Content-Encoding: deflate"
    )
    assert status == 415, answer
    assert http.get("/api/stations/coded").json()["stats"]["messages"] == 0


def test_identity_and_an_uncoded_body_are_taken(srv: Server, http: httpx.Client) -> None:
    path = new_stream(http, BINARY)
    status, _ = raw_post(
        srv, path, b"ab", "Content-Type: application/octet-stream", "Content-Encoding: identity"
    )
    assert status == 204
    # A GET naming a coding has no body to refuse.
    r = http.get(f"{path}?offset=-1", headers={"Content-Encoding": "gzip"})
    assert (r.status_code, r.content) == (200, b"ab")


# -- many small messages in one JSON append -------------------------------------------------------


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_many_small_json_messages_in_one_append_cost_bytes_not_kilobytes(
    srv: Server, http: httpx.Client
) -> None:
    """A JSON array written with spaces (Python's json.dumps, say) took the per-message path,
    one orjson.dumps per element, and each left about 3 KB of the server's heap behind: 200,000
    messages in a 1.6 MB body grew it by about 700 MB, for good."""
    path = new_stream(http, JSON)
    n = 100_000  # the most one append may carry by default (--max-append-messages)
    body = b"[" + b", ".join([b'{"a": 1}'] * n) + b"]"
    assert srv.proc is not None
    before = _rss_mb(srv.proc.pid)
    assert http.post(path, content=body, headers=JSON).status_code == 204
    grown = _rss_mb(srv.proc.pid) - before
    assert grown < 150, f"the server grew by {grown:.0f} MB for a {len(body) >> 10} KB body"
    # Every message is stored, compact, in order.
    tail = http.head(path).headers["Stream-Next-Offset"]
    r = http.get(f"/api/stations/{path.rsplit('/', 1)[1]}/messages?offset=-1&limit=3")
    assert [m["data"] for m in r.json()["messages"]] == [{"a": 1}] * 3
    assert http.get(f"/api/stations/{path.rsplit('/', 1)[1]}").json()["stats"]["messages"] == n
    assert tail == http.head(path).headers["Stream-Next-Offset"]


# -- serve options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--body-timeout-s", "nan"),  # served, and a body in two packets was dropped at once
        ("--head-timeout-s", "nan"),
        ("--idle-timeout-s", "inf"),  # served with the protection off
        ("--send-timeout-s", "inf"),
        ("--read-budget-mb", "nan"),  # a traceback
        ("--read-budget-mb", "inf"),
        ("--read-budget-mb", "1e308"),  # finite, but no number of bytes: a traceback
    ],
)
def test_a_timeout_or_budget_that_is_no_number_is_refused_at_start(
    tmp_path: Path, option: str, value: str
) -> None:
    command = [sys.executable, "-m", "stations", "serve", "--port", str(free_port())]
    command += ["--db", f"sqlite:///{tmp_path / 's.db'}", option, value]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"stations serve {option} {value} was started")
    assert proc.returncode == 2, err
    assert f"{option} must be a positive number".encode() in err, err
    assert b"Traceback" not in err


# -- subscriptions ----------------------------------------------------------------------------------


def test_a_subscription_request_names_at_most_1000_streams(http: httpx.Client) -> None:
    """Every path of one request is stored in one write transaction: 100,000 paths held every
    append back for about 5 s (400,000: a minute), and nothing bounded them but the body size."""
    http.put("/v1/stream/wake", headers=JSON)
    subs = "/v1/stream/__ds/subscriptions"
    many = {"type": "pull-wake", "wake_stream": "wake", "streams": [f"p{i}" for i in range(1001)]}
    r = http.put(f"{subs}/many", json=many)
    assert r.status_code == 400, r.text[:200]
    assert "1000" in r.text and "streams" in r.text
    assert http.get(f"{subs}/many").status_code == 404
    spec = {**many, "streams": [f"p{i}" for i in range(1000)]}
    assert http.put(f"{subs}/some", json=spec).status_code == 201
    # Adding to a standing subscription has the same bound.
    more = {"streams": [f"q{i}" for i in range(1001)]}
    r = http.post(f"{subs}/some/streams", json=more)
    assert r.status_code == 400, r.text[:200]
    assert len(http.get(f"{subs}/some").json()["streams"]) == 1000
    assert http.post(f"{subs}/some/streams", json={"streams": ["q1"]}).status_code == 204


def test_a_subscription_holds_at_most_10000_named_streams(http: httpx.Client) -> None:
    """Each request names at most 1000 paths, but requests added up without bound: every wake
    of the subscription carries, and every change of it re-reads, all of its streams."""
    http.put("/v1/stream/wake2", headers=JSON)
    subs = "/v1/stream/__ds/subscriptions"
    spec = {"type": "pull-wake", "wake_stream": "wake2", "streams": ["s-0-0"]}
    assert http.put(f"{subs}/full", json=spec).status_code == 201
    for k in range(10):
        paths = [f"s-{k}-{i}" for i in range(1000)]  # s-0-0 named again: it counts once
        r = http.post(f"{subs}/full/streams", json={"streams": paths})
        assert r.status_code == 204, (k, r.text[:200])
    assert len(http.get(f"{subs}/full").json()["streams"]) == 10_000
    r = http.post(f"{subs}/full/streams", json={"streams": ["s-0-1", "one-more"]})
    assert r.status_code == 400, r.text[:200]
    assert "10000" in r.text and "streams" in r.text
    assert len(http.get(f"{subs}/full").json()["streams"]) == 10_000
    # Paths it already names are no growth; after a removal there is room again.
    assert http.post(f"{subs}/full/streams", json={"streams": ["s-0-1"]}).status_code == 204
    assert http.delete(f"{subs}/full/streams/s-0-1").status_code in (200, 204)
    assert http.post(f"{subs}/full/streams", json={"streams": ["one-more"]}).status_code == 204


# -- odd headers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://[::1", "http://[zz]"])
def test_a_malformed_origin_is_no_grant_and_no_error(
    srv: Server, http: httpx.Client, origin: str
) -> None:
    """urlsplit raises on a bracketed host it cannot parse: every request with such an Origin
    lost its answer (the connection closed) and logged two tracebacks."""
    path = new_stream(http, BINARY)
    # Without tokens a write names a granted origin or none: this one is refused, in JSON.
    r = http.post(path, content=b"x", headers={**BINARY, "Origin": origin})
    assert r.status_code == 403 and r.json()["error"]["field"] == "Origin"
    assert "access-control-allow-origin" not in r.headers
    assert http.post(path, content=b"x", headers=BINARY).status_code == 204
    r = http.options(path, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert "access-control-allow-origin" not in r.headers
    assert http.get(f"{path}?offset=-1", headers={"Origin": origin}).content == b"x"
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize("host", ["127.0.0.1:99999", "127.0.0.1:abc", "[::1]]", "localhost:-1"])
def test_a_malformed_host_is_a_400_before_anything_is_done(
    srv: Server, http: httpx.Client, host: str
) -> None:
    """A create built its Location from the Host after the stream was made: a port out of
    range was a 500 for a create that had happened."""
    name = f"host-{uuid.uuid4().hex[:8]}"
    head = f"PUT /v1/stream/{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode())
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head_part, _, body = got.partition(b"\r\n\r\n")
    assert head_part.split(b"\r\n")[0].split()[1] == b"400", got[:300]
    assert httpx.Response(200, content=body).json()["error"]["field"] == "Host"
    assert http.head(f"/v1/stream/{name}").status_code == 404
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize("path", ["/v1/stream/x", "/api/stations", "/no/such/route"])
def test_an_expect_that_is_not_text_is_a_417_not_a_500(srv: Server, path: str) -> None:
    """aiohttp answers Expect before any middleware: its refusal of a value that is not UTF-8
    failed to encode the value into its own message (500 and a traceback, on every route)."""
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + b"Expect: \x80\xff\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(head + b"Connection: close\r\n\r\n")
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head_part, _, body = got.partition(b"\r\n\r\n")
    assert head_part.split(b"\r\n")[0].split()[1] == b"417", got[:300]
    assert httpx.Response(200, content=body).json()["error"]["field"] == "Expect"
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize("path", ["/v1/stream/x", "/api/stations", "/api/transactions"])
def test_an_unknown_expectation_is_a_json_417(srv: Server, path: str) -> None:
    """The review of 2026-11-29: ``Expect: foo`` was answered in aiohttp's plain text, the
    value quoted back, before any middleware; it is the JSON error every refusal is. (A path no
    route serves, or a method it does not take, still gets aiohttp's own 417: the Expect
    handler is then aiohttp's.)"""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: foo\r\n".encode()
    head += b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    got = _answer_to_head(srv, head)
    head_part, _, body = got.partition(b"\r\n\r\n")
    assert head_part.split(b"\r\n")[0].split()[1] == b"417", got[:300]
    assert b"application/json" in head_part.lower(), head_part
    error = httpx.Response(200, content=body).json()["error"]
    assert error["field"] == "Expect" and "foo" not in error["message"], error


def _answer_to_head(srv: Server, head: bytes) -> bytes:
    """The first answer to ``head`` sent alone (no body follows), whole. (The server then
    reads and drops what else comes for a while before it closes: aiohttp's lingering close.)"""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=8) as sock:  # < body timeout
        sock.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < _length(got):
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    return got


def _length(got: bytes) -> int:
    for line in got.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@pytest.mark.parametrize("expect", [False, True])
@pytest.mark.parametrize("path", ["/v1/stream/declared-big", "/api/stations"])
def test_a_body_declared_over_the_limit_is_refused_before_it_is_sent(
    srv: Server, http: httpx.Client, path: str, expect: bool
) -> None:
    """``Content-Length: 100000000`` (over 64 MiB): a 413 at once, naming the body. It was read
    up to the limit first, or a client that waited to send it got a 408 after the body
    timeout; with ``Expect: 100-continue`` the server asked for the 100 MB (100 Continue)."""
    http.put("/v1/stream/declared-big", headers={"Content-Type": "application/json"})
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    head += b"Content-Type: application/json\r\nContent-Length: 100000000\r\n"
    head += b"Expect: 100-continue\r\n" if expect else b""
    got = _answer_to_head(srv, head + b"\r\n")
    assert not got.startswith(b"HTTP/1.1 100"), got[:200]
    status_line, _, rest = got.partition(b"\r\n")
    assert status_line.split()[1] == b"413", got[:300]
    error = httpx.Response(200, content=rest.partition(b"\r\n\r\n")[2]).json()["error"]
    assert error["field"] == "body"


@pytest.mark.parametrize("expect", [False, True])
def test_a_body_declared_too_large_from_a_foreign_host_gets_the_host_refusal(
    srv: Server, expect: bool
) -> None:
    """The Expect variant was refused 413 before any middleware ran (no Host check, no count):
    the Host refusal comes first with or without it."""
    head = b"POST /api/stations HTTP/1.1\r\nHost: evil.example\r\n"
    head += b"Content-Type: application/json\r\nContent-Length: 100000000\r\n"
    head += b"Expect: 100-continue\r\n" if expect else b""
    got = _answer_to_head(srv, head + b"\r\n")
    assert got.split()[1] == b"403", got[:300]


def test_a_body_within_the_limit_is_still_asked_for_with_100_continue(
    srv: Server, http: httpx.Client
) -> None:
    name = f"continue-{uuid.uuid4().hex[:8]}"
    assert http.put(f"/v1/stream/{name}", headers={"Content-Type": "application/json"}).is_success
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/stream/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nContent-Length: 7\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b'{"a":1}')
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.split()[1] == b"204", got[:300]
    assert http.get(f"/v1/stream/{name}?offset=-1").json() == [{"a": 1}]


def test_expect_before_http_1_1_is_ignored(srv: Server) -> None:
    """Expect means nothing to an HTTP/1.0 request (RFC 9110): aiohttp ignores it, and the
    routes' own Expect handler answered 417."""
    head = b"GET /api/stations HTTP/1.0\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n\r\n"
    got = _answer_to_head(srv, head)
    assert got.split()[1] == b"200", got[:300]


def test_a_head_of_a_large_page_sends_no_body(srv: Server, http: httpx.Client) -> None:
    """A page over 64 KiB is sent in chunks; a HEAD of it sent the body too, and the next
    answer on the connection was read from inside it."""
    name = f"head-{uuid.uuid4().hex[:8]}"
    assert http.post("/api/stations", json={"name": name}).status_code == 201
    messages = [{"data": "x" * 1000} for _ in range(200)]
    assert http.post(f"/api/stations/{name}/messages", json={"messages": messages}).is_success
    path = f"/api/stations/{name}/messages?limit=200"
    assert len(http.get(path).content) > 64 * 1024
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while chunk := sock.recv(65536):
            got += chunk
    head, _, after = got.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200", head
    # Right after the HEAD's header block comes the next answer, not the page.
    assert after.startswith(b"HTTP/1.1 200"), after[:100]


# -- pages of the dead-letter store ---------------------------------------------------------------


def _dead_letter_all(http: httpx.Client, station: str) -> int:
    n = 0
    for _ in range(100):
        got = http.post(f"/api/stations/{station}/groups/g/fetch", json={"max": 100}).json()
        offsets = [m["offset"] for m in got["messages"]]
        if not offsets:
            return n
        r = http.post(f"/api/stations/{station}/groups/g/dead-letter", json={"offsets": offsets})
        n += r.json()["deadLettered"]
    raise AssertionError("the group never ran dry")


def _all_pages(http: httpx.Client, station: str, limit: int) -> list[list[dict[str, object]]]:
    pages: list[list[dict[str, object]]] = []
    after = ""
    for _ in range(100):
        body = http.get(f"/api/stations/{station}/dls?limit={limit}&after={after}").json()
        pages.append(body["entries"])
        if body["next"] is None:
            return pages
        after = body["next"]
    raise AssertionError("the pages never ended")


def test_a_page_of_large_dead_letters_stops_at_8_mib(http: httpx.Client) -> None:
    """The DLS listing read and answered up to 1000 entries whatever their size (a fetch and
    browsing stop at 8 MiB): 50 entries of 4 MB were one 266 MB answer that took the server
    about 1 GB, and 1000 of them would have taken it down."""
    station = f"bigdls-{uuid.uuid4().hex[:6]}"
    http.post("/api/stations", json={"name": station, "contentType": "application/octet-stream"})
    http.put(f"/api/stations/{station}/groups/g", json={})
    blobs = [bytes([0x80 + i]) * (3 << 20) for i in range(6)]  # not UTF-8: dataBase64
    for blob in blobs:
        assert http.post(f"/v1/stream/{station}", content=blob, headers=BINARY).status_code == 204
    assert _dead_letter_all(http, station) == 6
    pages = _all_pages(http, station, 100)
    for page in pages:
        data = sum(len(str(e["dataBase64"])) * 3 // 4 for e in page)
        assert len(page) == 1 or data <= 8 << 20, [len(p) for p in pages]
    entries = [e for page in pages for e in page]
    assert [base64.b64decode(str(e["dataBase64"])) for e in entries] == blobs
    assert len(pages) == 3


def test_pages_of_small_dead_letters_keep_their_limit(http: httpx.Client) -> None:
    station = f"smalldls-{uuid.uuid4().hex[:6]}"
    http.post("/api/stations", json={"name": station})
    http.put(f"/api/stations/{station}/groups/g", json={})
    messages = [{"data": i} for i in range(40)]
    http.post(f"/api/stations/{station}/messages", json={"messages": messages})
    assert _dead_letter_all(http, station) == 40
    assert [len(p) for p in _all_pages(http, station, 7)] == [7, 7, 7, 7, 7, 5]
    pages = _all_pages(http, station, 1000)
    assert [[e["data"] for e in p] for p in pages] == [list(range(40))]
    assert [len(p) for p in _all_pages(http, station, 40)] == [40]


# -- free text written into rows --------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def both(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory, "--log-level", "info")


def _leased(http: httpx.Client, station: str, n: int) -> list[str]:
    http.post("/api/stations", json={"name": station})
    http.put(f"/api/stations/{station}/groups/g", json={})
    http.post(
        f"/api/stations/{station}/messages", json={"messages": [{"data": i} for i in range(n)]}
    )
    got = http.post(f"/api/stations/{station}/groups/g/fetch", json={"max": n}).json()
    return [m["offset"] for m in got["messages"]]


def test_text_with_nul_is_a_400_naming_its_field_on_both_engines(both: Server) -> None:
    """PostgreSQL's text columns refuse NUL: a consumer, dead-letter reason, description or
    webhook URL holding one was a 500 there (and stored on SQLite)."""
    http = httpx.Client(base_url=both.url, timeout=30)
    station = f"nul-{uuid.uuid4().hex[:6]}"
    offsets = _leased(http, station, 2)
    groups = f"/api/stations/{station}/groups/g"
    sent = [
        (f"{groups}/fetch", {"consumer": "a\0b"}, "consumer"),
        (f"{groups}/dead-letter", {"offsets": offsets, "reason": "a\0b"}, "reason"),
        ("/api/transactions", {"consumer": "a\0b", "ack": []}, "consumer"),
        (
            "/api/transactions",
            {
                "deadLetter": [
                    {"station": station, "group": "g", "offset": offsets[0], "reason": "\0"}
                ]
            },
            "deadLetter.0.reason",
        ),
    ]
    for path, body, field in sent:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text[:300])
        assert r.json()["error"]["field"] == field
    subs = "/v1/stream/__ds/subscriptions"
    http.put(f"/v1/stream/{station}-wake", headers=JSON)
    pull = {"type": "pull-wake", "wake_stream": f"{station}-wake", "pattern": "x"}
    for body, field in [
        ({**pull, "description": "a\0b"}, "description"),
        (
            {"type": "webhook", "webhook": {"url": "https://example.com/\0"}, "pattern": "x"},
            "webhook.url",
        ),
    ]:
        r = http.put(f"{subs}/nul-{field}", json=body)
        assert r.status_code == 400, (body, r.text[:300])
        assert r.json()["error"]["field"] == field
    # Nothing was settled by the refused requests.
    assert http.post(f"{groups}/ack", json={"offsets": offsets}).json()["acked"] == 2
    assert "Traceback" not in both.log()


def test_a_dead_letter_reason_is_at_most_4096_characters(both: Server) -> None:
    """The reason is copied into every entry a request names: a 1 MB reason for 1000 offsets
    wrote 1 GB into the database in one request (10,000 offsets of 6 MB: 60 GB)."""
    http = httpx.Client(base_url=both.url, timeout=30)
    station = f"reason-{uuid.uuid4().hex[:6]}"
    offsets = _leased(http, station, 3)
    path = f"/api/stations/{station}/groups/g/dead-letter"
    r = http.post(path, json={"offsets": offsets, "reason": "r" * 4097})
    assert (r.status_code, r.json()["error"]["field"]) == (400, "reason")
    assert http.get(f"/api/stations/{station}/dls").json()["entries"] == []
    r = http.post(path, json={"offsets": offsets, "reason": "r" * 4096})
    assert r.json()["deadLettered"] == 3
    entries = http.get(f"/api/stations/{station}/dls").json()["entries"]
    assert [e["error"] for e in entries] == ["r" * 4096] * 3


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/stations/a%00b"),
        ("DELETE", "/api/stations/a%00b"),
        ("GET", "/api/stations/a%00b/messages"),
        ("POST", "/api/stations/a%00b/messages"),
        ("GET", "/api/stations/a%00b/groups"),
        ("PUT", "/api/stations/a%00b/groups/g"),
        ("POST", "/api/stations/a%00b/groups/g/fetch"),
        ("GET", "/api/stations/a%00b/cursors"),
        ("GET", "/api/stations/a%00b/dls"),
        ("GET", "/api/stations/nul-path/dls?group=a%00b"),
    ],
)
def test_a_nul_in_a_station_path_or_group_filter_is_a_400(
    both: Server, method: str, path: str
) -> None:
    """No name holds NUL, and PostgreSQL cannot compare one: every management route with a NUL
    in its station name, and the DLS listing's group filter, answered 500 there."""
    http = httpx.Client(base_url=both.url, timeout=30)
    http.post("/api/stations", json={"name": "nul-path"})
    body = {"messages": [{"data": 1}]} if path.endswith("messages") else {}
    r = http.request(method, path, json=body if method in ("POST", "PUT") else None)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["field"] in ("name", "group")
    assert "Traceback" not in both.log()


def test_a_nul_in_the_group_of_a_dls_replay_is_a_400(both: Server) -> None:
    http = httpx.Client(base_url=both.url, timeout=30)
    station = f"replay-{uuid.uuid4().hex[:6]}"
    offsets = _leased(http, station, 1)
    http.post(f"/api/stations/{station}/groups/g/dead-letter", json={"offsets": offsets})
    for body in [{"all": True, "group": "a\0b"}, {"ids": ["1"], "group": "\0"}]:
        r = http.post(f"/api/stations/{station}/dls/replay", json=body)
        assert (r.status_code, r.json()["error"]["field"]) == (400, "group"), r.text[:300]
    assert len(http.get(f"/api/stations/{station}/dls").json()["entries"]) == 1
    assert "Traceback" not in both.log()


def test_a_pull_wake_worker_holding_nul_is_a_400(both: Server) -> None:
    """The worker name is stored as the claim's holder: a NUL would fail on PostgreSQL."""
    http = httpx.Client(base_url=both.url, timeout=30)
    name = f"wk-{uuid.uuid4().hex[:6]}"
    http.put(f"/v1/stream/{name}", headers=JSON)
    sub = f"/v1/stream/__ds/subscriptions/{name}"
    spec = {"type": "pull-wake", "wake_stream": name, "streams": [f"{name}-data"]}
    assert http.put(sub, json=spec).status_code == 201
    r = http.post(f"{sub}/claim", json={"worker": "a\0b"})
    assert (r.status_code, r.json()["error"]["field"]) == (400, "worker"), r.text[:300]
