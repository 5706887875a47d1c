"""Extending leases (``POST .../groups/{group}/extend``, an extension of the contract in
api/openapi.yaml): a consumer still working on a message keeps it past ``maxAckTimeMs``, on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.groupkit import (
    EXPIRY_SLACK_S,
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    eventually,
    field_of,
    ms,
    shared_fixture,  # noqa: F401 - the fixture shared
)

_LEASE = {
    "offset": "0000000000000000_0000000000000000",
    "deliveryCount": 1,
    "ackDeadline": "2026-11-28T04:00:00.000Z",
}


def _named(m: dict[str, Any]) -> dict[str, Any]:
    """A delivery as the fetch answered it, naming its lease."""
    return {k: m[k] for k in ("offset", "deliveryCount", "ackDeadline")}


async def _extend(
    api: Api, station: str, group: str, offsets: list[str] | None, **extra: Any
) -> Any:
    body = extra if offsets is None else {"offsets": offsets, **extra}
    r = await api.c.post(api.path(station, "groups", group, "extend"), json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_an_extended_lease_is_not_delivered_again_until_its_new_deadline(api: Api) -> None:
    """A lease of 1.5 s extended to 6 s: the message is not redelivered when the first
    deadline passes, then is, with its delivery count unchanged by the extension. The other
    messages of the same fetch (one lease range) expire on time."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 5})
    offs = await api.produce(st, [{"i": i} for i in range(3)])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=3, consumer="w1")
    assert [m["offset"] for m in got] == offs
    before = time.time()
    answer = await _extend(api, st, "g", [offs[1]], leaseMs=6000, consumer="w1")
    assert (answer["extended"], answer["unknown"]) == (1, [])
    deadline = ms(answer["leaseUntil"])
    assert before + 6 - 0.05 <= deadline <= time.time() + 6 + 0.05

    # The other two expire at their own deadline and come again; the extended one does not.
    again = await api.fetch(st, "g", max=3, wait_ms=5000, consumer="w2")
    assert sorted((m["offset"], m["deliveryCount"]) for m in again) == [
        (offs[0], 2),
        (offs[2], 2),
    ]
    assert time.time() < deadline
    await api.ack(st, "g", [offs[0], offs[2]])
    assert (await api.groups(st))["g"]["inFlight"] == 1

    # Past the new deadline it is delivered again: its second delivery.
    late = await api.fetch(st, "g", max=3, wait_ms=10_000, consumer="w3")
    assert [(m["offset"], m["deliveryCount"]) for m in late] == [(offs[1], 2)]
    assert deadline - 0.05 <= time.time() < deadline + EXPIRY_SLACK_S


