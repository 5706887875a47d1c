"""Every 4xx of the Durable Streams protocol and of CONTRACT.md §3, plus randomized garbage.

Each rejection is checked for its status code and for the JSON error body
``{"error": {"code", "message", "field"}}`` naming the offending field. Nothing may answer 5xx.

One server per engine serves the whole module (the cases are independent: each makes its own
streams), so the many small cases stay fast.
"""

from __future__ import annotations

import json
import random
import socket
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server

MAX_SAFE = 2**53 - 1
BODY_LIMIT = 64 * 1024 * 1024  # api/app.py MAX_BODY (aiohttp client_max_size)
JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    # Short live reads: the garbage below may well ask for a valid long-poll or SSE read.
    args = ["--long-poll-timeout-ms", "200", "--sse-lifetime-ms", "300"]
    yield from module_server(request.param, tmp_path_factory, *args)


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


def short_id(value: object) -> str:
    """Readable test ids for long or odd parameter values."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)})"


def new_stream(
    client: httpx.Client, headers: dict[str, str] | None = None, body: bytes = b""
) -> str:
    path = f"/v1/stream/bad-{uuid.uuid4().hex[:12]}"
    r = client.put(path, headers=JSON if headers is None else headers, content=body)
    assert r.status_code == 201, r.text
    return path


@pytest.fixture
def js(client: httpx.Client) -> str:
    """A fresh JSON stream."""
    return new_stream(client)


@pytest.fixture
def txt(client: httpx.Client) -> str:
    """A fresh text/plain stream holding ``hello``."""
    return new_stream(client, TEXT, b"hello")


def assert_error(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """``r`` is the JSON error ``status``, naming ``field`` when one is given."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert set(error) == {"code", "message", "field"}, error
    assert isinstance(error["code"], str) and error["code"], error
    assert isinstance(error["message"], str) and error["message"], error
    if field is not None:
        assert (error["field"] or "").lower() == field.lower(), error
    return error


def read_all(client: httpx.Client, path: str) -> httpx.Response:
    r = client.get(path, params={"offset": "-1"})
    assert r.status_code == 200, r.text
    return r


def producer(pid: str, epoch: object, seq: object) -> dict[str, str]:
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


