"""Slots for outgoing webhook POSTs, shared so that endpoints that hang cannot starve the rest.

An endpoint is a webhook URL's ``scheme://host:port``.

- At most ``total`` POSTs are in flight (each holds one outbound connection).
- Endpoints waiting for a slot are served in turn (round robin), not in arrival order: one
  endpoint with many subscriptions does not queue the others behind all of its POSTs.
- A POST still unanswered after ``stall_s`` marks its endpoint *slow* (a quick answer marks it
  healthy again). Slow endpoints together hold at most ``slow_cap`` slots, each endpoint at
  most ``slow_per_endpoint``; their further POSTs wait their turn among themselves.
- No endpoint is known slow before its first POST has stalled: forty fresh endpoints that
  hang may hold every slot. Whatever slow POSTs hold beyond ``slow_cap`` is then *cut* while
  a healthy endpoint waits for a slot: the POST is ended, which counts as a failed attempt
  (retried with backoff, as after its timeout; its receiver may have got it: a duplicate,
  never a loss). So however many endpoints hang, a healthy one waits about ``stall_s`` at most.

Nothing polls: a grant happens when a slot is given back or a waiter comes, a stall is one
``call_later`` per POST. Memory is bounded by the waiters (the engine queues one per
subscription) and ``REMEMBER`` idle slow endpoints.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

STALL_S = 2.0  # a POST unanswered this long marks its endpoint slow
REMEMBER = 4096  # idle endpoints still known slow (their next POST waits among the slow)


class Slot:
    """One POST's place among those in flight."""

    __slots__ = ("endpoint", "slow", "cut", "released", "started", "task", "timer")

    def __init__(self, endpoint: str, slow: bool) -> None:
        self.endpoint = endpoint
        self.slow = slow  # counted among the slow endpoints' slots
        self.cut = False  # ended early to free the slot
        self.released = False
        self.started = 0.0
        self.task: asyncio.Future[Any] | None = None  # the POST, once it runs
        self.timer: asyncio.TimerHandle | None = None


class _Endpoint:
    __slots__ = ("key", "waiters", "inflight", "slow", "listed")

    def __init__(self, key: str, slow: bool) -> None:
        self.key = key
        self.waiters: deque[asyncio.Future[Slot]] = deque()
        self.inflight = 0
        self.slow = slow
        self.listed = False  # in one of the turn queues (the one of its class when listed)