async def test_extend_then_ack_and_a_lease_extended_twice(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2500, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    assert len(await api.fetch(st, "g")) == 1
    for _ in range(3):  # kept for 3 × 1 s, past its first 2.5 s deadline
        assert (await _extend(api, st, "g", [off]))["extended"] == 1
        await asyncio.sleep(1.0)
    assert await api.fetch(st, "g") == []
    assert await api.ack(st, "g", [off]) == {"acked": 1, "unknown": []}
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"]) == (0, 0)
    assert await api.fetch(st, "g", wait_ms=1000) == []  # never delivered again


async def test_what_extend_does_not_take(api: Api) -> None:
    """Unknown: an expired lease (its message may be another consumer's by now), another
    consumer's lease when ``consumer`` is given, a settled message, an undelivered one."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
    offs = await api.produce(st, [1, 2, 3, 4])
    await api.put_group(st, "g")
    [first] = await api.fetch(st, "g", max=1, consumer="w1")  # offs[0]: left to expire
    await _past(first)
    got = await api.fetch(st, "g", max=2, consumer="w2")  # offs[0] again, offs[1]
    assert sorted(m["offset"] for m in got) == offs[:2]
    await api.ack(st, "g", [offs[1]])
    answer = await _extend(api, st, "g", offs, consumer="w1")
    assert (answer["extended"], answer["unknown"]) == (0, offs)  # not w1's, settled, not out
    answer = await _extend(api, st, "g", offs, consumer="w2")
    assert (answer["extended"], answer["unknown"]) == (1, offs[1:])

    [third] = await api.fetch(st, "g", max=1, consumer="w3")  # offs[2], left to expire
    assert third["offset"] == offs[2]
    await _past(third)
    answer = await _extend(api, st, "g", [offs[2]])
    assert (answer["extended"], answer["unknown"]) == (0, [offs[2]])


async def _past(delivered: dict[str, Any]) -> None:
    """Wait until the lease of ``delivered`` has passed its deadline (server and tests share
    this machine's clock)."""
    await asyncio.sleep(max(0.0, ms(delivered["ackDeadline"]) - time.time()) + 0.05)


async def test_an_extended_lease_keeps_its_name_in_a_transaction(api: Api) -> None:
    """A transaction names a lease by the ``ackDeadline`` its fetch answered, and an extension
    does not change that (a transaction built before a heartbeat extension was refused); the
    extension's own deadline names nothing."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 5000, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    [m] = await api.fetch(st, "g", consumer="w1")
    await asyncio.sleep(0.01)
    answer = await _extend(api, st, "g", [off], consumer="w1")
    assert answer["leaseUntil"] != m["ackDeadline"]

    def tx(deadline: str) -> dict[str, Any]:
        lease = {"station": st, "group": "g", "offset": off, "deliveryCount": 1}
        return {"consumer": "w1", "ack": [lease | {"ackDeadline": deadline}]}

    wrong = await api.c.post("/api/transactions", json=tx(answer["leaseUntil"]))
    assert wrong.status_code == 409, wrong.text
    right = await api.c.post("/api/transactions", json=tx(m["ackDeadline"]))
    assert right.status_code == 200, right.text
    assert right.json()["acked"] == 1


async def test_a_named_lease_extends_that_delivery_only(api: Api) -> None:
    """``leases`` name deliveries as the fetch answered them: a worker whose lease expired
    (delivery 1) does not extend the message's next delivery, even under the same consumer
    name; the live one does."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    [first] = await api.fetch(st, "g", consumer="w")
    await _past(first)
    [second] = await api.fetch(st, "g", consumer="w")
    assert second["deliveryCount"] == 2

    stale = await _extend(api, st, "g", None, leases=[_named(first)], consumer="w")
    assert stale == {"extended": 0, "leaseUntil": None, "unknown": [off]}
    # The same count with another deadline (a seek or replay's delivery) is not it either.
    other = _named(second) | {"ackDeadline": first["ackDeadline"]}
    assert (await _extend(api, st, "g", None, leases=[other]))["extended"] == 0
    live = await _extend(api, st, "g", None, leases=[_named(second)], leaseMs=10_000)
    assert (live["extended"], live["unknown"]) == (1, [])
    assert ms(live["leaseUntil"]) > ms(second["ackDeadline"]) + 5


async def test_a_seek_after_a_long_extension_keeps_new_leases_short(api: Api) -> None:
    """A seek keeps new leases above the deadlines of the leases it revoked (their names); an
    extension's later deadline is no name, and must not make every later lease as long."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
    offs = await api.produce(st, [1, 2])
    await api.put_group(st, "g")
    await api.fetch(st, "g", max=2, consumer="w")
    assert (await _extend(api, st, "g", offs, leaseMs=3_600_000))["extended"] == 2
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"to": "earliest"})
    assert r.status_code == 200, r.text
    again = await api.fetch(st, "g", max=2, consumer="w")
    assert [m["offset"] for m in again] == offs
    assert ms(again[0]["ackDeadline"]) < time.time() + 5


async def test_extend_leaves_messages_retention_dropped(api: Api) -> None:
    """A leased message retention dropped is unknown to an extension, and its lease is not
    kept: it settles at its own deadline (it stayed in flight for the extension's hours)."""
    st = await api.station(
        consumerDefaults={"maxAckTimeMs": 400, "maxMsgDeliveries": 5},
        retention={"maxMessages": 1},
    )
    await api.put_group(st, "g")
    [old] = await api.produce(st, ["old"])
    [m] = await api.fetch(st, "g", consumer="w")
    await api.produce(st, ["new"])  # retention drops the leased one

    async def dropped() -> bool:
        return [m["data"] for m in await api.browse(st)] == ["new"]

    await eventually(dropped)
    answer = await _extend(api, st, "g", [old], leaseMs=3_600_000)
    assert answer == {"extended": 0, "leaseUntil": None, "unknown": [old]}
    await _past(m)
    await asyncio.sleep(EXPIRY_SLACK_S)
    assert (await api.groups(st))["g"]["inFlight"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"offsets": []}, "offsets"),
        ({"offsets": ["nope"]}, "offsets.0"),
        ({"offsets": ["0000000000000000_0000000000000000"], "leaseMs": 50}, "leaseMs"),
        ({"offsets": ["0000000000000000_0000000000000000"], "leaseMs": "1000"}, "leaseMs"),
        ({"offsets": ["0000000000000000_0000000000000000"], "leaseMs": 43_200_001}, "leaseMs"),
        ({"offsets": ["0000000000000000_0000000000000000"], "consumer": ""}, "consumer"),
        ({"offsets": ["0000000000000000_0000000000000000"], "consumer": 7}, "consumer"),
        ({"offsets": ["0000000000000000_0000000000000000"], "delayMs": 1}, "delayMs"),
        ({"offsets": ["0000000000000000_0000000000000000"], "consumer": None}, "consumer"),
        ({}, "offsets"),
        ({"offsets": ["0000000000000000_0000000000000000"], "leases": []}, "offsets"),
        ({"leases": []}, "leases"),
        ({"leases": [7]}, "leases.0"),
        ({"leases": [{"offset": "0000000000000000_0000000000000000"}]}, "leases.0.ackDeadline"),
        ({"leases": [dict(_LEASE, offset="x")]}, "leases.0.offset"),
        ({"leases": [dict(_LEASE, deliveryCount=0)]}, "leases.0.deliveryCount"),
        ({"leases": [dict(_LEASE, deliveryCount=True)]}, "leases.0.deliveryCount"),
        ({"leases": [dict(_LEASE, ackDeadline="soon")]}, "leases.0.ackDeadline"),
        ({"leases": [dict(_LEASE, ackDeadline="2026-11-28T04:00:00")]}, "leases.0.ackDeadline"),
        ({"leases": [dict(_LEASE, extra=1)]}, "leases.0.extra"),
    ],
)
async def test_bad_extend_bodies_name_their_field(api: Api, body: Any, field: str) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    r = await api.c.post(api.path(st, "groups", "g", "extend"), json=body)
    assert r.status_code == 400, r.text
    assert field_of(r) == field