def raw_request(srv: Server, head: bytes, body: bytes = b"", timeout: float = 15) -> int:
    """Send bytes as they are (httpx refuses some of what a hostile client sends); the status."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as sock:
        sock.sendall(head + b"\r\n" + body)
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        # Drain the rest so the server never sees a reset mid-answer.
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
    status_line = data.split(b"\r\n", 1)[0]
    # aiohttp's own parser answers garbage it cannot parse as HTTP/1.0.
    assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), data[:200]
    return int(status_line.split()[1])


def raw_head(method: str, path: str, headers: list[tuple[bytes, bytes]], length: int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    lines.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(lines) + b"\r\n"


# -- offsets and live modes -------------------------------------------------------------------

MALFORMED_OFFSETS = [
    "",
    "abc",
    "0,1",
    "0 1",
    "../x",
    "x/..",
    "a/b",
    "a&b",
    "a=b",
    "-2",
    "NOW",
    "Now",
    "1_2",
    "0000000000000000",
    "0000000000000000_0000000000000001",  # not on a message boundary: never minted
    "00000000000000000_0000000000000000",
    "0000000000000000_0000000000000000x",
    "x\x00",
    "x\n",
    "\r\n",
    "é",
    "9" * 300,
]


@pytest.mark.parametrize("offset", MALFORMED_OFFSETS, ids=short_id)
@pytest.mark.parametrize("live", [None, "long-poll", "sse"])
def test_malformed_offset(client: httpx.Client, txt: str, offset: str, live: str | None) -> None:
    params = {"offset": offset} if live is None else {"offset": offset, "live": live}
    assert_error(client.get(txt, params=params), 400, "offset")


def test_repeated_offset(client: httpx.Client, txt: str) -> None:
    assert_error(client.get(txt + "?offset=-1&offset=-1"), 400, "offset")
    assert_error(client.get(txt + "?offset=-1&offset=now&live=long-poll"), 400, "offset")


def test_offset_beyond_tail(client: httpx.Client, txt: str) -> None:
    tail = client.head(txt).headers["Stream-Next-Offset"]
    assert client.get(txt, params={"offset": tail}).status_code == 200
    assert_error(
        client.get(txt, params={"offset": "9999999999999999_0000000000000000"}), 400, "offset"
    )


@pytest.mark.parametrize(
    "live", ["", "x", "true", "LONG-POLL", "longpoll", "long_poll", "SSE", "sse "]
)
def test_bad_live_value(client: httpx.Client, txt: str, live: str) -> None:
    assert_error(client.get(txt, params={"offset": "-1", "live": live}), 400, "live")


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_live_needs_offset(client: httpx.Client, txt: str, live: str) -> None:
    assert_error(client.get(txt, params={"live": live}), 400, "offset")


@pytest.mark.parametrize("cursor", ["abc", "-1", "²", "1²", "9" * 5000, ""], ids=short_id)
def test_odd_cursor_is_not_an_error(client: httpx.Client, txt: str, cursor: str) -> None:
    """A cursor is only an echo; whatever a client sends, the read still works."""
    tail = client.head(txt).headers["Stream-Next-Offset"]
    r = client.get(txt, params={"offset": tail, "live": "long-poll", "cursor": cursor})
    assert r.status_code == 204, r.text
    assert r.headers["Stream-Cursor"].isascii() and r.headers["Stream-Cursor"].isdigit()
    assert len(r.headers["Stream-Cursor"]) <= 20


def test_a_cursor_echoed_back_never_goes_backwards(client: httpx.Client, txt: str) -> None:
    """Found by a review: an echoed 999999999999999990 came back with 19 digits, which the next
    request ignored, and the answer after that was the current interval: backwards."""
    tail = client.head(txt).headers["Stream-Next-Offset"]
    echoed = "999999999999999990"
    for _ in range(3):
        r = client.get(txt, params={"offset": tail, "live": "long-poll", "cursor": echoed})
        assert r.status_code == 204, r.text
        assert int(r.headers["Stream-Cursor"]) >= int(echoed)
        echoed = r.headers["Stream-Cursor"]


@pytest.mark.parametrize("header", ["W/{etag}", '"x", {etag}', "*", 'W/{etag} , "y"'], ids=short_id)
def test_if_none_match_compares_weakly_and_takes_lists(
    client: httpx.Client, txt: str, header: str
) -> None:
    """RFC 9110 §13.1.2: only an exact single tag got its 304 before (found by a review)."""
    client.post(txt, content=b"hello", headers={"Content-Type": "text/plain"})
    first = client.get(txt, params={"offset": "-1"})
    etag = first.headers["ETag"]
    again = client.get(
        txt, params={"offset": "-1"}, headers={"If-None-Match": header.format(etag=etag)}
    )
    assert again.status_code == 304, again.text
    other = client.get(txt, params={"offset": "-1"}, headers={"If-None-Match": '"nope"'})
    assert other.status_code == 200


# -- create: TTL, Expires-At, content type, forks ---------------------------------------------

BAD_TTLS = [
    "+3600",
    "03600",
    "3600.0",
    "3.6e3",
    "-1",
    "",
    "abc",
    "1 0",
    "0x10",
    "١٢",
    "9" * 30,
    "9" * 5000,
]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=short_id)
def test_bad_ttl(client: httpx.Client, ttl: str) -> None:
    path = f"/v1/stream/ttl-{uuid.uuid4().hex[:12]}"
    r = client.put(path, headers={"Stream-TTL": ttl.encode()})
    assert_error(r, 400, "Stream-TTL")
    assert client.head(path).status_code == 404  # nothing was created


def test_good_ttl_forms(client: httpx.Client) -> None:
    for ttl in ["0", "1", "3600"]:
        path = f"/v1/stream/ttl-{uuid.uuid4().hex[:12]}"
        assert client.put(path, headers={"Stream-TTL": ttl}).status_code == 201
        if ttl != "0":
            assert client.head(path).headers["Stream-TTL"] == ttl


def test_ttl_and_expires_at_together(client: httpx.Client) -> None:
    path = f"/v1/stream/both-{uuid.uuid4().hex[:12]}"
    r = client.put(path, headers={"Stream-TTL": "60", "Stream-Expires-At": "2099-01-01T00:00:00Z"})
    error = assert_error(r, 400)
    assert error["field"] in ("Stream-TTL", "Stream-Expires-At"), error
    assert client.head(path).status_code == 404


BAD_EXPIRES = [
    "",
    "nope",
    "2099-01-01",
    "2099-01-01T00:00:00",  # no zone
    "2099-13-01T00:00:00Z",
    "2099-02-30T00:00:00Z",
    "2099-01-01T25:00:00Z",
    "2099-01-01T00:00:00+25:00",
    "20990101T000000Z",  # ISO 8601 basic form is not RFC 3339
    "2099-01-01T00:00Z",
    "Thu, 01 Jan 2099 00:00:00 GMT",
    "4102444800",
]


@pytest.mark.parametrize("expires", BAD_EXPIRES, ids=short_id)
def test_bad_expires_at(client: httpx.Client, expires: str) -> None:
    path = f"/v1/stream/exp-{uuid.uuid4().hex[:12]}"
    assert_error(client.put(path, headers={"Stream-Expires-At": expires}), 400, "Stream-Expires-At")
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "expires",
    ["2099-01-01T00:00:00Z", "2099-01-01T00:00:00.123456789Z", "2099-01-01t00:00:00+02:00"],
)
def test_good_expires_at_forms(client: httpx.Client, expires: str) -> None:
    path = f"/v1/stream/exp-{uuid.uuid4().hex[:12]}"
    r = client.put(path, headers={"Stream-Expires-At": expires})
    assert r.status_code == 201, r.text
    assert (
        client.head(path)
        .headers["Stream-Expires-At"]
        .startswith("2098-12-31T22" if "+02" in expires else "2099-01-01T00")
    )


@pytest.mark.parametrize(
    "expires",
    [
        "0001-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-01:00",
    ],
)
def test_extreme_expires_at_is_not_a_server_error(client: httpx.Client, expires: str) -> None:
    path = f"/v1/stream/exp-{uuid.uuid4().hex[:12]}"
    r = client.put(path, headers={"Stream-Expires-At": expires})
    assert r.status_code in (200, 201, 400), r.text
    if r.status_code == 400:
        assert_error(r, 400, "Stream-Expires-At")
    assert client.head(path).status_code in (200, 404)


@pytest.mark.parametrize(
    "content_type",
    ["nonsense", "text", "/plain", "text/", "text/plain/x", "a b/c", "x" * 300 + "/y"],
    ids=short_id,
)
def test_bad_content_type_on_create(client: httpx.Client, content_type: str) -> None:
    path = f"/v1/stream/ct-{uuid.uuid4().hex[:12]}"
    assert_error(client.put(path, headers={"Content-Type": content_type}), 400, "Content-Type")
    assert client.head(path).status_code == 404


def test_invalid_initial_json_body(client: httpx.Client) -> None:
    path = f"/v1/stream/init-{uuid.uuid4().hex[:12]}"
    assert_error(client.put(path, headers=JSON, content=b"{nope"), 400, "body")
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "name", ["nul%00in-name", "cr%0Dname", "tab%09name", "del%7Fname", "x" * 1025], ids=short_id
)
def test_bad_stream_name(client: httpx.Client, name: str) -> None:
    assert_error(client.put(f"/v1/stream/{name}", headers=JSON), 400, "path")
    assert_error(client.get(f"/v1/stream/{name}"), 400, "path")
    assert_error(client.post(f"/v1/stream/{name}", headers=JSON, content=b"1"), 400, "path")


def test_stream_name_with_line_break(client: httpx.Client) -> None:
    # No route matches a path with a line break in it: that is an unknown stream.
    assert_error(client.put("/v1/stream/line%0Abreak", headers=JSON), 404)
    assert_error(client.get("/v1/stream/line%0Abreak"), 404)


def test_fork_errors(client: httpx.Client, txt: str) -> None:
    fork = f"/v1/stream/fork-{uuid.uuid4().hex[:12]}"
    missing = f"/v1/stream/missing-{uuid.uuid4().hex[:12]}"
    assert_error(
        client.put(fork, headers={"Stream-Forked-From": missing}), 404, "Stream-Forked-From"
    )
    bad_sources = ["/v1/stream/", "/v1/stream/a%00b", "/v1/stream/" + "y" * 1100]
    for source in bad_sources:
        r = client.put(fork, headers={"Stream-Forked-From": source})
        assert_error(r, 400, "Stream-Forked-From")
    for offset in ["abc", "1_2", "0000000000000000_0000000000000001", "-2", "now"]:
        r = client.put(fork, headers={"Stream-Forked-From": txt, "Stream-Fork-Offset": offset})
        assert_error(r, 400, "Stream-Fork-Offset")
    beyond = "9999999999999999_0000000000000000"
    r = client.put(fork, headers={"Stream-Forked-From": txt, "Stream-Fork-Offset": beyond})
    assert_error(r, 400, "Stream-Fork-Offset")
    for sub in ["-1", "abc", "1.5", "05", "+1", "", "9" * 5000, "99999999999999999999"]:
        r = client.put(fork, headers={"Stream-Forked-From": txt, "Stream-Fork-Sub-Offset": sub})
        assert_error(r, 400, "Stream-Fork-Sub-Offset")
    for header in ("Stream-Fork-Offset", "Stream-Fork-Sub-Offset"):
        assert_error(client.put(fork, headers={header: "0"}), 400, header)
    r = client.put(fork, headers={"Stream-Forked-From": txt, "Content-Type": "application/json"})
    assert_error(r, 409, "Content-Type")
    assert client.head(fork).status_code == 404  # none of that created anything
    assert client.put(fork, headers={"Stream-Forked-From": txt}).status_code == 201


def test_put_conflicts(client: httpx.Client, txt: str) -> None:
    assert_error(client.put(txt, headers=JSON), 409)
    assert_error(client.put(txt, headers={**TEXT, "Stream-TTL": "60"}), 409)
    assert_error(client.put(txt, headers={**TEXT, "Stream-Closed": "true"}), 409)
    assert client.put(txt, headers=TEXT).status_code == 200


# -- producer headers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "missing"),
    [
        ({"Producer-Id": "p"}, "Producer-Epoch"),
        ({"Producer-Id": "p", "Producer-Epoch": "0"}, "Producer-Seq"),
        ({"Producer-Id": "p", "Producer-Seq": "0"}, "Producer-Epoch"),
        ({"Producer-Epoch": "0", "Producer-Seq": "0"}, "Producer-Id"),
        ({"Producer-Epoch": "0"}, "Producer-Id"),
        ({"Producer-Seq": "0"}, "Producer-Id"),
    ],
)
def test_partial_producer_headers(
    client: httpx.Client, js: str, headers: dict[str, str], missing: str
) -> None:
    assert_error(client.post(js, headers={**JSON, **headers}, content=b"1"), 400, missing)
    assert read_all(client, js).json() == []


def test_empty_producer_id(client: httpx.Client, js: str) -> None:
    r = client.post(js, headers={**JSON, **producer("", 0, 0)}, content=b"1")
    assert_error(r, 400, "Producer-Id")
    assert read_all(client, js).json() == []


def test_producer_id_too_long(client: httpx.Client, js: str) -> None:
    r = client.post(js, headers={**JSON, **producer("p" * 257, 0, 0)}, content=b"1")
    assert_error(r, 400, "Producer-Id")
    r = client.post(
        js, headers={**JSON, **producer("p" * 256, 0, 0), "Stream-Closed": "true"}, content=b"1"
    )
    assert r.status_code == 200, r.text
    assert r.headers["Stream-Closed"] == "true"
    assert read_all(client, js).json() == [1]


BAD_INTEGERS = [
    "1abc",
    "-1",
    "1e3",
    "0x1",
    "01",
    "1.0",
    "",
    "+1",
    "١",
    str(MAX_SAFE + 1),
    "9" * 5000,
]


@pytest.mark.parametrize("field", ["Producer-Epoch", "Producer-Seq"])
@pytest.mark.parametrize("value", BAD_INTEGERS, ids=short_id)
def test_bad_producer_integer(client: httpx.Client, js: str, field: str, value: str) -> None:
    headers: dict[str, str | bytes] = {**JSON, **producer("p", 0, 0), field: value.encode()}
    assert_error(client.post(js, headers=headers, content=b"1"), 400, field)
    assert read_all(client, js).json() == []


def test_largest_producer_integers_accepted(client: httpx.Client, js: str) -> None:
    r = client.post(js, headers={**JSON, **producer("p", MAX_SAFE, 0)}, content=b"1")
    assert r.status_code == 200, r.text
    assert r.headers["Producer-Epoch"] == str(MAX_SAFE)


def test_new_epoch_must_start_at_seq_zero(client: httpx.Client, js: str) -> None:
    assert client.post(js, headers={**JSON, **producer("p", 0, 0)}, content=b"1").status_code == 200
    r = client.post(js, headers={**JSON, **producer("p", 1, 1)}, content=b"2")
    assert_error(r, 400, "Producer-Seq")
    assert read_all(client, js).json() == [1]
    assert client.post(js, headers={**JSON, **producer("p", 1, 0)}, content=b"3").status_code == 200


def test_stale_epoch_is_fenced(client: httpx.Client, js: str) -> None:
    assert client.post(js, headers={**JSON, **producer("p", 2, 0)}, content=b"1").status_code == 200
    r = client.post(js, headers={**JSON, **producer("p", 1, 0)}, content=b"2")
    assert_error(r, 403, "Producer-Epoch")
    assert r.headers["Producer-Epoch"] == "2"
    assert read_all(client, js).json() == [1]


def test_rejected_bodies_do_not_advance_producer(client: httpx.Client, js: str) -> None:
    p = producer("p", 0, 0)
    assert_error(client.post(js, headers={**JSON, **p}, content=b"{bad"), 400, "body")
    assert_error(client.post(js, headers={**JSON, **p}, content=b"[]"), 400, "body")
    assert_error(client.post(js, headers={**TEXT, **p}, content=b"x"), 409, "Content-Type")
    r = client.post(js, headers={**JSON, **p}, content=b"1")
    assert r.status_code == 200, r.text  # seq 0 was never used up
    assert read_all(client, js).json() == [1]


def test_producer_header_bytes_that_are_not_text(srv: Server, js: str) -> None:
    for name, value in [(b"Producer-Id", b"\xff\xfe"), (b"Producer-Id", b"a\x01b")]:
        headers = [(b"Content-Type", b"application/json"), (name, value)]
        headers += [(b"Producer-Epoch", b"0"), (b"Producer-Seq", b"0")]
        assert raw_request(srv, raw_head("POST", js, headers, 1), b"1") == 400


# -- bodies and content types -----------------------------------------------------------------


def test_invalid_json(client: httpx.Client, js: str) -> None:
    for body in [b"{bad", b"[1,", b"nul", b"'x'", b"\xff\xfe", b"1 2", b"[1]]"]:
        assert_error(client.post(js, headers=JSON, content=body), 400, "body")
    assert read_all(client, js).json() == []


@pytest.mark.parametrize(
    "body",
    [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b'{"a":NaN}',
        b"[1e400]",  # only fits as infinity
        b"[" * 5000 + b"]" * 5000,  # deeper than any parser nests
        b"\xef\xbb\xbf[1]",  # a byte order mark
        b"\xff\xfe1\x00",  # UTF-16
    ],
    ids=short_id,
)
def test_json_that_is_not_json(client: httpx.Client, js: str, body: bytes) -> None:
    # Python's json module takes the first four; stored, they would read back as null.
    assert_error(client.post(js, headers=JSON, content=body), 400, "body")
    assert read_all(client, js).json() == []


def test_json_values_are_kept_exactly(client: httpx.Client, js: str) -> None:
    body = b'[123456789012345678901234567890, -18446744073709551617, "\\ud800", 1.5, 1e308]'
    assert client.post(js, headers=JSON, content=body).status_code == 204
    stored = json.loads(read_all(client, js).text)
    assert stored == [123456789012345678901234567890, -18446744073709551617, "\ud800", 1.5, 1e308]
    assert isinstance(stored[0], int) and isinstance(stored[1], int)


def test_integers_of_more_than_4300_digits_are_refused_naming_them(
    client: httpx.Client, js: str
) -> None:
    """The review of 2026-11-29: 4,301 digits answered Python's own wording ("Exceeds the
    limit ... use sys.set_int_max_str_digits()"), naming no field on the management API."""
    most, more = "9" * 4300, "-" + "9" * 4301
    assert client.post(js, headers=JSON, content=f"[{most}]".encode()).status_code == 204
    error = assert_error(client.post(js, headers=JSON, content=f"[{more}]".encode()), 400, "body")
    assert "more than 4300 digits" in error["message"], error
    name = js.rstrip("/").rsplit("/", 1)[-1]
    body = f'{{"messages": [{{"data": 1}}, {{"data": {{"n": {more}}}}}]}}'.encode()
    answer = client.post(f"/api/stations/{name}/messages", headers=JSON, content=body)
    error = assert_error(answer, 400, "messages.1.data.n")
    assert "more than 4300 digits" in error["message"], error
    assert json.loads(read_all(client, js).text) == [int(most)]


