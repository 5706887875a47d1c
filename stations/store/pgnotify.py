"""PostgreSQL LISTEN/NOTIFY: a reader waiting at one process wakes on another's append.

Each commit that changes streams sends ``pg_notify('stations', name)`` inside its transaction;
PostgreSQL delivers it to every listener only once the transaction commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stations.repeats import Repeats
from stations.store import db

if TYPE_CHECKING:
    from psycopg import AsyncConnection

CHANNEL = "stations"
# A connection can die without a word (a NAT or firewall forgets it, a failover): then no
# notification and no error ever come, and readers keep answering from their last look at the
# tail. So after this long the listener asks the database for an answer on that connection...
HEARTBEAT_S = 3.0
ANSWER_S = 5.0  # ...and replaces the connection when none comes this fast.
STEADY_S = 1.0  # a LISTEN connection lost after this long is reconnected at once (see _run)
CONNECT_S = 10  # libpq's connect_timeout: a reconnect into the same silence gives up too
APPLICATION_NAME = "stations listen"  # tells operators (and tests) which connection this is
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
        # Lost and reconnecting every second while the database is away: logged once.
        self._failures = Repeats(logger, "LISTEN connection (reconnecting)")
        # A connection that worked and was ended, replaced at once: a line, then at most one a
        # minute with a count (a server that ends connections every few seconds, an
        # idle_session_timeout say). Never "works again": it is no outage.
        self._drops = Repeats(
            logger, "LISTEN connection (ended; reconnecting at once)", level=logging.WARNING
        )

    @property
    def failing(self) -> bool:
        """Whether the LISTEN connection cannot be made now (reconnecting since it failed)."""
        return self._failures.failing is not None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 30)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        up: float | None = None  # when the connection that just ended began to work
        while True:
            import psycopg

            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=CONNECT_S,
                    application_name=APPLICATION_NAME,
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._failures.succeeded()
                    up = time.monotonic()
                    # Commits made while no LISTEN ran were never announced: wake everyone.
                    self._on_connect()
                    self._ready.set()
                    while True:
                        async for note in conn.notifies(timeout=HEARTBEAT_S):
                            if note.pid != self._own_pid():
                                self._fire({note.payload})
                        # Notifications arriving meanwhile wait for the next notifies()
                        # (psycopg >= 3.2.4 keeps them).
                        timer = asyncio.get_running_loop().call_later(ANSWER_S, _abort, conn)
                        try:
                            await conn.execute("SELECT 1")
                        finally:
                            timer.cancel()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Waiters still wake on this process's own commits and on their timeouts.
                self._ready.set()
                worked, up = up, None
                if worked is not None and time.monotonic() - worked >= STEADY_S:
                    # A connection that worked ended (an operator's pg_terminate_backend, a
                    # restart, a failover): one line, and a new one at once. Only a reconnect
                    # that fails (or a connection ended as soon as made) is an outage: an
                    # ERROR, then a line a minute. Every single drop was an ERROR and a
                    # "works again" line.
                    self._drops.failed(exc, traceback=False)
                    continue
                self._failures.failed(exc, traceback=not db.unavailable(exc))
                await asyncio.sleep(1)


def _abort(conn: AsyncConnection[Any]) -> None:
    """Shut the connection's socket: the query waiting on it fails at once. (Cancelling the
    query instead makes psycopg wait 10 s for the server to confirm the cancel, in vain.)"""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
