"""The webhook POST slots (``outbound.Outbound``), from a review of its fairness: a flood of new
endpoints that hang no longer delays an endpoint known to answer by a stall per 16 of them, an
endpoint that recovers or whose slow mark is old is no longer kept behind hung ones, and a
slow endpoint alone uses every slot, not 4 of 32.

The POSTs here end when the test says (an event), so what is asserted is who got a slot and
what was cut for it, not how long it took; ``stall_s`` is short, and the bounds generous."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stations.domain.subscriptions import outbound
from stations.domain.subscriptions.outbound import Outbound

STALL = 0.2
WAIT = 10.0  # generous: only a fault waits this long


class Run:
    """POSTs through one ``Outbound``: who was granted in which order, what was cut."""

    def __init__(self, ob: Outbound, total: int) -> None:
        self.ob = ob
        self.total = total
        self.granted: list[str] = []
        self.cut: list[str] = []
        self.cut_before: dict[str, int] = {}  # POSTs cut before the endpoint's last grant
        self.most = 0
        self.never = asyncio.Event()  # hung POSTs wait for it (the test's end)
        self.tasks: list[asyncio.Task[Any]] = []
        self._grants: dict[str, asyncio.Event] = {}

    def granted_to(self, endpoint: str) -> asyncio.Event:
        return self._grants.setdefault(endpoint, asyncio.Event())

    async def one(self, endpoint: str, call: Callable[[], Awaitable[Any]]) -> Any:
        slot = await self.ob.acquire(endpoint)
        self.granted.append(endpoint)
        self.cut_before[endpoint] = len(self.cut)
        self.most = max(self.most, self.ob.in_flight)
        assert self.ob.in_flight <= self.total
        self.granted_to(endpoint).set()
        try:
            answer = await self.ob.post(slot, call())
        finally:
            self.ob.release(slot)
        if answer is None:
            self.cut.append(endpoint)
        return answer

    def start(self, endpoint: str, call: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(self.one(endpoint, call))
        self.tasks.append(task)
        return task

    async def hang(self) -> bool:
        await self.never.wait()
        return True

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        assert self.ob.in_flight == 0


async def quick() -> bool:
    return True


async def late() -> bool:
    """Answered, but after the stall: marks the endpoint slow."""
    await asyncio.sleep(STALL * 1.5)
    return True


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(int(WAIT / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"waited {WAIT} s for {what}")


async def test_a_flood_of_new_hung_endpoints_delays_a_known_fast_endpoint_one_stall() -> None:
    """150 endpoints never seen before hang. They counted as healthy: a healthy endpoint's
    waiter queued behind them, and cuts let them in 16 per stall (118 cuts, 2 s x 150/16
    with the real stall). Now they are on probation: an endpoint known to answer quickly
    gets the first slot cut, one stall after they came."""
    run = Run(Outbound(32, stall_s=STALL), 32)
    try:
        assert await run.one("https://ok:443", quick)  # known to answer quickly
        for i in range(150):
            run.start(f"https://hung{i}:443", run.hang)
        await until(lambda: run.ob.in_flight == 32, "the hung endpoints to hold every slot")
        ok = run.start("https://ok:443", quick)
        await asyncio.wait_for(ok, WAIT)
        cut = run.cut_before["https://ok:443"]
        assert cut <= 2, f"{cut} POSTs cut before the healthy one's turn"
        assert run.most <= 32
    finally:
        await run.stop()


async def test_a_new_endpoint_behind_new_hung_ones_gets_its_turn_once_they_stall() -> None:
    """40 new endpoints that hang take the 32 slots (nobody else waits); a 41st new endpoint
    (healthy, but not known yet) gets a slot once they have stalled: a newcomer cuts a
    stalled POST, and the 8 queued before it go first."""
    run = Run(Outbound(32, stall_s=STALL), 32)
    try:
        for i in range(40):
            run.start(f"https://hung{i}:443", run.hang)
        await until(lambda: run.ob.in_flight == 32, "the hung endpoints to hold every slot")
        await asyncio.wait_for(run.start("https://new:443", quick), WAIT)
        assert 1 <= len(run.cut) <= 9 + 1
    finally:
        await run.stop()


async def test_an_endpoint_that_recovers_leaves_the_slow_queue() -> None:
    """E was slow; its next waiter queued among the slow endpoints', behind H's. Its POST in
    flight then answered quickly: E is fast again, but its waiter stayed in the slow queue
    (and the slow had no slot left: it waited for H's hung POST to end). Now it moves with
    E's class, and fast goes first: it gets the slot E's answer freed."""
    run = Run(Outbound(3, slow_cap=1, slow_per_endpoint=2, stall_s=STALL), 3)
    try:
        await asyncio.gather(*(run.one(f"https://{n}:443", late) for n in "ehg"))
        answer = asyncio.Event()

        async def e_first() -> bool:
            await answer.wait()
            return True

        run.start("https://h:443", run.hang)
        run.start("https://g:443", run.hang)
        first = run.start("https://e:443", e_first)
        await until(lambda: run.ob.in_flight == 3, "every slot to be held")
        h = run.start("https://h:443", quick)  # H's next waiter, before E's
        await asyncio.sleep(0)
        e = run.start("https://e:443", quick)
        await asyncio.sleep(0)
        answer.set()  # E answers at once: fast again
        await asyncio.wait_for(asyncio.gather(first, e, h), WAIT)
        assert run.granted[-2:] == ["https://e:443", "https://h:443"]
        assert run.cut == []
    finally:
        await run.stop()


async def test_a_slow_mark_is_forgotten_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """E was slow once, long ago (here 0.6 s, as SLOW_FOR_S is patched to 0.5 s). The mark
    never expired: E's next POST waited among the slow endpoints, behind hung POSTs that
    hold every slot. Now E is on probation again, and as a newcomer it gets a stalled POST's
    slot."""
    monkeypatch.setattr(outbound, "SLOW_FOR_S", 0.5, raising=False)
    run = Run(Outbound(4, stall_s=STALL), 4)
    try:
        await run.one("https://e:443", late)
        await asyncio.sleep(0.6)
        for i in range(4):
            run.start(f"https://h{i}:443", run.hang)
        await until(lambda: run.ob.in_flight == 4, "the hung endpoints to hold every slot")
        await asyncio.sleep(STALL * 1.5)  # they have stalled
        await asyncio.wait_for(run.start("https://e:443", quick), WAIT)
        assert len(run.cut) == 1
    finally:
        await run.stop()


async def test_a_slow_endpoint_alone_uses_every_slot_and_gives_one_back() -> None:
    """One endpoint that answers, slowly, has a backlog and nobody else waits: it had 4 of 32
    slots (28 idle; a plain semaphore gave it 32). Now it borrows all idle slots; when an
    endpoint known to answer quickly comes, one of its stalled POSTs is cut for it."""
    run = Run(Outbound(32, stall_s=STALL), 32)
    try:
        assert await run.one("https://ok:443", quick)
        assert await run.one("https://slow:443", late)
        for _ in range(40):
            run.start("https://slow:443", run.hang)
        await until(lambda: run.ob.in_flight == 32, "the slow endpoint to hold every slot")
        await asyncio.sleep(STALL * 1.5)  # they have stalled
        await asyncio.wait_for(run.start("https://ok:443", quick), WAIT)
        assert run.cut == ["https://slow:443"]
    finally:
        await run.stop()


async def test_nobody_waits_for_a_stall_while_a_slot_is_free() -> None:
    """A fast endpoint's POSTs, probation and slow ones: whenever a waiter is left waiting,
    every slot is held."""
    run = Run(Outbound(8, stall_s=STALL), 8)
    try:
        assert await run.one("https://slow:443", late)
        for i in range(6):
            run.start(f"https://new{i}:443", run.hang)
        for _ in range(6):
            run.start("https://slow:443", run.hang)
        await until(lambda: run.ob.in_flight == 8, "every slot to be held")
    finally:
        await run.stop()


@pytest.mark.parametrize("seed", range(3))
async def test_slots_are_given_back_exactly_once_on_every_path(seed: int) -> None:
    """Random endpoints, durations, failures, grants with nothing to send, and callers
    cancelled while waiting or posting, with cuts: never more than the total in flight, and
    every count, map and queue empty at the end."""
    rnd = random.Random(seed)
    total = 6
    ob = Outbound(total, stall_s=0.05)
    errors: list[BaseException] = []

    async def call(duration: float, fail: bool) -> bool:
        await asyncio.sleep(duration)
        if fail:
            raise RuntimeError("refused")
        return True

    async def one(endpoint: str) -> None:
        slot = await ob.acquire(endpoint)
        if ob.in_flight > total:
            errors.append(AssertionError(f"{ob.in_flight} in flight"))
        try:
            if rnd.random() < 0.1:
                return  # nothing due
            durations = [0.0, 0.01, 0.03, 0.08, 0.3]
            with contextlib.suppress(RuntimeError):
                await ob.post(slot, call(rnd.choice(durations), rnd.random() < 0.1))
        finally:
            ob.release(slot)

    tasks: list[asyncio.Task[None]] = []
    for _ in range(300):
        tasks.append(asyncio.ensure_future(one(f"e{rnd.randrange(12)}")))
        if rnd.random() < 0.15:
            rnd.choice(tasks).cancel()
        await asyncio.sleep(rnd.choice([0, 0, 0.001, 0.005]))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert not errors
    assert [r for r in results if isinstance(r, Exception)] == []
    assert (ob.in_flight, ob._slow_held, ob._cutting, ob._stalled_slots) == (0, 0, 0, {})
    assert ob._eps == {}
    assert all(not queue for queue in ob._queues.values())