@pytest.mark.parametrize("alone", [True, False])
def test_negative_integers_below_64_bits_are_kept_exactly(
    client: httpx.Client, js: str, alone: bool
) -> None:
    """19 digits and below -2^63: orjson reads them as floats, and no 20-digit run sent the
    body to the exact parser (-9223372036854775809 was stored as -9.223372036854776e+18)."""
    values = [-9223372036854775809, -9999999999999999999, -9223372036854775808]
    body = json.dumps(values if alone else [*values, 2**70]).encode()
    assert client.post(js, headers=JSON, content=body).status_code == 204
    stored = json.loads(read_all(client, js).text)
    assert stored[:3] == values and all(isinstance(v, int) for v in stored)
    # The management API's produce and the transactions' alike.
    name = js.rstrip("/").rsplit("/", 1)[-1]
    one = {"messages": [{"data": {"n": values[0]}}]}
    assert client.post(f"/api/stations/{name}/messages", json=one).status_code == 200
    tx = {"produce": [{"station": name, "data": values[1]}]}
    assert client.post("/api/transactions", json=tx).status_code == 200
    again = json.loads(read_all(client, js).text)
    assert again[-2:] == [{"n": values[0]}, values[1]]


def test_empty_json_array(client: httpx.Client, js: str) -> None:
    assert_error(client.post(js, headers=JSON, content=b"[]"), 400, "body")
    assert_error(client.post(js, headers=JSON, content=b" [ ] "), 400, "body")
    assert read_all(client, js).json() == []


