"""Edges of ``POST /api/transactions`` found by an adversarial review, on both engines: a retry
after a lost answer, leases of another station, group or consumer, one delivery named twice,
produce into the station consumed, dead letters forwarded inside a transaction, concurrent
settlements of one lease, and partial failures that must leave everything as it was."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    field_of,
    shared_fixture,  # noqa: F401 - the fixture shared
)


def lease(st: str, group: str, m: dict[str, Any]) -> dict[str, Any]:
    return {
        "station": st,
        "group": group,
        "offset": m["offset"],
        "deliveryCount": m["deliveryCount"],
        "ackDeadline": m["ackDeadline"],
    }


async def post(api: Api, body: Any) -> Any:
    return await api.c.post("/api/transactions", json=body)


async def test_retry_after_a_lost_answer_produces_once(api: Api) -> None:
    src, out = await api.station(), await api.station()
    await api.produce(src, [{"n": 1}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    body = {"ack": [lease(src, "g", got[0])], "produce": [{"station": out, "data": "x"}]}
    first = await post(api, body)
    assert first.status_code == 200, first.text
    again = await post(api, body)  # the same request again, its first answer lost
    assert again.status_code == 409 and field_of(again) == "ack.0.offset", again.text
    assert [m["data"] for m in await api.browse(out)] == ["x"]


async def test_leases_of_another_station_group_or_consumer(api: Api) -> None:
    a, b, out = await api.station(), await api.station(), await api.station()
    await api.produce(a, [{"n": 1}])
    await api.produce(b, [{"n": 1}])
    for st in (a, b):
        await api.put_group(st, "g")
        await api.put_group(st, "h")
    got = await api.fetch(a, "g", consumer="c1")
    await api.fetch(b, "h", consumer="c1")  # same offset, another station and group
    produce = [{"station": out, "data": 1}]
    for wrong in (
        {"station": b, "group": "g"},  # g on b never delivered it
        {"group": "h"},  # h on a never delivered it
    ):
        r = await post(api, {"ack": [{**lease(a, "g", got[0]), **wrong}], "produce": produce})
        assert r.status_code == 409 and field_of(r) == "ack.0.offset", r.text
    r = await post(api, {"consumer": "c2", "ack": [lease(a, "g", got[0])], "produce": produce})
    assert r.status_code == 409 and "held by consumer c1, not by c2" in r.text
    # Named twice, by two verbs: refused before anything is looked up.
    r = await post(api, {"ack": [lease(a, "g", got[0])], "nack": [lease(a, "g", got[0])]})
    assert r.status_code == 400 and field_of(r) == "nack.0.offset", r.text
    assert await api.browse(out) == []
    assert (await api.groups(a))["g"]["inFlight"] == 1


async def test_produce_into_the_station_consumed(api: Api) -> None:
    src = await api.station()
    await api.produce(src, [{"n": 1}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    r = await post(
        api, {"ack": [lease(src, "g", got[0])], "produce": [{"station": src, "data": {"n": 2}}]}
    )
    assert r.status_code == 200, r.text
    nxt = await api.fetch(src, "g")
    assert [(m["data"], m["deliveryCount"]) for m in nxt] == [({"n": 2}, 1)]
    r = await post(
        api, {"ack": [lease(src, "g", nxt[0])], "produce": [{"station": src, "data": {"n": 3}}]}
    )
    assert r.status_code == 200, r.text
    assert [m["data"] for m in await api.browse(src)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert (await api.groups(src))["g"]["inFlight"] == 0


async def test_dead_letter_forwarded_inside_a_transaction(api: Api) -> None:
    dead = await api.station()
    src = await api.station(dls={"forwardTo": dead})
    out = await api.station()
    await api.produce(src, [{"n": 1}, {"n": 2}])
    await api.put_group(src, "g", maxMsgDeliveries=1)
    got = await api.fetch(src, "g")
    r = await post(
        api,
        {
            "deadLetter": [{**lease(src, "g", got[0]), "reason": "bad"}],
            "nack": [lease(src, "g", got[1])],  # its last delivery: to the DLS too
            "produce": [{"station": out, "data": 1}, {"station": dead, "data": "mine"}],
        },
    )
    assert r.status_code == 200, r.text
    assert (r.json()["deadLettered"], r.json()["nacked"]) == (1, 1)
    stored = await api.browse(dead)
    # The produced message, then each dead letter's forwarded copy, once (the nacked one
    # first: settlements run nacks before dead letters).
    assert [(m["data"], m["headers"].get("dls-source")) for m in stored] == [
        ("mine", None),
        ({"n": 2}, src),
        ({"n": 1}, src),
    ]
    assert len(await api.dls_entries(src, "g")) == 2


async def test_a_closed_or_deleted_target_fails_everything(api: Api) -> None:
    src, closed, gone = await api.station(), await api.station(), await api.station()
    await api.produce(src, [{"n": 1}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    r = await api.c.post(f"/v1/stream/{closed}", headers={"Stream-Closed": "true"})
    assert r.status_code == 204, r.text
    r = await api.c.delete(api.path(gone))
    assert r.status_code in (200, 204), r.text
    for target, status in ((gone, 404), (closed, 409)):
        r = await post(
            api,
            {
                "ack": [lease(src, "g", got[0])],
                "produce": [{"station": src, "data": 1}, {"station": target, "data": 1}],
            },
        )
        assert r.status_code == status and field_of(r) == "produce.1.station", r.text
    assert [m["data"] for m in await api.browse(src)] == [{"n": 1}]
    assert (await api.groups(src))["g"]["inFlight"] == 1


async def test_concurrent_settlements_of_one_lease(api: Api) -> None:
    src, out = await api.station(), await api.station()
    await api.produce(src, [{"n": k} for k in range(20)])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g", max=20)
    bodies = [
        {"ack": [lease(src, "g", m)], "produce": [{"station": out, "data": m["offset"]}]}
        for m in got
    ]
    # Each lease settled by three transactions and a plain ack at once: exactly one wins.
    calls = [post(api, b) for b in bodies for _ in range(3)]
    calls += [
        api.c.post(api.path(src, "groups", "g", "ack"), json={"offsets": [m["offset"]]})
        for m in got
    ]
    answers = await asyncio.gather(*calls)
    txs, plain = answers[: 3 * len(got)], answers[3 * len(got) :]
    assert all(r.status_code in (200, 409) for r in txs), [r.text for r in txs]
    assert all(r.status_code == 200 for r in plain)
    won = [json.loads(r.request.content)["produce"][0]["data"] for r in txs if r.status_code == 200]
    acked = [m["offset"] for m, r in zip(got, plain, strict=True) if r.json()["acked"] == 1]
    assert sorted(won + acked) == sorted(m["offset"] for m in got)  # each settled once
    assert sorted(m["data"] for m in await api.browse(out)) == sorted(won)  # produced once
    assert (await api.groups(src))["g"]["inFlight"] == 0


async def test_ids_against_plain_produces(api: Api) -> None:
    out = await api.station()
    calls = []
    for k in range(30):
        calls.append(post(api, {"produce": [{"station": out, "id": f"id-{k}", "data": k}]}))
        plain = {"messages": [{"id": f"id-{k}", "data": k}]}
        calls.append(api.c.post(api.path(out, "messages"), json=plain))
    answers = await asyncio.gather(*calls)
    assert all(r.status_code == 200 for r in answers)
    stored = [m["id"] for m in await api.browse(out)]
    assert sorted(stored) == sorted(f"id-{k}" for k in range(30))


async def test_dead_letter_beside_a_produce_to_its_own_station(api: Api) -> None:
    """The dead letter copies its message from the log while the same op's produce to that
    station is still unwritten in the batch: the entry must hold the settled message."""
    src = await api.station()
    await api.produce(src, [{"n": 1}, {"n": 2}])
    await api.put_group(src, "g")
    got = await api.fetch(src, "g")
    body = {
        "produce": [{"station": src, "data": {"n": 3}}, {"station": src, "data": {"n": 4}}],
        "deadLetter": [lease(src, "g", got[1])],
        "nack": [{**lease(src, "g", got[0]), "delayMs": 0}],
    }
    r = await post(api, body)
    assert r.status_code == 200, r.text
    entries = await api.dls_entries(src, "g")
    assert [(e["offset"], e["data"]) for e in entries] == [(got[1]["offset"], {"n": 2})]
    again = await api.fetch(src, "g")
    assert [(m["data"], m["deliveryCount"]) for m in again] == [
        ({"n": 1}, 2),
        ({"n": 3}, 1),
        ({"n": 4}, 1),
    ]


async def test_a_transaction_ack_of_a_closed_stations_last_message_wakes_fetches(
    api: Api,
) -> None:
    """The review of 2026-11-29: the ack route told a closed station's waiting fetches that
    its group was done; the same ack in a transaction left them waiting out ``waitMs``."""
    st, out = await api.station(), await api.station()
    await api.produce(st, [{"n": 1}])
    await api.put_group(st, "g", maxAckTimeMs=60_000)
    closed = await api.c.post(
        f"/v1/stream/{st}", headers={"Stream-Closed": "true", "Content-Type": "application/json"}
    )
    assert closed.status_code in (200, 204), closed.text
    (m,) = await api.fetch(st, "g", consumer="a")
    path = api.path(st, "groups", "g", "fetch")
    waiting = asyncio.create_task(
        api.c.post(path, json={"max": 1, "waitMs": 15_000, "consumer": "b"}, timeout=30)
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    body = {"ack": [lease(st, "g", m)], "produce": [{"station": out, "data": 1}]}
    assert (await post(api, body)).status_code == 200
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.json() == {"messages": [], "closed": True}, answer.text
