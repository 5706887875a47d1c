"""Slots for outgoing webhook POSTs, shared so that endpoints that hang cannot starve the rest.

An endpoint is a webhook URL's ``scheme://host:port``. Each is in one of three classes:

- *fast*: its last POST ended (answered or failed) within ``stall_s``;
- *slow*: a POST of it went ``stall_s`` unanswered, or was answered later than that;
- *probation*: not known: never seen, or idle long enough to be forgotten (a slow mark after
  ``slow_for_s``; either mark beyond the ``REMEMBER`` most recent). Its first POST decides.

An endpoint moves to the queue of its class as soon as its class changes. The policy:

- At most ``total`` POSTs are in flight, and no slot stays idle while anyone waits: an
  endpoint beyond its share borrows idle slots.
- Shares: probation and slow endpoints (the *unproven*) together hold ``slow_cap`` slots,
  ``slow_per_endpoint`` each; the rest is the fast endpoints'. Waiting endpoints take turns
  within their class; fast and unproven take turns while the unproven hold fewer than
  ``slow_cap``, and beyond it a fast endpoint goes first. Among the unproven a *newcomer*
  (on probation, nothing in flight) goes first; one already at ``slow_per_endpoint`` gets a
  slot only when nobody else waits.
- A POST unanswered for ``stall_s`` is *stalled* (it then counts among the unproven). When
  no slot is free, one stalled POST is *cut* to make room for the endpoint whose turn it is,
  if that is a fast endpoint while the unproven hold more than ``slow_cap`` (the oldest of an
  endpoint whose last POST got no answer, else the oldest), or a newcomer (the oldest of an
  endpoint whose last POST got no answer: one that answers, if late, frees its slots
  itself). A cut ends the POST, which counts as a failed attempt of its own number (retried
  with backoff, as after its timeout; its receiver may have got it: a duplicate, never a
  loss). Nothing else is cut, and never a POST younger than ``stall_s``.

So however many endpoints hang, a fast endpoint waits about ``stall_s`` at most for its turn:
every POST in flight when it came has ended or stalled ``stall_s`` later, and what the
unproven then hold beyond ``slow_cap`` is cut. A newcomer (healthy or not: nothing tells them
apart yet) waits about ``stall_s`` for each ``total`` newcomers before it. A slow endpoint
alone uses every slot; beside busy fast ones, ``slow_cap``.

Nothing polls: a grant happens when a slot is given back or a waiter comes, a stall is one
``call_later`` per POST. Memory is bounded by the waiters (the engine queues one per
subscription) and ``REMEMBER`` idle endpoints of each class.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

STALL_S = 2.0  # a POST unanswered this long is stalled, and marks its endpoint slow
SLOW_FOR_S = 300.0  # an idle endpoint's slow mark is forgotten after this (longer than backoff)
REMEMBER = 4096  # idle endpoints remembered as fast, and as slow (each)

# Endpoint classes, and the turn queues (a probation or slow endpoint waits in NEW, SLOW or
# CAPPED by what it holds).
FAST, PROBATION, SLOW = "fast", "probation", "slow"
NEW, CAPPED = "new", "capped"


class Slot:
    """One POST's place among those in flight."""

    __slots__ = ("endpoint", "slow", "cut", "released", "task", "timer")

    def __init__(self, endpoint: str, slow: bool) -> None:
        self.endpoint = endpoint
        self.slow = slow  # counted among the unproven's slots (granted to one, or stalled)
        self.cut = False  # ended early to free the slot
        self.released = False
        self.task: asyncio.Future[Any] | None = None  # the POST, once it runs
        self.timer: asyncio.TimerHandle | None = None


class _Endpoint:
    __slots__ = ("key", "waiters", "inflight", "cls", "answers", "queue")

    def __init__(self, key: str, cls: str) -> None:
        self.key = key
        self.waiters: deque[asyncio.Future[Slot]] = deque()
        self.inflight = 0
        self.cls = cls  # FAST, PROBATION or SLOW
        self.answers = False  # its last POST that ended got an answer (however late)
        self.queue: str | None = None  # the turn queue it waits in


