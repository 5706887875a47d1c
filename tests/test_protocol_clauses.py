"""Durable Streams PROTOCOL.md clauses the conformance suite does not check, each against a real
``stations serve`` on both engines: idempotent fork re-creation that names the defaults the
fork resolved (§4.2), reads from an offset that retention dropped (§5.6: 410, not a silent
skip, on the management browse too), and ETags that change when retention changes a read's
body (§10.1)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server

TEXT = {"Content-Type": "text/plain"}
ZERO = "0000000000000000_0000000000000000"


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory, "--long-poll-timeout-ms", "500")


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def _name() -> str:
    return f"pc-{uuid.uuid4().hex[:10]}"


def _path(name: str) -> str:
    return f"/v1/stream/{name}"


# -- §4.2 idempotent fork creation ------------------------------------------------------------


def test_fork_recreated_naming_the_offset_it_defaulted_to_is_200(http: httpx.Client) -> None:
    """A fork made without Stream-Fork-Offset forks at the source's tail; a retry that names
    that offset asks for the same fork (matching Stream-Forked-From and Stream-Fork-Offset):
    200, not 409. Another offset stays a 409."""
    src, fork = _name(), _name()
    assert http.put(_path(src), headers=TEXT, content=b"abc").status_code == 201
    made = http.put(_path(fork), headers={"Stream-Forked-From": _path(src)})
    assert made.status_code == 201
    tail = made.headers["Stream-Next-Offset"]
    assert tail != ZERO
    again = http.put(
        _path(fork), headers={"Stream-Forked-From": _path(src), "Stream-Fork-Offset": tail}
    )
    assert again.status_code == 200, again.text
    assert again.headers["Stream-Next-Offset"] == tail
    other = http.put(
        _path(fork), headers={"Stream-Forked-From": _path(src), "Stream-Fork-Offset": ZERO}
    )
    assert other.status_code == 409
    # The original request, repeated, still matches.
    assert http.put(_path(fork), headers={"Stream-Forked-From": _path(src)}).status_code == 200


def test_fork_recreated_naming_the_ttl_it_inherited_is_200(http: httpx.Client) -> None:
    """A fork made without TTL or expiry inherits its source's (§4.2 table); a retry that names
    the inherited value asks for a fork with that configuration: 200. Another TTL: 409."""
    src, fork = _name(), _name()
    assert http.put(_path(src), headers={**TEXT, "Stream-TTL": "600"}).status_code == 201
    made = http.put(_path(fork), headers={"Stream-Forked-From": _path(src)})
    assert made.status_code == 201
    assert made.headers["Stream-TTL"] == "600"
    same = http.put(_path(fork), headers={"Stream-Forked-From": _path(src), "Stream-TTL": "600"})
    assert same.status_code == 200, same.text
    assert same.headers["Stream-TTL"] == "600"
    other = http.put(_path(fork), headers={"Stream-Forked-From": _path(src), "Stream-TTL": "601"})
    assert other.status_code == 409

    src, fork = _name(), _name()
    expires = "2099-01-01T00:00:00Z"
    assert http.put(_path(src), headers={**TEXT, "Stream-Expires-At": expires}).status_code == 201
    assert http.put(_path(fork), headers={"Stream-Forked-From": _path(src)}).status_code == 201
    same = http.put(
        _path(fork), headers={"Stream-Forked-From": _path(src), "Stream-Expires-At": expires}
    )
    assert same.status_code == 200, same.text
    # The inherited expiry is not a TTL.
    ttl = http.put(_path(fork), headers={"Stream-Forked-From": _path(src), "Stream-TTL": "600"})
    assert ttl.status_code == 409


# -- §5.6 / §10.1 reads after retention -------------------------------------------------------


def _retained(http: httpx.Client, keep: int, count: int) -> str:
    """A text station keeping its last ``keep`` of ``count`` appends m0; m1; ..."""
    name = _name()
    made = http.post(
        "/api/stations",
        json={"name": name, "contentType": "text/plain", "retention": {"maxMessages": keep}},
    )
    assert made.status_code == 201, made.text
    for i in range(count):
        assert http.post(_path(name), headers=TEXT, content=f"m{i};".encode()).status_code == 204
    want = "".join(f"m{i};" for i in range(count - keep, count))
    deadline = time.monotonic() + 10
    while http.get(_path(name), params={"offset": "-1"}).text != want:
        assert time.monotonic() < deadline, "retention did not drop the oldest messages"
        time.sleep(0.1)
    return name


@pytest.mark.parametrize("live", [None, "long-poll", "sse"])
def test_zero_offset_after_retention_is_410(http: httpx.Client, live: str | None) -> None:
    """The zero offset is a real offset (a new stream's Stream-Next-Offset, the first message's
    Msg-Offset): a reader resuming there after retention dropped the first messages must learn
    they are gone (410), not skip them silently. ``-1`` still means the earliest retained."""
    name = _retained(http, keep=2, count=5)
    params = {"offset": ZERO} if live is None else {"offset": ZERO, "live": live}
    with http.stream("GET", _path(name), params=params) as gone:
        assert gone.status_code == 410, gone.status_code
        assert json.loads(gone.read())["error"]["field"] == "offset"
    params["offset"] = "-1"
    assert _first_data(http, name, params) == "m3;m4;"


def test_management_browse_from_a_dropped_offset_is_410(http: httpx.Client) -> None:
    """The management browse follows the same rule as the Durable Streams read: an offset the
    client names that retention dropped, the zero offset included, is 410 (it started silently
    at the earliest kept message); ``-1`` (the default) is the earliest retained message."""
    name = _retained(http, keep=2, count=5)
    browse = f"/api/stations/{name}/messages"
    for offset in (ZERO, "0000000000000002_0000000000000000"):
        gone = http.get(browse, params={"offset": offset})
        assert gone.status_code == 410, (offset, gone.text)
        assert gone.json()["error"]["field"] == "offset"
    for params in ({"offset": "-1"}, {}):
        page = http.get(browse, params=params)
        assert page.status_code == 200, page.text
        assert [m["data"] for m in page.json()["messages"]] == ["m3;", "m4;"]
    # The earliest retained message's own offset is still there.
    kept = http.get(browse, params={"offset": "0000000000000003_0000000000000000"})
    assert [m["data"] for m in kept.json()["messages"]] == ["m3;", "m4;"]


def _first_data(http: httpx.Client, name: str, params: dict[str, str]) -> str:
    """The body of a read, or of an SSE read's first data event (the connection stays open)."""
    with http.stream("GET", _path(name), params=params) as response:
        assert response.status_code == 200
        if params.get("live") != "sse":
            return response.read().decode()
        lines = response.iter_lines()
        for line in lines:
            if line == "event: data":
                return next(lines).removeprefix("data:")
    raise AssertionError("no data event")


