"""The shutdown's drain, in-process: what it waits for and what it ends (``stations.api.drain``,
``Notifier.wake_all``). The whole server's shutdown is in tests/test_operate.py."""

from __future__ import annotations

import asyncio

from stations.api.drain import READER_GRACE_S, Drain
from stations.api.limits import ReaderSlots
from stations.domain.notify import LINGER_MAX_S, Notifier


def test_a_request_begun_during_the_grace_is_not_cut_at_its_end() -> None:
    """Only a waiting read that does not answer was left, so the drain gave the readers a
    second's grace; a write that came meanwhile on a kept-alive connection was cancelled
    with them at its end, after it may have committed, its client told nothing."""

    async def main() -> None:
        slots = ReaderSlots(10)
        drain = Drain(slots, end_waits=lambda: None)

        async def stuck_reader() -> None:
            task = drain.enter()
            try:
                with slots.slot():
                    await asyncio.sleep(60)  # a client that does not read its answer
            finally:
                drain.leave(task)

        async def late_write() -> str:
            task = drain.enter()
            try:
                await asyncio.sleep(READER_GRACE_S * 1.5)
                return "answered"
            finally:
                drain.leave(task)

        reader = asyncio.create_task(stuck_reader())
        await asyncio.sleep(0)
        settled = asyncio.create_task(drain.settle(10))
        await asyncio.sleep(READER_GRACE_S / 2)
        write = asyncio.create_task(late_write())
        assert await asyncio.wait_for(settled, 10) == 0  # nothing cut
        assert write.result() == "answered"
        assert reader.cancelled()  # the reader that never answered is ended

    asyncio.run(main())


def test_ending_the_waits_releases_held_answers_at_once() -> None:
    """With many readers on a station their answers are held for its next release, up to
    ``LINGER_MAX_S`` away: past the drain's grace, so a busy station's readers were cut off
    unanswered at a shutdown."""

    async def main() -> None:
        notifier = Notifier()
        for _ in range(1000):
            notifier.attach("s")
        assert notifier.pace("s") is None  # the first answer goes at once...
        held = notifier.pace("s")  # ... the next waits for the release
        assert held is not None
        woken = notifier.subscribe("s")
        started = asyncio.get_running_loop().time()
        notifier.wake_all()
        await asyncio.wait_for(asyncio.gather(held, woken), LINGER_MAX_S)
        assert asyncio.get_running_loop().time() - started < 0.5

    asyncio.run(main())
