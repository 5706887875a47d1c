"""The requests in progress, for a shutdown (SIGTERM) to let them finish before it stops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from stations.api.limits import ReaderSlots

# How long waiting reads get to write the answer they were told to give at the drain's start
# (``Service.end_all_waits``), and cancelled handlers to end, before their connections close.
READER_GRACE_S = 1.0


class Drain:
    """The requests in progress, for a shutdown to finish. aiohttp's own signal handling
    cancelled every handler at once: a write committed while its client was told nothing, so
    a retry without a message id stored it twice. (Its graceful shutdown is no better here:
    it stops reading the connections first, so a body still arriving never completes.)

    Waiting reads (long-poll, SSE, group fetches: ``app[READERS]``) are not waited for,
    which would hold a restart for up to their timeouts: they answer at once as at their
    timeout (``Service.end_all_waits``: a long-poll's 204, a fetch's empty page, an SSE
    response ends), and their clients read again from where they were. A waiting read still
    in progress after ``READER_GRACE_S``, and any other request after the drain's timeout, ends
    as when its client leaves.

    The edge middleware (``stations.api.edge``) calls ``enter`` and ``leave`` around every
    request."""

    def __init__(self, readers: ReaderSlots, end_waits: Callable[[], None]) -> None:
        self.readers = readers  # ``used``: waiting reads in progress
        self.end_waits = end_waits
        self.handlers: set[asyncio.Task[Any]] = set()
        self.draining = False
        # Set whenever a handler starts or ends or a waiting read starts or ends: the drain
        # waits on it.
        self.moved = asyncio.Event()
        readers.changed = self.moved.set

    def enter(self) -> asyncio.Task[Any]:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        if self.draining:  # a request on a kept-alive connection: the drain waits for it too
            self.moved.set()
        return task

    def leave(self, task: asyncio.Task[Any]) -> None:
        self.handlers.discard(task)
        if self.draining:
            self.moved.set()

    async def settle(self, timeout: float) -> int:
        """End the waits (they answer as at their timeout); give waiting reads
        ``READER_GRACE_S`` and every other request the whole ``timeout`` to finish; then end
        what is left, and return how many requests other than waiting reads that was.
        Connections stay open meanwhile: a request on a kept-alive one is answered too, and
        closes it."""
        self.draining = True
        self.end_waits()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # The waiting reads were told to answer: a moment for them to write it. Any other
        # request (one begun meanwhile on a kept-alive connection too) has the drain's whole
        # time: cut at the grace, a write could commit with its client told nothing.
        grace = min(deadline, loop.time() + READER_GRACE_S)
        while self.handlers:
            until = deadline if len(self.handlers) > self.readers.used else grace
            if loop.time() >= until or not await self._moved_by(until):
                break
        cut = max(0, len(self.handlers) - self.readers.used)
        left = list(self.handlers)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=READER_GRACE_S)
        return cut

    async def _moved_by(self, deadline: float) -> bool:
        """Whether a handler began or ended or a waiting read began or ended before
        ``deadline``."""
        self.moved.clear()
        try:
            await asyncio.wait_for(self.moved.wait(), deadline - asyncio.get_running_loop().time())
        except TimeoutError:
            return False
        return True


async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """Every response prepared during a drain closes its connection (``on_response_prepare``):
    a stream (SSE, a large read) too, which the handler prepares itself. Kept alive, an SSE
    that ends at once (the waits are over) was asked again and again on one connection."""
    if request.app[DRAIN].draining:
        response.force_close()
        # aiohttp wrote its Connection header before this hook: the client is told here.
        response.headers["Connection"] = "close"


# Its object in the application (see stations.api.keys).
DRAIN: web.AppKey[Drain] = web.AppKey("drain")