def test_etag_changes_when_retention_changes_the_body(http: httpx.Client) -> None:
    """Same offset, same tail, other bytes: once retention drops a message, a read from ``-1``
    answers another body, so it has another ETag (no 304 for the body a client cached)."""
    name = _name()
    assert http.post("/api/stations", json={"name": name, "contentType": "text/plain"}).is_success
    for i in range(3):
        http.post(_path(name), headers=TEXT, content=f"m{i};".encode())
    first = http.get(_path(name), params={"offset": "-1"})
    assert first.text == "m0;m1;m2;"
    etag = first.headers["ETag"]
    patched = http.patch(f"/api/stations/{name}", json={"retention": {"maxMessages": 2}})
    assert patched.status_code == 200, patched.text
    deadline = time.monotonic() + 10
    while http.get(_path(name), params={"offset": "-1"}).text != "m1;m2;":
        assert time.monotonic() < deadline, "retention did not drop m0"
        time.sleep(0.1)
    again = http.get(_path(name), params={"offset": "-1"}, headers={"If-None-Match": etag})
    assert again.status_code == 200
    assert again.text == "m1;m2;"
    assert again.headers["ETag"] != etag


# -- §10.1 caching at the tail ----------------------------------------------------------------


def test_empty_read_at_an_open_tail_is_not_cacheable(http: httpx.Client) -> None:
    """The closure signal (and new data) is found by reading at the tail offset again (§10.1):
    an empty answer there that a shared cache kept for a minute would hide both from everyone
    behind that cache. Data chunks, pages behind the tail and the EOF answer of a closed
    stream are kept but asked for again (``no-cache``): a stream deleted and created again
    answers other data at the same URL, which a browser kept for minutes."""
    name = _name()
    made = http.put(_path(name), headers=TEXT)
    tail = made.headers["Stream-Next-Offset"]
    empty = http.get(_path(name), params={"offset": tail})
    assert empty.status_code == 200
    assert empty.content == b""
    assert empty.headers["Stream-Up-To-Date"] == "true"
    assert empty.headers["Cache-Control"] == "no-store"
    assert http.post(_path(name), headers=TEXT, content=b"abc").status_code == 204
    chunk = http.get(_path(name), params={"offset": tail})
    assert chunk.content == b"abc"
    assert chunk.headers["Cache-Control"] == "public, no-cache"
    again = http.get(
        _path(name), params={"offset": tail}, headers={"If-None-Match": chunk.headers["ETag"]}
    )
    assert again.status_code == 304
    megabyte = b"x" * (1 << 20)
    for _ in range(5):  # more than one answer's 4 MiB
        assert http.post(_path(name), headers=TEXT, content=megabyte).status_code == 204
    page = http.get(_path(name), params={"offset": tail})
    assert "Stream-Up-To-Date" not in page.headers
    assert page.headers["Cache-Control"] == "public, no-cache"
    assert http.post(_path(name), headers={"Stream-Closed": "true"}).status_code == 204
    end = http.head(_path(name)).headers["Stream-Next-Offset"]
    eof = http.get(_path(name), params={"offset": end})
    assert eof.content == b""
    assert eof.headers["Stream-Closed"] == "true"
    assert eof.headers["Cache-Control"] == "public, no-cache"


