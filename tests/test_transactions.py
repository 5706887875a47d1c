"""Transactions across stations (``POST /api/transactions``) on both engines: settling and
producing commit together or not at all; a stale or moved lease fails the whole request with a
409 naming the message; duplicates are reported per message; bad input is a 4xx naming the
field; auth asks for the consumer role on what is settled and the producer role where it
produces."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stations.domain import dls, groups, transactions
from stations.domain.service import Service
from stations.store.writer import Batch
from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    field_of,
    ms,
    shared_fixture,  # noqa: F401 - the fixture shared
)
from tests.harness import Server


async def tx(api: Api, body: dict[str, Any], status: int = 200) -> Any:
    r = await api.c.post("/api/transactions", json=body)
    assert r.status_code == status, r.text
    return r.json()


def lease(st: str, group: str, m: dict[str, Any]) -> dict[str, Any]:
    return {
        "station": st,
        "group": group,
        "offset": m["offset"],
        "deliveryCount": m["deliveryCount"],
    }


async def until_past(iso: str) -> None:
    """Wait until the server's ``ackDeadline`` has passed (by the wall clock both share)."""
    await asyncio.sleep(max(0.0, ms(iso) - time.time()) + 0.05)


async def test_two_stations_two_groups(api: Api) -> None:
    a, b = await api.station(), await api.station()
    out1, out2 = await api.station(), await api.station(contentType="text/plain")
    await api.produce(a, [{"n": 1}, {"n": 2}])
    await api.produce(b, [{"n": 3}])
    await api.put_group(a, "ga")
    await api.put_group(b, "gb")
    ma = await api.fetch(a, "ga", max=2)
    mb = await api.fetch(b, "gb", max=1)
    answer = await tx(
        api,
        {
            "consumer": "c1",
            "ack": [lease(a, "ga", ma[0]), lease(b, "gb", mb[0])],
            "nack": [{**lease(a, "ga", ma[1]), "delayMs": 0}],
            "produce": [
                {"station": out1, "data": {"sum": 4}, "id": "s-1", "headers": {"k": "v"}},
                {"station": out2, "data": "plain text"},
                {"station": out1, "data": {"sum": 5}},
            ],
        },
    )
    assert answer["acked"] == 2 and answer["nacked"] == 1 and answer["deadLettered"] == 0
    assert [(p["station"], p["duplicate"]) for p in answer["produced"]] == [
        (out1, False),
        (out2, False),
        (out1, False),
    ]
    stored = await api.browse(out1)
    assert [(m["data"], m["id"], m["headers"]) for m in stored] == [
        ({"sum": 4}, "s-1", {"k": "v"}),
        ({"sum": 5}, None, {}),
    ]
    assert [m["offset"] for m in stored] == [
        answer["produced"][0]["offset"],
        answer["produced"][2]["offset"],
    ]
    assert [m["data"] for m in await api.browse(out2)] == ["plain text"]
    groups_a, groups_b = await api.groups(a), await api.groups(b)
    assert groups_a["ga"]["inFlight"] == 0 and groups_a["ga"]["pending"] == 1  # the nacked one
    assert groups_b["gb"]["inFlight"] == 0 and groups_b["gb"]["pending"] == 0
    again = await api.fetch(a, "ga")
    assert [(m["offset"], m["deliveryCount"]) for m in again] == [(ma[1]["offset"], 2)]
    # Dead-lettering inside a transaction, with its reason.
    answer = await tx(api, {"deadLetter": [{**lease(a, "ga", again[0]), "reason": "bad sum"}]})
    assert answer["deadLettered"] == 1
    entries = await api.dls_entries(a, "ga")
    assert [(e["offset"], e["reason"], e["error"]) for e in entries] == [
        (ma[1]["offset"], "dead_letter", "bad sum")
    ]


