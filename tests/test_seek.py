"""Group seek (``POST .../groups/{group}/seek``) to each target, with leases in flight, on both
engines: leases in flight are revoked, waiting redeliveries dropped, delivery goes on from the
new position with fresh delivery counts."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    field_of,
    shared_fixture,  # noqa: F401 - the fixture shared
)
from tests.harness import Server


async def seek(api: Api, st: str, group: str, status: int = 200, **body: Any) -> Any:
    r = await api.c.post(api.path(st, "groups", group, "seek"), json=body)
    assert r.status_code == status, r.text
    return r.json()


async def in_flight(api: Api, st: str, n: int = 10) -> tuple[list[str], list[str]]:
    """A group g with 3 leases in flight and one nacked, waiting for redelivery after a long
    delay: (all offsets, leased offsets)."""
    offs = await api.produce(st, [{"i": i} for i in range(n)])
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=4)
    await api.nack(st, "g", [got[3]["offset"]], delay_ms=600_000)
    return offs, [m["offset"] for m in got[:3]]


async def assert_cut(api: Api, st: str, leased: list[str], answer: dict[str, Any]) -> None:
    assert answer["revoked"] == 3 and answer["dropped"] == 1
    # The revoked leases settle nothing any more.
    assert await api.ack(st, "g", leased) == {"acked": 0, "unknown": leased}


async def test_seek_to_offset(api: Api) -> None:
    st = await api.station()
    offs, leased = await in_flight(api, st)
    answer = await seek(api, st, "g", to=offs[2])
    assert answer["cursor"] == offs[2]
    await assert_cut(api, st, leased, answer)
    got = await api.fetch(st, "g", max=100)
    assert [m["offset"] for m in got] == offs[2:]
    assert {m["deliveryCount"] for m in got} == {1}
    view = (await api.groups(st))["g"]
    assert view["inFlight"] == 8 and view["pending"] == 0


async def test_seek_to_earliest_and_now(api: Api) -> None:
    st = await api.station()
    offs, leased = await in_flight(api, st)
    answer = await seek(api, st, "g", to="now")
    await assert_cut(api, st, leased, answer)
    assert await api.fetch(st, "g", max=100) == []
    assert (await api.groups(st))["g"]["pending"] == 0
    more = await api.produce(st, [{"i": "after"}])
    assert [m["offset"] for m in await api.fetch(st, "g", max=100)] == more

    earliest = await seek(api, st, "g", to="earliest")
    assert earliest["revoked"] == 1 and earliest["dropped"] == 0
    got = await api.fetch(st, "g", max=100)
    assert [m["offset"] for m in got] == offs + more
    assert {m["deliveryCount"] for m in got} == {1}


async def test_seek_to_earliest_retained(api: Api) -> None:
    st = await api.station(retention={"maxMessages": 4})
    offs = await api.produce(st, [{"i": i} for i in range(10)])

    async def trimmed() -> bool:
        return (await api.browse(st))[0]["offset"] == offs[6]

    for _ in range(100):  # retention runs once a second
        if await trimmed():
            break
        await asyncio.sleep(0.1)
    await api.put_group(st, "g", startFrom="latest")
    late = await api.produce(st, [{"i": "late"}, {"i": "later"}])
    leased = await api.fetch(st, "g", max=1)  # one lease in flight
    answer = await seek(api, st, "g", to="earliest")
    assert answer["revoked"] == 1 and answer["dropped"] == 0
    assert (await api.ack(st, "g", [leased[0]["offset"]]))["acked"] == 0
    got = [m["offset"] for m in await api.fetch(st, "g", max=100)]
    assert got[-2:] == late and set(got) <= set(offs[6:] + late)
    assert got == sorted(got) and len(got) >= 4  # everything retained, in order
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"to": offs[0]})
    assert r.status_code == 400 and field_of(r) == "to"


async def test_seek_to_time(api: Api) -> None:
    st = await api.station()
    first = await api.produce(st, [{"i": i} for i in range(3)])
    await asyncio.sleep(0.02)  # a later store time for the second request
    second = await api.produce(st, [{"i": i} for i in range(3, 6)])
    times = {m["offset"]: m["time"] for m in await api.browse(st)}
    assert times[first[-1]] < times[second[0]]
    await api.put_group(st, "g")
    got = await api.fetch(st, "g", max=2)
    answer = await seek(api, st, "g", time=times[second[0]])
    assert answer["revoked"] == 2 and answer["cursor"] == second[0]
    assert [m["offset"] for m in await api.fetch(st, "g", max=100)] == second
    assert (await api.ack(st, "g", [got[0]["offset"]]))["acked"] == 0
    # Before every message: all of them; after the last: nothing until something new comes.
    await seek(api, st, "g", time=0)
    assert [m["offset"] for m in await api.fetch(st, "g", max=100)] == first + second
    await seek(api, st, "g", time="2999-01-01T00:00:00Z")
    assert await api.fetch(st, "g", max=100) == []


async def test_seek_bad_input(api: Api) -> None:
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    await api.put_group(st, "g")
    for body, field in [
        ({}, "to"),
        ({"to": "x"}, "to"),
        ({"to": "now", "time": 1}, "to"),
        ({"time": "yesterday"}, "time"),
        ({"time": "2026-11-22T10:00:00"}, "time"),  # no zone
        ({"time": -5}, "time"),
        ({"to": "now", "extra": 1}, "extra"),
        ({"to": "0000000000000099_0000000000000000"}, "to"),  # beyond the tail
    ]:
        r = await api.c.post(api.path(st, "groups", "g", "seek"), json=body)
        assert r.status_code == 400, (body, r.text)
        assert field_of(r) == field, body
    r = await api.c.post(api.path(st, "groups", "nope", "seek"), json={"to": "now"})
    assert r.status_code == 404 and field_of(r) == "group"


async def test_sdk_seek(shared: Server) -> None:
    from datetime import UTC, datetime

    from stations.client import Client

    async with Client(shared.url) as c:
        name = f"sdk-seek-{datetime.now(UTC).timestamp()}"
        await c.create_station(name)
        station = c.station(name)
        produced = await station.produce_many([{"i": i} for i in range(5)])
        async with station.consumer("g", consumer="w", batch_size=2, wait_ms=0) as consumer:
            first = await consumer.fetch()
            assert [m.data["i"] for m in first] == [0, 1]
            result = await consumer.seek(produced[3].offset)
            assert result.revoked == 2 and result.cursor == produced[3].offset
            assert [m.data["i"] for m in await consumer.fetch()] == [3, 4]
            again = await station.seek("g", "earliest")
            assert again.revoked == 2
            assert [m.data["i"] for m in await consumer.fetch(10)] == [0, 1, 2, 3, 4]
            await station.seek("g", datetime(2999, 1, 1, tzinfo=UTC))
            assert await consumer.fetch(wait_ms=0) == []