def test_empty_body_without_close(client: httpx.Client, js: str, txt: str) -> None:
    assert_error(client.post(js, headers=JSON, content=b""), 400, "body")
    assert_error(client.post(txt, headers=TEXT, content=b""), 400, "body")
    assert_error(client.post(txt, content=b""), 400, "body")
    assert_error(
        client.post(txt, headers={**TEXT, "Stream-Closed": "false"}, content=b""), 400, "body"
    )
    assert read_all(client, txt).content == b"hello"


def test_missing_content_type(srv: Server, client: httpx.Client, txt: str) -> None:
    # httpx adds no Content-Type for raw bytes; the raw request makes that certain.
    assert_error(client.post(txt, content=b"more"), 400, "Content-Type")
    assert raw_request(srv, raw_head("POST", txt, [], 4), b"more") == 400
    assert raw_request(srv, raw_head("POST", txt, [(b"Content-Type", b"")], 4), b"more") == 400
    assert read_all(client, txt).content == b"hello"


def test_content_type_mismatch(client: httpx.Client, js: str, txt: str) -> None:
    assert_error(client.post(txt, headers=JSON, content=b"1"), 409, "Content-Type")
    assert_error(client.post(js, headers=TEXT, content=b"1"), 409, "Content-Type")
    assert_error(
        client.post(txt, headers={"Content-Type": "application/octet-stream"}, content=b"x"),
        409,
        "Content-Type",
    )
    assert read_all(client, txt).content == b"hello"
    # Case and parameters do not matter.
    r = client.post(txt, headers={"Content-Type": "TEXT/PLAIN; charset=utf-8"}, content=b"!")
    assert r.status_code == 204, r.text