class Outbound:
    def __init__(
        self,
        total: int,
        *,
        slow_cap: int | None = None,
        slow_per_endpoint: int | None = None,
        stall_s: float = STALL_S,
        slow_for_s: float | None = None,
    ) -> None:
        self._total = max(1, total)
        # Half the slots are the unproven's share; a quarter of it per endpoint.
        self._slow_cap = max(1, self._total // 2) if slow_cap is None else slow_cap
        per = max(1, self._slow_cap // 4) if slow_per_endpoint is None else slow_per_endpoint
        self._slow_per_endpoint = per
        self._stall_s = stall_s
        self._slow_for_s = SLOW_FOR_S if slow_for_s is None else slow_for_s
        self._eps: dict[str, _Endpoint] = {}
        # Endpoints with waiters, in turn (an ordered dict: one moves to another in O(1)).
        self._queues: dict[str, OrderedDict[str, None]] = {
            kind: OrderedDict() for kind in (FAST, NEW, SLOW, CAPPED)
        }
        self._prefer_slow = False  # fast and unproven take turns within the unproven's share
        self._in_flight = 0
        self._slow_held = 0
        self._cutting = 0  # cut POSTs not yet given back
        self._stalled_slots: dict[Slot, None] = {}  # oldest first: the first cut
        self._fast_idle: OrderedDict[str, None] = OrderedDict()
        self._slow_idle: OrderedDict[str, float] = OrderedDict()  # when it went idle

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def acquire(self, endpoint: str) -> Slot:
        ep = self._eps.get(endpoint)
        if ep is None:
            ep = _Endpoint(endpoint, self._remembered(endpoint))
            self._eps[endpoint] = ep
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        ep.waiters.append(fut)
        self._relist(ep)
        self._pump()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # granted as it was cancelled: give it back
            elif self._eps.get(endpoint) is ep:
                self._relist(ep)
                self._forget_if_idle(ep)
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
        self._stalled_slots.pop(slot, None)
        if slot.cut:
            self._cutting -= 1
        self._relist(ep)  # what it holds may change its queue
        self._forget_if_idle(ep)
        self._pump()

    async def post(self, slot: Slot, call: Awaitable[T]) -> T | None:
        """Run the POST ``call`` in ``slot`` and give the slot back once it ends; None when it
        was cut. Its own task, so that a cut ends the POST and not its caller."""
        loop = asyncio.get_running_loop()
        task: asyncio.Future[T] = asyncio.ensure_future(call)
        slot.task = task
        started = loop.time()
        slot.timer = loop.call_later(self._stall_s, self._stalled, slot)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if slot.cut and task.cancelled() and (current is None or not current.cancelling()):
                return None
            raise
        finally:
            if not slot.cut and task.done() and not task.cancelled():
                ep = self._eps.get(slot.endpoint)
                if ep is not None:  # how long it took says whether the endpoint answers
                    ep.cls = FAST if loop.time() - started < self._stall_s else SLOW
                    ep.answers = task.exception() is None
            self.release(slot)

    # -- classes ----------------------------------------------------------------------------

    def _remembered(self, endpoint: str) -> str:
        """The class of an endpoint that comes back from idle (and it is forgotten there)."""
        if endpoint in self._fast_idle:
            del self._fast_idle[endpoint]
            return FAST
        idle_since = self._slow_idle.pop(endpoint, None)
        if idle_since is None:
            return PROBATION
        return SLOW if time.monotonic() - idle_since < self._slow_for_s else PROBATION

    def _forget_if_idle(self, ep: _Endpoint) -> None:
        if ep.waiters or ep.inflight or ep.queue is not None:
            return
        del self._eps[ep.key]
        if ep.cls == FAST:
            self._fast_idle[ep.key] = None
            self._fast_idle.move_to_end(ep.key)
            while len(self._fast_idle) > REMEMBER:
                self._fast_idle.popitem(last=False)
        elif ep.cls == SLOW:
            self._slow_idle[ep.key] = time.monotonic()
            self._slow_idle.move_to_end(ep.key)
            while len(self._slow_idle) > REMEMBER:
                self._slow_idle.popitem(last=False)

    # -- turns ------------------------------------------------------------------------------

    def _kind(self, ep: _Endpoint) -> str:
        if ep.cls == FAST:
            return FAST
        if ep.cls == PROBATION and ep.inflight == 0:
            return NEW
        return SLOW if ep.inflight < self._slow_per_endpoint else CAPPED

    def _relist(self, ep: _Endpoint) -> None:
        """Into the queue its class and holdings say now (keeping its place if unchanged),
        or out of any when nobody of it waits."""
        while ep.waiters and ep.waiters[0].done():  # cancelled waiters
            ep.waiters.popleft()
        kind = self._kind(ep) if ep.waiters else None
        if kind == ep.queue:
            return
        if ep.queue is not None:
            del self._queues[ep.queue][ep.key]
        ep.queue = kind
        if kind is not None:
            self._queues[kind][ep.key] = None

    def _head(self, kind: str) -> _Endpoint | None:
        queue = self._queues[kind]
        while queue:
            ep = self._eps[next(iter(queue))]
            self._relist(ep)  # drops cancelled waiters; out of the queue when none is left
            if ep.queue == kind and next(iter(queue)) == ep.key:
                return ep
            self._forget_if_idle(ep)
        return None

    def _choose(self) -> _Endpoint | None:
        """The endpoint whose turn it is (left in its queue)."""
        fast = self._head(FAST)
        if fast is not None and (self._slow_held >= self._slow_cap or not self._prefer_slow):
            return fast
        for kind in (NEW, SLOW):
            ep = self._head(kind)
            if ep is not None:
                return ep
        return fast if fast is not None else self._head(CAPPED)

    def _pump(self) -> None:
        while self._in_flight < self._total:
            ep = self._choose()
            if ep is None:
                return
            self._grant(ep)
        # Full. Cut the oldest stalled POST for a fast endpoint while the unproven hold more
        # than their share, or for a newcomer (one at a time: its slot comes back within a
        # turn of the loop, and this runs again).
        if self._cutting:
            return
        ep = self._choose()
        if ep is None or not (
            ep.queue == NEW or (ep.queue == FAST and self._slow_held > self._slow_cap)
        ):
            return
        victim = self._victim(answering=ep.queue == FAST)
        if victim is not None and victim.task is not None:
            victim.cut = True
            self._cutting += 1
            victim.task.cancel()

    def _victim(self, *, answering: bool) -> Slot | None:
        """The oldest stalled POST of an endpoint that did not answer its last one, else (if
        ``answering``) the oldest stalled POST."""
        fallback = None
        for slot in self._stalled_slots:
            if slot.task is None or slot.task.done() or slot.cut:
                continue
            ep = self._eps.get(slot.endpoint)
            if ep is None or not ep.answers:
                return slot
            if answering and fallback is None:
                fallback = slot
        return fallback

    def _grant(self, ep: _Endpoint) -> None:
        fut = ep.waiters.popleft()  # not done: _head dropped the cancelled ones
        slot = Slot(ep.key, ep.cls != FAST)
        ep.inflight += 1
        self._in_flight += 1
        if slot.slow:
            self._slow_held += 1
        self._prefer_slow = ep.cls == FAST
        assert ep.queue is not None
        del self._queues[ep.queue][ep.key]
        ep.queue = None
        self._relist(ep)  # its next waiter takes its turn after the others'
        fut.set_result(slot)

    def _stalled(self, slot: Slot) -> None:
        slot.timer = None
        if slot.released:
            return
        self._stalled_slots[slot] = None  # it may be cut now
        if not slot.slow:
            slot.slow = True
            self._slow_held += 1
        ep = self._eps.get(slot.endpoint)
        if ep is not None:
            ep.cls = SLOW
            self._relist(ep)
        self._pump()