def test_head_tags_the_streams_state(http: httpx.Client) -> None:
    """The reference server gives HEAD an ETag (the TS client's ``head().etag``); Stations gave
    none. It changes with an append and with the close, and names the stream (one deleted and
    created again is another)."""
    name = _name()
    assert http.put(_path(name), headers=TEXT).status_code == 201
    tags = [http.head(_path(name)).headers["ETag"]]
    assert http.post(_path(name), headers=TEXT, content=b"abc").status_code == 204
    tags.append(http.head(_path(name)).headers["ETag"])
    assert http.post(_path(name), headers={"Stream-Closed": "true"}).status_code == 204
    tags.append(http.head(_path(name)).headers["ETag"])
    assert http.delete(_path(name)).status_code == 204
    assert http.put(_path(name), headers=TEXT).status_code == 201
    tags.append(http.head(_path(name)).headers["ETag"])
    assert len(set(tags)) == 4, tags
    assert all(t.startswith('"') and t.endswith('"') for t in tags)


def test_head_answers_a_tag_it_still_has_with_304(http: httpx.Client) -> None:
    """RFC 9110 §13.1.2: a HEAD whose If-None-Match names the current tag is a 304 (it was
    always a 200), with the stream's headers; once the stream moves on, a 200 again."""
    name = _name()
    assert http.put(_path(name), headers=TEXT).status_code == 201
    first = http.head(_path(name))
    tag = first.headers["ETag"]
    same = http.head(_path(name), headers={"If-None-Match": tag})
    assert same.status_code == 304
    assert same.headers["ETag"] == tag
    assert same.headers["Stream-Next-Offset"] == first.headers["Stream-Next-Offset"]
    assert http.post(_path(name), headers=TEXT, content=b"abc").status_code == 204
    moved = http.head(_path(name), headers={"If-None-Match": tag})
    assert moved.status_code == 200 and moved.headers["ETag"] != tag


