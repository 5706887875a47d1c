"""Bad input a fuzzing review found answered 5xx (or worse), each now a 4xx naming its field;
each case failed on the code before its fix."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from stations.domain import dls
from stations.domain.subscriptions.spec import glob_match
from tests.harness import Server

ADMIN = "admin-token-1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("fuzzed")
    (work / "tokens.json").write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}]}))
    server = Server(
        f"sqlite:///{work / 'db.sqlite'}", Path(work), ["--tokens", str(work / "tokens.json")]
    )
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as c:
        yield c


def _station(client: httpx.Client) -> str:
    name = f"fz-{uuid.uuid4().hex[:8]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    return name


def _refused(answer: httpx.Response, field: str) -> None:
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field, answer.text


@pytest.mark.parametrize("time_", ["²", "999999999999999", "0001-01-01T00:00:00+01:00"])
def test_offset_at_a_time_out_of_range(client: httpx.Client, time_: str) -> None:
    name = _station(client)
    _refused(client.get(f"/api/stations/{name}/offsets", params={"time": time_}), "time")


def test_a_lone_surrogate_in_a_name_is_refused(client: httpx.Client) -> None:
    name = _station(client)
    assert client.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
    body = b'{"max": 1, "consumer": "\\ud800"}'
    answer = client.post(
        f"/api/stations/{name}/groups/g/fetch",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    _refused(answer, "consumer")


def test_subscription_bodies_nested_too_deeply_or_with_bad_hosts(client: httpx.Client) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    answer = client.put("/v1/stream/__ds/subscriptions/deep", content=deep)
    assert answer.status_code == 400, answer.text
    for url in ("https://a..b/", f"https://{'x' * 64}.test/"):
        spec = {"type": "webhook", "streams": ["a"], "webhook": {"url": url}}
        answer = client.put("/v1/stream/__ds/subscriptions/hooked", json=spec)
        assert answer.status_code == 400, answer.text


def test_an_authorization_header_that_is_not_utf8_is_unauthorized(srv: Server) -> None:
    with socket.create_connection(("127.0.0.1", srv.port)) as conn:
        conn.sendall(
            b"GET /api/stations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n"
        )
        head = conn.recv(1024)
    assert head.startswith(b"HTTP/1.1 401"), head


def test_deleting_a_stream_ends_its_sse_readers_cleanly(srv: Server, client: httpx.Client) -> None:
    """The reader's chunked answer ends properly (it had a second response written into it)."""
    path = f"/v1/stream/sse-{uuid.uuid4().hex[:8]}"
    assert client.put(path, headers={"Content-Type": "application/json"}).status_code == 201
    with socket.create_connection(("127.0.0.1", srv.port)) as conn:
        conn.settimeout(10)
        conn.sendall(
            f"GET {path}?offset=-1&live=sse HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {ADMIN}\r\n\r\n".encode()
        )
        received = conn.recv(65536)
        assert received.startswith(b"HTTP/1.1 200"), received
        time.sleep(0.2)
        assert client.delete(path).status_code == 204
        while not received.endswith(b"0\r\n\r\n"):
            chunk = conn.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b"HTTP/1.1") == 1, received


def test_redrive_delays_cap_however_many_redrives() -> None:
    policy = {"delayMs": 1, "backoff": 10, "maxDelayMs": 60_000}
    assert dls.redrive_delay(policy, 400) == 60_000