def test_malformed_content_type_on_append(client: httpx.Client, txt: str) -> None:
    for content_type in ["nonsense", "text/", "x" * 300 + "/y"]:
        r = client.post(txt, headers={"Content-Type": content_type}, content=b"x")
        assert_error(r, 400, "Content-Type")
    assert read_all(client, txt).content == b"hello"


def test_append_to_closed_stream(client: httpx.Client, txt: str) -> None:
    close = client.post(txt, headers={"Stream-Closed": "true"})
    assert close.status_code == 204
    r = client.post(txt, headers=TEXT, content=b"late")
    assert_error(r, 409)
    assert r.headers["Stream-Closed"] == "true"
    assert r.headers["Stream-Next-Offset"] == close.headers["Stream-Next-Offset"]
    # The closed check comes before the content-type check (protocol §5.2 precedence).
    r = client.post(txt, headers=JSON, content=b"1")
    assert_error(r, 409)
    assert r.headers["Stream-Closed"] == "true"
    # A close-only request without producer headers is idempotent: 204 again.
    assert client.post(txt, headers={"Stream-Closed": "true"}).status_code == 204


def test_a_producer_closing_a_stream_closed_by_another_tuple_is_refused(
    client: httpx.Client, txt: str
) -> None:
    """PROTOCOL.md §5.2.1: only the tuple that closed the stream is answered as a duplicate;
    any other producer close (a later seq, a fenced older epoch, another producer) is 409, as
    the reference answers. It was 204, telling a zombie producer its close had worked."""
    closing = {"Stream-Closed": "true", **producer("p1", 3, 0)}
    assert client.post(txt, headers=closing).status_code == 204
    again = client.post(txt, headers=closing)
    assert again.status_code == 204, again.text  # the closing request's retry
    assert again.headers["Producer-Seq"] == "0"
    for other in (producer("p1", 3, 1), producer("p1", 2, 0), producer("p2", 0, 0)):
        r = client.post(txt, headers={"Stream-Closed": "true", **other})
        assert_error(r, 409)
        assert r.headers["Stream-Closed"] == "true", other


def test_stream_seq_regression(client: httpx.Client, txt: str) -> None:
    assert client.post(txt, headers={**TEXT, "Stream-Seq": "b"}, content=b"1").status_code == 204
    for seq in ["b", "a", "B"]:
        r = client.post(txt, headers={**TEXT, "Stream-Seq": seq}, content=b"2")
        assert_error(r, 409, "Stream-Seq")
    r = client.post(txt, headers={**TEXT, "Stream-Seq": "c" * 2000}, content=b"3")
    assert_error(r, 400, "Stream-Seq")
    assert read_all(client, txt).content == b"hello1"


# -- Msg-Id (CONTRACT.md §3) ------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"[1,2]", b'[{"a":1},{"b":2},{"c":3}]'])
def test_msg_id_with_several_messages(client: httpx.Client, js: str, body: bytes) -> None:
    assert_error(client.post(js, headers={**JSON, "Msg-Id": "m1"}, content=body), 400, "Msg-Id")
    assert read_all(client, js).json() == []
    # The id was not used up.
    r = client.post(js, headers={**JSON, "Msg-Id": "m1"}, content=b"[7]")
    assert r.status_code == 204 and r.headers["Msg-Duplicate"] == "false"


def test_msg_id_without_body(client: httpx.Client, js: str) -> None:
    assert_error(client.post(js, headers={**JSON, "Msg-Id": "m1"}, content=b""), 400, "Msg-Id")
    # A close-only request carries no message either; the stream stays open.
    r = client.post(js, headers={"Msg-Id": "m1", "Stream-Closed": "true"})
    assert_error(r, 400, "Msg-Id")
    assert "Stream-Closed" not in client.head(js).headers


@pytest.mark.parametrize("msg_id", ["", "a" * 257, "a b", "a\tb", "x\ty"], ids=short_id)
def test_invalid_msg_id(client: httpx.Client, js: str, msg_id: str) -> None:
    assert_error(client.post(js, headers={**JSON, "Msg-Id": msg_id}, content=b"1"), 400, "Msg-Id")
    assert read_all(client, js).json() == []


