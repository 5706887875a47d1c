"""kill -9 while consumers fetch and ack: what a crash may cost a consumer group, and no more.

A fetch is answered before its leases commit (see ``stations.domain.groups``): a crash in that
window costs one extra delivery of the messages in flight, nothing else. Acks are answered after
their commit, so an acked message never comes back, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from tests.groupkit import Api, client
from tests.harness import Server

MESSAGES = 400
KILL_AFTER_FETCHES = 6


async def _until_killed(
    server: Server, api: Api, st: str, delivered: Counter[str], acked: set[str]
) -> None:
    """Four consumers fetch 20 and ack; the server is killed right after a fetch is answered,
    while that fetch's commit may still be under way."""
    killed = asyncio.Event()
    fetches = 0

    async def consumer(name: str) -> None:
        nonlocal fetches
        while not killed.is_set():
            try:
                got = await api.fetch(st, "g", max=20, consumer=name)
            except httpx.HTTPError:
                return
            delivered.update(m["offset"] for m in got)
            fetches += 1
            if fetches >= KILL_AFTER_FETCHES and not killed.is_set():
                killed.set()
                server.kill()  # SIGKILL from inside the loop: no shutdown code runs
                return
            sent = [m["offset"] for m in got]
            try:
                answer = await api.ack(st, "g", sent)
            except httpx.HTTPError:
                return
            acked.update(set(sent) - set(answer["unknown"]))

    await asyncio.gather(*(consumer(f"c{i}") for i in range(4)))
    assert killed.is_set()


def test_kill9_mid_fetch_costs_one_extra_delivery_at_most(server: Server) -> None:
    async def scenario() -> None:
        delivered_before: Counter[str] = Counter()
        acked_before: set[str] = set()
        async with client(server) as c:
            api = Api(c)
            # Leases long enough that none expires before the crash on a loaded machine.
            st = await api.station(consumerDefaults={"maxAckTimeMs": 3000, "maxMsgDeliveries": 9})
            offs = await api.produce(st, list(range(MESSAGES)))
            await api.put_group(st, "g")
            await _until_killed(server, api, st, delivered_before, acked_before)
        assert all(n == 1 for n in delivered_before.values())
        in_flight = set(delivered_before) - acked_before

        server.start()
        delivered_after: Counter[str] = Counter()
        async with client(server) as c:
            api = Api(c)
            stop = time.monotonic() + 30
            while len(acked_before) + sum(delivered_after.values()) < MESSAGES:
                assert time.monotonic() < stop, "the group did not drain"
                got = await api.fetch(st, "g", max=50, wait_ms=1000)
                delivered_after.update(m["offset"] for m in got)
                if got:
                    answer = await api.ack(st, "g", [m["offset"] for m in got])
                    assert answer == {"acked": len(got), "unknown": []}
            assert await api.fetch(st, "g", wait_ms=200) == []
            g = (await api.groups(st))["g"]
            assert (g["pending"], g["inFlight"], g["deadLettered"]) == (0, 0, 0)

        # Nothing lost: every message acked, once.
        assert acked_before.isdisjoint(delivered_after)
        assert acked_before | set(delivered_after) == set(offs)
        # An acked message never comes back; after the restart each message comes once.
        assert all(n == 1 for n in delivered_after.values())
        # The only messages delivered twice were in flight at the crash: one extra each.
        twice = set(delivered_before) & set(delivered_after)
        assert twice <= in_flight

    asyncio.run(scenario())