@pytest.mark.parametrize(
    "bad",
    [
        {"offset": "x"},
        {"deliveryCount": 0},
        {"deliveryCount": 1_000_001},
        {"deliveryCount": True},
        {"ackDeadline": "soon"},
        {"ackDeadline": "2026-11-28T04:00:00"},
    ],
)
async def test_a_lease_is_checked_alike_by_extend_and_by_a_transaction(
    api: Api, bad: dict[str, Any]
) -> None:
    """A lease as a fetch answered it is one thing with one check: the same bad field gets the
    same answer from an extend and from a transaction's ack (extend had checks of its own)."""
    st = await api.station()
    await api.put_group(st, "g")
    lease = dict(_LEASE, **bad)
    r = await api.c.post(api.path(st, "groups", "g", "extend"), json={"leases": [lease]})
    tx = await api.c.post("/api/transactions", json={"ack": [dict(lease, station=st, group="g")]})
    assert (r.status_code, tx.status_code) == (400, 400), (r.text, tx.text)
    [key] = bad
    assert (field_of(r), field_of(tx)) == (f"leases.0.{key}", f"ack.0.{key}")
    said = r.json()["error"]["message"].replace("leases.0", "ack.0")
    assert said == tx.json()["error"]["message"]


async def test_extend_on_a_group_that_does_not_exist_is_404(api: Api) -> None:
    st = await api.station()
    r = await api.c.post(
        api.path(st, "groups", "nope", "extend"),
        json={"offsets": ["0000000000000000_0000000000000000"]},
    )
    assert r.status_code == 404, r.text
    assert field_of(r) == "group"


