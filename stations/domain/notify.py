"""Wake-ups for readers waiting at a stream's tail (long-poll, SSE, group fetches).

A waiter subscribes *before* it reads, so an append that commits between its read and its wait
still wakes it. Nothing here polls the database: the writer fires after each commit, and on
PostgreSQL a LISTEN connection relays commits made by other processes (see ``pgnotify``).

Reads are shared within a *generation*: the time between two fires of a key. While no fire has
come, the database holds nothing new for that key that a read begun in the generation missed, so
every reader of the same position gets the one read's result, and a reader at the tail a read
of this generation saw needs no read at all (the generation's ``snapshot``). One append thus
costs one read for all the readers woken at the same position, however many they are.

Answers are *paced* when many readers wait on one station (``pace``), like Kafka's
``fetch.min.bytes``/``fetch.max.wait``: each append would otherwise cost one HTTP answer and one
new request per reader, and 1,000 readers at 50 appends/s are 50,000 answers a second, which
starve the producers' requests. With more than ``LINGER_FREE_READERS`` readers attached to a
station, an answer that reached the tail (a catch-up page, EOF or a timeout is never held) waits
for the station's next *release*; releases are at least ``linger`` apart, ``linger`` =
``LINGER_PER_READER_S`` per attached reader, at most ``LINGER_MAX_S``. Each answer then carries
every message of its wait, and a station sends at most about ``1 / LINGER_PER_READER_S`` answers
a second (``readers / LINGER_MAX_S`` beyond the cap). Releases are one-shot timers set by a
held answer, never a polling loop; with few readers nothing is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator
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


LINGER_FREE_READERS = 64  # up to this many readers of a station: answers are never held
LINGER_PER_READER_S = 0.002  # beyond it, releases are this much apart per reader...
LINGER_MAX_S = 2.0  # ...and at most this much
# Released answers are woken this many per loop turn: each costs an answer and a new request,
# and a producer's request waits for about one such batch.
RELEASE_BATCH = 16
WRITE_FIRST_S = 0.05  # a batch of released answers waits at most this long for writes in flight


def linger_for(readers: int) -> float:
    """How far apart a station's releases are, with ``readers`` attached to it."""
    if readers <= LINGER_FREE_READERS:
        return 0.0
    return min(LINGER_MAX_S, readers * LINGER_PER_READER_S)


class _Gate:
    """A station's pacing: its attached readers, its last release, the answers held for the next."""

    __slots__ = ("readers", "recent", "last", "held", "timer")

    def __init__(self) -> None:
        self.readers = 0
        # Readers attached at the last release: between two long-poll requests a reader is not
        # attached, so right after a release the count alone would fall and splinter the cohort.
        self.recent = 0
        self.last = float("-inf")
        self.held: list[asyncio.Future[None]] = []
        self.timer: asyncio.TimerHandle | None = None

    def linger(self) -> float:
        return linger_for(max(self.readers, self.recent))


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        # Called with the keys of every fire (subscriptions wake on appends this way).
        self.listeners: list[Callable[[set[str]], None]] = []
        # Called when anything may have changed unannounced (see ``fire_all``).
        self.resync: list[Callable[[], None]] = []
        self._generations: dict[str, _Generation] = {}
        self._gates: dict[str, _Gate] = {}
        self._writes = 0  # writes in flight: releases of held answers wait for them
        self._after_writes: list[Callable[[], None]] = []

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

    def wake_all(self) -> None:
        """Wake every waiter, for nothing new, and release every held answer (a shutdown
        ends the waits: a held one waited up to ``LINGER_MAX_S``, past the drain's grace). No
        listener hears of it, so no parked fetch leases again."""
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            _wake(list(futures))
        for gate in self._gates.values():
            if gate.timer is not None:
                gate.timer.cancel()
                gate.timer = None
            held, gate.held = gate.held, []
            _wake(held)

    def fire_all(self) -> None:
        """Something may have changed anywhere (a lost LISTEN connection came back)."""
        self.fire(set(self._waiters) | set(self._generations))
        for resync in self.resync:
            resync()

    async def wait(self, future: asyncio.Future[None], timeout: float) -> bool:
        """True when woken, False on timeout."""
        if timeout <= 0:
            return future.done()
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return False

    # -- pacing ---------------------------------------------------------------------------------

    def attach(self, key: str) -> None:
        """A reader of ``key`` begins (a long-poll request, an SSE connection's wait)."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate()
        gate.readers += 1

    def detach(self, key: str) -> None:
        gate = self._gates.get(key)
        if gate is None:
            return
        gate.readers -= 1
        if gate.readers <= 0:  # held answers are attached readers: none is left behind
            if gate.timer is not None:
                gate.timer.cancel()
            del self._gates[key]

    def readers(self, key: str) -> int:
        gate = self._gates.get(key)
        return 0 if gate is None else gate.readers

    def pace(self, key: str) -> asyncio.Future[None] | None:
        """None: answer now. Else a future done at ``key``'s next release: the answer is held
        until then (and should read again, to carry what came meanwhile)."""
        gate = self._gates.get(key)
        if gate is None:
            return None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not gate.held and now >= gate.last + gate.linger():
            gate.last = now  # released at once: nothing was sent for a whole linger
            return None
        future: asyncio.Future[None] = loop.create_future()
        gate.held.append(future)
        if gate.timer is None:
            gate.timer = loop.call_at(gate.last + gate.linger(), self._release, gate)
        return future

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write in flight: a release's next batch of answers waits until no write is (at
        most ``WRITE_FIRST_S``), so a producer's request is not queued behind the fan-out."""
        self._writes += 1
        try:
            yield
        finally:
            self._writes -= 1
            if not self._writes and self._after_writes:
                resume, self._after_writes = self._after_writes, []
                for fn in resume:
                    fn()

    def _after_writing(self, fn: Callable[[], None]) -> None:
        if not self._writes:
            fn()
            return
        done = False

        def once() -> None:
            nonlocal done
            if not done:
                done = True
                fn()

        self._after_writes.append(once)
        asyncio.get_running_loop().call_later(WRITE_FIRST_S, once)  # never starve readers

    def _release_batch(self, held: list[asyncio.Future[None]], start: int) -> None:
        for future in held[start : start + RELEASE_BATCH]:
            if not future.done():
                future.set_result(None)
        if start + RELEASE_BATCH < len(held):
            # The next batch after a loop turn (sockets are read) and after the writes in flight.
            loop = asyncio.get_running_loop()
            after = functools.partial(self._release_batch, held, start + RELEASE_BATCH)
            loop.call_soon(self._after_writing, after)

    def _release(self, gate: _Gate) -> None:
        gate.timer = None
        loop = asyncio.get_running_loop()
        due = gate.last + gate.linger()
        if loop.time() < due:  # more readers came meanwhile: the linger grew
            gate.timer = loop.call_at(due, self._release, gate)
            return
        gate.last = loop.time()
        gate.recent = gate.readers
        held, gate.held = gate.held, []
        self._after_writing(functools.partial(self._release_batch, held, 0))

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
                except BaseException:
                    generation.flights.pop(part, None)
                    # A read that failed (no such stream, a 404 after its delete) leaves
                    # nothing to share; kept, the generation of a name nothing fires again
                    # stayed for good: one per name a reader asked for, any name.
                    if (
                        not generation.flights
                        and generation.snapshot is None
                        and self._generations.get(key) is generation
                    ):
                        del self._generations[key]
                    raise
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