async def test_stale_lease_fails_everything(api: Api) -> None:
    src, out = await api.station(), await api.station()
    await api.produce(src, [{"n": 1}, {"n": 2}])
    await api.put_group(src, "g", maxAckTimeMs=1500, maxMsgDeliveries=5)
    first = await api.fetch(src, "g", max=1)
    await until_past(first[0]["ackDeadline"])
    second = await api.fetch(src, "g", max=1, consumer="c2")  # the expired one comes first
    assert second[0]["offset"] == first[0]["offset"] and second[0]["deliveryCount"] == 2
    fresh = await api.fetch(src, "g", max=1, consumer="c2")
    body = {
        "ack": [lease(src, "g", fresh[0]), lease(src, "g", first[0])],
        "produce": [{"station": out, "data": {"x": 1}, "id": "x-1"}],
    }
    # The old delivery moved to c2 (delivery 2): the whole transaction fails.
    r = await api.c.post("/api/transactions", json=body)
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["field"] == "ack.1.offset" and first[0]["offset"] in error["message"]
    assert await api.browse(out) == []  # nothing produced
    # ... and nothing settled: the good lease of the same request still acks.
    assert (await api.ack(src, "g", [fresh[0]["offset"]]))["acked"] == 1
    # The same consumer name does not make a moved lease valid again.
    body["consumer"] = "c1"
    body["ack"] = [{**lease(src, "g", first[0]), "deliveryCount": 2}]
    r = await api.c.post("/api/transactions", json=body)
    assert r.status_code == 409 and field_of(r) == "ack.0.offset"
    # An expired lease (without a new delivery yet) is stale too.
    await until_past(second[0]["ackDeadline"])
    r = await api.c.post("/api/transactions", json={"ack": [lease(src, "g", second[0])]})
    assert r.status_code == 409 and "expired" in r.json()["error"]["message"]
    # An acked one is stale; the msg-id of the refused produce was never used.
    r = await api.c.post("/api/transactions", json={"ack": [lease(src, "g", fresh[0])]})
    assert r.status_code == 409
    assert await api.browse(out) == []
    ok = await tx(api, {"produce": [{"station": out, "data": {"x": 1}, "id": "x-1"}]})
    assert ok["produced"][0]["duplicate"] is False