# -- §5.8 SSE framing -------------------------------------------------------------------------


def _sse_events(raw: str) -> list[tuple[str, str]]:
    """(event, data) pairs as an SSE parser (WHATWG HTML §9.2.6, and the Durable Streams
    client) reads them: one space after ``data:`` is dropped, lines joined with newlines."""
    events: list[tuple[str, str]] = []
    kind, data = "message", []
    for line in raw.split("\n"):
        if line == "":
            if data:
                events.append((kind, "\n".join(data)))
            kind, data = "message", []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)
    return events


def test_sse_text_lines_keep_their_leading_spaces(http: httpx.Client) -> None:
    """An SSE parser drops one space after ``data:``: a text line that begins with spaces must
    be framed so that the reader still gets every one of them."""
    name = _name()
    body = " lead\n  two\nthree "
    assert http.put(_path(name), headers=TEXT, content=body.encode()).status_code == 201
    assert http.post(_path(name), headers={"Stream-Closed": "true"}).status_code == 204
    raw = http.get(_path(name), params={"offset": "-1", "live": "sse"}).text
    events = _sse_events(raw)
    assert [data for kind, data in events if kind == "data"] == [body], raw
    control = json.loads([data for kind, data in events if kind == "control"][-1])
    assert control["streamClosed"] is True


def _sse_cursors(http: httpx.Client, name: str, params: dict[str, str], appends: int) -> list[int]:
    """The streamCursor of each control event while ``appends`` appends arrive one by one."""
    cursors: list[int] = []
    with http.stream("GET", _path(name), params=params) as response:
        lines = response.iter_lines()
        for _ in range(appends):
            assert http.post(_path(name), headers=TEXT, content=b"x").status_code == 204
            for line in lines:
                if line.startswith("data:{") and "streamCursor" in line:
                    cursors.append(int(json.loads(line[5:])["streamCursor"]))
                    break
    return cursors


def test_sse_cursor_follows_the_clock_not_the_event_count(http: httpx.Client) -> None:
    """§10.1: a cursor is the current 20 s interval; only a client cursor at or past it is
    moved on, by jitter of at most an hour (180 intervals). Within one SSE connection the
    cursor never goes back, and many events do not push it hours ahead of the clock."""
    name = _name()
    assert http.put(_path(name), headers=TEXT).status_code == 201
    cursors = _sse_cursors(http, name, {"offset": "-1", "live": "sse"}, 30)
    assert cursors == sorted(cursors)
    assert cursors[-1] - cursors[0] <= 2, cursors  # the clock's intervals, no jitter
    # A client cursor at the current interval: answered above it, by one jitter at most.
    echoed = _sse_cursors(
        http, name, {"offset": "now", "live": "sse", "cursor": str(cursors[-1])}, 30
    )
    assert echoed == sorted(echoed)
    assert cursors[-1] < echoed[0]
    assert echoed[-1] - cursors[-1] <= 180 + 2, echoed


def test_not_modified_carries_the_cache_control_of_the_read(http: httpx.Client) -> None:
    """A 304 carries the Cache-Control a 200 would (RFC 9110 §15.4.5): a cache that
    revalidated its copy takes its freshness from it. That is the chunk's max-age, and
    no-store for the empty read at an open tail."""
    name = _name()
    assert http.put(_path(name), headers=TEXT, content=b"abc").status_code == 201
    for offset in ("-1", http.head(_path(name)).headers["Stream-Next-Offset"]):
        first = http.get(_path(name), params={"offset": offset})
        again = http.get(
            _path(name), params={"offset": offset}, headers={"If-None-Match": first.headers["ETag"]}
        )
        assert again.status_code == 304
        assert again.headers.get("Cache-Control") == first.headers["Cache-Control"]


