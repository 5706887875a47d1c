"""Messages per append (``--max-append-messages``): a JSON body of millions of tiny messages is
refused before any message is built or stored, on every route that appends, and one at the cap
is stored whole. On both engines, against a real ``stations serve``."""

from __future__ import annotations

import gc
import subprocess
import sys

import httpx
import pytest

from stations.client import IdempotentProducer
from stations.domain import framing
from stations.errors import TooLarge
from tests.harness import Server

JSON = {"Content-Type": "application/json"}
CAP = 5


def _body(n: int) -> bytes:
    return b"[" + b",".join(b"[]" for _ in range(n)) + b"]"


@pytest.fixture
def capped(db_url: str, make_server) -> Server:  # type: ignore[no-untyped-def]
    return make_server(db_url, "--max-append-messages", str(CAP))


def _stored(client: httpx.Client, name: str) -> list[object]:
    r = client.get(f"/v1/stream/{name}", params={"offset": "-1"})
    assert r.status_code == 200, r.text
    value: list[object] = r.json()
    return value


def _too_many(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["field"] == field
    assert str(CAP) in error["message"]


def test_a_stream_append_over_the_cap_is_a_413_naming_the_body_and_stores_nothing(
    capped: Server,
) -> None:
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        assert c.put("/v1/stream/s", headers=JSON).status_code == 201
        r = c.post("/v1/stream/s", content=_body(CAP + 1), headers=JSON)
        _too_many(r, 413, "body")
        assert r.json()["error"]["code"] == "too_large"
        assert _stored(c, "s") == []
        # Strings holding commas and brackets are one message each: only elements count.
        at_cap = b'["a,b",{"x":[1,2,3]},"[[]]",[[],[]],0]'
        assert c.post("/v1/stream/s", content=at_cap, headers=JSON).status_code == 204
        assert _stored(c, "s") == ["a,b", {"x": [1, 2, 3]}, "[[]]", [[], []], 0]


def test_a_stream_created_with_more_messages_than_the_cap_is_not_created(
    capped: Server,
) -> None:
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        _too_many(c.put("/v1/stream/t", content=_body(CAP + 1), headers=JSON), 413, "body")
        assert c.head("/v1/stream/t").status_code == 404
        assert c.put("/v1/stream/t", content=_body(CAP), headers=JSON).status_code == 201
        assert _stored(c, "t") == [[]] * CAP


def test_an_idempotent_producer_over_the_cap_is_refused_without_using_its_seq(
    capped: Server,
) -> None:
    def producer(seq: int) -> dict[str, str]:
        return {**JSON, "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": str(seq)}

    with httpx.Client(base_url=capped.url, timeout=30) as c:
        assert c.put("/v1/stream/p", headers=JSON).status_code == 201
        r = c.post("/v1/stream/p", content=_body(CAP + 1), headers=producer(0))
        _too_many(r, 413, "body")
        assert _stored(c, "p") == []
        # Seq 0 is still the next one: the refusal took nothing of the producer's session.
        r = c.post("/v1/stream/p", content=_body(CAP), headers=producer(0))
        assert r.status_code == 200, r.text
        assert r.headers["Producer-Seq"] == "0"
        r = c.post("/v1/stream/p", content=_body(CAP), headers=producer(0))
        assert r.status_code == 204, r.text  # the retry is a duplicate
        assert _stored(c, "p") == [[]] * CAP


def test_a_management_produce_over_the_cap_is_a_400_naming_messages_and_stores_nothing(
    capped: Server,
) -> None:
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        assert c.post("/api/stations", json={"name": "m"}).status_code == 201
        over = {"messages": [{"data": i} for i in range(CAP + 1)]}
        _too_many(c.post("/api/stations/m/messages", json=over), 400, "messages")
        assert _stored(c, "m") == []
        at = {"messages": [{"data": i} for i in range(CAP)]}
        r = c.post("/api/stations/m/messages", json=at)
        assert r.status_code == 200, r.text
        assert _stored(c, "m") == list(range(CAP))


def test_the_default_cap_is_what_a_mebibyte_of_tiny_messages_holds(tmp_path, make_server) -> None:  # type: ignore[no-untyped-def]
    """524,288 ("1," each in 1 MiB): the TS client's IdempotentProducer sends batches of up to
    1 MiB, and at the old default of 100,000 a batch of one-digit messages, and every one after
    it, was refused with 413 (found by a review)."""
    server = make_server(f"sqlite:///{tmp_path / 'd' / 's.db'}")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.put("/v1/stream/d", headers=JSON).status_code == 201
        over = b"[" + b"0," * 524_288 + b"0]"
        r = c.post("/v1/stream/d", content=over, headers=JSON)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["field"] == "body"
        assert "524288" in r.json()["error"]["message"]
        assert _stored(c, "d") == []
        at = b"[" + b"0," * 524_287 + b"0]"
        assert len(at) == (1 << 20) + 1  # the brackets around 1 MiB of "0,"
        assert c.post("/v1/stream/d", content=at, headers=JSON).status_code == 204


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_max_append_messages_must_be_a_positive_integer(value: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, "-m", "stations", "serve", "--max-append-messages", value],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "--max-append-messages" in proc.stderr


async def test_the_sdk_producer_keeps_its_batches_within_the_default_cap(
    tmp_path, make_server
) -> None:  # type: ignore[no-untyped-def]
    # A megabyte batch of "0" would be half a million messages: refused by a default server.
    server = make_server(f"sqlite:///{tmp_path / 'k' / 's.db'}")
    url = f"{server.url}/v1/stream/tiny"
    async with httpx.AsyncClient(timeout=60) as c:
        assert (await c.put(url, headers=JSON)).status_code == 201
    n = 250_000
    async with IdempotentProducer(url, "tiny", linger_ms=1000) as producer:
        for _ in range(n):
            producer.append(0)
        await producer.flush()
    stats = httpx.get(f"{server.url}/api/stations/tiny", timeout=30).json()["stats"]
    assert stats["messages"] == n, stats


async def test_the_sdk_producer_takes_max_batch_messages(capped: Server) -> None:
    url = f"{capped.url}/v1/stream/few"
    async with httpx.AsyncClient(timeout=60) as c:
        assert (await c.put(url, headers=JSON)).status_code == 201
    async with IdempotentProducer(url, "few", max_batch_messages=CAP, linger_ms=1000) as producer:
        for i in range(4 * CAP + 1):
            producer.append(i)
        await producer.flush()
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        assert _stored(c, "few") == list(range(4 * CAP + 1))
    with pytest.raises(ValueError):
        IdempotentProducer(url, "few", max_batch_messages=0)


@pytest.mark.parametrize(
    "head",
    [b"[]", b'"\\ud800"', b"123456789012345678901234567890"],
    ids=["orjson", "lone-surrogate", "long-integer"],
)
def test_split_json_counts_the_elements_whichever_parser_reads_the_body(head: bytes) -> None:
    # orjson refuses a lone surrogate escape and rounds a long integer: the standard library
    # reads those bodies, and the cap holds there too.
    def body(n: int) -> bytes:
        return b"[" + b",".join([head] + [b"0"] * (n - 1)) + b"]"

    with pytest.raises(TooLarge) as refused:
        framing.split_json(body(CAP + 1), allow_empty=False, max_messages=CAP)
    assert refused.value.field == "body" and f"at most {CAP}" in refused.value.message
    assert len(framing.split_json(body(CAP), allow_empty=False, max_messages=CAP)) == CAP
    assert gc.isenabled()  # the collector, off while parsing, is back on either way


def _leased(c: httpx.Client, station: str, group: str) -> dict[str, object]:
    """One message produced to ``station`` and fetched by ``group``: its lease."""
    assert c.post("/api/stations", json={"name": station}).status_code == 201
    r = c.post(f"/api/stations/{station}/messages", json={"messages": [{"data": "in"}]})
    assert r.status_code == 200, r.text
    assert c.put(f"/api/stations/{station}/groups/{group}", json={}).status_code == 201
    r = c.post(
        f"/api/stations/{station}/groups/{group}/fetch",
        json={"max": 1, "waitMs": 0, "consumer": "c1"},
    )
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    return {
        "station": station,
        "group": group,
        "offset": m["offset"],
        "deliveryCount": m["deliveryCount"],
        "ackDeadline": m["ackDeadline"],
    }


def test_a_transaction_producing_more_than_the_cap_is_a_400_naming_produce_and_leaves_nothing(
    capped: Server,
) -> None:
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        lease = _leased(c, "in", "g")
        assert c.post("/api/stations", json={"name": "out"}).status_code == 201
        produce = [{"station": "out", "id": f"id-{i}", "data": i} for i in range(CAP + 1)]
        r = c.post("/api/transactions", json={"ack": [lease], "produce": produce})
        _too_many(r, 400, "produce")
        assert _stored(c, "out") == []
        # Nothing of it committed: the ack did not (the lease is still held, so a transaction
        # at the cap may settle it) and no msg-id was taken (none of them is a duplicate).
        r = c.post("/api/transactions", json={"ack": [lease], "produce": produce[:CAP]})
        assert r.status_code == 200, r.text
        assert r.json()["acked"] == 1
        assert [p["duplicate"] for p in r.json()["produced"]] == [False] * CAP
        last = {"messages": [{"id": f"id-{CAP}", "data": CAP}]}
        r = c.post("/api/stations/out/messages", json=last)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["duplicate"] is False
        assert _stored(c, "out") == list(range(CAP + 1))


def test_the_cap_counts_a_transactions_produced_messages_across_stations(
    capped: Server,
) -> None:
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        for name in ("x", "y"):
            assert c.post("/api/stations", json={"name": name}).status_code == 201
        # CAP + 1 messages in all, none of the stations' appends over the cap by itself.
        produce = [{"station": "x" if i % 2 else "y", "data": i} for i in range(CAP + 1)]
        _too_many(c.post("/api/transactions", json={"produce": produce}), 400, "produce")
        assert _stored(c, "x") == [] and _stored(c, "y") == []
        r = c.post("/api/transactions", json={"produce": produce[:CAP]})
        assert r.status_code == 200, r.text
        assert sorted(_stored(c, "x") + _stored(c, "y")) == list(range(CAP))  # type: ignore[type-var]


def test_settlements_do_not_count_against_the_append_cap(capped: Server) -> None:
    # The cap bounds messages written; acks write none (the transaction's own 10000 items
    # still bound them).
    with httpx.Client(base_url=capped.url, timeout=30) as c:
        assert c.post("/api/stations", json={"name": "many"}).status_code == 201
        items = {"messages": [{"data": i} for i in range(CAP)]}
        for _ in range(2):
            r = c.post("/api/stations/many/messages", json=items)
            assert r.status_code == 200, r.text
        assert c.put("/api/stations/many/groups/g", json={}).status_code == 201
        r = c.post(
            "/api/stations/many/groups/g/fetch",
            json={"max": 2 * CAP, "waitMs": 0, "consumer": "c1"},
        )
        assert r.status_code == 200, r.text
        acks = [
            {"station": "many", "group": "g", "offset": m["offset"]} for m in r.json()["messages"]
        ]
        assert len(acks) == 2 * CAP
        r = c.post("/api/transactions", json={"ack": acks})
        assert r.status_code == 200, r.text
        assert r.json()["acked"] == 2 * CAP