async def test_a_message_delivered_again_after_a_seek_or_replay_is_another_lease(
    api: Api,
) -> None:
    """A seek and a DLS replay deliver a message again from delivery count 1: station, group,
    offset and count were the same as the first delivery's, and a transaction of the first
    delivery committed (the current one's then failed). The fetch's ackDeadline tells them
    apart (found by a review)."""
    src, out = await api.station(), await api.station()
    await api.produce(src, [{"n": 1}])

    def held(m: dict[str, Any]) -> dict[str, Any]:
        return {**lease(src, "g", m), "ackDeadline": m["ackDeadline"]}

    await api.put_group(src, "g", maxAckTimeMs=1500, maxMsgDeliveries=1)
    first = await api.fetch(src, "g", max=1)
    r = await api.c.post(f"/api/stations/{src}/groups/g/seek", json={"to": "earliest"})
    assert r.status_code == 200, r.text
    again = await api.fetch(src, "g", max=1)
    assert (again[0]["offset"], again[0]["deliveryCount"]) == (first[0]["offset"], 1)
    stale = {"ack": [held(first[0])], "produce": [{"station": out, "data": "stale"}]}
    r = await api.c.post("/api/transactions", json=stale)
    assert r.status_code == 409 and field_of(r) == "ack.0.offset", r.text
    assert "another delivery" in r.json()["error"]["message"]
    # The lease expires (its last delivery: to the DLS) and a replay delivers it again.
    await until_past(again[0]["ackDeadline"])
    deadline = time.monotonic() + 10
    while not await api.dls_entries(src, "g"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert await api.replay(src, {"all": True}) == 1
    third = await api.fetch(src, "g", max=1)
    assert (third[0]["offset"], third[0]["deliveryCount"]) == (first[0]["offset"], 1)
    for old in (first[0], again[0]):
        r = await api.c.post("/api/transactions", json={"ack": [held(old)]})
        assert r.status_code == 409, r.text
    answer = await tx(api, {"ack": [held(third[0])], "produce": [{"station": out, "data": 1}]})
    assert answer["acked"] == 1
    assert [m["data"] for m in await api.browse(out)] == [1]
    bad = {"ack": [{**held(third[0]), "ackDeadline": "soon"}]}
    r = await api.c.post("/api/transactions", json=bad)
    assert r.status_code == 400 and field_of(r) == "ack.0.ackDeadline", r.text


async def test_duplicates_inside_a_transaction(api: Api) -> None:
    src, out = await api.station(), await api.station()
    before = await api.produce(out, [{"old": True}], ids=["seen"])
    await api.produce(src, [{"n": 1}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    answer = await tx(
        api,
        {
            "ack": [lease(src, "g", got[0])],
            "produce": [
                {"station": out, "id": "a", "data": 1},
                {"station": out, "id": "a", "data": 2},  # repeats the first
                {"station": out, "id": "seen", "data": 3},  # already in the window
                {"station": out, "data": 4},
            ],
        },
    )
    produced = answer["produced"]
    assert [p["duplicate"] for p in produced] == [False, True, True, False]
    assert produced[1]["offset"] == produced[0]["offset"]
    assert produced[2]["offset"] == before[0]
    assert [m["data"] for m in await api.browse(out)] == [{"old": True}, 1, 4]
    # The metric of duplicates by message id counts a transaction's like any produce's.
    metrics = (await api.c.get("/metrics")).text
    assert f'stations_station_duplicates_total{{station="{out}"}} 2.0' in metrics


async def test_bad_input_names_the_field(api: Api) -> None:
    src, text = await api.station(), await api.station(contentType="text/plain")
    await api.produce(src, [{"n": 1}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    good = lease(src, "g", got[0])
    cases: list[tuple[Any, int, str | None]] = [
        ([], 400, None),
        ({}, 400, None),
        ({"ack": {}}, 400, "ack"),
        ({"bogus": []}, 400, "bogus"),
        ({"ack": [{**good, "station": "no-such-station"}]}, 404, "ack.0.station"),
        ({"ack": [{**good, "group": "no-such-group"}]}, 404, "ack.0.group"),
        ({"ack": [{**good, "offset": "zz"}]}, 400, "ack.0.offset"),
        ({"ack": [{"station": src, "offset": got[0]["offset"]}]}, 400, "ack.0.group"),
        ({"ack": [good, good]}, 400, "ack.1.offset"),
        ({"ack": [{**good, "deliveryCount": "1"}]}, 400, "ack.0.deliveryCount"),
        ({"nack": [{**good, "delayMs": -1}]}, 400, "nack.0.delayMs"),
        ({"deadLetter": [{**good, "reason": 5}]}, 400, "deadLetter.0.reason"),
        ({"ack": [good], "produce": [{"station": "no-such", "data": 1}]}, 404, "produce.0.station"),
        ({"produce": [{"station": "bad name!", "data": 1}]}, 400, "produce.0.station"),
        (
            {"produce": [{"station": src, "data": 1}, {"station": text, "data": {"a": 1}}]},
            400,
            "produce.1.data",
        ),
        (
            {"produce": [{"station": text, "data": "x", "contentType": "application/json"}]},
            409,
            "produce.0.contentType",
        ),
        ({"produce": [{"station": src, "data": 1, "id": ""}]}, 400, "produce.0.id"),
        ({"produce": [{"station": src}]}, 400, "produce.0.data"),
        ({"produce": [{"station": src, "data": 1, "colour": "red"}]}, 400, "produce.0.colour"),
        ({"produce": [{"station": src, "data": i} for i in range(10_001)]}, 400, "produce"),
        ({"ack": [good] * 6000, "produce": [{"station": src, "data": 1}] * 5000}, 400, "ack"),
    ]
    for body, status, field in cases:
        r = await api.c.post("/api/transactions", json=body)
        assert r.status_code == status, (str(body)[:200], r.text)
        assert field_of(r) == field, (str(body)[:200], r.text)
    for body, field in [
        ({"ack": [None]}, "ack.0"),
        ({"produce": [1]}, "produce.0"),
        ({"consumer": 5, "ack": [good]}, "consumer"),
        ({"consumer": "", "ack": [good]}, "consumer"),
        ({"ack": [{**good, "station": 5}]}, "ack.0.station"),
        ({"ack": [{**good, "group": ["g"]}]}, "ack.0.group"),
        ({"ack": [{**good, "group": ".."}]}, "ack.0.group"),
        ({"ack": [{**good, "deliveryCount": True}]}, "ack.0.deliveryCount"),
        ({"ack": [{**good, "offset": "-1"}]}, "ack.0.offset"),
        ({"nack": [{**good, "delayMs": 1.5}]}, "nack.0.delayMs"),
        ({"produce": [{"station": src, "data": 1, "headers": {"a": 1}}]}, "produce.0.headers"),
        ({"produce": [{"station": src, "dataBase64": "!!"}]}, "produce.0.dataBase64"),
        ({"produce": [{"station": src, "data": 1, "contentType": 7}]}, "produce.0.contentType"),
        ({"produce": "x"}, "produce"),
    ]:
        r = await api.c.post("/api/transactions", json=body)
        assert r.status_code == 400, (body, r.text)
        assert field_of(r) == field, (body, r.text)
    # None of it produced or settled anything.
    assert [m["data"] for m in await api.browse(src)] == [{"n": 1}]
    assert await api.browse(text) == []
    assert (await api.groups(src))["g"]["inFlight"] == 1
    r = await api.c.post("/api/transactions", content=b"{not json")
    assert r.status_code == 400


# -- auth --------------------------------------------------------------------------------------

ADMIN, PRODUCER, CONSUMER, OTHER = (
    "admin-tx-secret",
    "prod-tx-secret",
    "cons-tx-secret",
    "other-tx-secret",
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir: Path = tmp_path_factory.mktemp("tx-auth")
    tokens = workdir / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": ADMIN, "role": "admin"},
                    {"token": PRODUCER, "role": "producer", "stations": ["out*"]},
                    {"token": CONSUMER, "role": "consumer", "stations": ["in*"]},
                    {"token": OTHER, "role": "consumer", "stations": ["elsewhere"]},
                ]
            }
        )
    )
    url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    server = Server(url, workdir, ["--tokens", str(tokens)]).start()
    try:
        yield server
    finally:
        server.kill()


def test_auth_roles_and_scopes(secured: Server) -> None:
    def call(token: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            secured.url + "/api/transactions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    admin = httpx.Client(base_url=secured.url, headers={"Authorization": f"Bearer {ADMIN}"})
    for name in ("in-1", "out-1"):
        assert admin.post("/api/stations", json={"name": name}).status_code == 201
    forwards = {"name": "in-fwd", "dls": {"forwardTo": "out-1"}}
    assert admin.post("/api/stations", json=forwards).status_code == 201
    admin.post("/api/stations/in-1/messages", json={"messages": [{"data": i} for i in range(4)]})
    assert admin.put("/api/stations/in-1/groups/g", json={}).status_code == 201
    got = admin.post("/api/stations/in-1/groups/g/fetch", json={"max": 4}).json()["messages"]
    leases = [lease("in-1", "g", m) for m in got]
    produce = [{"station": "out-1", "data": {"x": 1}}]

    assert call("not-a-token-at-all", {"ack": leases[:1]}).status_code == 401
    # A consumer settles on its stations, and may not produce.
    r = call(CONSUMER, {"ack": leases[:1], "produce": produce})
    assert r.status_code == 403 and r.json()["error"]["field"] == "produce.0.station"
    assert call(CONSUMER, {"ack": leases[:1]}).json()["acked"] == 1
    # A producer produces on its stations, and may not settle.
    r = call(PRODUCER, {"ack": leases[1:2], "produce": produce})
    assert r.status_code == 403 and r.json()["error"]["field"] == "ack.0.station"
    assert call(PRODUCER, {"produce": produce}).status_code == 200
    r = call(PRODUCER, {"produce": [{"station": "in-1", "data": 1}]})
    assert r.status_code == 403 and r.json()["error"]["field"] == "produce.0.station"
    # A consumer token that does not cover the station.
    r = call(OTHER, {"nack": leases[1:2]})
    assert r.status_code == 403 and r.json()["error"]["field"] == "nack.0.station"
    # Nothing of the refused requests happened.
    msgs = admin.get("/api/stations/out-1/messages").json()["messages"]
    assert len(msgs) == 1
    assert admin.get("/api/stations/in-1/groups").json()["groups"][0]["inFlight"] == 3
    # Dead-lettering on a station that forwards its dead letters elsewhere writes there too.
    admin.post("/api/stations/in-fwd/messages", json={"messages": [{"data": 1}]})
    assert admin.put("/api/stations/in-fwd/groups/g", json={}).status_code == 201
    fwd = admin.post("/api/stations/in-fwd/groups/g/fetch", json={}).json()["messages"]
    r = call(CONSUMER, {"deadLetter": [lease("in-fwd", "g", fwd[0])]})
    assert r.status_code == 403 and r.json()["error"]["field"] == "deadLetter.0.station"
    assert call(CONSUMER, {"ack": [lease("in-fwd", "g", fwd[0])]}).json()["acked"] == 1
    # Admin may do both at once.
    assert call(ADMIN, {"ack": leases[1:], "produce": produce}).json()["acked"] == 3
    # An unknown station is named by its item's field, scoped token or not.
    gone = {"nack": [{"station": "in-nope", "group": "g", "offset": leases[0]["offset"]}]}
    for token in (CONSUMER, ADMIN):
        r = call(token, gone)
        assert r.status_code == 404 and r.json()["error"]["field"] == "nack.0.station", r.text
    admin.close()


# -- the SDK -----------------------------------------------------------------------------------


async def test_sdk_transaction(shared: Server) -> None:
    from stations.client import Client, Conflict

    async with Client(shared.url) as c:
        src, out = await c.create_station(f"sdk-in-{time.time_ns()}"), None
        out = await c.create_station(f"sdk-out-{time.time_ns()}")
        source, target = c.station(src.name), c.station(out.name)
        await source.produce_many([{"n": i} for i in range(4)])
        async with source.consumer("g", consumer="w", batch_size=4, wait_ms=0) as consumer:
            batch = await consumer.fetch()
            async with consumer.transaction() as tx:
                tx.produce(target, {"n": batch[0].data["n"]}, msg_id="t-0", headers={"h": "1"})
                tx.produce(target.name, b"\x22raw\x22")  # bytes: a JSON value here
                tx.ack(batch[0])
                tx.nack(batch[1], delay_ms=60_000)
                tx.dead_letter(batch[2], "nope")
            assert tx.result is not None
            assert (tx.result.acked, tx.result.nacked, tx.result.dead_lettered) == (1, 1, 1)
            assert [p.duplicate for p in tx.result.produced] == [False, False]
            # An exception inside the block sends nothing.
            try:
                async with consumer.transaction() as tx:
                    tx.produce(target, {"never": True})
                    tx.ack(batch[3])
                    raise RuntimeError("transform failed")
            except RuntimeError:
                pass
            # A settled lease fails the whole transaction.
            tx = consumer.transaction()
            tx.produce(target, {"never": True})
            tx.ack(batch[0])
            try:
                await tx.commit()
                raise AssertionError("a stale lease committed")
            except Conflict as exc:
                assert batch[0].offset in str(exc)
            async with c.transaction() as tx:  # a transaction without a consumer name
                tx.ack(batch[3])
                tx.produce(target, {"n": 3}, msg_id="t-0")  # a duplicate, reported
            assert tx.result is not None and tx.result.produced[0].duplicate
            # After a seek the same message comes again as delivery 1: the SDK names the lease
            # by its deadline too, so the earlier delivery's transaction is refused.
            await source.produce_many([{"n": 4}])
            (before,) = await consumer.fetch()
            await consumer.seek(before.offset)
            (after,) = await consumer.fetch()
            assert (after.offset, after.delivery_count) == (before.offset, 1)
            tx = consumer.transaction()
            tx.ack(before)
            try:
                await tx.commit()
                raise AssertionError("the earlier delivery's lease committed")
            except Conflict as exc:
                assert "another delivery" in str(exc)
            async with consumer.transaction() as tx:
                tx.ack(after)
            assert tx.result is not None and tx.result.acked == 1
        page = await target.browse()
        assert [m.data for m in page.messages] == [{"n": 0}, "raw"]
        assert page.messages[0].msg_id == "t-0" and page.messages[0].headers == {"h": "1"}


async def test_a_consumers_transaction_settles_other_consumers_messages(shared: Server) -> None:
    """The README: messages of several consumers' groups may be settled in one transaction. A
    ``consumer.transaction()`` named its consumer, which the server requires to hold every lease,
    so another consumer's message failed it with a 409 saying the lease "moved" (it had not)."""
    from stations.client import Client

    async with Client(shared.url) as c:
        a = await c.create_station(f"multi-a-{time.time_ns()}")
        b = await c.create_station(f"multi-b-{time.time_ns()}")
        await c.station(a.name).produce_many([{"a": 1}])
        await c.station(b.name).produce_many([{"b": 1}])
        async with (
            c.station(a.name).consumer("ga", consumer="worker-a", wait_ms=0) as ca,
            c.station(b.name).consumer("gb", consumer="worker-b", wait_ms=0) as cb,
        ):
            (ma,), (mb,) = await ca.fetch(1), await cb.fetch(1)
            async with ca.transaction() as tx:
                tx.ack(ma)
                tx.ack(mb)
            assert tx.result is not None and tx.result.acked == 2
            assert (await ca.fetch(1), await cb.fetch(1)) == ([], [])
        # A request that names its consumer still settles only that consumer's leases, and
        # the refusal says whose the lease is.
        await c.station(a.name).produce_many([{"a": 2}])
    async with httpx.AsyncClient(base_url=shared.url) as http:
        r = await http.post(
            f"/api/stations/{a.name}/groups/ga/fetch",
            json={"max": 1, "waitMs": 0, "consumer": "worker-a"},
        )
        (m,) = r.json()["messages"]
        body = {"consumer": "someone-else", "ack": [lease(a.name, "ga", m)]}
        answer = await http.post("/api/transactions", json=body)
        assert answer.status_code == 409, answer.text
        assert "held by consumer worker-a, not by someone-else" in answer.text


def test_sync_transaction(shared: Server) -> None:
    from stations.client.sync import SyncClient

    with SyncClient(shared.url) as c:
        name = f"sync-{time.time_ns()}"
        c.create_station(name)
        c.create_station(name + "-out")
        c.station(name).produce_many([{"n": 1}, {"n": 2}])
        with c.station(name).consumer("g", consumer="s", wait_ms=0) as consumer:
            msgs = consumer.fetch()
            with consumer.transaction() as tx:
                for msg in msgs:
                    tx.produce(name + "-out", {"copied": msg.data["n"]})
                    tx.ack(msg)
            assert tx.result.acked == 2
        page = c.station(name + "-out").browse()
        assert [m.data for m in page.messages] == [{"copied": 1}, {"copied": 2}]


def test_a_seek_never_lets_a_revoked_lease_settle_a_new_delivery(db_url: str) -> None:
    """A transaction tells a lease from another delivery of the same message by its
    deadline. A seek revokes every lease; when a fetch, a seek and a fetch share one writer
    transaction (one clock reading), the new delivery of a message has delivery count 1 as the
    revoked one had: the deadlines must still differ, or the revoked lease's transaction acks
    the new delivery, which then is never processed."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            await svc.produce("s", {"messages": [{"data": k} for k in range(2)]})
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 60_000, "maxMsgDeliveries": 5})

            def fetch_seek_fetch(batch: Batch) -> tuple[groups.Fetched, groups.Fetched]:
                first = groups.fetch(batch, "s", "g", 1, "c1")
                groups.seek(batch, "s", "g", ("earliest", None))
                return first, groups.fetch(batch, "s", "g", 1, "c1")

            first, second = await svc.write(fetch_seek_fetch)
            (old,), (new,) = first.messages, second.messages
            assert (old.seq, old.delivery_count) == (new.seq, new.delivery_count) == (1, 1)
            assert new.ack_deadline != old.ack_deadline
            settle = transactions.Settle("ack", "ack.0", "s", "g", 1, 1, old.ack_deadline)
            try:
                await svc.transact(transactions.TxRequest("c1", [settle]))
            except Exception as exc:  # the revoked lease is stale: 409
                assert "another delivery" in str(exc) or "not held" in str(exc), exc
            else:
                raise AssertionError("a revoked lease's transaction acked the new delivery")
            fresh = transactions.Settle("ack", "ack.0", "s", "g", 1, 1, new.ack_deadline)
            assert (await svc.transact(transactions.TxRequest("c1", [fresh]))).acked == 1
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_dls_replay_never_lets_a_dead_lettered_lease_settle_the_new_delivery(
    db_url: str,
) -> None:
    """As a seek: a replayed message is delivered again from count 1, so within one clock
    reading its new lease had the dead-lettered one's deadline, and a transaction naming that
    lease acked the replayed delivery before anyone processed it."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            await svc.produce("s", {"messages": [{"data": 1}]})
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 60_000, "maxMsgDeliveries": 5})

            def round_trip(batch: Batch) -> tuple[groups.Fetched, groups.Fetched]:
                first = groups.fetch(batch, "s", "g", 1, "c1")
                groups.dead_letter(batch, "s", "g", [1], "bad")
                assert dls.replay(batch, "s", {"all": True}) == 1
                return first, groups.fetch(batch, "s", "g", 1, "c1")

            first, second = await svc.write(round_trip)
            (old,), (new,) = first.messages, second.messages
            assert (old.seq, old.delivery_count) == (new.seq, new.delivery_count) == (1, 1)
            assert new.ack_deadline != old.ack_deadline
            stale = transactions.Settle("ack", "ack.0", "s", "g", 1, 1, old.ack_deadline)
            try:
                await svc.transact(transactions.TxRequest("c1", [stale]))
            except Exception as exc:  # the dead-lettered lease is stale: 409
                assert "another delivery" in str(exc), exc
            else:
                raise AssertionError("a dead-lettered lease's transaction acked the replay")
        finally:
            await svc.close()

    asyncio.run(run())