@pytest.mark.parametrize(
    "value", [b"\xff", b"caf\xc3\xa9", b"a\x01b", b"a\x00b", b"x\x7f", b"a" * 257], ids=short_id
)
def test_non_printable_msg_id_bytes(
    srv: Server, client: httpx.Client, js: str, value: bytes
) -> None:
    headers = [(b"Content-Type", b"application/json"), (b"Msg-Id", value)]
    assert raw_request(srv, raw_head("POST", js, headers, 1), b"1") == 400
    assert read_all(client, js).json() == []


def test_longest_msg_id_accepted(client: httpx.Client, js: str) -> None:
    r = client.post(js, headers={**JSON, "Msg-Id": "~" * 256}, content=b"1")
    assert r.status_code == 204 and r.headers["Msg-Duplicate"] == "false"


# -- size limit -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_oversized_body(client: httpx.Client, method: str) -> None:
    path = new_stream(client, {"Content-Type": "application/octet-stream"}, b"a")
    headers = {"Content-Type": "application/octet-stream"}
    r = client.request(method, path, headers=headers, content=b"\0" * (BODY_LIMIT + 1))
    assert_error(r, 413, "body")
    assert read_all(client, path).content == b"a"
    # The connection pool and the server are fine afterwards.
    assert client.post(path, headers=headers, content=b"b").status_code == 204
    assert read_all(client, path).content == b"ab"


def test_oversized_chunked_body(client: httpx.Client) -> None:
    path = new_stream(client, {"Content-Type": "application/octet-stream"})

    def chunks() -> Iterator[bytes]:
        for _ in range(BODY_LIMIT // (1 << 20) + 2):
            yield b"\0" * (1 << 20)

    r = client.post(path, headers={"Content-Type": "application/octet-stream"}, content=chunks())
    assert_error(r, 413, "body")
    assert read_all(client, path).content == b""


# -- unknown streams --------------------------------------------------------------------------


def test_unknown_stream(client: httpx.Client) -> None:
    path = f"/v1/stream/missing-{uuid.uuid4().hex[:12]}"
    assert_error(client.get(path), 404)
    assert_error(client.get(path, params={"offset": "now"}), 404)
    assert_error(client.get(path, params={"offset": "-1", "live": "long-poll"}), 404)
    assert_error(client.get(path, params={"offset": "-1", "live": "sse"}), 404)
    assert_error(client.post(path, headers=JSON, content=b"1"), 404)
    assert_error(client.post(path, headers={"Stream-Closed": "true"}), 404)
    assert_error(client.post(path, headers={**JSON, **producer("p", 0, 0)}, content=b"1"), 404)
    assert_error(client.post(path, headers={**JSON, "Msg-Id": "m"}, content=b"1"), 404)
    assert_error(client.delete(path), 404)
    r = client.head(path)
    assert r.status_code == 404 and r.content == b""


def test_soft_deleted_stream_is_gone(client: httpx.Client, txt: str) -> None:
    fork = f"/v1/stream/fork-{uuid.uuid4().hex[:12]}"
    assert client.put(fork, headers={"Stream-Forked-From": txt}).status_code == 201
    assert client.delete(txt).status_code == 204  # the fork keeps it alive, soft-deleted
    assert_error(client.get(txt), 410)
    assert_error(client.post(txt, headers=TEXT, content=b"x"), 410)
    assert_error(client.delete(txt), 410)
    assert client.head(txt).status_code == 410
    assert_error(client.put(txt, headers=TEXT), 409)
    again = f"/v1/stream/fork-{uuid.uuid4().hex[:12]}"
    assert_error(client.put(again, headers={"Stream-Forked-From": txt}), 409, "Stream-Forked-From")
    assert read_all(client, fork).content == b"hello"


def test_unsupported_method(client: httpx.Client, txt: str) -> None:
    assert_error(client.patch(txt, headers=TEXT, content=b"x"), 405)
    assert read_all(client, txt).content == b"hello"


def test_deleted_stream_is_unknown(client: httpx.Client, txt: str) -> None:
    assert client.delete(txt).status_code == 204
    assert_error(client.get(txt), 404)
    assert_error(client.post(txt, headers=TEXT, content=b"x"), 404)
    assert_error(client.delete(txt), 404)


# -- randomized garbage -----------------------------------------------------------------------

FUZZ_SEED = 20240611
FUZZ_REQUESTS = 400


def _junk(rng: random.Random) -> bytes:
    """A header value that is wrong for any header."""
    return rng.choice(
        [
            b"",
            b"-1",
            b"9" * rng.randint(17, 5000),
            str(rng.randint(-(2**70), 2**70)).encode(),
            "²".encode(),
            bytes(rng.randrange(0x21, 0x7F) for _ in range(rng.randint(1, 300))),
            bytes(rng.randrange(0x80, 0x100) for _ in range(rng.randint(1, 8))),
            "é€😀".encode(),
            b"a" * rng.randint(250, 1100),
            b"\xc3\xa9" * rng.randint(1, 600),
        ]
    )


def _int_text(rng: random.Random) -> bytes:
    return str(rng.choice([0, 0, 1, 2, 3, rng.randint(0, 2**53 - 1), 2**53, 2**63, 2**64])).encode()


def _offset_text(rng: random.Random) -> str:
    return rng.choice(
        ["-1", "now", "0000000000000000_0000000000000000"]
        + [f"{rng.randint(0, 30):016d}_{rng.choice([0, 0, 0, 1]):016d}", f"{rng.randint(0, 9)}"]
    )


def _plausible(rng: random.Random, name: bytes, streams: list[str]) -> bytes:
    """A value that a real client might send for ``name``, often valid, sometimes just off."""
    if name == b"Content-Type":
        return rng.choice(
            [
                b"application/json",
                b"TEXT/PLAIN; charset=utf-8",
                b"application/octet-stream",
                b"image/png",
                b"text/" + b"y" * rng.randint(1, 400),
                b"nonsense",
                b"application/json;",
            ]
        )
    if name == b"Stream-TTL":
        return rng.choice([_int_text(rng), b"1", b"3600", b"03600", b"3.6e3"])
    if name == b"Stream-Expires-At":
        return rng.choice(
            [
                b"2099-01-01T00:00:00Z",
                b"2099-01-01T00:00:00.123456789+05:30",
                b"0001-01-01T00:00:00Z",
                b"9999-12-31T23:59:59-05:00",
                b"1970-01-01T00:00:00Z",
            ]
        )
    if name == b"Stream-Closed":
        return rng.choice([b"true", b"TRUE", b"false", b"1"])
    if name in (b"Producer-Epoch", b"Producer-Seq", b"Stream-Fork-Sub-Offset"):
        return _int_text(rng)
    if name == b"Stream-Fork-Offset":
        return _offset_text(rng).encode()
    if name == b"Stream-Forked-From":
        return rng.choice(streams).encode() + rng.choice([b"", b"", b"x", b"%00", b"%ff"])
    if name in (b"Producer-Id", b"Msg-Id", b"Stream-Seq"):
        return rng.choice([b"p", b"q", b"m-%d" % rng.randint(0, 5), b"x" * rng.randint(250, 1100)])
    return rng.choice([b'"x"', b"*", b'"%d:0:0"' % rng.randint(0, 9)])  # If-None-Match


FUZZ_HEADERS = [
    b"Content-Type",
    b"Stream-TTL",
    b"Stream-Expires-At",
    b"Stream-Closed",
    b"Stream-Seq",
    b"Stream-Forked-From",
    b"Stream-Fork-Offset",
    b"Stream-Fork-Sub-Offset",
    b"Producer-Id",
    b"Producer-Epoch",
    b"Producer-Seq",
    b"Msg-Id",
    b"If-None-Match",
]
PRODUCER = [b"Producer-Id", b"Producer-Epoch", b"Producer-Seq"]


def _headers(rng: random.Random, streams: list[str]) -> list[tuple[bytes, bytes]]:
    names = rng.sample(FUZZ_HEADERS, rng.randint(0, 4))
    if rng.random() < 0.3:
        names += [n for n in PRODUCER if n not in names]
    return [
        (name, _junk(rng) if rng.random() < 0.25 else _plausible(rng, name, streams))
        for name in names
    ]


def _path(rng: random.Random, streams: list[str]) -> str:
    path = rng.choice(
        [
            *streams,
            *streams,
            "/v1/stream/fz-"
            + "".join(
                rng.choice(["a", "b", "%20", "%00", "%ff", "%2F", "."])
                for _ in range(rng.randint(1, 12))
            ),
            "/v1/stream/" + "q" * rng.randint(1000, 1100),
            "/v1/stream/%C3%A9%E2%82%AC",
            "/v1/stream/a/b/c",
        ]
    )
    query = []
    if rng.random() < 0.7:
        query.append("offset=" + quote(_offset_text(rng)))
    if rng.random() < 0.3:
        query.append("live=" + rng.choice(["long-poll", "sse", "", "x"]))
    if rng.random() < 0.3:
        cursor = rng.choice(["1", "99999999999", "9" * rng.randint(1, 5000), "²", "-5", "x"])
        query.append("cursor=" + quote(cursor))
    if rng.random() < 0.1:
        query.append("offset=" + quote(_offset_text(rng)))
    if rng.random() < 0.1:
        query = [q[:7] + quote(bytes(rng.randrange(256) for _ in range(3))) for q in query]
    return path + ("?" + "&".join(query) if query else "")


def _body(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"",
            b"[]",
            b"[1,2,3]",
            b'{"a":1}',
            b"1",
            b"{bad",
            b"[" * 2000 + b"]" * 2000,  # deeper than JSON parsers nest
            b"1" * rng.randint(1, 5000),
            bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
            b'"\\ud800"',
            b'"\\u0000"',
            b"123456789012345678901234567890",
            b"1e999999",
            b"NaN",
        ]
    )


