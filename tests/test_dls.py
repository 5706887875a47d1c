"""The dead-letter store over HTTP (CONTRACT.md §4 "Dead-letter store"), on SQLite and
PostgreSQL: listing, replay, drop, ``dls.poison``, ``dls.forwardTo`` and ``dls.retentionMs``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

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


def pairs(msgs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(m["offset"], m["deliveryCount"]) for m in msgs]


async def dead_letter_all(api: Api, st: str, group: str, reason: str = "bad") -> list[str]:
    """Fetch everything the group has and dead-letter it; returns the offsets."""
    got = await api.fetch(st, group, max=100)
    offsets = [m["offset"] for m in got]
    if offsets:
        result = await api.dead_letter(st, group, offsets, reason=reason)
        assert result == {"deadLettered": len(offsets), "unknown": []}
    return offsets


# -- listing -----------------------------------------------------------------------------------


async def test_list_filters_and_pagination(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, [{"i": i} for i in range(5)], ids=[f"id{i}" for i in range(5)])
    await api.put_group(st, "g1")
    await api.put_group(st, "g2")
    before = time.time()
    got = await api.fetch(st, "g1", max=3)
    for i, m in enumerate(got):  # one request each: three entries, in this order
        await api.dead_letter(st, "g1", [m["offset"]], reason=f"r{i}")
    assert await dead_letter_all(api, st, "g2", reason="two") == offs
    after = time.time()

    page = await api.dls(st)
    assert page["next"] is None
    entries = page["entries"]
    assert len(entries) == 8
    assert [e["group"] for e in entries] == ["g1"] * 3 + ["g2"] * 5
    ids = [int(e["id"]) for e in entries]
    assert ids == sorted(ids) and len(set(ids)) == 8
    first = entries[0]
    assert set(first) >= {
        "id",
        "group",
        "offset",
        "msgId",
        "headers",
        "data",
        "deliveryCount",
        "reason",
        "error",
        "deadLetteredAt",
    }
    assert (first["offset"], first["msgId"], first["data"], first["headers"]) == (
        offs[0],
        "id0",
        {"i": 0},
        {"n": "0"},
    )
    assert [e["error"] for e in entries[:3]] == ["r0", "r1", "r2"]
    assert all(e["reason"] == "dead_letter" for e in entries)
    assert all(before - 0.01 <= ms(e["deadLetteredAt"]) <= after + 0.01 for e in entries)

    g1 = await api.dls(st, group="g1")
    assert [e["offset"] for e in g1["entries"]] == offs[:3]
    assert g1["next"] is None
    assert (await api.dls(st, group="nobody"))["entries"] == []

    # Pages of 3: after=next walks the whole store, each entry once.
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3} | ({"after": cursor} if cursor else {})
        page = await api.dls(st, **params)
        assert len(page["entries"]) <= 3
        seen += [e["id"] for e in page["entries"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [e["id"] for e in entries]
    # Pages within one group.
    page = await api.dls(st, group="g2", limit=2)
    assert [e["offset"] for e in page["entries"]] == offs[:2]
    page = await api.dls(st, group="g2", limit=2, after=page["next"])
    assert [e["offset"] for e in page["entries"]] == offs[2:4]
    page = await api.dls(st, group="g2", limit=2, after=page["next"])
    assert [e["offset"] for e in page["entries"]] == offs[4:]
    assert page["next"] is None

    gs = await api.groups(st)
    assert (gs["g1"]["deadLettered"], gs["g2"]["deadLettered"]) == (3, 5)
    assert (await api.view(st))["stats"]["deadLettered"] == 8


async def test_text_station_entries(api: Api) -> None:
    st = await api.station(contentType="text/plain")
    r = await api.c.post(
        api.path(st, "messages"),
        json={"messages": [{"data": "héllo", "id": "t1"}, {"dataBase64": "/wA="}]},
    )
    assert r.status_code == 200, r.text
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=5)
    assert [m["data"] for m in got] == ["héllo", None]
    assert got[1]["dataBase64"] == "/wA="
    await api.dead_letter(st, "g", [m["offset"] for m in got])
    entries = await api.dls_entries(st)
    assert [e["data"] for e in entries] == ["héllo", None]
    assert entries[1]["dataBase64"] == "/wA="
    assert await api.replay(st, {"all": True}) == 2
    again = await api.fetch(st, "g", max=5)
    assert [(m["data"], m["deliveryCount"]) for m in again] == [("héllo", 1), (None, 1)]


# -- replay and drop ---------------------------------------------------------------------------


async def test_replay_one_then_all(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 3})
    offs = await api.produce(st, ["a", "b", "c"])
    await api.put_group(st, "g")
    # a: poison after 3 nacks; b, c: dead-lettered by hand.
    for n in (1, 2, 3):
        got = await api.fetch(st, "g", max=3)
        assert (offs[0], n) in pairs(got)
        await api.nack(st, "g", [offs[0]])
        if n == 1:
            await api.dead_letter(st, "g", offs[1:], reason="manual")
    entries = await api.dls_entries(st)
    assert [(e["offset"], e["reason"]) for e in entries] == [
        (offs[1], "dead_letter"),
        (offs[2], "dead_letter"),
        (offs[0], "max_deliveries"),
    ]
    assert entries[2]["deliveryCount"] == 3

    poison = entries[2]["id"]
    # Replayed before any fetch: not yet delivered, so not yet ackable.
    assert await api.replay(st, {"ids": [poison]}) == 1
    assert await api.ack(st, "g", [offs[0]]) == {"acked": 0, "unknown": [offs[0]]}
    assert await api.replay(st, {"ids": [poison]}) == 0  # replayed already: nothing
    assert [e["offset"] for e in await api.dls_entries(st)] == offs[1:]
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["deadLettered"]) == (1, 2)
    assert pairs(await api.fetch(st, "g", max=10)) == [(offs[0], 1)]  # a fresh count
    assert await api.fetch(st, "g", max=10) == []  # one redelivery, not two
    assert (await api.ack(st, "g", [offs[0]]))["acked"] == 1

    # Ids as numbers work too; unknown ids replay nothing.
    assert await api.replay(st, {"ids": [99_999_999]}) == 0
    assert await api.replay(st, {"all": True}) == 2
    assert await api.replay(st, {"all": True}) == 0
    assert await api.dls_entries(st) == []
    got = await api.fetch(st, "g", max=10)
    assert pairs(got) == [(offs[1], 1), (offs[2], 1)]
    assert await api.fetch(st, "g", max=10, wait_ms=300) == []
    assert (await api.ack(st, "g", offs[1:]))["acked"] == 2
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["inFlight"], g["deadLettered"]) == (0, 0, 0)


async def test_replayed_message_goes_round_again(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 200, "maxMsgDeliveries": 2})
    [off] = await api.produce(st, ["p"])
    await api.put_group(st, "g")
    await api.fetch(st, "g")
    assert pairs(await api.fetch(st, "g", wait_ms=3000)) == [(off, 2)]
    [entry] = await eventually(lambda: api.dls_entries(st), timeout=3)
    assert await api.replay(st, {"ids": [entry["id"]]}) == 1
    # The full count again: delivered twice more, then back in the DLS with a new id.
    assert pairs(await api.fetch(st, "g")) == [(off, 1)]
    assert pairs(await api.fetch(st, "g", wait_ms=3000)) == [(off, 2)]
    [again] = await eventually(lambda: api.dls_entries(st), timeout=3)
    assert again["id"] != entry["id"]
    assert (again["offset"], again["deliveryCount"]) == (off, 2)


async def test_replay_per_group(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, ["x", "y"])
    for group in ("a", "b"):
        await api.put_group(st, group)
        await dead_letter_all(api, st, group)
    assert await api.replay(st, {"all": True, "group": "a"}) == 2
    assert {e["group"] for e in await api.dls_entries(st)} == {"b"}
    assert pairs(await api.fetch(st, "a", max=5)) == [(offs[0], 1), (offs[1], 1)]
    assert await api.fetch(st, "b", max=5) == []  # b's entries stay put
    assert await api.replay(st, {"all": True, "group": "nobody"}) == 0
    # ids and a group: only the ids of that group.
    b_ids = [e["id"] for e in await api.dls_entries(st, "b")]
    assert await api.replay(st, {"ids": b_ids, "group": "a"}) == 0
    # An entry replays into its own group only.
    b_first = (await api.dls_entries(st, "b"))[0]["id"]
    assert await api.replay(st, {"ids": [b_first]}) == 1
    assert await api.fetch(st, "a", max=5) == []
    assert pairs(await api.fetch(st, "b", max=5)) == [(offs[0], 1)]


async def test_entry_ids_are_never_reused(api: Api) -> None:
    """A retried replay or drop by id, or an ``after`` cursor, must never hit a later entry."""
    st = await api.station()
    offs = await api.produce(st, ["a", "b"])
    await api.put_group(st, "g")
    await api.fetch(st, "g", max=2)
    await api.dead_letter(st, "g", [offs[0]])
    [first] = await api.dls_entries(st)
    assert await api.replay(st, {"ids": [first["id"]]}) == 1  # the newest entry anywhere
    await api.fetch(st, "g")
    await api.dead_letter(st, "g", [offs[0]])  # the same message dead-lettered again
    [second] = await api.dls_entries(st)
    assert second["id"] != first["id"]
    assert await api.replay(st, {"ids": [first["id"]]}) == 0  # the retry replays nothing
    assert await api.drop(st, {"ids": [second["id"]]}) == 1
    await api.dead_letter(st, "g", [offs[1]])
    [third] = await api.dls_entries(st)
    assert int(third["id"]) > int(second["id"]) > int(first["id"])
    assert await api.drop(st, {"ids": [second["id"]]}) == 0
    assert (await api.dls(st, after=second["id"]))["entries"] == [third]
    stats = (await api.view(st))["stats"]
    assert stats["deadLettered"] == 1


async def test_replay_wakes_a_waiting_consumer(api: Api) -> None:
    st = await api.station()
    [off] = await api.produce(st, ["w"])
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    task = asyncio.create_task(api.fetch(st, "g", wait_ms=8000))
    await asyncio.sleep(0.3)
    assert not task.done()
    t0 = time.monotonic()
    assert await api.replay(st, {"all": True}) == 1
    got = await asyncio.wait_for(task, 10)
    assert pairs(got) == [(off, 1)]
    assert time.monotonic() - t0 < 1.5


async def test_concurrent_replays_redeliver_once(api: Api) -> None:
    st = await api.station()
    offs = await api.produce(st, list(range(5)))
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    ids = [e["id"] for e in await api.dls_entries(st)]
    counts = await asyncio.gather(
        *(api.replay(st, {"ids": ids}) for _ in range(4)),
        *(api.replay(st, {"all": True}) for _ in range(4)),
    )
    assert sum(counts) == 5
    got = await api.fetch(st, "g", max=50)
    assert sorted(m["offset"] for m in got) == offs
    assert await api.fetch(st, "g", max=50, wait_ms=200) == []


async def test_drop(api: Api) -> None:
    st = await api.station()
    await api.produce(st, list(range(4)))
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    ids = [e["id"] for e in await api.dls_entries(st)]
    assert await api.drop(st, {"ids": [ids[0], int(ids[1])]}) == 2
    assert await api.drop(st, {"ids": [ids[0]]}) == 0
    assert await api.replay(st, {"ids": [ids[0]]}) == 0  # dropped: gone for good
    assert [e["id"] for e in await api.dls_entries(st)] == ids[2:]
    assert (await api.groups(st))["g"]["deadLettered"] == 2
    assert await api.drop(st, {"all": True}) == 2
    assert await api.dls_entries(st) == []
    assert await api.fetch(st, "g", max=10, wait_ms=200) == []
    stats = (await api.view(st))["stats"]
    assert stats["deadLettered"] == 0


async def test_drop_and_replay_stay_in_their_station(api: Api) -> None:
    one = await api.station()
    two = await api.station()
    for st in (one, two):
        await api.produce(st, ["m"])
        await api.put_group(st, "g")
        await dead_letter_all(api, st, "g")
    two_id = (await api.dls_entries(two))[0]["id"]
    assert await api.replay(one, {"ids": [two_id]}) == 0
    assert await api.drop(one, {"ids": [two_id]}) == 0
    assert await api.drop(one, {"all": True}) == 1
    assert len(await api.dls_entries(two)) == 1
    assert await api.replay(one, {"all": True}) == 0


# -- station settings --------------------------------------------------------------------------


async def test_poison_off_drops_poison_messages(api: Api) -> None:
    st = await api.station(
        dls={"poison": False},
        # 1.5 s: the nack below must come before the lease runs out on a loaded box.
        consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 1},
    )
    offs = await api.produce(st, ["p", "q", "r"])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=2)
    assert pairs(got) == [(offs[0], 1), (offs[1], 1)]
    deadline = ms(got[0]["ackDeadline"])
    await api.nack(st, "g", [offs[1]])  # last delivery nacked: dropped as well

    async def settled() -> bool:
        g = (await api.groups(st))["g"]
        return g["inFlight"] == 0

    await eventually(settled, timeout=deadline - time.time() + EXPIRY_SLACK_S + 0.5)
    assert await api.dls_entries(st) == []
    g = (await api.groups(st))["g"]
    assert (g["pending"], g["deadLettered"]) == (1, 0)  # only r is left
    assert pairs(await api.fetch(st, "g", max=5)) == [(offs[2], 1)]
    assert await api.ack(st, "g", offs) == {"acked": 1, "unknown": offs[:2]}
    # An explicit dead-letter is still kept.
    [extra] = await api.produce(st, ["s"])
    await api.fetch(st, "g")
    await api.dead_letter(st, "g", [extra], reason="explicit")
    [entry] = await api.dls_entries(st)
    assert (entry["offset"], entry["reason"], entry["error"]) == (extra, "dead_letter", "explicit")


async def test_poison_setting_can_be_patched(api: Api) -> None:
    st = await api.station(consumerDefaults={"maxAckTimeMs": 10_000, "maxMsgDeliveries": 1})
    offs = await api.produce(st, ["a", "b"])
    await api.put_group(st, "g")
    await api.fetch(st, "g", max=2)
    await api.nack(st, "g", [offs[0]])
    r = await api.c.patch(api.path(st), json={"dls": {"poison": False}})
    assert r.status_code == 200, r.text
    await api.nack(st, "g", [offs[1]])
    assert [e["offset"] for e in await api.dls_entries(st)] == [offs[0]]


async def test_retention(api: Api) -> None:
    st = await api.station(dls={"retentionMs": 400})
    keep = await api.station()
    for name in (st, keep):
        await api.produce(name, ["a", "b"])
        await api.put_group(name, "g")
        # Their answer, not a listing, shows the entries were made: under load a listing
        # may come after the 400 ms are up.
        assert len(await dead_letter_all(api, name, "g")) == 2

    async def gone() -> bool:
        return await api.dls_entries(st) == []

    await eventually(gone, timeout=10)
    assert (await api.groups(st))["g"]["deadLettered"] == 0
    assert (await api.view(st))["stats"]["deadLettered"] == 0
    assert len(await api.dls_entries(keep)) == 2  # retentionMs null keeps them
    # Expired entries are gone, not replayed.
    assert await api.replay(st, {"all": True}) == 0
    assert await api.fetch(st, "g", max=10) == []


async def test_replay_after_retention_dropped_the_original(api: Api) -> None:
    """The DLS keeps its own copy; an entry whose original retention has dropped cannot go
    back to the queue, so a replay must not silently lose it."""
    st = await api.station()
    offs = await api.produce(st, ["old", "mid"])
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    # The limit comes after the dead-letter: set at creation, a retention pass between the
    # produce and the dead-letter dropped "old" first (the dead-letter then said it unknown).
    r = await api.c.patch(api.path(st), json={"retention": {"maxMessages": 1}})
    assert r.status_code == 200, r.text
    await api.produce(st, ["new"])

    async def dropped() -> bool:
        return [m["data"] for m in await api.browse(st)] == ["new"]

    await eventually(dropped, timeout=5)
    entries = await api.dls_entries(st)
    assert [(e["offset"], e["data"]) for e in entries] == [(offs[0], "old"), (offs[1], "mid")]
    assert await api.replay(st, {"all": True}) == 0
    assert [e["data"] for e in await api.dls_entries(st)] == ["old", "mid"]  # still kept
    assert [m["data"] for m in await api.fetch(st, "g", max=5)] == ["new"]


async def test_forward_to(api: Api) -> None:
    target = await api.station(uniq("dead"))
    st = await api.station(
        dls={"forwardTo": target},
        # 2 s: the dead-letter below must come before the lease runs out on a loaded box.
        consumerDefaults={"maxAckTimeMs": 2000, "maxMsgDeliveries": 1},
    )
    offs = await api.produce(st, [{"o": 1}, {"o": 2}], ids=["one", "two"])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=2)
    await api.dead_letter(st, "g", [got[1]["offset"]], reason="nope")
    # offs[0] expires into the DLS.
    await eventually(lambda: api.dls_entries(st), timeout=5)

    async def forwarded() -> list[dict[str, Any]] | None:
        msgs = await api.browse(target)
        return msgs if len(msgs) >= 2 else None

    msgs = await eventually(forwarded, timeout=5)
    await asyncio.sleep(0.3)
    msgs = await api.browse(target)
    assert len(msgs) == 2
    by_data = {m["data"]["o"]: m for m in msgs}
    assert by_data[2]["headers"] == {
        "n": "1",
        "dls-source": st,
        "dls-group": "g",
        "dls-reason": "dead_letter",
    }
    assert by_data[1]["headers"] == {
        "n": "0",
        "dls-source": st,
        "dls-group": "g",
        "dls-reason": "max_deliveries",
    }
    assert all(m["id"] is None for m in msgs)
    assert len(await api.dls_entries(st)) == 2
    # Replaying and dropping do not forward again; a new dead letter does.
    assert await api.replay(st, {"all": True}) == 2
    got = await api.fetch(st, "g", max=5)
    assert sorted(m["offset"] for m in got) == offs
    await api.ack(st, "g", offs)
    assert len(await api.browse(target)) == 2
    # An array stays one message in the target.
    [third] = await api.produce(st, [[{"o": 3}, {"o": 4}]])
    await api.fetch(st, "g")
    await api.dead_letter(st, "g", [third])
    msgs = await api.browse(target)
    assert len(msgs) == 3
    assert msgs[-1]["data"] == [{"o": 3}, {"o": 4}]


async def test_forward_to_text_station(api: Api) -> None:
    target = await api.station(uniq("dead"), contentType="text/plain")
    st = await api.station(contentType="text/plain", dls={"forwardTo": target})
    await api.c.post(api.path(st, "messages"), json={"messages": [{"data": "raw bytes"}]})
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    [msg] = await api.browse(target)
    assert msg["data"] == "raw bytes"
    assert msg["headers"]["dls-reason"] == "dead_letter"


# -- bad input ---------------------------------------------------------------------------------


async def test_bad_input(api: Api) -> None:
    st = await api.station()
    await api.produce(st, ["a"])
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    replay, drop, listing = (
        api.path(st, "dls", "replay"),
        api.path(st, "dls", "drop"),
        api.path(st, "dls"),
    )
    bodies: list[tuple[Any, Any]] = [
        ([1], None),
        ("null", None),
        ({}, "ids"),
        ({"ids": []}, "ids"),
        ({"ids": "1"}, "ids"),
        ({"ids": ["abc"]}, "ids.0"),
        ({"ids": ["1", "x"]}, "ids.1"),
        ({"ids": [-1]}, "ids.0"),
        ({"ids": [1.5]}, "ids.0"),
        ({"ids": [True]}, "ids.0"),
        ({"ids": [None]}, "ids.0"),
        ({"ids": ["²"]}, "ids.0"),
        ({"ids": ["١"]}, "ids.0"),
        ({"ids": [" 1"]}, "ids.0"),
        ({"ids": ["1"] * 10_001}, "ids"),
        ({"all": "yes"}, "all"),
        ({"all": 1}, "all"),
        ({"all": True, "ids": ["1"]}, "ids"),
        ({"everything": True}, "everything"),
    ]
    failures = []
    for path in (replay, drop):
        for body, field in bodies:
            kwargs: dict[str, Any] = {"content": body} if isinstance(body, str) else {"json": body}
            r = await api.c.post(path, **kwargs)
            if r.status_code != 400 or field_of(r) != field:
                failures.append((path, str(body)[:60], r.status_code, r.text[:200]))
    extra: list[tuple[str, Any, int, Any]] = [
        (replay, {"all": True, "group": 5}, 400, "group"),
        (replay, {"all": True, "group": "g", "ids": ["1"]}, 400, "ids"),
        (drop, {"all": True, "group": "g"}, 400, "group"),
        (api.path("no-such", "dls", "replay"), {"all": True}, 404, None),
        (api.path("no-such", "dls", "drop"), {"all": True}, 404, None),
    ]
    for path, body, status, field in extra:
        r = await api.c.post(path, json=body)
        if r.status_code != status or (field and field_of(r) != field):
            failures.append((path, str(body)[:60], r.status_code, r.text[:200]))
    r = await api.c.post(replay, content=b"{oops", headers={"content-type": "application/json"})
    if r.status_code != 400:
        failures.append((replay, "{oops", r.status_code, r.text[:200]))
    r = await api.c.post(replay)
    if r.status_code != 400:
        failures.append((replay, "(no body)", r.status_code, r.text[:200]))
    queries: list[tuple[dict[str, str], str]] = [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"limit": "-5"}, "limit"),
        ({"limit": "²"}, "limit"),
        ({"after": "x"}, "after"),
        ({"after": "-1"}, "after"),
        ({"after": "²"}, "after"),
        ({"after": "1.0"}, "after"),
    ]
    for params, field in queries:
        r = await api.c.get(listing, params=params)
        if r.status_code != 400 or field_of(r) != field:
            failures.append((listing, params, r.status_code, r.text[:200]))
    r = await api.c.get(api.path("no-such", "dls"))
    if r.status_code != 404:
        failures.append(("no-such dls", None, r.status_code, r.text[:200]))
    assert not failures, "\n".join(map(str, failures))
    # Still there after all that.
    assert len(await api.dls_entries(st)) == 1


async def test_huge_ids_are_not_a_server_error(api: Api) -> None:
    st = await api.station()
    await api.produce(st, ["a"])
    await api.put_group(st, "g")
    await dead_letter_all(api, st, "g")
    huge = "9" * 30
    for path in (api.path(st, "dls", "replay"), api.path(st, "dls", "drop")):
        for ids in ([huge], [int(huge)], ["2147483648"], ["9223372036854775808"]):
            r = await api.c.post(path, json={"ids": ids})
            assert r.status_code in (200, 400), (path, ids, r.status_code, r.text)
            if r.status_code == 200:
                assert r.json() in ({"replayed": 0}, {"dropped": 0})
    for after in (huge, "2147483648", "9223372036854775808"):
        r = await api.c.get(api.path(st, "dls"), params={"after": after})
        assert r.status_code in (200, 400), (after, r.status_code, r.text)
        if r.status_code == 200:
            assert r.json() == {"entries": [], "next": None}
    assert len(await api.dls_entries(st)) == 1


# -- durability ----------------------------------------------------------------------------------


async def test_replay_with_no_consumer_online_survives_kill(shared: Server) -> None:
    async with client(shared) as c:
        api = Api(c)
        st = await api.station()
        offs = await api.produce(st, ["a", "b", "c"])
        await api.put_group(st, "g")
        await dead_letter_all(api, st, "g")
        ids = [e["id"] for e in await api.dls_entries(st)]
        assert await api.replay(st, {"ids": ids[:2]}) == 2
    shared.restart()  # kill -9: no consumer was ever online for the replayed entries
    async with client(shared) as c:
        api = Api(c)
        got = await api.fetch(st, "g", max=10, wait_ms=2000)
        assert pairs(got) == [(offs[0], 1), (offs[1], 1)]
        assert await api.replay(st, {"ids": ids[:2]}) == 0
        assert [e["id"] for e in await api.dls_entries(st)] == ids[2:]
        assert (await api.ack(st, "g", offs[:2]))["acked"] == 2
        assert await api.fetch(st, "g", max=10, wait_ms=300) == []


async def test_forward_to_exactly_once_across_kill(shared: Server) -> None:
    """Leases of 40 messages expire into the DLS around a kill -9: each is forwarded exactly
    once, whether its expiry committed before the crash or after the restart."""
    n = 40
    async with client(shared) as c:
        api = Api(c)
        target = await api.station(uniq("dead"))
        st = await api.station(
            dls={"forwardTo": target},
            consumerDefaults={"maxAckTimeMs": 300, "maxMsgDeliveries": 1},
        )
        await api.produce(st, [{"i": i} for i in range(n)])
        await api.put_group(st, "g")
        got = await api.fetch(st, "g", max=n)
        assert len(got) == n
        deadline = ms(got[0]["ackDeadline"])
        await asyncio.sleep(max(0.0, deadline - time.time()))
    shared.restart()
    async with client(shared) as c:
        api = Api(c)

        async def all_dead() -> bool:
            return len(await api.dls_entries(st)) == n

        await eventually(all_dead, timeout=8)
        await asyncio.sleep(0.5)
        msgs = await api.browse(target)
        assert sorted(m["data"]["i"] for m in msgs) == list(range(n))
        assert all(m["headers"]["dls-reason"] == "max_deliveries" for m in msgs)
        shared.restart()  # and once more: nothing is forwarded again
    async with client(shared) as c:
        api = Api(c)
        await asyncio.sleep(0.5)
        assert len(await api.browse(target)) == n
        assert len(await api.dls_entries(st)) == n


async def _dead_letter_then_seek_back(api: Api, st: str, n: int) -> None:
    await api.produce(st, [{"n": i} for i in range(n)])
    await api.put_group(st, "g", maxAckTimeMs=60_000)
    await dead_letter_all(api, st, "g")
    seek = await api.c.post(api.path(st, "groups", "g", "seek"), json={"to": "earliest"})
    assert seek.status_code == 200, seek.text


async def test_a_replay_leaves_a_live_lease_of_its_message_alone(api: Api) -> None:
    """The review of 2026-11-29: a seek keeps dead letters, so after one back past them the
    group leases the messages again while their entries stand. Replaying those entries
    deleted the live leases: the holder's ack answered ``unknown`` and another consumer was
    handed the message again as a first delivery (processed twice)."""
    st = uniq()
    await api.station(st)
    await _dead_letter_then_seek_back(api, st, 3)
    held = await api.fetch(st, "g", max=10, consumer="b")
    assert [m["deliveryCount"] for m in held] == [1, 1, 1]
    assert await api.replay(st, {"all": True}) == 3
    assert await api.dls_entries(st) == []
    assert await api.fetch(st, "g", max=10, consumer="c") == []
    acked = await api.ack(st, "g", [m["offset"] for m in held])
    assert acked["acked"] == 3 and not acked.get("unknown"), acked
    assert await api.fetch(st, "g", max=10, consumer="c") == []


async def test_a_message_dead_lettered_twice_is_replayed_once(api: Api) -> None:
    """After a seek back, a message can die again and have two entries: a replay of both
    put it back once but answered ``replayed`` for each entry."""
    st = uniq()
    await api.station(st)
    await _dead_letter_then_seek_back(api, st, 2)
    await dead_letter_all(api, st, "g")
    assert len(await api.dls_entries(st)) == 4
    assert await api.replay(st, {"all": True}) == 2
    again = await api.fetch(st, "g", max=10)
    assert sorted(m["data"]["n"] for m in again) == [0, 1]
    assert await api.fetch(st, "g", max=10, consumer="c2") == []


async def test_a_selection_of_too_many_ids_names_the_limit(api: Api) -> None:
    """10,001 ids were refused as "ids must be a non-empty array", which they were."""
    st = await api.station()
    for verb in ("replay", "drop"):
        r = await api.c.post(api.path(st, "dls", verb), json={"ids": ["1"] * 10_001})
        assert r.status_code == 400 and field_of(r) == "ids", r.text
        assert "at most 10000" in r.json()["error"]["message"], r.text
