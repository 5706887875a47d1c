"""Consumer groups over HTTP (CONTRACT.md §4 "Consumer groups"), on SQLite and PostgreSQL.

Leases are 200 to 500 ms so lease expiry is seen quickly; the hard bound on expiry is
``EXPIRY_SLACK_S`` after the deadline (the machine is shared), the contract's 100 ms only a
warning.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from typing import Any

import pytest

from tests.groupkit import (
    EXPIRY_SLACK_S,
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    client,
    eventually,
    field_of,
    ms,
    shared_fixture,  # noqa: F401 - the fixture shared
    uniq,
)
from tests.harness import Server


def soft_on_time(late_s: float, what: str) -> None:
    if late_s > 0.1:
        warnings.warn(
            f"{what} {late_s * 1000:.0f} ms after its deadline (contract: 100 ms)", stacklevel=2
        )


def pairs(msgs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(m["offset"], m["deliveryCount"]) for m in msgs]


# -- fetch, ack, stats -------------------------------------------------------------------------


async def test_fetch_fields_ack_and_stats(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 30_000, "maxMsgDeliveries": 4})
    offs = await api.produce(st, [{"i": i} for i in range(5)], ids=[f"m{i}" for i in range(5)])
    view = await api.put_group(st, "g")
    assert view["name"] == "g"
    assert (view["maxAckTimeMs"], view["maxMsgDeliveries"]) == (30_000, 4)  # station defaults
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (5, 0, 0, 5)

    before = time.time()
    got = await api.fetch(st, "g", max=2, consumer="w1")
    after = time.time()
    assert [m["offset"] for m in got] == offs[:2]
    assert [m["id"] for m in got] == ["m0", "m1"]
    assert [m["data"] for m in got] == [{"i": 0}, {"i": 1}]
    assert [m["headers"] for m in got] == [{"n": "0"}, {"n": "1"}]
    assert [m["deliveryCount"] for m in got] == [1, 1]
    for m in got:
        deadline = ms(m["ackDeadline"])
        assert before + 30 - 0.05 <= deadline <= after + 30 + 0.05
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (3, 2, 0, 3)

    # Leased to w1: another consumer of the group gets the next ones, not these.
    other = await api.fetch(st, "g", max=1, consumer="w2")
    assert pairs(other) == [(offs[2], 1)]

    assert await api.ack(st, "g", [offs[0]]) == {"acked": 1, "unknown": []}
    # Acked twice, never delivered, beyond the tail: all unknown.
    beyond = "0000000000000099_0000000000000000"
    result = await api.ack(st, "g", [offs[0], offs[4], beyond, offs[2]])
    assert result == {"acked": 1, "unknown": [offs[0], offs[4], beyond]}

    assert await api.nack(st, "g", [offs[1]], delay_ms=60_000) == {"nacked": 1, "unknown": []}
    g = (await api.groups(st))["g"]
    # lag: 3 and 4 not yet taken; offs[1] waits out its delay.
    assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (3, 0, 0, 2)
    rest = await api.fetch(st, "g", max=10)
    assert pairs(rest) == [(offs[3], 1), (offs[4], 1)]  # the nacked one is not due yet
    assert await api.dead_letter(st, "g", [offs[3]], reason="bad") == {
        "deadLettered": 1,
        "unknown": [],
    }
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (1, 1, 1, 0)
    stats = (await api.view(st))["stats"]
    assert (stats["groups"], stats["deadLettered"]) == (1, 1)
    await api.put_group(st, "h")
    stats = (await api.view(st))["stats"]
    assert (stats["groups"], stats["deadLettered"]) == (2, 1)


async def test_fetch_respects_max_and_order(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, list(range(25)))
    await api.put_group(st, "g")
    seen: list[str] = []
    for _ in range(3):
        seen += [m["offset"] for m in await api.fetch(st, "g", max=10)]
    assert seen == offs
    assert await api.fetch(st, "g", max=10) == []


async def test_fetches_across_a_stored_row_larger_than_an_answer_lose_nothing(api: Api) -> None:
    """A Durable Streams append is stored as one row: here 9,000 messages, 9 MB, more than one
    fetch answers (8 MiB). A fetch whose window runs past that row's end used to lease and
    pass the messages after it that its read had not reached (it stopped at the row's size
    while the fetch counted the messages' own), then forget them as if retention had dropped
    them: 100 messages of each such window were never delivered."""
    st = await api.station()
    big = json.dumps(["x" * 1000 for _ in range(9000)]).encode()
    for body in (big, json.dumps(list(range(1000))).encode()):
        r = await api.c.post(
            f"/v1/stream/{st}",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert r.status_code in (200, 204), r.text
    await api.put_group(st, "g")
    delivered: list[str] = []
    for _ in range(40):
        got = await api.fetch(st, "g", max=700)
        if not got:
            break
        assert all(m["deliveryCount"] == 1 for m in got)
        delivered += [m["offset"] for m in got]
        assert (await api.ack(st, "g", [m["offset"] for m in got]))["acked"] == len(got)
    assert len(delivered) == len(set(delivered)) == 10_000
    assert delivered == sorted(delivered)
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["lag"]) == (0, 0, 0)


async def test_a_lower_max_deliveries_sends_whats_waiting_past_it_to_the_dls(api: Api) -> None:
    """A message nacked three times waits for its fourth delivery; the group's limit then goes
    down to two. Its last delivery is behind it: it goes to the DLS, and is not delivered a
    fourth time (it was, with deliveryCount 4 under a limit of 2)."""
    st = await api.station()
    await api.put_group(st, "g", maxMsgDeliveries=5, maxAckTimeMs=60_000)
    [off, other] = await api.produce(st, ["x", "y"])
    for n in (1, 2, 3):
        got = await api.fetch(st, "g", max=1)
        assert pairs(got) == [(off, n)]
        assert (await api.nack(st, "g", [off]))["nacked"] == 1
    assert pairs(await api.fetch(st, "g", max=1)) == [(off, 4)]
    await api.nack(st, "g", [off])  # waits for its fifth, which the limit still allows
    assert pairs(await api.fetch(st, "g", max=1)) == [(off, 5)]
    await api.put_group(st, "g", status=200, maxMsgDeliveries=7)  # raised: nothing moves
    await api.nack(st, "g", [off])
    await api.put_group(st, "g", status=200, maxMsgDeliveries=2)
    assert pairs(await api.fetch(st, "g", max=5)) == [(other, 1)]
    [entry] = await api.dls_entries(st, "g")
    assert (entry["offset"], entry["deliveryCount"], entry["reason"]) == (off, 5, "max_deliveries")
    assert entry["error"] == "maxMsgDeliveries lowered to 2"
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["deadLettered"]) == (0, 1)


async def test_deleting_a_group_answers_its_waiting_fetch_at_once(api: Api) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    path = api.path(st, "groups", "g", "fetch")
    waiting = asyncio.ensure_future(api.c.post(path, json={"waitMs": 20_000}, timeout=30))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    began = time.monotonic()
    r = await api.c.delete(api.path(st, "groups", "g"))
    assert r.status_code == 204, r.text
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.status_code == 404, answer.text  # it waited out its 20 s, then said 200 []
    assert time.monotonic() - began < 5


async def test_put_group_twice_and_change_limits(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 400, "maxMsgDeliveries": 7})
    first = await api.put_group(st, "g", status=201, maxMsgDeliveries=5)
    assert (first["maxAckTimeMs"], first["maxMsgDeliveries"]) == (400, 5)
    again = await api.put_group(st, "g", status=200, maxMsgDeliveries=5)
    assert (again["maxAckTimeMs"], again["maxMsgDeliveries"]) == (400, 5)
    assert (await api.put_group(st, "g", status=200))["maxMsgDeliveries"] == 5  # no change

    [off] = await api.produce(st, ["x"])
    got = await api.fetch(st, "g")
    assert pairs(got) == [(off, 1)]

    changed = await api.put_group(st, "g", status=200, maxAckTimeMs=20_000, maxMsgDeliveries=2)
    assert (changed["maxAckTimeMs"], changed["maxMsgDeliveries"]) == (20_000, 2)
    listed = (await api.groups(st))["g"]
    assert (listed["maxAckTimeMs"], listed["maxMsgDeliveries"]) == (20_000, 2)

    # The new limits apply to the standing group: the next lease is 20 s long ...
    assert await api.nack(st, "g", [off]) == {"nacked": 1, "unknown": []}
    t0 = time.time()
    got = await api.fetch(st, "g")
    assert pairs(got) == [(off, 2)]
    assert ms(got[0]["ackDeadline"]) - t0 > 15
    # ... and the second delivery is now the last: a nack sends it to the DLS.
    assert await api.nack(st, "g", [off]) == {"nacked": 1, "unknown": []}
    [entry] = await api.dls_entries(st, "g")
    assert (entry["offset"], entry["deliveryCount"], entry["reason"]) == (off, 2, "max_deliveries")
    assert await api.fetch(st, "g") == []


async def test_start_from(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, ["a", "b", "c"])
    await api.put_group(st, "early", startFrom="earliest")
    await api.put_group(st, "dflt")
    await api.put_group(st, "late", startFrom="latest")
    await api.put_group(st, "mid", startFrom=offs[1])
    await api.put_group(st, "dash", startFrom="-1")
    tail = (await api.view(st))["stats"]["tailOffset"]
    await api.put_group(st, "tail", startFrom=tail)
    lag = {name: g["lag"] for name, g in (await api.groups(st)).items()}
    assert lag == {"early": 3, "dflt": 3, "late": 0, "mid": 2, "tail": 0, "dash": 3}
    assert await api.fetch(st, "late") == []
    assert await api.fetch(st, "tail") == []

    await api.produce(st, ["d"])
    data = {}
    for name in ("early", "dflt", "late", "mid", "tail", "dash"):
        data[name] = [m["data"] for m in await api.fetch(st, name)]
    assert data == {
        "early": ["a", "b", "c", "d"],
        "dflt": ["a", "b", "c", "d"],
        "late": ["d"],
        "mid": ["b", "c", "d"],
        "tail": ["d"],
        "dash": ["a", "b", "c", "d"],
    }
    # startFrom only applies when the group is created.
    await api.put_group(st, "late", status=200, startFrom="earliest")
    assert await api.fetch(st, "late") == []


async def test_delete_group(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, ["a", "b"])
    await api.put_group(st, "g")
    await api.put_group(st, "keep")
    await api.fetch(st, "g", max=2)
    await api.dead_letter(st, "g", [offs[0]], reason="x")
    await api.fetch(st, "keep", max=1)
    await api.dead_letter(st, "keep", [offs[0]], reason="y")

    r = await api.c.delete(api.path(st, "groups", "g"))
    assert r.status_code == 204
    assert set(await api.groups(st)) == {"keep"}
    assert [e["group"] for e in await api.dls_entries(st)] == ["keep"]
    assert (await api.view(st))["stats"]["groups"] == 1
    assert (await api.view(st))["stats"]["deadLettered"] == 1
    for verb in ("fetch", "ack"):
        body = {} if verb == "fetch" else {"offsets": offs}
        r = await api.c.post(api.path(st, "groups", "g", verb), json=body)
        assert r.status_code == 404, r.text
    r = await api.c.delete(api.path(st, "groups", "g"))
    assert r.status_code == 404
    # A group of the same name starts afresh.
    await api.put_group(st, "g", status=201)
    assert pairs(await api.fetch(st, "g", max=5)) == [(offs[0], 1), (offs[1], 1)]


async def test_delete_station_removes_groups_and_dls(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, ["a"])
    await api.put_group(st, "g")
    await api.fetch(st, "g")
    await api.dead_letter(st, "g", offs, reason="x")
    assert (await api.view(st))["stats"]["deadLettered"] == 1
    r = await api.c.delete(api.path(st))
    assert r.status_code == 204
    for path in (api.path(st, "groups"), api.path(st, "dls")):
        r = await api.c.get(path)
        assert r.status_code == 404, r.text
    r = await api.c.post(api.path(st, "groups", "g", "fetch"), json={})
    assert r.status_code == 404

    await api.station(st)  # same name, new station: nothing of the old one is left
    assert await api.groups(st) == {}
    assert await api.dls_entries(st) == []
    stats = (await api.view(st))["stats"]
    assert (stats["groups"], stats["deadLettered"]) == (0, 0)
    await api.put_group(st, "g", status=201)
    assert await api.fetch(st, "g") == []


# -- lease expiry, nack, dead-letter: the poison path --------------------------------------------


async def test_poison_path_to_dls(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 3})
    [off] = await api.produce(st, [{"k": "poison"}], ids=["p-1"])
    await api.put_group(st, "g")
    first = await api.fetch(st, "g", consumer="c1")
    assert pairs(first) == [(off, 1)]
    assert await api.fetch(st, "g", consumer="c2") == []  # leased to c1 only
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"]) == (0, 1)
    deadline = ms(first[0]["ackDeadline"])
    for n in (2, 3):
        # A waiting fetch is woken by the lease expiry: no busy polling on the client side.
        got = await api.fetch(st, "g", wait_ms=5000, consumer=f"c{n}")
        at = time.time()
        assert pairs(got) == [(off, n)]
        assert deadline - 0.01 <= at < deadline + EXPIRY_SLACK_S, (at, deadline)
        soft_on_time(at - deadline, f"redelivery {n}")
        deadline = ms(got[0]["ackDeadline"])

    # The third lease expires: the message leaves the queue for the DLS.
    async def dead() -> list[dict[str, Any]]:
        return await api.dls_entries(st)

    [entry] = await eventually(dead, timeout=deadline - time.time() + EXPIRY_SLACK_S + 0.5)
    assert entry["group"] == "g"
    assert entry["offset"] == off
    assert entry["msgId"] == "p-1"
    assert entry["headers"] == {"n": "0"}
    assert entry["data"] == {"k": "poison"}
    assert entry["deliveryCount"] == 3
    assert entry["reason"] == "max_deliveries"
    assert isinstance(entry["id"], str)
    assert deadline - 0.01 <= ms(entry["deadLetteredAt"]) < deadline + EXPIRY_SLACK_S
    soft_on_time(ms(entry["deadLetteredAt"]) - deadline, "dead-lettering")

    assert await api.fetch(st, "g", wait_ms=600) == []  # not delivered a fourth time
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (0, 0, 1, 0)
    assert (await api.view(st))["stats"]["deadLettered"] == 1
    assert await api.ack(st, "g", [off]) == {"acked": 0, "unknown": [off]}


async def test_max_deliveries_one_expiry_goes_straight_to_dls(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 1})
    offs = await api.produce(st, ["a", "b"])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=1)
    assert pairs(got) == [(offs[0], 1)]
    # Meanwhile the next consumer call gets the new message, never the leased one.
    later = await api.fetch(st, "g", max=5, wait_ms=0)
    assert pairs(later) == [(offs[1], 1)]
    await api.ack(st, "g", [offs[1]])
    entries = await eventually(lambda: api.dls_entries(st), timeout=5)
    assert [(e["offset"], e["deliveryCount"]) for e in entries] == [(offs[0], 1)]
    assert await api.fetch(st, "g", wait_ms=500) == []


async def test_staggered_leases_all_expire_on_time(api: Api) -> None:
    """Leases falling due a few ms apart: each timer tick arms the next while it runs, and no
    expiry may be left to the periodic re-arm. (Leases of 1.5 s: under load the 30 first
    fetches may take longer than a shorter lease, and a late one would get a redelivery.)"""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 3})
    offs = await api.produce(st, list(range(30)))
    await api.put_group(st, "g")
    firsts = await asyncio.gather(
        *(api.fetch(st, "g", max=1, consumer=f"first-{i}") for i in range(len(offs)))
    )
    assert sorted(pairs([m for got in firsts for m in got])) == [(o, 1) for o in offs]
    deadlines = {got[0]["offset"]: ms(got[0]["ackDeadline"]) for got in firsts}
    late: dict[str, float] = {}
    stop = time.monotonic() + 10
    while len(late) < len(offs) and time.monotonic() < stop:
        got = await api.fetch(st, "g", max=30, wait_ms=2000, consumer="second")
        at = time.time()
        for m in got:
            assert m["deliveryCount"] == 2
            late[m["offset"]] = at - deadlines[m["offset"]]
        if got:
            await api.ack(st, "g", [m["offset"] for m in got])
    assert set(late) == set(offs)
    worst = max(late.values())
    assert min(late.values()) >= -0.01
    assert worst < EXPIRY_SLACK_S, f"a lease was redelivered {worst:.2f} s after its deadline"
    soft_on_time(worst, "worst redelivery")


async def test_redelivery_comes_before_new_messages(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 250, "maxMsgDeliveries": 5})
    offs = await api.produce(st, ["a", "b", "c", "d"])
    await api.put_group(st, "g")
    assert pairs(await api.fetch(st, "g", max=2)) == [(offs[0], 1), (offs[1], 1)]
    await api.nack(st, "g", [offs[0]])
    # offs[1]'s lease expires; then both come back before c and d.
    await asyncio.sleep(0.8)
    assert pairs(await api.fetch(st, "g", max=1)) == [(offs[0], 2)]
    await api.ack(st, "g", [offs[0]])
    assert pairs(await api.fetch(st, "g", max=2)) == [(offs[1], 2), (offs[2], 1)]
    await api.ack(st, "g", offs[1:3])
    assert pairs(await api.fetch(st, "g", max=5)) == [(offs[3], 1)]


async def test_nack_with_delay(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 3})
    [off] = await api.produce(st, ["n"])
    await api.put_group(st, "g")
    assert pairs(await api.fetch(st, "g")) == [(off, 1)]
    t_nack = time.time()
    assert await api.nack(st, "g", [off], delay_ms=2000) == {"nacked": 1, "unknown": []}
    assert await api.fetch(st, "g") == []  # still delayed
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"]) == (1, 0)
    got = await api.fetch(st, "g", wait_ms=5000)
    at = time.time()
    assert pairs(got) == [(off, 2)]
    assert t_nack + 2.0 - 0.05 <= at < t_nack + 2.0 + EXPIRY_SLACK_S
    soft_on_time(at - t_nack - 2.0, "nacked message redelivered")

    # No delay: back at once. It was the last delivery: the nack sends it to the DLS.
    assert await api.nack(st, "g", [off], delay_ms=0) == {"nacked": 1, "unknown": []}
    assert pairs(await api.fetch(st, "g")) == [(off, 3)]
    assert await api.nack(st, "g", [off], delay_ms=0) == {"nacked": 1, "unknown": []}
    [entry] = await api.dls_entries(st)
    assert (entry["offset"], entry["deliveryCount"], entry["reason"]) == (off, 3, "max_deliveries")
    assert await api.fetch(st, "g", wait_ms=300) == []
    assert await api.nack(st, "g", [off]) == {"nacked": 0, "unknown": [off]}


async def test_explicit_dead_letter(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 5})
    offs = await api.produce(st, [{"v": 1}, {"v": 2}], ids=["a", "b"])
    await api.put_group(st, "g")
    await api.fetch(st, "g", max=2)
    result = await api.dead_letter(st, "g", [offs[1]], reason="cannot parse total")
    assert result == {"deadLettered": 1, "unknown": []}
    [entry] = await api.dls_entries(st)
    assert entry["offset"] == offs[1]
    assert entry["msgId"] == "b"
    assert entry["data"] == {"v": 2}
    assert entry["deliveryCount"] == 1
    assert entry["reason"] == "dead_letter"
    assert entry["error"] == "cannot parse total"
    assert await api.dead_letter(st, "g", [offs[1]]) == {"deadLettered": 0, "unknown": [offs[1]]}
    assert await api.ack(st, "g", [offs[1]]) == {"acked": 0, "unknown": [offs[1]]}
    assert await api.ack(st, "g", [offs[0]]) == {"acked": 1, "unknown": []}
    assert await api.fetch(st, "g", wait_ms=300) == []
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"]) == (0, 0, 1)


async def test_two_groups_are_independent(api: Api) -> None:
    st = await api.station()
    [off] = await api.produce(st, ["shared"])
    await api.put_group(st, "strict", maxAckTimeMs=1500, maxMsgDeliveries=1)
    await api.put_group(st, "patient", maxAckTimeMs=2500, maxMsgDeliveries=3)

    assert pairs(await api.fetch(st, "strict")) == [(off, 1)]
    assert pairs(await api.fetch(st, "patient")) == [(off, 1)]
    # strict: its only lease expires → DLS. patient: redelivered twice, then acked.
    assert pairs(await api.fetch(st, "patient", wait_ms=5000)) == [(off, 2)]
    entries = await eventually(lambda: api.dls_entries(st), timeout=5)
    assert [(e["group"], e["deliveryCount"]) for e in entries] == [("strict", 1)]
    [last] = await api.fetch(st, "patient", wait_ms=5000)
    assert pairs([last]) == [(off, 3)]
    assert await api.ack(st, "patient", [off]) == {"acked": 1, "unknown": []}
    # Past patient's last deadline (expiring, the third lease would dead-letter): no change.
    await asyncio.sleep(max(0.0, ms(last["ackDeadline"]) - time.time()) + 0.5)

    assert await api.dls_entries(st, "patient") == []
    assert len(await api.dls_entries(st, "strict")) == 1
    gs = await api.groups(st)
    assert (gs["strict"]["deadLettered"], gs["patient"]["deadLettered"]) == (1, 0)
    assert (gs["strict"]["pending"], gs["patient"]["pending"]) == (0, 0)
    # An ack in one group settles nothing in another.
    [off2] = await api.produce(st, ["second"])
    await api.fetch(st, "strict")
    await api.fetch(st, "patient")
    assert (await api.ack(st, "strict", [off2]))["acked"] == 1
    g = (await api.groups(st))["patient"]
    assert g["inFlight"] == 1
    assert (await api.ack(st, "patient", [off2]))["acked"] == 1


async def test_ack_after_lease_expired_before_redelivery(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 200, "maxMsgDeliveries": 5})
    offs = await api.produce(st, ["slow", "slower"])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=2)
    deadline = ms(got[0]["ackDeadline"])

    async def put_back() -> bool:  # expired, not fetched again
        g = (await api.groups(st))["g"]
        return (g["pending"], g["inFlight"]) == (2, 0)  # the scheduler put them back

    await asyncio.sleep(max(0.0, deadline - time.time()))
    await eventually(put_back, timeout=EXPIRY_SLACK_S)
    assert await api.ack(st, "g", [offs[0]]) == {"acked": 1, "unknown": []}
    # nack and dead-letter too
    assert await api.dead_letter(st, "g", [offs[1]], reason="late") == {
        "deadLettered": 1,
        "unknown": [],
    }
    assert await api.fetch(st, "g", wait_ms=400) == []


async def test_nacked_message_is_settled_until_delivered_again(api: Api) -> None:
    """A nack settles the delivery: ack, nack and dead-letter of it answer unknown until the
    message is delivered again."""
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 5})
    offs = await api.produce(st, ["a", "b"])
    await api.put_group(st, "g")
    await api.fetch(st, "g", max=2)
    assert await api.nack(st, "g", offs, delay_ms=60_000) == {"nacked": 2, "unknown": []}
    assert await api.ack(st, "g", [offs[0]]) == {"acked": 0, "unknown": [offs[0]]}
    assert await api.nack(st, "g", [offs[0]]) == {"nacked": 0, "unknown": [offs[0]]}
    assert await api.dead_letter(st, "g", [offs[0]]) == {"deadLettered": 0, "unknown": [offs[0]]}
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"]) == (2, 0, 0)  # both still wait
    assert await api.dls_entries(st) == []
    # Neither is handed out again before its delay is over.
    assert await api.nack(st, "g", [offs[1]]) == {"nacked": 0, "unknown": [offs[1]]}
    assert await api.fetch(st, "g", max=5) == []


async def test_nack_without_delay_counts_on(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 4})
    [off] = await api.produce(st, ["a"])
    await api.put_group(st, "g")
    for n in (1, 2, 3):
        assert pairs(await api.fetch(st, "g")) == [(off, n)]
        assert await api.nack(st, "g", [off]) == {"nacked": 1, "unknown": []}
        assert await api.ack(st, "g", [off]) == {"acked": 0, "unknown": [off]}
    assert pairs(await api.fetch(st, "g")) == [(off, 4)]
    assert await api.ack(st, "g", [off]) == {"acked": 1, "unknown": []}
    assert await api.fetch(st, "g", wait_ms=200) == []


async def test_fetch_waits_for_an_append(api: Api) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    t0 = time.monotonic()
    assert await api.fetch(st, "g", wait_ms=400) == []
    waited = time.monotonic() - t0
    assert 0.38 <= waited < 2.5, waited

    task = asyncio.create_task(api.fetch(st, "g", wait_ms=8000))
    await asyncio.sleep(0.4)
    assert not task.done()
    t0 = time.monotonic()
    [off] = await api.produce(st, ["late"])
    got = await asyncio.wait_for(task, 10)
    woke = time.monotonic() - t0
    assert pairs(got) == [(off, 1)]
    assert woke < 1.5, f"fetch returned {woke:.2f} s after the append"
    if woke > 0.25:
        warnings.warn(f"fetch woke {woke * 1000:.0f} ms after the append", stacklevel=1)


async def test_concurrent_consumers_one_lease_each(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 20_000, "maxMsgDeliveries": 2})
    await api.put_group(st, "g")
    # Eight consumers wait; twenty messages come in small batches.
    tasks = [
        asyncio.create_task(api.fetch(st, "g", max=3, wait_ms=4000, consumer=f"w{i}"))
        for i in range(8)
    ]
    await asyncio.sleep(0.2)
    offs: list[str] = []
    for i in range(0, 20, 4):
        offs += await api.produce(st, list(range(i, i + 4)))
    got = [m for t in tasks for m in await t]
    while True:
        more = await api.fetch(st, "g", max=20)
        if not more:
            break
        got += more
    assert sorted(m["offset"] for m in got) == offs
    assert all(m["deliveryCount"] == 1 for m in got)


# -- bad input ---------------------------------------------------------------------------------


async def test_bad_input(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, ["a"])
    await api.put_group(st, "g")
    c = api.c
    grp = api.path(st, "groups", "g")
    cases: list[tuple[str, str, Any, int, Any]] = [
        # group names
        ("PUT", api.path(st, "groups", "a" * 257), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "has%20space"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "a$b"), {}, 400, "group"),
        ("POST", api.path(st, "groups", "a*b", "fetch"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "a%2Fb"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "%2E"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "%2E%2E"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "caf%C3%A9"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "tab%09"), {}, 400, "group"),
        ("PUT", api.path(st, "groups", "newline%0A"), {}, 400, "group"),
        # PUT group bodies
        ("PUT", grp, {"maxAckTimeMs": 99}, 400, "maxAckTimeMs"),
        ("PUT", grp, {"maxAckTimeMs": 43_200_001}, 400, "maxAckTimeMs"),
        ("PUT", grp, {"maxAckTimeMs": "1000"}, 400, "maxAckTimeMs"),
        ("PUT", grp, {"maxMsgDeliveries": 0}, 400, "maxMsgDeliveries"),
        ("PUT", grp, {"maxMsgDeliveries": 1001}, 400, "maxMsgDeliveries"),
        ("PUT", grp, {"maxMsgDeliveries": True}, 400, "maxMsgDeliveries"),
        ("PUT", grp, {"startFrom": "bogus"}, 400, "startFrom"),
        ("PUT", grp, {"startFrom": 3}, 400, "startFrom"),
        ("PUT", grp, {"startFrom": "0000000000000099_0000000000000000"}, 400, "startFrom"),
        ("PUT", grp, {"colour": "red"}, 400, "colour"),
        ("PUT", grp, [1], 400, None),
        # fetch
        ("POST", grp + "/fetch", {"max": 0}, 400, "max"),
        ("POST", grp + "/fetch", {"max": 1001}, 400, "max"),
        ("POST", grp + "/fetch", {"max": "5"}, 400, "max"),
        ("POST", grp + "/fetch", {"max": 2.5}, 400, "max"),
        ("POST", grp + "/fetch", {"waitMs": -1}, 400, "waitMs"),
        ("POST", grp + "/fetch", {"waitMs": 300_001}, 400, "waitMs"),
        ("POST", grp + "/fetch", {"waitMs": True}, 400, "waitMs"),
        ("POST", grp + "/fetch", {"consumer": ""}, 400, "consumer"),
        ("POST", grp + "/fetch", {"consumer": 7}, 400, "consumer"),
        ("POST", grp + "/fetch", {"consumer": "x" * 257}, 400, "consumer"),
        ("POST", grp + "/fetch", {"limit": 5}, 400, "limit"),
        ("POST", grp + "/fetch", "not an object", 400, None),
        # ack / nack / dead-letter
        ("POST", grp + "/ack", {}, 400, "offsets"),
        ("POST", grp + "/ack", {"offsets": []}, 400, "offsets"),
        ("POST", grp + "/ack", {"offsets": offs[0]}, 400, "offsets"),
        ("POST", grp + "/ack", {"offsets": [offs[0], 5]}, 400, "offsets.1"),
        ("POST", grp + "/ack", {"offsets": ["nope"]}, 400, "offsets.0"),
        ("POST", grp + "/ack", {"offsets": ["-1"]}, 400, "offsets.0"),
        ("POST", grp + "/ack", {"offsets": ["now"]}, 400, "offsets.0"),
        (
            "POST",
            grp + "/ack",
            {"offsets": ["0000000000000000_0000000000000001"]},
            400,
            "offsets.0",
        ),
        ("POST", grp + "/ack", {"offsets": [None]}, 400, "offsets.0"),
        ("POST", grp + "/ack", {"offsets": [offs[0] + "\n"]}, 400, "offsets.0"),
        ("PUT", grp, {"startFrom": offs[0] + "\n"}, 400, "startFrom"),
        ("POST", grp + "/ack", {"offsets": ["1" * 70]}, 400, "offsets.0"),
        # Digits that are not ASCII ("\u0661" is Arabic-Indic one; int() would take them).
        ("POST", grp + "/ack", {"offsets": ["\u0661" * 16 + "_" + "0" * 16]}, 400, "offsets.0"),
        ("POST", grp + "/ack", {"offsets": [" " + offs[0][1:]]}, 400, "offsets.0"),
        ("POST", grp + "/ack", {"offsets": [offs[0]] * 10_001}, 400, "offsets"),
        ("POST", grp + "/ack", {"offsets": offs, "delayMs": 5}, 400, "delayMs"),
        ("POST", grp + "/nack", {"offsets": offs, "delayMs": -1}, 400, "delayMs"),
        ("POST", grp + "/nack", {"offsets": offs, "delayMs": "5"}, 400, "delayMs"),
        ("POST", grp + "/nack", {"offsets": offs, "delayMs": 86_400_001}, 400, "delayMs"),
        ("POST", grp + "/nack", {"offsets": ["x"]}, 400, "offsets.0"),
        ("POST", grp + "/dead-letter", {"offsets": offs, "reason": 5}, 400, "reason"),
        ("POST", grp + "/dead-letter", {"offsets": [[]]}, 400, "offsets.0"),
        # unknown station or group
        ("GET", api.path("no-such-station", "groups"), None, 404, None),
        ("PUT", api.path("no-such-station", "groups", "g"), {}, 404, None),
        ("POST", api.path("no-such-station", "groups", "g", "fetch"), {}, 404, None),
        ("POST", api.path("no-such-station", "groups", "g", "ack"), {"offsets": offs}, 404, None),
        ("DELETE", api.path("no-such-station", "groups", "g"), None, 404, None),
        ("POST", api.path(st, "groups", "nope", "fetch"), {}, 404, "group"),
        ("POST", api.path(st, "groups", "nope", "ack"), {"offsets": offs}, 404, "group"),
        ("POST", api.path(st, "groups", "nope", "nack"), {"offsets": offs}, 404, "group"),
        ("POST", api.path(st, "groups", "nope", "dead-letter"), {"offsets": offs}, 404, "group"),
        ("DELETE", api.path(st, "groups", "nope"), None, 404, "group"),
    ]
    failures = []
    for method, path, body, status, field in cases:
        kwargs: dict[str, Any] = {}
        if isinstance(body, str):
            kwargs["content"] = body
        elif body is not None:
            kwargs["json"] = body
        r = await c.request(method, path, **kwargs)
        got_field = field_of(r) if r.status_code >= 400 else None
        if r.status_code != status or (field is not None and got_field != field):
            failures.append(
                (
                    method,
                    path[:80],
                    body if len(str(body)) < 80 else "...",
                    r.status_code,
                    r.text[:200],
                )
            )
        elif r.status_code >= 400:
            assert r.json()["error"]["code"], r.text
    assert not failures, "\n".join(map(str, failures))

    # Not JSON at all.
    for verb in ("fetch", "ack", "nack", "dead-letter"):
        r = await c.post(
            grp + "/" + verb, content=b"{nope", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, (verb, r.text)
    # The group is untouched by all of that.
    g = (await api.groups(st))["g"]
    assert (g["maxAckTimeMs"], g["maxMsgDeliveries"], g["pending"]) == (30_000, 2, 1)


async def test_fetch_without_body_uses_defaults(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, list(range(12)))
    await api.put_group(st, "g")
    r = await api.c.post(api.path(st, "groups", "g", "fetch"))
    assert r.status_code == 200, r.text
    assert [m["offset"] for m in r.json()["messages"]] == offs[:10]  # max defaults to 10


async def test_group_name_edges(api: Api) -> None:
    st = await api.station(uniq("a") + "/nested")
    name = "A-z_0.9~" + "x" * 248  # 256 characters, every allowed kind
    assert len(name) == 256
    await api.put_group(st, name, status=201)
    [off] = await api.produce(st, ["v"])
    assert pairs(await api.fetch(st, name)) == [(off, 1)]
    assert list(await api.groups(st)) == [name]


@pytest.mark.parametrize("method", ["GET", "PUT", "POST"])
async def test_no_500_on_garbage(api: Api, method: str) -> None:
    st = await api.station()
    await api.put_group(st, "g")
    for suffix in ("", "/fetch", "/ack", "/nack", "/dead-letter"):
        for content in (b"", b"null", b"[]", b"\xff\xfe", b'{"offsets": {"a": 1}}', b"1e999"):
            r = await api.c.request(
                method,
                api.path(st, "groups", "g") + suffix,
                content=content,
                headers={"content-type": "application/json"},
            )
            assert r.status_code < 500, (method, suffix, content, r.status_code, r.text)


# -- durability ----------------------------------------------------------------------------------


async def test_kill9_with_leases_out(shared: Server) -> None:
    """kill -9 with leases out: after the restart every un-acked message comes again after its
    deadline, nothing acked comes back, nothing is lost."""
    async with client(shared) as c:
        api = Api(c)
        st = await api.station(consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 5})
        offs = await api.produce(st, list(range(12)))
        await api.put_group(st, "g")
        got = await api.fetch(st, "g", max=10)
        assert [m["offset"] for m in got] == offs[:10]
        deadline = ms(got[0]["ackDeadline"])
        acked = offs[0:10:2]
        assert await api.ack(st, "g", acked) == {"acked": 5, "unknown": []}
        nack_at = time.time()
        assert (await api.nack(st, "g", [offs[1]], delay_ms=2500))["nacked"] == 1

    shared.restart()  # kill -9, start again
    # Under load a restart may outlast the leases: then they are due the moment it is up.
    due = max(deadline, time.time())

    async with client(shared) as c:
        api = Api(c)
        delivered: dict[str, tuple[int, float]] = {}
        wanted = set(offs) - set(acked)
        stop = time.monotonic() + 10
        while set(delivered) != wanted and time.monotonic() < stop:
            batch = await api.fetch(st, "g", max=10, wait_ms=1000)
            at = time.time()
            for m in batch:
                assert m["offset"] not in acked, f"acked message {m['offset']} came back"
                assert m["offset"] not in delivered, f"{m['offset']} delivered twice"
                delivered[m["offset"]] = (m["deliveryCount"], at)
            if batch:
                result = await api.ack(st, "g", [m["offset"] for m in batch])
                assert result == {"acked": len(batch), "unknown": []}
        assert set(delivered) == wanted
        for off in offs[10:]:  # never fetched before the crash
            assert delivered[off][0] == 1
        for off in offs[3:10:2]:  # leased when the shared died
            count, at = delivered[off]
            assert count == 2
            assert deadline - 0.01 <= at < due + EXPIRY_SLACK_S + 1.0, at - due
        count, at = delivered[offs[1]]  # nacked with a delay
        assert count == 2
        assert at >= nack_at + 2.5 - 0.05
        assert await api.fetch(st, "g", wait_ms=500) == []
        g = (await api.groups(st))["g"]
        assert (g["pending"], g["inFlight"], g["deadLettered"], g["lag"]) == (0, 0, 0, 0)