async def test_a_replayed_message_never_takes_the_name_of_the_lease_it_replaced(api: Api) -> None:
    """A DLS replay lifts the group's lease floor above every lease name handed out: after a
    lowered maxAckTimeMs and a seek, fetches named leases floor + 1, the replay's fence kept
    the floor below that, and the replayed message's next delivery took the very name (count
    1, same ackDeadline) of the dead-lettered lease, whose late transaction then acked it and
    committed its output (found by a review)."""
    st = await api.station()
    out = await api.station()
    [off] = await api.produce(st, ["job"])
    await api.put_group(st, "g", maxAckTimeMs=60_000, maxMsgDeliveries=5)
    await api.fetch(st, "g", consumer="w0")
    await api.put_group(st, "g", status=200, maxAckTimeMs=1000)
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"to": "earliest"})
    assert r.status_code == 200, r.text
    [m1] = await api.fetch(st, "g", consumer="w1")
    assert (await api.dead_letter(st, "g", [off]))["deadLettered"] == 1
    assert await api.replay(st, {"all": True}) == 1
    [m2] = await api.fetch(st, "g", consumer="w2")
    assert m2["deliveryCount"] == 1
    assert m2["ackDeadline"] != m1["ackDeadline"]

    def tx(m: dict[str, Any], who: str) -> dict[str, Any]:
        lease = _named(m)
        return {
            "ack": [{"station": st, "group": "g", **lease}],
            "produce": [{"station": out, "data": {"from": who}}],
        }

    stale = await api.c.post("/api/transactions", json=tx(m1, "w1"))
    assert stale.status_code == 409, stale.text
    live = await api.c.post("/api/transactions", json=tx(m2, "w2"))
    assert live.status_code == 200, live.text
    assert [m["data"] for m in await api.browse(out)] == [{"from": "w2"}]


async def test_an_extend_naming_two_deliveries_of_a_message_extends_the_held_one(
    api: Api,
) -> None:
    """A stale delivery named beside the live one (one request for a consumer's messages):
    the live lease is extended (the last one named won, and the live lease expired)."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    [first] = await api.fetch(st, "g", consumer="w")
    await _past(first)
    [second] = await api.fetch(st, "g", consumer="w")

    answer = await _extend(api, st, "g", None, leases=[_named(second), _named(first)])
    assert (answer["extended"], answer["unknown"]) == (1, [])


async def test_page_parameters_with_a_nul_are_refused(api: Api) -> None:
    """A NUL in after, prefix or contains is a 400 naming it (PostgreSQL answered 500)."""
    for key in ("after", "prefix", "contains"):
        r = await api.c.get("/api/stations", params={key: "a\x00b"})
        assert r.status_code == 400, r.text
        assert field_of(r) == key


@pytest.mark.parametrize("verb", ["nack", "dead-letter"])
async def test_a_nack_or_dead_letter_by_lease_leaves_a_later_delivery_alone(
    api: Api, verb: str
) -> None:
    """``leases`` instead of ``offsets`` (as extend takes them): a consumer giving back a
    delivery that expired and went to another consumer leaves that one alone (by offset it
    was taken away); its own held delivery is settled."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
    [off, off2] = await api.produce(st, ["x", "y"])
    await api.put_group(st, "g")
    [first] = await api.fetch(st, "g", max=1, consumer="a")
    await _past(first)
    [second, other] = await api.fetch(st, "g", max=2, consumer="b")
    assert (second["offset"], second["deliveryCount"], other["offset"]) == (off, 2, off2)

    path = api.path(st, "groups", "g", verb)
    stale = await api.c.post(path, json={"leases": [_named(first)]})
    assert stale.status_code == 200, stale.text
    settled = "nacked" if verb == "nack" else "deadLettered"
    assert (stale.json()[settled], stale.json()["unknown"]) == (0, [off])
    groups = await api.groups(st)
    assert (groups["g"]["inFlight"], groups["g"]["deadLettered"]) == (2, 0)

    live = await api.c.post(path, json={"leases": [_named(other), _named(first)]})
    assert live.status_code == 200, live.text
    assert (live.json()[settled], live.json()["unknown"]) == (1, [off])


@pytest.mark.parametrize("verb", ["nack", "dead-letter"])
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"offsets": ["0000000000000000_0000000000000000"], "leases": [_LEASE]}, "offsets"),
        ({"leases": []}, "leases"),
        ({"leases": [7]}, "leases.0"),
        ({"leases": [dict(_LEASE, deliveryCount=0)]}, "leases.0.deliveryCount"),
        ({"leases": [dict(_LEASE, ackDeadline="soon")]}, "leases.0.ackDeadline"),
    ],
)
async def test_bad_settle_leases_name_their_field(
    api: Api, verb: str, body: Any, field: str
) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    r = await api.c.post(api.path(st, "groups", "g", verb), json=body)
    assert r.status_code == 400, r.text
    assert field_of(r) == field
