"""Waiting Durable Streams readers cost what they must: renewing a TTL stream's countdown."""

from __future__ import annotations

import asyncio

from stations.domain.service import Service


def test_waiting_readers_of_a_ttl_stream_share_their_renewals(db_url: str) -> None:
    """Each long-poll reader of a stream with a TTL renews it every half TTL while it waits;
    each wrote its own touch (300 readers of a 1 s TTL: 8.6% of a core at rest). A renewal any
    reader made in the last quarter TTL now stands for the others'."""
    from stations.domain.lifecycle import CreateRequest

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        ops: list[int] = []
        try:
            await svc.create(CreateRequest("t", "application/json", {}, ttl_seconds=2))
            svc.tally.batch_observers.append(lambda n, _s: ops.append(n))
            readers = [
                asyncio.ensure_future(svc.read_or_wait("t", None, 4, max_bytes=1 << 16))
                for _ in range(40)
            ]
            # Every reader waits once its first touch, its own, is written: counted until all
            # 40 are in (a fixed sleep let a busy box write some of them inside the 2.5 s).
            deadline = asyncio.get_running_loop().time() + 30
            while sum(ops) < 40:
                assert asyncio.get_running_loop().time() < deadline, ops
                await asyncio.sleep(0.02)
            ops.clear()
            await asyncio.sleep(2.5)  # two and a half renewals per reader
            assert sum(ops) <= 12, f"{sum(ops)} writer ops while 40 readers waited 2.5 s"
            assert (await svc.stream("t")).name == "t"  # alive
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        finally:
            await svc.close()

    asyncio.run(run())
