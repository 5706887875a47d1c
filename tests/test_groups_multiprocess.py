"""Several ``stations serve`` processes on one PostgreSQL database serving one consumer group:
no message is leased to two consumers at once, and every message is acked exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tests.groupkit import EXPIRY_SLACK_S, Api, assert_clean_log, client, eventually, ms
from tests.harness import Server

MakeServer = Callable[..., Server]
TOTAL = 300


async def test_competing_consumers_across_processes(pg_url: str, make_server: MakeServer) -> None:
    one, two = make_server(pg_url), make_server(pg_url)
    async with client(one) as c1, client(two) as c2:
        a, b = Api(c1), Api(c2)
        st = await a.station(consumerDefaults={"maxAckTimeMs": 60_000, "maxMsgDeliveries": 5})
        await b.put_group(st, "workers")
        # (offset, consumer, deliveryCount) for every message handed out.
        deliveries: list[tuple[str, str, int]] = []
        acked: list[str] = []
        produced: list[str] = []
        done = asyncio.Event()

        async def produce() -> None:
            # Messages keep arriving through both processes while the consumers work.
            for i in range(0, TOTAL, 20):
                api = a if (i // 20) % 2 else b
                produced.extend(await api.produce(st, [{"i": j} for j in range(i, i + 20)]))
                await asyncio.sleep(0.01)

        async def consume(api: Api, name: str) -> None:
            while not done.is_set():
                got = await api.fetch(st, "workers", max=7, wait_ms=300, consumer=name)
                if not got:
                    continue
                deliveries.extend((m["offset"], name, m["deliveryCount"]) for m in got)
                offsets = [m["offset"] for m in got]
                result = await api.ack(st, "workers", offsets)
                assert result == {"acked": len(offsets), "unknown": []}, (name, result)
                acked.extend(offsets)
                if len(acked) >= TOTAL:
                    done.set()

        consumers = [
            asyncio.create_task(consume(api, f"{proc}-{k}"))
            for proc, api in (("p1", a), ("p2", b))
            for k in range(2)
        ]
        started = time.monotonic()
        await produce()
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            done.set()
            await asyncio.gather(*consumers)
        elapsed = time.monotonic() - started

        assert len(produced) == TOTAL
        first = [off for off, _, count in deliveries if count == 1]
        assert len(first) == len(set(first)), "an offset was delivered twice with deliveryCount 1"
        assert all(count == 1 for _, _, count in deliveries), "a lease expired: redelivery"
        assert len(acked) == TOTAL and set(acked) == set(produced), "acked exactly once in total"
        by_consumer = {name for _, name, _ in deliveries}
        assert {n.split("-")[0] for n in by_consumer} == {"p1", "p2"}, by_consumer
        # Nothing left over on either process.
        for api in (a, b):
            assert await api.fetch(st, "workers", max=50, wait_ms=200) == []
            g = (await api.groups(st))["workers"]
            assert (g["pending"], g["inFlight"], g["lag"]) == (0, 0, 0)
        assert elapsed < 60
    for server in (one, two):
        assert_clean_log(server)


async def test_one_message_many_fetchers_across_processes(
    pg_url: str, make_server: MakeServer
) -> None:
    one, two = make_server(pg_url), make_server(pg_url)
    async with client(one) as c1, client(two) as c2:
        a, b = Api(c1), Api(c2)
        st = await a.station(consumerDefaults={"maxAckTimeMs": 30_000, "maxMsgDeliveries": 3})
        await a.put_group(st, "g")
        for round_ in range(3):
            # Eight consumers, four per process, all waiting for the same single message.
            fetches = [
                asyncio.create_task(api.fetch(st, "g", max=5, wait_ms=700, consumer=f"c{k}"))
                for k in range(4)
                for api in (a, b)
            ]
            await asyncio.sleep(0.15)
            [off] = await (a if round_ % 2 else b).produce(st, [round_])
            results = await asyncio.gather(*fetches)
            winners = [r for r in results if r]
            assert len(winners) == 1, results
            assert [m["offset"] for m in winners[0]] == [off]
            assert (await b.ack(st, "g", [off]))["acked"] == 1
    for server in (one, two):
        assert_clean_log(server)


async def test_leases_expire_across_processes(pg_url: str, make_server: MakeServer) -> None:
    """A lease taken on one process expires for a consumer waiting on the other, whether the
    first process lives (its timer wakes the waiter through the database) or was killed."""
    one, two = make_server(pg_url), make_server(pg_url)
    async with client(one) as c1, client(two) as c2:
        a, b = Api(c1), Api(c2)
        st = await a.station(consumerDefaults={"maxAckTimeMs": 1500, "maxMsgDeliveries": 3})
        await a.put_group(st, "g")
        offs = await a.produce(st, ["x", "y"])
        got = await a.fetch(st, "g", max=2, consumer="on-one")
        assert [m["offset"] for m in got] == offs
        assert await b.fetch(st, "g", consumer="on-two") == []  # leased on process one
        await a.ack(st, "g", [offs[1]])
        # Process one lives: the consumer waiting on process two is woken at the expiry.
        deadline = ms(got[0]["ackDeadline"])
        again = await b.fetch(st, "g", max=5, wait_ms=5000, consumer="on-two")
        at = time.time()
        assert [(m["offset"], m["deliveryCount"]) for m in again] == [(offs[0], 2)]
        assert deadline - 0.01 <= at < deadline + EXPIRY_SLACK_S, at - deadline
        # Process two dies holding the lease: process one hands the message out once more.
        two.kill()
        deadline = ms(again[0]["ackDeadline"])
        await asyncio.sleep(max(0.0, deadline - time.time()) + 0.05)
        third = await a.fetch(st, "g", max=5, wait_ms=3000, consumer="on-one")
        assert [(m["offset"], m["deliveryCount"]) for m in third] == [(offs[0], 3)]
        # Its last lease expires on process one: into the DLS, once.
        entries: list[dict[str, Any]] = await eventually(lambda: a.dls_entries(st), timeout=6)
        assert [(e["offset"], e["deliveryCount"]) for e in entries] == [(offs[0], 3)]
        two.start()
        await asyncio.sleep(0.3)
        assert len(await b.dls_entries(st)) == 1
        assert await b.fetch(st, "g", wait_ms=300) == []
    assert_clean_log(one)


async def test_a_waiting_fetch_gets_a_dead_process_lease_on_time(
    pg_url: str, make_server: MakeServer
) -> None:
    """A consumer already waiting on one process is handed a message whose lease, taken on a
    process since killed, expires: within the expiry slack of its deadline, not at the
    survivor's next re-arm from the database (every 5 s). The survivor starts last, so its
    first re-arm after start-up comes about 5 s later, well after the deadline."""
    dead = make_server(pg_url)
    survivor = make_server(pg_url)
    async with client(survivor) as c1, client(dead) as c2:
        a, b = Api(c1), Api(c2)
        st = await a.station(consumerDefaults={"maxAckTimeMs": 1000, "maxMsgDeliveries": 3})
        await a.put_group(st, "g")
        [off] = await a.produce(st, ["x"])
        [lease] = await b.fetch(st, "g", consumer="doomed")
        dead.kill()
        # Parked before the deadline: nothing of the dead process's will wake it.
        got = await a.fetch(st, "g", wait_ms=8000, consumer="heir")
        at = time.time()
        deadline = ms(lease["ackDeadline"])
        assert [(m["offset"], m["deliveryCount"]) for m in got] == [(off, 2)]
        assert at < deadline + EXPIRY_SLACK_S, f"served {at - deadline:.2f} s after the deadline"
    assert_clean_log(survivor)
