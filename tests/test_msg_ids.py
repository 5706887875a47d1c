"""Msg-Id deduplication (CONTRACT.md §3 and §4 "Producing with message ids"), over HTTP against
live servers, on SQLite and on PostgreSQL.

An id is a duplicate while ``now < storedAt + the window in force now``: inside the window a
repeat is not stored and answers the original offset; after it the id is stored again. The
window holds across ``kill -9`` and restart, across retention dropping the original message,
for ids repeated inside one request, through both doors (the messages API and the ``Msg-Id``
header), and a PATCH of the window applies to ids already stored.

Most cases share one server per engine (each makes its own stations); the restart and sweep
cases start their own. Windows that must run out are a few seconds long at most (long enough
for the requests that must come inside them on a loaded box running three test workers).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import ClockServer, Server
from tests.module_server import ENGINES, module_server

JSON = {"Content-Type": "application/json"}
LONG_WINDOW = 60_000  # never runs out during a test
SHORT_WINDOW = 2000  # runs out after a short sleep; holds a few requests on a loaded box


def offset(position: int) -> str:
    """The offset token the server mints for ``position`` (CONTRACT.md §1: the offset of
    message n is the position just before it)."""
    return f"{position:016d}_{0:016d}"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory, "--long-poll-timeout-ms", "500")


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


# -- helpers ----------------------------------------------------------------------------------


def new_station(client: httpx.Client, **config: Any) -> str:
    name = f"ids-{uuid.uuid4().hex[:10]}"
    r = client.post("/api/stations", json={"name": name, **config})
    assert r.status_code == 201, r.text
    return name


def produce(client: httpx.Client, name: str, *items: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/api/stations/{name}/messages", json={"messages": list(items)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == len(items), body
    return body


def one(client: httpx.Client, name: str, msg_id: str, data: Any = None) -> tuple[str, bool]:
    """Produce one message with ``msg_id``; its (offset, duplicate)."""
    result = produce(client, name, {"id": msg_id, "data": data})["results"][0]
    return result["offset"], result["duplicate"]


def browse(client: httpx.Client, name: str, start: str = "-1") -> list[dict[str, Any]]:
    r = client.get(f"/api/stations/{name}/messages", params={"offset": start, "limit": "1000"})
    assert r.status_code == 200, r.text
    return r.json()["messages"]


def stats(client: httpx.Client, name: str) -> dict[str, Any]:
    r = client.get(f"/api/stations/{name}")
    assert r.status_code == 200, r.text
    return r.json()["stats"]


def post_with_id(
    client: httpx.Client, name: str, msg_id: str, body: bytes, headers: dict[str, str] = JSON
) -> httpx.Response:
    return client.post(f"/v1/stream/{name}", headers={**headers, "Msg-Id": msg_id}, content=body)


def eventually(check: Callable[[], bool], timeout: float = 6.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(0.05)


def sleep_past(window_ms: int, since: float) -> None:
    """Sleep until ``window_ms`` (plus a 0.3 s margin) has passed ``since``, a time taken after
    the request that stored the id returned."""
    remaining = since + window_ms / 1000 + 0.3 - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


# -- inside and after the window --------------------------------------------------------------


def test_duplicate_inside_window_is_not_stored(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    first = produce(client, name, {"id": "order-17", "data": {"total": 12}})
    assert first["results"] == [{"offset": offset(0), "duplicate": False}]
    assert first["nextOffset"] == offset(1)

    again = produce(client, name, {"id": "order-17", "data": {"total": 99}})
    assert again["results"] == [{"offset": offset(0), "duplicate": True}]
    assert again["nextOffset"] == offset(1), "a duplicate must not move the tail"

    messages = browse(client, name)
    assert [(m["id"], m["data"]) for m in messages] == [("order-17", {"total": 12})]
    assert stats(client, name)["messages"] == 1


def test_the_two_doors_share_one_id_space(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    produce(client, name, {"data": 0})  # so the interesting offsets are not zero
    via_api, dup = one(client, name, "a", 1)
    assert (via_api, dup) == (offset(1), False)

    r = post_with_id(client, name, "a", b'{"x":1}')
    assert r.status_code in (200, 204), r.text
    assert r.headers["Msg-Duplicate"] == "true"
    assert r.headers["Msg-Offset"] == via_api
    assert r.headers["Stream-Next-Offset"] == offset(2)

    r = post_with_id(client, name, "b", b'{"x":2}')
    assert r.headers["Msg-Duplicate"] == "false"
    assert r.headers["Msg-Offset"] == offset(2)
    assert one(client, name, "b", 3) == (offset(2), True)
    assert [m["id"] for m in browse(client, name)] == [None, "a", "b"]


def test_ids_are_per_station(client: httpx.Client) -> None:
    first = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    second = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    assert one(client, first, "shared", 1) == (offset(0), False)
    assert one(client, second, "shared", 2) == (offset(0), False)
    assert one(client, first, "shared", 3) == (offset(0), True)


def test_ids_repeated_inside_one_request(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    body = produce(
        client,
        name,
        {"id": "x", "data": "first x"},
        {"id": "x", "data": "second x"},
        {"id": "y", "data": "y"},
        {"data": "no id"},
        {"id": "x", "data": "third x"},
        {"id": "y", "data": "second y"},
    )
    assert body["results"] == [
        {"offset": offset(0), "duplicate": False},
        {"offset": offset(0), "duplicate": True},
        {"offset": offset(1), "duplicate": False},
        {"offset": offset(2), "duplicate": False},
        {"offset": offset(0), "duplicate": True},
        {"offset": offset(1), "duplicate": True},
    ]
    assert body["nextOffset"] == offset(3)
    assert [(m["id"], m["data"]) for m in browse(client, name)] == [
        ("x", "first x"),
        ("y", "y"),
        (None, "no id"),
    ]
    # ... and the next request sees them as stored ids.
    again = produce(client, name, {"id": "y", "data": 0}, {"id": "x", "data": 0})
    assert [r["offset"] for r in again["results"]] == [offset(1), offset(0)]
    assert all(r["duplicate"] for r in again["results"])


def test_same_id_after_the_window_is_stored(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=SHORT_WINDOW)
    assert one(client, name, "late", 1) == (offset(0), False)
    stored = time.monotonic()
    assert one(client, name, "late", 2) == (offset(0), True)
    assert stats(client, name)["idsInWindow"] == 1

    sleep_past(SHORT_WINDOW, stored)
    assert stats(client, name)["idsInWindow"] == 0
    assert one(client, name, "late", 3) == (offset(1), False)
    stored_again = time.monotonic()
    # The new message opens a new window for the id.
    assert one(client, name, "late", 4) == (offset(1), True)
    assert [(m["id"], m["data"]) for m in browse(client, name)] == [("late", 1), ("late", 3)]

    sleep_past(SHORT_WINDOW, stored_again)
    r = post_with_id(client, name, "late", b"5")
    assert r.headers["Msg-Duplicate"] == "false"
    assert r.headers["Msg-Offset"] == offset(2)


def test_window_is_per_message_not_per_station(client: httpx.Client) -> None:
    """Each id expires on its own clock (sliding, per-id), not in station-wide buckets."""
    window = 3000
    name = new_station(client, idempotencyWindowMs=window)
    one(client, name, "early", 1)
    early = time.monotonic()  # after "early" was stored
    time.sleep(1.5)
    late = time.monotonic()  # before "late" is stored
    one(client, name, "late", 2)
    sleep_past(window, early)
    # "early" is free again, "late" (stored 1.5 s later) is still remembered.
    assert one(client, name, "late", 3) == (offset(1), True)
    assert time.monotonic() < late + window / 1000, "the machine is too slow for this test"
    assert one(client, name, "early", 4) == (offset(2), False)


# -- the Msg-Id header on the Durable Streams door --------------------------------------------


def test_msg_id_header_json_stream(client: httpx.Client) -> None:
    name = f"ids-ds-{uuid.uuid4().hex[:10]}"
    assert client.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    stored = post_with_id(client, name, "m-1", b'{"n":1}')
    assert stored.status_code in (200, 204), stored.text
    assert stored.headers["Msg-Duplicate"] == "false"
    assert stored.headers["Msg-Offset"] == offset(0)
    assert stored.headers["Stream-Next-Offset"] == offset(1)

    # A one-element array is one message too.
    dup = post_with_id(client, name, "m-1", b'[{"n":2}]')
    assert dup.status_code == stored.status_code, "a duplicate answers the same success status"
    assert dup.headers["Msg-Duplicate"] == "true"
    assert dup.headers["Msg-Offset"] == offset(0)
    assert dup.headers["Stream-Next-Offset"] == offset(1)

    r = client.get(f"/v1/stream/{name}", params={"offset": "-1"})
    assert r.json() == [{"n": 1}]
    assert [m["id"] for m in browse(client, name)] == ["m-1"]


def test_msg_id_header_text_stream(client: httpx.Client) -> None:
    name = f"ids-txt-{uuid.uuid4().hex[:10]}"
    text = {"Content-Type": "text/plain"}
    assert client.put(f"/v1/stream/{name}", headers=text).status_code == 201
    assert post_with_id(client, name, "t", b"hello", text).headers["Msg-Duplicate"] == "false"
    dup = post_with_id(client, name, "t", b"hello again", text)
    assert (dup.headers["Msg-Duplicate"], dup.headers["Msg-Offset"]) == ("true", offset(0))
    assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).text == "hello"


def test_msg_id_header_needs_one_message(client: httpx.Client) -> None:
    name = new_station(client)
    for body in (b"[1,2]", b"[]"):
        r = post_with_id(client, name, "many", body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["field"] == "Msg-Id" or r.json()["error"]["field"] == "body"
    for bad in ("", "has space", "x" * 257):
        r = post_with_id(client, name, bad, b"1")
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["field"] == "Msg-Id"
    assert stats(client, name)["messages"] == 0
    # The longest legal id works.
    longest = "~" * 256
    assert post_with_id(client, name, longest, b"1").headers["Msg-Duplicate"] == "false"
    assert one(client, name, longest) == (offset(0), True)


def test_a_retry_with_stream_seq_is_a_duplicate(client: httpx.Client) -> None:
    """A Msg-Id retry that also carries Stream-Seq was refused 409 ("not above"): the client
    could not tell that its message was stored. And a request of duplicates alone, storing
    nothing, took its Stream-Seq: the writer's next message with that seq was refused."""
    name = f"ids-seq-{uuid.uuid4().hex[:10]}"
    assert client.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    seq = {**JSON, "Stream-Seq": "a"}
    stored = post_with_id(client, name, "q1", b"1", seq)
    assert stored.status_code in (200, 204), stored.text
    retry = post_with_id(client, name, "q1", b"1", seq)
    assert retry.status_code == stored.status_code, retry.text
    assert (retry.headers["Msg-Duplicate"], retry.headers["Msg-Offset"]) == ("true", offset(0))
    # A duplicate under a later seq stores nothing and leaves that seq to the next message.
    later = post_with_id(client, name, "q1", b"1", {**JSON, "Stream-Seq": "b"})
    assert later.headers["Msg-Duplicate"] == "true", later.text
    fresh = post_with_id(client, name, "q2", b"2", {**JSON, "Stream-Seq": "b"})
    assert fresh.status_code in (200, 204), fresh.text
    assert fresh.headers["Msg-Offset"] == offset(1)
    # A new message under a seq not above the last is still refused.
    refused = post_with_id(client, name, "q3", b"3", {**JSON, "Stream-Seq": "b"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["field"] == "Stream-Seq"


def test_a_producers_request_with_a_stale_stream_seq_is_still_refused(
    client: httpx.Client,
) -> None:
    """The shortcut above is for requests without producer headers: a producer's new epoch
    resent with a known id and the same Stream-Seq got a 200 that did not record the epoch,
    and its next request was refused."""
    name = f"ids-pseq-{uuid.uuid4().hex[:10]}"
    assert client.put(f"/v1/stream/{name}", headers=JSON).status_code == 201

    def send(epoch: int, seq: int, msg_id: str, stream_seq: str) -> httpx.Response:
        headers = {
            **JSON,
            "Producer-Id": "p",
            "Producer-Epoch": str(epoch),
            "Producer-Seq": str(seq),
            "Stream-Seq": stream_seq,
        }
        return post_with_id(client, name, msg_id, b"1", headers)

    assert send(0, 0, "x", "001").status_code in (200, 204)
    again = send(1, 0, "x", "001")
    assert again.status_code == 409, again.text
    assert again.json()["error"]["field"] == "Stream-Seq"


def test_the_retry_of_an_append_that_closed_is_a_duplicate(client: httpx.Client) -> None:
    """An append with a Msg-Id that closed the stream, sent again (its answer was lost): it
    was 409 "closed", so the client could not learn that its last message was stored."""
    name = f"ids-close-{uuid.uuid4().hex[:10]}"
    assert client.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    closing = {**JSON, "Stream-Closed": "true"}
    assert post_with_id(client, name, "first", b"0").status_code in (200, 204)
    stored = post_with_id(client, name, "last", b"1", closing)
    assert stored.status_code in (200, 204), stored.text
    assert stored.headers["Stream-Closed"] == "true"
    retry = post_with_id(client, name, "last", b"1", closing)
    assert retry.status_code == stored.status_code, retry.text
    assert (retry.headers["Msg-Duplicate"], retry.headers["Msg-Offset"]) == ("true", offset(1))
    assert retry.headers["Stream-Closed"] == "true"
    # A closing request whose message is stored already asks for what holds: a duplicate.
    earlier = post_with_id(client, name, "first", b"0", closing)
    assert (earlier.headers["Msg-Duplicate"], earlier.headers["Msg-Offset"]) == ("true", offset(0))
    # Anything else is refused as closed: a message not stored, or a request that does not close.
    for msg_id, headers in (("last", JSON), ("other", closing)):
        refused = post_with_id(client, name, msg_id, b"1", headers)
        assert refused.status_code == 409, (msg_id, refused.text)
    assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == [0, 1]


def test_a_create_does_not_take_a_msg_id(client: httpx.Client) -> None:
    name = f"ids-put-{uuid.uuid4().hex[:10]}"
    r = client.put(f"/v1/stream/{name}", headers={**JSON, "Msg-Id": "z"}, content=b"[1]")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "Msg-Id"
    assert client.head(f"/v1/stream/{name}").status_code == 404


def test_msg_id_header_on_unknown_stream(client: httpx.Client) -> None:
    r = post_with_id(client, f"nope-{uuid.uuid4().hex}", "a", b"1")
    assert r.status_code == 404, r.text


def test_producer_check_runs_before_the_msg_id_check(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW)

    def send(seq: int, msg_id: str, body: bytes) -> httpx.Response:
        headers = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": str(seq)}
        r = post_with_id(client, name, msg_id, body, {**JSON, **headers})
        assert r.status_code in (200, 204), r.text
        return r

    first = send(0, "m", b"1")
    assert (first.headers["Msg-Duplicate"], first.headers["Msg-Offset"]) == ("false", offset(0))
    # The producer's retry is a producer duplicate, and so a Msg-Id duplicate.
    retry = send(0, "m", b"1")
    assert (retry.headers["Msg-Duplicate"], retry.headers["Msg-Offset"]) == ("true", offset(0))
    # A new producer seq carrying a known id: accepted by the producer check, not stored.
    known = send(1, "m", b"2")
    assert (known.headers["Msg-Duplicate"], known.headers["Msg-Offset"]) == ("true", offset(0))
    assert known.headers["Producer-Seq"] == "1"
    fresh = send(2, "n", b"3")
    assert (fresh.headers["Msg-Duplicate"], fresh.headers["Msg-Offset"]) == ("false", offset(1))
    assert [m["data"] for m in browse(client, name)] == [1, 3]


# -- a PATCH of the window applies to ids already stored --------------------------------------


def patch_window(client: httpx.Client, name: str, window: int) -> None:
    r = client.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": window})
    assert r.status_code == 200, r.text
    assert r.json()["idempotencyWindowMs"] == window


def test_shrinking_the_window_expires_stored_ids(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW)
    assert one(client, name, "a", 1) == (offset(0), False)
    stored = time.monotonic()
    assert one(client, name, "a", 1) == (offset(0), True)  # now also in the hot cache
    patch_window(client, name, 100)
    sleep_past(100, stored)
    assert stats(client, name)["idsInWindow"] == 0
    assert one(client, name, "a", 2) == (offset(1), False)


def test_growing_the_window_keeps_stored_ids(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=SHORT_WINDOW)
    assert one(client, name, "a", 1) == (offset(0), False)
    stored = time.monotonic()
    assert one(client, name, "a", 1) == (offset(0), True)
    patch_window(client, name, LONG_WINDOW)
    sleep_past(SHORT_WINDOW, stored)
    assert stats(client, name)["idsInWindow"] == 1
    assert one(client, name, "a", 2) == (offset(0), True)
    r = post_with_id(client, name, "a", b"3")
    assert (r.headers["Msg-Duplicate"], r.headers["Msg-Offset"]) == ("true", offset(0))


def test_growing_the_window_does_not_bring_back_ids_that_ran_out(tmp_path: Path) -> None:
    """An id whose window ran out is forgotten whether or not the sweep has come round: a
    PATCH that grew the window counted it a duplicate again until then (the sweep of a
    4-minute window runs once a minute). The server's clock is moved, not slept through."""
    clock = tmp_path / "clock"
    clock.write_text("0")
    url = f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"
    server = ClockServer(url, tmp_path, clock=clock).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            name = new_station(client, idempotencyWindowMs=240_000)
            time.sleep(2.5)  # the first sweeps set the sweep's period to a minute
            assert one(client, name, "gone", 1) == (offset(0), False)
            clock.write_text("300")  # five minutes on: "gone" ran out a minute ago
            assert one(client, name, "kept", 2) == (offset(1), False)
            patch_window(client, name, 86_400_000)
            assert one(client, name, "gone", 3) == (offset(2), False)
            assert one(client, name, "kept", 4) == (offset(1), True)
    finally:
        server.kill()


# -- retention drops the data, not the ids ----------------------------------------------------


def test_duplicate_after_retention_dropped_the_original(client: httpx.Client) -> None:
    name = new_station(client, idempotencyWindowMs=LONG_WINDOW, retention={"maxMessages": 2})
    offsets = [one(client, name, f"m{i}", {"i": i})[0] for i in range(5)]
    assert offsets == [offset(i) for i in range(5)]

    # The scheduler enforces retention about every second.
    eventually(lambda: len(browse(client, name)) == 2, what="retention to keep 2 messages")
    kept = browse(client, name)
    assert [(m["offset"], m["id"], m["data"]) for m in kept] == [
        (offset(3), "m3", {"i": 3}),
        (offset(4), "m4", {"i": 4}),
    ]
    # A dropped offset is gone, on both doors.
    r = client.get(f"/v1/stream/{name}", params={"offset": offset(1)})
    assert r.status_code == 410, r.text
    r = client.get(f"/api/stations/{name}/messages", params={"offset": offset(2)})
    assert r.status_code == 410, r.text

    # The ids of the dropped messages are still remembered, with their original offsets.
    for i in range(5):
        assert one(client, name, f"m{i}", "again") == (offset(i), True)
    r = post_with_id(client, name, "m1", b'"again"')
    assert (r.headers["Msg-Duplicate"], r.headers["Msg-Offset"]) == ("true", offset(1))

    s = stats(client, name)
    assert (s["messages"], s["tailOffset"], s["idsInWindow"]) == (2, offset(5), 5)
    # A new id is stored after the tail.
    assert one(client, name, "m5", 5) == (offset(5), False)


def ids_in_table(db_url: str, station: str) -> int:
    """Ids of ``station`` in the durable id tables (msg_ids on PostgreSQL, the blocks of
    recent ids on SQLite), read straight from the database."""
    query = (
        "SELECT (SELECT count(*) FROM msg_ids m WHERE m.stream_id = s.id) "
        "+ (SELECT coalesce(sum(b.ids), 0) FROM id_blocks b WHERE b.stream_id = s.id) "
        "FROM streams s WHERE s.name = {}"
    )
    if db_url.startswith("sqlite"):
        with closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            return int(conn.execute(query.format("?"), (station,)).fetchone()[0])
    import psycopg

    with psycopg.connect(db_url) as conn:
        row = conn.execute(query.format("%s"), (station,)).fetchone()
        assert row is not None
        return int(row[0])


# -- kill -9 and restart ----------------------------------------------------------------------


def test_duplicate_after_kill_and_restart(server: Server) -> None:
    """After ``kill -9`` the hot cache is gone and the durable id table answers: for ids whose
    messages are still there, and for ids whose messages retention dropped before the kill.

    On the way (this case has a fresh server, whose sweeper settles on a long period at its
    first run): expired ids leave the table on the sweeper's next run, whose period follows the
    windows, so a station created with a short window is swept within about a quarter of it
    even though the sweeper had settled on a long period for the stations before it."""
    started = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        name = new_station(c, idempotencyWindowMs=LONG_WINDOW)
        text = f"txt-{uuid.uuid4().hex[:8]}"
        assert c.put(f"/v1/stream/{text}", headers={"Content-Type": "text/plain"}).is_success
        body = produce(c, name, *({"id": f"k{i}", "data": i} for i in range(3)))
        header = post_with_id(c, name, "via-header", b"3")
        text_first = post_with_id(c, text, "t", b"abc", {"Content-Type": "text/plain"})
        assert header.headers["Msg-Offset"] == offset(3)

        retained = new_station(c, idempotencyWindowMs=LONG_WINDOW, retention={"maxMessages": 1})
        produce(c, retained, *({"id": f"r{i}", "data": i} for i in range(4)))
        eventually(lambda: stats(c, retained)["messages"] == 1, what="retention")

        # The sweeper first ran about 1 s after the start; with 60 s windows it settled on a
        # 15 s period. A new station with a 2 s window must not wait for that.
        time.sleep(max(0.0, started + 1.4 - time.monotonic()))
        short = new_station(c, idempotencyWindowMs=2000)
        produce(c, short, *({"id": f"s{i}", "data": i} for i in range(20)))
        assert ids_in_table(server.db_url, short) == 20
        eventually(
            lambda: ids_in_table(server.db_url, short) == 0,
            timeout=6.0,
            what="the sweeper to remove expired ids",
        )
        assert ids_in_table(server.db_url, name) == 4, "only expired ids are swept"

    server.kill()  # the acknowledgements above must already be durable
    server.start()

    with httpx.Client(base_url=server.url, timeout=30) as c:
        again = produce(c, name, *({"id": f"k{i}", "data": -1} for i in range(3)))
        assert [r["offset"] for r in again["results"]] == [r["offset"] for r in body["results"]]
        assert all(r["duplicate"] for r in again["results"])
        assert one(c, name, "via-header", -1) == (offset(3), True)
        r = post_with_id(c, text, "t", b"abc", {"Content-Type": "text/plain"})
        assert (r.headers["Msg-Duplicate"], r.headers["Msg-Offset"]) == (
            "true",
            text_first.headers["Msg-Offset"],
        )
        assert one(c, name, "new", 4) == (offset(4), False)
        assert [m["data"] for m in browse(c, name)] == [0, 1, 2, 3, 4]
        assert stats(c, name)["idsInWindow"] == 5

        assert [m["id"] for m in browse(c, retained)] == ["r3"]
        for i in range(4):
            assert one(c, retained, f"r{i}", "again") == (offset(i), True)
        assert stats(c, retained)["messages"] == 1

        # The swept ids are free again.
        results = produce(c, short, {"id": "s0", "data": 0}, {"id": "s1", "data": 1})["results"]
        assert results == [
            {"offset": offset(20), "duplicate": False},
            {"offset": offset(21), "duplicate": False},
        ]
