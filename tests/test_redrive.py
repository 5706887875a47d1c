"""DLS redrive on both engines: replay with ``delayMs``, the per-station ``dls.redrive`` policy
(cap, delay, backoff), redrive counts per entry, and durability across kill -9."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    assert_clean_log,
    client,
    field_of,
    shared_fixture,  # noqa: F401 - the fixture shared
)
from tests.harness import Server


async def dead_letter_one(api: Api, st: str, wait_ms: int = 0) -> tuple[dict[str, Any], float]:
    """Fetch one message and dead-letter it; the message, and a time (``time.monotonic``) taken
    after the fetch returned and before the dead-letter was sent."""
    got = await api.fetch(st, "g", max=1, wait_ms=wait_ms)
    assert len(got) == 1, got
    sent = time.monotonic()
    assert (await api.dead_letter(st, "g", [got[0]["offset"]], reason="boom"))["deadLettered"] == 1
    return got[0], sent


async def test_replay_with_delay_waits(api: Api) -> None:
    st = await api.station()
    await api.produce(st, [{"n": 1}])
    await api.put_group(st, "g")
    msg, _ = await dead_letter_one(api, st)
    entry = (await api.dls_entries(st))[0]
    start = time.monotonic()
    # 3 s: the checks below that it is not yet due must come inside it on a loaded box.
    r = await api.c.post(
        api.path(st, "dls", "replay"), json={"ids": [entry["id"]], "delayMs": 3000}
    )
    assert r.status_code == 200 and r.json()["replayed"] == 1
    assert await api.dls_entries(st) == []
    assert await api.fetch(st, "g", wait_ms=0) == []  # not yet due
    assert (await api.groups(st))["g"]["pending"] == 1
    # A long-poll fetch is woken when the replay falls due, not before.
    got = await api.fetch(st, "g", wait_ms=20_000)
    elapsed = time.monotonic() - start
    assert [m["offset"] for m in got] == [msg["offset"]] and got[0]["deliveryCount"] == 1
    assert elapsed >= 3.0, elapsed  # the delay is a floor ...
    assert elapsed < 15, elapsed  # ... and the wake-up comes (loosely: a shared, loaded box)


async def test_replay_delay_bad_input(api: Api) -> None:
    st = await api.station()
    for delay in (-1, "5", 7 * 86_400_000 + 1, True):
        r = await api.c.post(api.path(st, "dls", "replay"), json={"all": True, "delayMs": delay})
        assert r.status_code == 400 and field_of(r) == "delayMs", r.text


async def test_policy_validation(api: Api) -> None:
    for redrive, field in [
        ({}, "dls.redrive.maxRedrives"),
        ({"maxRedrives": 0}, "dls.redrive.maxRedrives"),
        ({"maxRedrives": 1001}, "dls.redrive.maxRedrives"),
        ({"maxRedrives": 2, "delayMs": -1}, "dls.redrive.delayMs"),
        ({"maxRedrives": 2, "backoff": 0.5}, "dls.redrive.backoff"),
        ({"maxRedrives": 2, "backoff": "2"}, "dls.redrive.backoff"),
        ({"maxRedrives": 2, "delayMs": 5000, "maxDelayMs": 100}, "dls.redrive.maxDelayMs"),
        ({"maxRedrives": 2, "every": 1}, "dls.redrive.every"),
        ("often", "dls.redrive"),
    ]:
        r = await api.c.post("/api/stations", json={"name": "pv-x", "dls": {"redrive": redrive}})
        assert r.status_code == 400 and field_of(r) == field, (redrive, r.text)
    st = await api.station(dls={"redrive": {"maxRedrives": 3}})
    view = await api.view(st)
    assert view["dls"]["redrive"] == {
        "maxRedrives": 3,
        "delayMs": 60000,
        "backoff": 1,
        "maxDelayMs": 7 * 86_400_000,
    }
    r = await api.c.patch(api.path(st), json={"dls": {"redrive": None}})
    assert r.status_code == 200 and "redrive" not in r.json()["dls"]


async def test_policy_redrives_until_the_cap(api: Api) -> None:
    # Delays of 1.5 s and 3 s: a listing of the DLS must come before each redrive on a loaded
    # box. maxDelayMs holds the step after them (6 s by the backoff) at 3 s.
    policy = {"maxRedrives": 2, "delayMs": 1500, "backoff": 2, "maxDelayMs": 3000}
    st = await api.station(dls={"redrive": policy})
    await api.produce(st, [{"n": 1}])
    await api.put_group(st, "g", maxMsgDeliveries=1)
    msg, sent = await dead_letter_one(api, st)
    for n, delay in ((0, 1.5), (1, 3.0)):
        (entry,) = await api.dls_entries(st)
        assert entry["redrives"] == n and entry["redriveAt"] is not None
        assert entry["reason"] == "dead_letter"
        again, next_sent = await dead_letter_one(api, st, wait_ms=20_000)  # woken by the redrive
        # From before its dead-letter was sent to after the redrive came back.
        assert next_sent - sent >= delay - 0.05, next_sent - sent
        assert again["offset"] == msg["offset"] and again["deliveryCount"] == 1
        sent = next_sent
    (entry,) = await api.dls_entries(st)
    assert entry["redrives"] == 2 and entry["redriveAt"] is None
    assert entry["reason"] == "max_redrives" and entry["error"] == "dead_letter: boom"
    # It stays: no redrive comes (a bounded look, well past the next step of 3 s).
    assert await api.fetch(st, "g", wait_ms=3800) == []
    assert len(await api.dls_entries(st)) == 1
    # A lease that expires on its last delivery takes the same road.
    st2 = await api.station(dls={"redrive": {"maxRedrives": 1, "delayMs": 0}})
    await api.produce(st2, [{"n": 2}])
    await api.put_group(st2, "g", maxMsgDeliveries=1, maxAckTimeMs=200)
    first = await api.fetch(st2, "g")
    again = await api.fetch(st2, "g", wait_ms=20_000)  # expired → DLS → redriven
    assert [m["offset"] for m in again] == [first[0]["offset"]]
    assert await api.dls_entries(st2) == []  # redriven: it left the DLS


# -- across restarts -----------------------------------------------------------------------------


async def test_cap_and_redrives_survive_kill9(server: Server) -> None:
    async with client(server) as c:
        api = Api(c)
        # 3 s: the listing and the kill -9 and restart below come before any redrive is due.
        st = await api.station(dls={"redrive": {"maxRedrives": 1, "delayMs": 3000}})
        n = 40
        offsets = await api.produce(st, [{"i": i} for i in range(n)])
        await api.put_group(st, "g", maxMsgDeliveries=1)
        got = await api.fetch(st, "g", max=n)
        await api.dead_letter(st, "g", [m["offset"] for m in got], reason="first")
        assert {e["redrives"] for e in await api.dls_entries(st)} == {0}
    server.restart()  # kill -9 before any redrive is due: none may be lost or doubled
    async with client(server) as c:
        api = Api(c)
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + 30
        while sum(seen.values()) < n and time.monotonic() < deadline:
            for m in await api.fetch(st, "g", max=n, wait_ms=5000):
                seen[m["offset"]] += 1
                await api.dead_letter(st, "g", [m["offset"]], reason="second")
        assert sorted(seen) == offsets and set(seen.values()) == {1}
        entries = await api.dls_entries(st)
        assert len(entries) == n
        assert {(e["reason"], e["redrives"], e["redriveAt"]) for e in entries} == {
            ("max_redrives", 1, None)
        }
    server.restart()
    async with client(server) as c:
        api = Api(c)
        assert await api.fetch(st, "g", max=n, wait_ms=3500) == []  # the cap holds
        assert len(await api.dls_entries(st)) == n
    assert_clean_log(server)


async def test_sdk_policy_and_delayed_replay(shared: Server) -> None:
    from stations.client import Client, DeadLetterSettings, RedrivePolicy

    async with Client(shared.url) as c:
        name = f"sdk-redrive-{time.time_ns()}"
        policy = RedrivePolicy(max_redrives=1, delay_ms=60_000, backoff=2)
        info = await c.create_station(name, dls=DeadLetterSettings(redrive=policy))
        assert info.dls.redrive == policy
        station = c.station(name)
        await station.produce({"n": 1})
        async with station.consumer("g", consumer="w", wait_ms=0) as consumer:
            (msg,) = await consumer.fetch()
            await msg.dead_letter("bad")
            (entry,) = (await station.dead_letters()).entries
            assert entry.redrives == 0 and entry.redrive_at is not None
            assert await station.replay_dead_letters([entry.id], delay_ms=60_000) == 1
            assert await consumer.fetch(wait_ms=0) == []  # waits for its delay
            assert (await station.groups())[0].pending == 1
        off = await station.patch(dls=DeadLetterSettings(redrive=None))
        assert off.dls.redrive is None
