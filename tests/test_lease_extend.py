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
    field_of,
    ms,
    shared_fixture,  # noqa: F401 - the fixture shared
)


async def _extend(api: Api, station: str, group: str, offsets: list[str], **extra: Any) -> Any:
    r = await api.c.post(
        api.path(station, "groups", group, "extend"), json={"offsets": offsets, **extra}
    )
    assert r.status_code == 200, r.text
    return r.json()


async def test_an_extended_lease_is_not_delivered_again_until_its_new_deadline(api: Api) -> None:
    """A lease of 400 ms extended to 2.5 s: the message is not redelivered when the first
    deadline passes, then is, with its delivery count unchanged by the extension. The other
    messages of the same fetch (one lease range) expire on time."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 400, "maxMsgDeliveries": 5})
    offs = await api.produce(st, [{"i": i} for i in range(3)])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=3, consumer="w1")
    assert [m["offset"] for m in got] == offs
    before = time.time()
    answer = await _extend(api, st, "g", [offs[1]], leaseMs=2500, consumer="w1")
    assert (answer["extended"], answer["unknown"]) == (1, [])
    deadline = ms(answer["ackDeadline"])
    assert before + 2.5 - 0.05 <= deadline <= time.time() + 2.5 + 0.05

    # The other two expire at their own deadline and come again; the extended one does not.
    again = await api.fetch(st, "g", max=3, wait_ms=2000, consumer="w2")
    assert sorted((m["offset"], m["deliveryCount"]) for m in again) == [
        (offs[0], 2),
        (offs[2], 2),
    ]
    assert time.time() < deadline
    await api.ack(st, "g", [offs[0], offs[2]])
    assert (await api.groups(st))["g"]["inFlight"] == 1

    # Past the new deadline it is delivered again: its second delivery.
    late = await api.fetch(st, "g", max=3, wait_ms=5000, consumer="w3")
    assert [(m["offset"], m["deliveryCount"]) for m in late] == [(offs[1], 2)]
    assert deadline - 0.05 <= time.time() < deadline + EXPIRY_SLACK_S


async def test_extend_then_ack_and_a_lease_extended_twice(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 600, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    assert len(await api.fetch(st, "g")) == 1
    for _ in range(3):  # kept for 3 × 0.3 s past its first 0.6 s deadline
        assert (await _extend(api, st, "g", [off]))["extended"] == 1
        await asyncio.sleep(0.3)
    assert await api.fetch(st, "g") == []
    assert await api.ack(st, "g", [off]) == {"acked": 1, "unknown": []}
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"]) == (0, 0)
    assert await api.fetch(st, "g", wait_ms=1000) == []  # never delivered again


async def test_what_extend_does_not_take(api: Api) -> None:
    """Unknown: an expired lease (its message may be another consumer's by now), another
    consumer's lease when ``consumer`` is given, a settled message, an undelivered one."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 300, "maxMsgDeliveries": 5})
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


async def test_extended_lease_settles_in_a_transaction_by_its_new_deadline(api: Api) -> None:
    """A transaction names a lease by its ``ackDeadline``: after an extension that is the one
    the extension answered (the fetch's is refused, 409)."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 5000, "maxMsgDeliveries": 5})
    [off] = await api.produce(st, ["x"])
    await api.put_group(st, "g")
    [m] = await api.fetch(st, "g", consumer="w1")
    await asyncio.sleep(0.01)
    answer = await _extend(api, st, "g", [off], consumer="w1")
    assert answer["ackDeadline"] != m["ackDeadline"]

    def tx(deadline: str) -> dict[str, Any]:
        return {
            "consumer": "w1",
            "ack": [
                {
                    "station": st,
                    "group": "g",
                    "offset": off,
                    "deliveryCount": 1,
                    "ackDeadline": deadline,
                }
            ],
        }

    stale = await api.c.post("/api/transactions", json=tx(m["ackDeadline"]))
    assert stale.status_code == 409, stale.text
    fresh = await api.c.post("/api/transactions", json=tx(answer["ackDeadline"]))
    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["acked"] == 1


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
    ],
)
async def test_bad_extend_bodies_name_their_field(api: Api, body: Any, field: str) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    r = await api.c.post(api.path(st, "groups", "g", "extend"), json=body)
    assert r.status_code == 400, r.text
    assert field_of(r) == field


async def test_extend_on_a_group_that_does_not_exist_is_404(api: Api) -> None:
    st = await api.station()
    r = await api.c.post(
        api.path(st, "groups", "nope", "extend"),
        json={"offsets": ["0000000000000000_0000000000000000"]},
    )
    assert r.status_code == 404, r.text
    assert field_of(r) == "group"