def test_randomized_garbage_never_answers_5xx(srv: Server, client: httpx.Client) -> None:
    rng = random.Random(FUZZ_SEED)
    streams = [
        new_stream(client),
        new_stream(client, TEXT, b"t"),
        new_stream(client, {"Content-Type": "application/octet-stream"}, b"\x00\x01"),
        new_stream(client, {**JSON, "Stream-TTL": "3600"}, b"[1]"),
    ]
    failures: list[str] = []
    statuses: dict[int, int] = {}
    for i in range(FUZZ_REQUESTS):
        method = rng.choice(
            ["GET", "GET", "HEAD", "PUT", "POST", "POST", "POST", "DELETE", "PATCH"]
        )
        path = _path(rng, streams)
        headers = _headers(rng, streams)
        body = _body(rng) if method in ("PUT", "POST") else b""
        head = raw_head(method, path, headers, len(body))
        status = raw_request(srv, head, body)
        statuses[status] = statuses.get(status, 0) + 1
        if status >= 500:
            failures.append(f"#{i} {status}: {head!r} body={body[:80]!r}")
    print("fuzz statuses:", sorted(statuses.items()))
    assert not failures, "\n".join(failures[:20])
    # The server is alive and still serves normal requests.
    assert client.get("/healthz").json() == {"status": "ok"}
    path = new_stream(client)
    assert client.post(path, headers=JSON, content=b"[1,2]").status_code == 204
    assert read_all(client, path).json() == [1, 2]