def test_stacked_double_stars_match_in_polynomial_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segment comparisons are bounded by pattern segments x path segments (backtracking
    made ``**/**/.../zz`` exponential: seconds per append, the event loop stalled)."""
    from fnmatch import fnmatchcase

    from stations.domain.subscriptions import spec

    calls = []

    def counted(name: str, pat: str) -> bool:
        calls.append(1)
        return fnmatchcase(name, pat)

    monkeypatch.setattr(spec, "fnmatchcase", counted)
    pats, segs = ["**"] * 6 + ["zz"], ["x"] * 12
    assert not glob_match("/".join(pats), "/".join(segs))
    assert glob_match("/".join(pats), "/".join([*segs, "zz"]))
    assert len(calls) <= 2 * len(pats) * (len(segs) + 1)
    assert glob_match("a/**/c", "a/c") and glob_match("a/**", "a") and not glob_match("a/*", "a")


@pytest.mark.parametrize("name", ["x%0A", "%2E", "%2E%2E"])
def test_cursor_names_are_whole_names(client: httpx.Client, name: str) -> None:
    """``x\\n`` passed a ``^...$`` match; ``.`` and ``..`` could never be reached by URL."""
    station = _station(client)
    answer = client.put(f"/api/stations/{station}/cursors/{name}", json={"offset": "-1"})
    _refused(answer, "cursor")


@pytest.mark.parametrize("body", [b"null", b"[]", b'"x"', b"1"])
def test_a_group_body_that_is_not_an_object_is_refused(client: httpx.Client, body: bytes) -> None:
    name = _station(client)
    answer = client.put(
        f"/api/stations/{name}/groups/g", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert "JSON object" in answer.json()["error"]["message"]
    assert client.get(f"/api/stations/{name}/groups").json()["groups"] == []


def test_sse_on_text_keeps_a_character_split_between_appends(client: httpx.Client) -> None:
    """A text stream takes bytes as they come: a character split between two appends was
    written as two replacement characters when the halves fell in two SSE events (review)."""
    name = f"fz-{uuid.uuid4().hex[:8]}"
    path = f"/v1/stream/{name}"
    assert client.put(path, headers={"Content-Type": "text/plain"}).status_code == 201
    texts: list[str] = []
    with client.stream("GET", path, params={"offset": "-1", "live": "sse"}) as r:
        lines = r.iter_lines()

        def next_event() -> tuple[str, str]:
            kind, data = "", []
            for line in lines:
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    data.append(line[5:])
                elif not line and kind:
                    return kind, "\n".join(data)
            raise AssertionError("the SSE response ended")

        assert next_event()[0] == "control"
        for part in (b"price \xe2\x82", b"\xac 5"):
            r2 = client.post(path, content=part, headers={"Content-Type": "text/plain"})
            assert r2.status_code in (200, 204), r2.text
            kind, data = next_event()
            while kind != "control":
                texts.append(data)
                kind, data = next_event()
    assert "".join(texts) == "price \u20ac 5", texts


def test_live_given_twice_is_a_400_as_offset_given_twice_is(client: httpx.Client) -> None:
    """``?live=long-poll&live=sse`` was served as a long-poll (the first won) where a second
    ``offset`` is refused: which mode was meant is not said."""
    name = f"twice-{uuid.uuid4().hex[:8]}"
    assert (
        client.put(f"/v1/stream/{name}", headers={"Content-Type": "text/plain"}).status_code == 201
    )
    r = client.get(f"/v1/stream/{name}?offset=-1&live=long-poll&live=sse")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "live"


@pytest.mark.parametrize(
    "sub_id", ["a\u200bb", "x\x85y", "a\u00a0b", "line\u2028two", "\u202eevil", "a b"]
)
def test_subscription_ids_hold_only_visible_characters(client: httpx.Client, sub_id: str) -> None:
    """The review of 2026-11-29: C1 controls and invisible format characters (a zero-width
    space, a bidirectional override) passed as "visible": two ids that look the same."""
    spec = {"type": "pull-wake", "streams": ["a"], "wake_stream": "w"}
    path = f"/v1/stream/__ds/subscriptions/{quote(sub_id, safe='')}"
    answer = client.put(path, json=spec)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "id", answer.text


def test_subscription_ids_in_any_script_are_taken(client: httpx.Client) -> None:
    spec = {"type": "pull-wake", "streams": ["a"], "wake_stream": "w"}
    answer = client.put(f"/v1/stream/__ds/subscriptions/{quote('注文-café')}", json=spec)
    assert answer.status_code in (200, 201), answer.text