# -- the review of 2026-11-29 -------------------------------------------------------------------


def test_a_fork_without_content_type_frames_its_body_as_its_sources_type(
    http: httpx.Client,
) -> None:
    """A fork "inherits the source stream's content type" when the PUT names none (§4.2), and
    its body is then that type's: a JSON source's fork took its body as one raw message (an
    array stored unflattened, text stored as if it were JSON: reads answered invalid JSON)."""
    src, fork, bad = _name(), _name(), _name()
    json_type = {"Content-Type": "application/json"}
    assert http.put(_path(src), headers=json_type, content=b"[1,2]").status_code == 201
    inherit = {"Stream-Forked-From": _path(src)}
    made = http.put(_path(fork), headers=inherit, content=b"[3,4]")
    assert made.status_code == 201, made.text
    assert made.headers["Content-Type"].startswith("application/json")
    assert http.get(_path(fork), params={"offset": "-1"}).json() == [1, 2, 3, 4]
    refused = http.put(_path(bad), headers=inherit, content=b"hello world")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "body"
    assert http.head(_path(bad)).status_code == 404


def test_a_put_without_content_type_asks_for_the_default_type(http: httpx.Client) -> None:
    """§5.1: 200 only if the existing stream's configuration matches; a PUT that names no
    Content-Type asks for application/octet-stream, so on a JSON stream it is a 409."""
    name = _name()
    assert http.put(_path(name), headers={"Content-Type": "application/json"}).status_code == 201
    assert http.put(_path(name)).status_code == 409
    binary = _name()
    assert http.put(_path(binary)).status_code == 201
    assert http.put(_path(binary)).status_code == 200


@pytest.mark.parametrize("body", [b"not json", b"[]"])
def test_an_append_of_another_type_is_a_409_whatever_its_body(
    http: httpx.Client, body: bytes
) -> None:
    """§5.2: 409 "when the content type is valid but does not match the stream's"; the body
    was first read as the request's type, and what that ran into answered (400)."""
    name = _name()
    assert http.put(_path(name), headers=TEXT).status_code == 201
    answer = http.post(_path(name), headers={"Content-Type": "application/json"}, content=body)
    assert answer.status_code == 409 and answer.json()["error"]["field"] == "Content-Type"


def test_a_long_poll_at_now_is_not_cached(http: httpx.Client) -> None:
    """``offset=now`` names no position: a shared cache keeping its page (it was ``public,
    max-age=60``) would hand it to later readers as what comes next."""
    name = _name()
    assert http.put(_path(name), headers=TEXT).status_code == 201
    with httpx.Client(base_url=str(http.base_url), timeout=10) as other:
        import threading

        timer = threading.Timer(0.15, lambda: other.post(_path(name), headers=TEXT, content=b"x"))
        timer.start()
        answer = http.get(_path(name), params={"offset": "now", "live": "long-poll"})
        timer.join()
    assert answer.status_code == 200 and answer.content == b"x"
    assert answer.headers["Cache-Control"] == "no-store"


def test_a_long_poll_ends_with_404_when_its_stream_expires(http: httpx.Client) -> None:
    """A wait that ran past the stream's Stream-Expires-At answered 204 with a cursor (poll
    again) and an expiry in the past, whenever the sweep had not come round yet."""
    name = _name()
    expires = time.time() + 0.25
    stamp = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(expires))
        + f".{int(expires % 1 * 1000):03d}Z"
    )
    made = http.put(_path(name), headers={**TEXT, "Stream-Expires-At": stamp})
    assert made.status_code == 201, made.text
    answer = http.get(_path(name), params={"offset": "now", "live": "long-poll"})
    assert answer.status_code == 404, (answer.status_code, dict(answer.headers))