class Outbound:
    def __init__(
        self,
        total: int,
        *,
        slow_cap: int | None = None,
        slow_per_endpoint: int | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self._total = max(1, total)
        # Half the slots stay for endpoints that answer; a quarter of the slow ones per endpoint.
        self._slow_cap = max(1, self._total // 2) if slow_cap is None else slow_cap
        per = max(1, self._slow_cap // 4) if slow_per_endpoint is None else slow_per_endpoint
        self._slow_per_endpoint = per
        self._stall_s = stall_s
        self._eps: dict[str, _Endpoint] = {}
        self._fast: deque[str] = deque()  # endpoints with waiters, in turn
        self._slow: deque[str] = deque()
        self._prefer_slow = False  # the two queues take turns, so neither starves
        self._in_flight = 0
        self._slow_held = 0
        self._cutting = 0  # cut POSTs not yet given back
        self._slow_slots: dict[Slot, None] = {}  # oldest first: the first cut
        self._slow_idle: OrderedDict[str, None] = OrderedDict()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def acquire(self, endpoint: str) -> Slot:
        ep = self._eps.get(endpoint)
        if ep is None:
            ep = _Endpoint(endpoint, endpoint in self._slow_idle)
            self._slow_idle.pop(endpoint, None)
            self._eps[endpoint] = ep
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        ep.waiters.append(fut)
        self._list(ep)
        self._pump()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # granted as it was cancelled: give it back
            raise

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        ep = self._eps[slot.endpoint]
        ep.inflight -= 1
        self._in_flight -= 1
        if slot.slow:
            self._slow_held -= 1
            self._slow_slots.pop(slot, None)
        if slot.cut:
            self._cutting -= 1
        self._list(ep)  # it may have been at its own cap
        self._forget_if_idle(ep)
        self._pump()

    async def post(self, slot: Slot, call: Awaitable[T]) -> T | None:
        """Run the POST ``call`` in ``slot`` and give the slot back once it ends; None when it
        was cut. Its own task, so that a cut ends the POST and not its caller."""
        loop = asyncio.get_running_loop()
        task: asyncio.Future[T] = asyncio.ensure_future(call)
        slot.task = task
        slot.started = loop.time()
        if not slot.slow:
            slot.timer = loop.call_later(self._stall_s, self._stalled, slot)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if slot.cut and task.cancelled() and (current is None or not current.cancelling()):
                return None
            raise
        finally:
            if not slot.cut and not task.cancelled():
                ep = self._eps.get(slot.endpoint)
                if ep is not None:  # how long it took says whether the endpoint answers
                    ep.slow = loop.time() - slot.started >= self._stall_s
            self.release(slot)

    # -- turns ------------------------------------------------------------------------------

    def _list(self, ep: _Endpoint) -> None:
        if ep.listed or not ep.waiters:
            return
        if ep.slow and ep.inflight >= self._slow_per_endpoint:
            return  # listed again when one of its POSTs ends
        (self._slow if ep.slow else self._fast).append(ep.key)
        ep.listed = True

    def _head(self, queue: deque[str], slow: bool) -> _Endpoint | None:
        """The endpoint whose turn it is in ``queue``, left at its head; entries that went stale
        (no waiters left, class changed, at its cap) are dropped or moved on the way."""
        while queue:
            ep = self._eps.get(queue[0])
            if ep is not None and ep.slow == slow:
                while ep.waiters and ep.waiters[0].done():  # cancelled waiters
                    ep.waiters.popleft()
                if ep.waiters and not (slow and ep.inflight >= self._slow_per_endpoint):
                    return ep
            queue.popleft()
            if ep is not None:
                ep.listed = False
                self._list(ep)  # into the queue of its class now, if it still waits
                self._forget_if_idle(ep)
        return None

    def _next(self) -> _Endpoint | None:
        slow_open = self._slow_held < self._slow_cap
        for slow in (True, False) if self._prefer_slow else (False, True):
            if slow and not slow_open:
                continue
            queue = self._slow if slow else self._fast
            ep = self._head(queue, slow)
            if ep is not None:
                queue.popleft()
                ep.listed = False
                self._prefer_slow = not slow
                return ep
        return None

    def _pump(self) -> None:
        while self._in_flight < self._total:
            ep = self._next()
            if ep is None:
                return
            self._grant(ep)
        # Full. A healthy endpoint waits while slow ones hold more than their share: cut one
        # (one at a time: its slot comes back within a turn of the loop, and this runs again).
        if (
            self._cutting == 0
            and self._slow_held > self._slow_cap
            and self._head(self._fast, False) is not None
        ):
            for slot in self._slow_slots:
                if slot.task is not None and not slot.task.done() and not slot.cut:
                    slot.cut = True
                    self._cutting += 1
                    slot.task.cancel()
                    return

    def _grant(self, ep: _Endpoint) -> None:
        fut = ep.waiters.popleft()
        slot = Slot(ep.key, ep.slow)
        ep.inflight += 1
        self._in_flight += 1
        if slot.slow:
            self._slow_held += 1
            self._slow_slots[slot] = None
        fut.set_result(slot)
        self._list(ep)  # its next waiter takes its turn after the others'

    def _stalled(self, slot: Slot) -> None:
        slot.timer = None
        ep = self._eps.get(slot.endpoint)
        if ep is not None:
            ep.slow = True
        if not slot.slow and not slot.released:
            slot.slow = True
            self._slow_held += 1
            self._slow_slots[slot] = None
        self._pump()

    def _forget_if_idle(self, ep: _Endpoint) -> None:
        if ep.waiters or ep.inflight or ep.listed:
            return
        del self._eps[ep.key]
        if ep.slow:
            self._slow_idle[ep.key] = None
            self._slow_idle.move_to_end(ep.key)
            while len(self._slow_idle) > REMEMBER:
                self._slow_idle.popitem(last=False)
