"""Wake-ups for readers waiting at a stream's tail (long-poll, SSE, group fetches).

A waiter subscribes *before* it reads, so an append that commits between its read and its wait
still wakes it. Nothing here polls the database: the writer fires after each commit, and on
PostgreSQL a LISTEN connection relays commits made by other processes (see ``pgnotify``).

Reads are shared within a *generation*: the time between two fires of a key. While no fire has
come, the database holds nothing new for that key that a read begun in the generation missed, so
every reader of the same position gets the one read's result, and a reader at the tail a read
of this generation saw needs no read at all (the generation's ``snapshot``). One append thus
costs one read for all the readers woken at the same position, however many they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class _Flight:
    """One read in progress and the callers waiting for its result."""

    __slots__ = ("task", "waiters")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.waiters: list[asyncio.Future[Any]] = []


class _Generation:
    __slots__ = ("flights", "snapshot")

    def __init__(self) -> None:
        self.flights: dict[Hashable, _Flight] = {}
        self.snapshot: Any = None


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        # Called with the keys of every fire (subscriptions wake on appends this way).
        self.listeners: list[Callable[[set[str]], None]] = []
        self._generations: dict[str, _Generation] = {}

    def subscribe(self, key: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, set()).add(future)
        return future

    def unsubscribe(self, key: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[key]
        if not future.done():
            future.cancel()

    def fire(self, keys: Iterable[str]) -> None:
        if not isinstance(keys, set):
            keys = set(keys)
        for key in keys:
            self._generations.pop(key, None)
            waiters = self._waiters.pop(key, None)
            if waiters:
                _wake(list(waiters))
        for listener in self.listeners:
            listener(keys)

    def fire_all(self) -> None:
        """Something may have changed anywhere (a lost LISTEN connection came back)."""
        self.fire(set(self._waiters) | set(self._generations))

    async def wait(self, future: asyncio.Future[None], timeout: float) -> bool:
        """True when woken, False on timeout."""
        if timeout <= 0:
            return future.done()
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return False

    # -- shared reads -----------------------------------------------------------------------

    def snapshot(self, key: str) -> Any:
        """What a read of the current generation left for later readers (None: nothing)."""
        generation = self._generations.get(key)
        return None if generation is None else generation.snapshot

    async def shared(
        self,
        key: str,
        part: Hashable,
        read: Callable[[], Awaitable[T]],
        keep: Callable[[T], Any] = lambda _result: None,
    ) -> T:
        """``read()`` once for every caller asking for ``part`` of ``key`` in this generation.

        Callers must have subscribed to ``key`` first. ``keep(result)``, if not None, becomes the
        generation's snapshot (unless a fire ended the generation meanwhile).
        """
        generation = self._generations.get(key)
        if generation is None:
            generation = self._generations[key] = _Generation()
        flight = generation.flights.get(part)
        if flight is None:
            flight = generation.flights[part] = _Flight()

            async def run() -> T:
                try:
                    result = await read()
                finally:
                    generation.flights.pop(part, None)
                kept = keep(result)
                if kept is not None:
                    generation.snapshot = kept
                return result

            # A task of its own: one caller going away does not cancel the others' read.
            flight.task = asyncio.get_running_loop().create_task(run())
            flight.task.add_done_callback(lambda task: _deliver(task, flight.waiters))
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        flight.waiters.append(future)
        return await future


WAKE_BATCH = 64


def _wake(futures: list[asyncio.Future[Any]], start: int = 0, value: Any = None) -> None:
    """Wake waiters a batch per event-loop turn: between batches the loop reads its sockets,
    so a producer's request is not queued behind a thousand readers' answers."""
    for future in futures[start : start + WAKE_BATCH]:
        if not future.done():
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)
    if start + WAKE_BATCH < len(futures):
        asyncio.get_running_loop().call_soon(_wake, futures, start + WAKE_BATCH, value)


def _deliver(task: asyncio.Task[Any], waiters: list[asyncio.Future[Any]]) -> None:
    """A shared read is done: hand its result (or error) to its callers, in batches."""
    if task.cancelled():
        _wake(waiters, 0, asyncio.CancelledError())
    elif task.exception() is not None:
        _wake(waiters, 0, task.exception())
    else:
        _wake(waiters, 0, task.result())