# -- found by the review of 2026-11-27 (late) -----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "header", "values"),
    [
        ("POST", "Msg-Id", ["dupA", "dupB"]),
        ("POST", "Producer-Seq", ["0", "1"]),
        ("POST", "Stream-Closed", ["true", "false"]),
        ("PUT", "Stream-TTL", ["60", "3600"]),
        ("PUT", "Stream-Expires-At", ["2099-01-01T00:00:00Z", "2098-01-01T00:00:00Z"]),
    ],
)
def test_a_header_given_twice_is_refused(
    client: httpx.Client, js: str, method: str, header: str, values: list[str]
) -> None:
    """Two Msg-Id headers stored the message under the first, silently: which copy a proxy
    keeps would decide the exactly-once id."""
    headers = [("Content-Type", "application/json"), *((header, v) for v in values)]
    if header == "Producer-Seq":
        headers += [("Producer-Id", "p"), ("Producer-Epoch", "0")]
    path = js if method == "POST" else f"/v1/stream/twice-{uuid.uuid4().hex[:12]}"
    r = client.request(
        method, path, headers=headers, content=b'{"a":1}' if method == "POST" else b""
    )
    body = assert_error(r, 400, header)
    assert "may be given once" in body["message"]
    if method == "POST":
        assert read_all(client, js).json() == []  # nothing stored


def test_the_latest_expires_at_comes_back_exactly(client: httpx.Client) -> None:
    """Reckoned through float seconds, the largest one was answered 1 ms early."""
    path = f"/v1/stream/exp-{uuid.uuid4().hex[:12]}"
    latest = "9999-12-31T23:59:59.999Z"
    assert client.put(path, headers={"Stream-Expires-At": latest}).status_code == 201
    assert client.head(path).headers["Stream-Expires-At"] == latest


@pytest.mark.parametrize("name", ["a%20b", "x%2F..%2Fy", "x" * 600, "__ds%2Fx"])
def test_the_management_api_refuses_what_no_station_can_be_named(
    client: httpx.Client, name: str
) -> None:
    """Such a path was "station ... not found" (404, the whole name repeated however long),
    while /v1/stream refused it with 400."""
    for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/groups"), ("GET", "/messages")):
        r = client.request(method, f"/api/stations/{name}{suffix}")
        body = assert_error(r, 400, "name")
        assert len(body["message"]) < 200


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=1&limit=2", "limit"),
        ("group=a&group=b", "group"),
        ("group=", "group"),
        ("after=1&after=2", "after"),
    ],
)
def test_dls_query_parameters_given_twice_or_empty(
    client: httpx.Client, js: str, query: str, field: str
) -> None:
    """A repeated limit said "must be an integer from 1 to 1000"; a repeated group took one of
    them, and an empty one meant every group, silently."""
    name = js.rsplit("/", 1)[1]
    r = client.get(f"/api/stations/{name}/dls?{query}")
    body = assert_error(r, 400, field)
    if "&" in query:
        assert "may be given once" in body["message"]


@pytest.mark.parametrize("section", ["retention", "dls", "consumerDefaults", "idempotencyWindowMs"])
def test_a_null_section_in_a_patch_is_refused(client: httpx.Client, section: str) -> None:
    """{"retention": null} was a 200 that changed nothing: a client that meant "reset" was not
    told. A limit set to null inside its section still removes it."""
    name = f"nulls-{uuid.uuid4().hex[:12]}"
    created = client.post("/api/stations", json={"name": name, "retention": {"maxAgeMs": 60_000}})
    assert created.status_code == 201, created.text
    before = client.get(f"/api/stations/{name}").json()
    r = client.patch(f"/api/stations/{name}", json={section: None})
    assert "may not be null" in assert_error(r, 400, section)["message"]
    assert client.get(f"/api/stations/{name}").json() == before
    r = client.patch(f"/api/stations/{name}", json={"retention": {"maxAgeMs": None}})
    assert r.status_code == 200 and r.json()["retention"]["maxAgeMs"] is None, r.text


@pytest.mark.parametrize(
    ("path", "method", "body", "field"),
    [
        ("/api/stations", "POST", '{"name":"dupkeys-a","name":"dupkeys-b"}', "name"),
        ("PATCH", "PATCH", '{"idempotencyWindowMs":1000,"idempotencyWindowMs":5000}', None),
        ("PATCH", "PATCH", '{"retention":{"maxAgeMs":1000,"maxAgeMs":null}}', "maxAgeMs"),
        ("GROUP", "PUT", '{"maxAckTimeMs":1000,"maxAckTimeMs":2000}', "maxAckTimeMs"),
    ],
)
def test_a_settings_key_given_twice_is_refused(
    client: httpx.Client, path: str, method: str, body: str, field: str | None
) -> None:
    """The last copy won silently; other parsers keep the first, so a client and the server
    could read different settings (found by a review)."""
    name = f"dup-{uuid.uuid4().hex[:12]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    url = {"PATCH": f"/api/stations/{name}", "GROUP": f"/api/stations/{name}/groups/g"}
    r = client.request(method, url.get(path, path), content=body, headers=JSON)
    error = assert_error(r, 400, field or "idempotencyWindowMs")
    assert "given twice" in error["message"]
    assert client.get("/api/stations/dupkeys-a").status_code == 404
    assert client.get(f"/api/stations/{name}/groups").json()["groups"] == []


@pytest.mark.parametrize("depth", [990, 100_000])
def test_deeply_nested_settings_bodies_are_a_400(client: httpx.Client, depth: int) -> None:
    """The check for keys given twice parsed the body again with the standard library, whose
    recursion limit is lower than orjson's: a station create nested 990 deep was a 500."""
    name = f"deep-{uuid.uuid4().hex[:12]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    body = '{"name":"x","retention":' + "[" * depth + "]" * depth + "}"
    for method, path in (
        ("POST", "/api/stations"),
        ("PATCH", f"/api/stations/{name}"),
        ("PUT", f"/api/stations/{name}/groups/g"),
    ):
        r = client.request(method, path, content=body, headers=JSON)
        assert_error(r, 400)
