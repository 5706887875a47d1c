"""Edges (issue 11): the Durable Streams door has the management API's name rules, JSON nested
past the depth limit is a 400 naming the limit, and a client that disconnects mid-upload costs
one line at info. One SQLite server, logging at info."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import module_server

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_server("sqlite", tmp_path_factory, "--log-level", "info")


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def raw_request(srv: Server, method: str, path: str) -> int:
    """A request line sent as is (no client-side normalisation of ``..`` or ``//``)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"
        sock.sendall(
            (head + "Content-Type: application/json\r\nConnection: close\r\n\r\n").encode()
        )
        status = sock.recv(4096).split(b"\r\n", 1)[0]
    return int(status.split()[1])


# -- one set of name rules ------------------------------------------------------------------------

REFUSED = [
    "__ds%2Fx",
    "__ds",
    "a%2F..%2Fb",
    "..%2Fx",
    "a%2F.",
    "a%2F%2Fb",
    "a%2F",
    "%2Fa",
    "a%7Bb%7D",
    "a%20b",
    "x" * 513,
]


@pytest.mark.parametrize("name", REFUSED, ids=lambda n: n[:20])
def test_stream_door_refuses_what_the_station_api_refuses(http: httpx.Client, name: str) -> None:
    # The management API refuses it ...
    decoded = name.replace("%2F", "/").replace("%7B", "{").replace("%7D", "}").replace("%20", " ")
    made = http.post("/api/stations", json={"name": decoded})
    assert made.status_code == 400, made.text
    # ... and so does the Durable Streams door, for every method.
    for method in ("PUT", "POST", "GET", "DELETE"):
        content = b"[1]" if method == "POST" else None
        response = http.request(method, f"/v1/stream/{name}", headers=JSON, content=content)
        assert response.status_code == 400, (method, name, response.text)
        assert response.json()["error"]["field"] == "path"
    assert http.head(f"/v1/stream/{name}").status_code == 400
    assert decoded not in {s["name"] for s in http.get("/api/stations").json()["stations"]}


@pytest.mark.parametrize(
    "path", ["/v1/stream/__ds/x", "/v1/stream/a//b", "/v1/stream/a/../b", "/v1/stream/a/./b"]
)
def test_raw_paths_are_refused(srv: Server, http: httpx.Client, path: str) -> None:
    status = raw_request(srv, "PUT", path)
    if path.startswith("/v1/stream/__ds/"):
        assert status == 404  # the protocol's control routes own __ds/: no such route there
    else:
        assert status == 400
    names = {s["name"] for s in http.get("/api/stations").json()["stations"]}
    assert not any(n.startswith("__ds") or "//" in n or "." in n.split("/") for n in names)


def test_fork_source_names_follow_the_rules(http: httpx.Client) -> None:
    fork = f"/v1/stream/fork-{uuid.uuid4().hex[:8]}"
    for source in ("/v1/stream/__ds/x", "/v1/stream/a//b", "/v1/stream/a%7Bb%7D"):
        response = http.put(fork, headers={"Stream-Forked-From": source})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["field"] == "Stream-Forked-From"


def test_good_names_still_work_on_both_doors(http: httpx.Client) -> None:
    name = f"ok/{uuid.uuid4().hex[:8]}/a.b_c~d-e"
    enc = name.replace("/", "%2F")
    assert http.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    assert http.post(f"/v1/stream/{name}", headers=JSON, content=b"[1,2]").status_code == 204
    assert http.get(f"/api/stations/{enc}").json()["stats"]["messages"] == 2


# -- JSON depth -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [513, 1000, 1024, 1100, 100_000])
@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_deep_json_is_a_400_naming_the_limit(http: httpx.Client, method: str, depth: int) -> None:
    path = f"/v1/stream/deep-{uuid.uuid4().hex[:8]}"
    if method == "POST":
        assert http.put(path, headers=JSON).status_code == 201
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        response = http.request(method, path, headers=JSON, content=body)
        assert response.status_code == 400, (depth, response.status_code, response.text[:200])
        error = response.json()["error"]
        assert error["field"] == "body"
        assert "512" in error["message"], error


def test_json_up_to_the_limit_is_stored(http: httpx.Client) -> None:
    path = f"/v1/stream/deep-ok-{uuid.uuid4().hex[:8]}"
    assert http.put(path, headers=JSON).status_code == 201
    # 512 levels in the body: the outer array is flattened, so the message nests 511.
    body = b"[" * 512 + b"]" * 512
    assert http.post(path, headers=JSON, content=body).status_code == 204
    read = http.get(path, params={"offset": "-1"})
    assert read.status_code == 200
    assert read.content == b"[" + b"[" * 511 + b"]" * 511 + b"]"


# -- clients that go away mid-upload ------------------------------------------------------------


def test_disconnect_mid_upload_is_one_info_line(srv: Server, http: httpx.Client) -> None:
    name = f"upload-{uuid.uuid4().hex[:8]}"
    assert http.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    log_path = srv.workdir / f"server-{srv.port}.log"
    start = log_path.stat().st_size
    requests = [
        ("POST", f"/v1/stream/{name}"),
        ("PUT", f"/v1/stream/{name}-new"),
        ("POST", "/api/stations"),
        ("POST", f"/api/stations/{name}/messages"),
    ]
    for method, path in requests:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            head += "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            sock.sendall(head.encode() + b'{"messages": [1, 2, 3')
            time.sleep(0.1)  # the server is reading the body when the client goes
    deadline = time.monotonic() + 10
    while True:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        lines = [line for line in text.splitlines() if "disconnected during" in line]
        if len(lines) == len(requests) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == len(requests), text[-3000:]
    assert all(" INFO " in line for line in lines), lines
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]
    assert http.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == []


# -- a stream's content is data, never a page of this origin ----------------------------------


@pytest.mark.parametrize("media", ["text/html", "image/svg+xml", "application/xhtml+xml"])
def test_a_stream_read_is_sandboxed_whatever_its_media_type(http: httpx.Client, media: str) -> None:
    """A station of text/html (or SVG) was served with its own media type and no policy: a
    link to its read opened a page of the console's origin running its messages' scripts,
    which could read the console's token or, without tokens, write as the console (the
    console review deleted a station that way). Every response outside the console's pages
    now carries a sandboxing policy: no script runs, and the page has no origin of ours."""
    name = f"page-{uuid.uuid4().hex[:8]}"
    page = b"<html><script>fetch('/api/stations/x', {method: 'DELETE'})</script></html>"
    assert http.put(f"/v1/stream/{name}", content=page, headers={"Content-Type": media}).is_success
    for method in ("GET", "HEAD"):
        r = http.request(method, f"/v1/stream/{name}?offset=-1")
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(media)
        assert r.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"
    answers = [
        http.post(f"/v1/stream/{name}", content=b"<p>", headers={"Content-Type": media}),
        http.get(f"/api/stations/{name}/messages", params={"offset": "-1"}),
        http.get("/v1/stream/no-such-stream"),
    ]
    for r in answers:
        assert r.headers["Content-Security-Policy"] == "sandbox; default-src 'none'", r.url
    # The console's own pages keep their policy (scripts of its own, nothing else).
    console = http.get("/ui/")
    assert "default-src 'self'" in console.headers["Content-Security-Policy"]
    assert "sandbox" not in console.headers["Content-Security-Policy"]


def test_the_openapi_document_is_served_as_yaml(http: httpx.Client) -> None:
    """It went as application/octet-stream (Python's mimetypes knows no .yaml before 3.13):
    a browser downloaded it, and tools that pick a parser by type did not take it."""
    import yaml

    r = http.get("/api/openapi.yaml")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/yaml; charset=utf-8"
    assert yaml.safe_load(r.text)["openapi"].startswith("3.")
