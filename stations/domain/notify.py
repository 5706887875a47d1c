"""Wake-ups for readers waiting at a stream's tail (long-poll, SSE, group fetches).

A waiter subscribes *before* it reads, so an append that commits between its read and its wait
still wakes it. Nothing here polls the database: the writer fires after each commit, and on
PostgreSQL a LISTEN connection relays commits made by other processes (see ``pgnotify``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        # Called with the keys of every fire (subscriptions wake on appends this way).
        self.listeners: list[Callable[[set[str]], None]] = []

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
            for future in self._waiters.pop(key, ()):
                if not future.done():
                    future.set_result(None)
        for listener in self.listeners:
            listener(keys)

    async def wait(self, future: asyncio.Future[None], timeout: float) -> bool:
        """True when woken, False on timeout."""
        if timeout <= 0:
            return future.done()
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return False
