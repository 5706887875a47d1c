"""A global budget for the bytes of read pages held in memory, across every connection.

A catch-up page is up to a few MB; a client that asks for pages and never reads them would
otherwise pin one per connection. Each read takes a grant before it runs (waiting, in order,
while the budget is spent), trims it to what the page really holds, and keeps that much until
the page object is freed: a page shared by many waiters is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable

MIN_GRANT = 64 * 1024  # a read waits for at least this much room rather than run tiny pages
# How long a read waits for room before ``on_starved`` is told (and again while it waits): the
# pages holding the budget may be those of clients that stopped reading.
STARVED_S = 1.0


class Overloaded(Exception):
    """The budget stayed spent for the whole wait: the caller should answer 503."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class ByteBudget:
    def __init__(self, limit: int, wait_s: float = 10.0) -> None:
        self.limit = limit
        self.used = 0
        self.wait_s = wait_s
        # Called with STARVED_S while reads have waited that long for room (the HTTP layer
        # closes the connections of clients that stopped reading, whose pages hold it).
        self.on_starved: Callable[[float], object] | None = None
        self._starved_timer: asyncio.TimerHandle | None = None
        # (room needed, bytes wanted, whole, the waiter's future: its grant, alive)
        self._waiters: deque[tuple[int, int, bool, asyncio.Future[int], Callable[[], bool]]] = (
            deque()
        )

    @property
    def free(self) -> int:
        return self.limit - self.used

    async def take(
        self, want: int, alive: Callable[[], bool] = lambda: True, *, whole: bool = False
    ) -> int:
        """Reserve up to ``want`` bytes; returns the grant (less when the budget is short).
        ``whole``: all of ``want``, waiting for that much room (for more than the whole budget:
        until nothing else is held).

        ``alive()`` False (the client left while waiting) ends the wait with ConnectionError.
        """
        need = min(want, self.limit) if whole else min(want, MIN_GRANT, self.limit)
        if not self._waiters and self.free >= need:
            return self._grant(want, whole)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (need, want, whole, future, alive)
        self._waiters.append(entry)
        self._wake()  # room now, behind a whole read that waits for more: taken at once
        if self._waiters and self._starved_timer is None and self.on_starved is not None:
            self._starved_timer = asyncio.get_running_loop().call_later(STARVED_S, self._starved)
        try:
            # The grant is counted when the waiter is woken, not when it runs again: nothing
            # that comes in between can take the room it was woken for.
            return await asyncio.wait_for(future, self.wait_s)
        except BaseException as exc:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif future.done() and not future.cancelled() and future.exception() is None:
                self.give(future.result())  # granted, but not taken after all
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    "the server holds too many unread responses; retry shortly"
                ) from None
            raise

    def _starved(self) -> None:
        self._starved_timer = None
        if not any(not entry[3].done() for entry in self._waiters):
            return
        assert self.on_starved is not None
        self.on_starved(STARVED_S)
        self._starved_timer = asyncio.get_running_loop().call_later(STARVED_S, self._starved)

    def _grant(self, want: int, whole: bool) -> int:
        grant = want if whole else max(min(want, self.free), 0)
        self.used += grant
        return grant

    def give(self, nbytes: int) -> None:
        if nbytes:
            self.used -= nbytes
            self._wake()

    def hold(self, owner: object, granted: int, size: int) -> None:
        """Turn a grant into ``size`` bytes kept until ``owner`` is garbage."""
        self.used += size - granted
        if size:
            weakref.finalize(owner, self.give, size)
        self._wake()

    @contextlib.asynccontextmanager
    async def room(
        self, want: int, alive: Callable[[], bool] = lambda: True
    ) -> AsyncIterator[Room]:
        """A grant (as ``take``) held until the block ends: for an answer built from the
        page and sent inside the block (``Room.resize`` to what it really holds)."""
        room = Room(self, await self.take(want, alive))
        try:
            yield room
        finally:
            room.resize(0)

    def charge(self, owner: object, size: int) -> None:
        """Count ``size`` more bytes (a copy built from ``owner``) for ``owner``'s lifetime."""
        self.hold(owner, 0, size)

    def _wake(self) -> None:
        # In order: the first waiter is served before a later, smaller one; but a read waiting
        # for room for a whole large message does not hold back the reads behind it (it may
        # wait its whole time and be refused; they would all wait with it).
        k = 0
        while k < len(self._waiters):
            need, want, whole, future, alive = self._waiters[k]
            if future.done():
                del self._waiters[k]
                continue
            if self.free < need:
                if whole:
                    k += 1
                    continue
                break
            del self._waiters[k]
            if not alive():
                future.set_exception(ConnectionResetError("the client left while waiting"))
                continue
            future.set_result(self._grant(want, whole))


class Room:
    """Bytes of the budget held by one answer while it is built and sent (``ByteBudget.room``)."""

    def __init__(self, budget: ByteBudget, granted: int) -> None:
        self.budget = budget
        self.granted = granted  # what the read may fetch
        self.size = granted  # what is counted now

    def resize(self, size: int) -> None:
        """Count ``size`` bytes from now on (more than granted: a page holds one message at
        least, and an answer encodes its page)."""
        self.budget.used += size - self.size
        self.size = size
        self.budget._wake()
