"""PostgreSQL LISTEN/NOTIFY: a reader waiting at one process wakes on another's append.

Each commit that changes streams sends ``pg_notify('stations', name)`` inside its transaction;
PostgreSQL delivers it to every listener only once the transaction commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

CHANNEL = "stations"
logger = logging.getLogger("stations.store.pgnotify")


class Listener:
    def __init__(
        self,
        dsn: str,
        fire: Callable[[set[str]], None],
        on_connect: Callable[[], None] = lambda: None,
        own_pid: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._dsn = dsn  # a libpq connection string (``stations.store.db.listen_dsn``)
        self._fire = fire
        self._on_connect = on_connect
        # The backend of this process's writer: its commits were fired locally already, and a
        # late echo would only send waiting fetches for a needless look of their own.
        self._own_pid = own_pid
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 30)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            import psycopg

            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Commits made while no LISTEN ran were never announced: wake everyone.
                    self._on_connect()
                    self._ready.set()
                    async for note in conn.notifies():
                        if note.pid != self._own_pid():
                            self._fire({note.payload})
            except asyncio.CancelledError:
                raise
            except Exception:
                # Waiters still wake on this process's own commits and on their timeouts.
                logger.warning("LISTEN connection lost; reconnecting", exc_info=True)
                self._ready.set()
                await asyncio.sleep(1)
