"""The database as the service sees it: both engines, the group-commit writer, the readers'
threads, schema upgrades and the wake-ups other processes send (PostgreSQL LISTEN/NOTIFY).

The service hands it plain functions: ``write(op)`` runs ``op(batch)`` in the writer's next
transaction, ``read(fn, ...)`` runs ``fn(tx, ...)`` in a read transaction on a reader thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from stations.store import clock, db
from stations.store.checkpoints import Checkpoints, WalFigures
from stations.store.db import Tx
from stations.store.idruns import IdRuns
from stations.store.pgnotify import Listener
from stations.store.writer import Batch, Writer

T = TypeVar("T")
# While the writer's own batches failed this recently (seconds), a probe write that commits
# does not say writes work (see ``Database.writes_failing``): an idle server's probe decides
# once they are older.
FRESH_FAILURE_S = 10.0
# About two WAL autocheckpoints' worth: a disk with less free is full for a batch of appends.
MIN_FREE_BYTES = 8 << 20


class Database:
    def __init__(
        self, url: str | None, *, durability: str = "fsync", read_threads: int = 4
    ) -> None:
        self.url = db.normalize_url(url or db.default_url())
        self._snapshot = db.snapshot_options(self.url)
        self.durability = durability
        # One process owns an embedded database (SQLite); others may be shared by several.
        self.embedded = db.embedded(self.url)
        self._read_threads = read_threads
        self._listener: Listener | None = None
        self.checkpoints: Checkpoints | None = None
        self._probed_after = -1  # the writer's failed batches when a probe write last committed
        # A writer's batch failed this recently: its writes fail, whatever a probe says (see
        # ``writes_failing``).
        self.fresh_failure_s = FRESH_FAILURE_S
        # After the writer's latest batch failed for a full disk, less free space than this on
        # an embedded database's disk says writes still fail, whatever a probe says
        # (``disk_short``).
        self.min_free_bytes = MIN_FREE_BYTES

    async def open(
        self,
        on_commit: Callable[[set[str]], None],
        runs: IdRuns | None,
        *,
        on_batch: Callable[[int, float], None] | None = None,
        on_listen: Callable[[], None] | None = None,
        lock_in_order: Callable[[Batch, list[str]], None] | None = None,
    ) -> None:
        """Connect, bring the schema up to date and start the writer. ``on_commit`` hears the
        names of the streams every commit changed, this process's and (PostgreSQL) others';
        ``on_batch`` each transaction's ops and seconds (monitoring); ``on_listen`` that the
        LISTEN connection (re)connected, so notifications may have been missed;
        ``lock_in_order`` how a batch locks its stations up front (see ``Writer``)."""
        loop = asyncio.get_running_loop()
        self.write_engine = db.make_engine(self.url, durability=self.durability, writer=True)
        self.read_engine = db.make_engine(self.url, durability=self.durability)
        self._readers = ThreadPoolExecutor(self._read_threads, thread_name_prefix="stations-read")
        await loop.run_in_executor(self._readers, db.upgrade, self.write_engine)
        await loop.run_in_executor(self._readers, clock.sync, self.read_engine)
        if runs is not None:
            await loop.run_in_executor(self._readers, runs.load, self.read_engine)
        path = db.database_file(self.url)
        if path is not None:
            checkpoints = Checkpoints(
                path, self.read_engine.raw_connection, db.WAL_AUTOCHECKPOINT_PAGES
            )
            if await loop.run_in_executor(self._readers, checkpoints.start):
                self.checkpoints = checkpoints
        self.writer = Writer(
            self.write_engine,
            on_commit,
            on_batch=on_batch,
            fsync=self.durability == "fsync",
            checkpoints=self.checkpoints,
        )
        if lock_in_order is not None:
            self.writer.lock_in_order = lock_in_order
        self.writer.start()
        dsn = db.listen_dsn(self.url)
        if dsn is not None:
            # The writer's own commits were fired locally already: the listener skips their echo.
            writer = self.writer
            self._listener = Listener(
                dsn, on_commit, on_listen or (lambda: None), own_pid=lambda: writer.backend_pid
            )
            await self._listener.start()

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await self.writer.stop()
        checkpoints, self.checkpoints = self.checkpoints, None
        if checkpoints is not None:
            checkpoints.stop()
        self._readers.shutdown(wait=True)
        self.write_engine.dispose()
        self.read_engine.dispose()
        if checkpoints is not None:
            checkpoints.release()  # after the last connection: see Checkpoints.start

    def wal(self) -> WalFigures | None:
        """The WAL's figures when this process checkpoints it (an SQLite file), else None."""
        return self.checkpoints.figures() if self.checkpoints is not None else None

    def enqueue(
        self,
        op: Callable[[Batch], T],
        sort_key: Any = None,
        relaxed: bool = False,
        *,
        small: bool = False,
        first: bool = False,
        future: asyncio.Future[Any] | None = None,
        locks: tuple[str, ...] = (),
    ) -> asyncio.Future[T]:
        """Queue ``op`` for the writer now (ops queued in one step of the event loop share a
        transaction, in order); the future is answered after the commit. ``relaxed``,
        ``small``, ``first``, ``future``, ``locks``: see ``Writer.enqueue``."""
        return self.writer.enqueue(
            op, sort_key, relaxed, small=small, first=first, future=future, locks=locks
        )

    async def write(
        self,
        op: Callable[[Batch], T],
        sort_key: Any = None,
        relaxed: bool = False,
        *,
        small: bool = False,
        locks: tuple[str, ...] = (),
        alone: bool = False,
    ) -> T:
        """Run ``op(batch)`` in the writer's next transaction; answered after the commit.
        ``locks``, ``alone``: how it locks stations (see ``Writer.enqueue``)."""
        result: T = await self.writer.submit(
            op, sort_key, relaxed, small=small, locks=locks, alone=alone
        )
        return result

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(tx, *args, **kwargs)`` in a read transaction on a reader thread."""

        def run() -> T:
            with self.read_engine.connect() as conn:
                conn.execution_options(**self._snapshot)
                with conn.begin():
                    return fn(conn, *args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._readers, run)

    async def refresh_statistics(self) -> list[str]:
        """Refresh the planner's statistics of tables that grew (see ``db.analyze_grown``)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._readers, db.analyze_grown, self.read_engine
        )

    async def sync_clock(self) -> None:
        """Measure the database's clock again (see ``stations.store.clock``)."""
        await asyncio.get_running_loop().run_in_executor(
            self._readers, clock.sync, self.read_engine
        )

    async def ping(self) -> None:
        """Raise unless the database answers a trivial query."""
        await asyncio.get_running_loop().run_in_executor(self._readers, db.ping, self.read_engine)

    @property
    def notifications_failing(self) -> bool:
        """PostgreSQL: whether this process hears no other process's commits now (its LISTEN
        connection cannot be made): waits for their appends end only at their timeouts."""
        return self._listener is not None and self._listener.failing

    @property
    def writes_failing(self) -> str | None:
        """Why the writer's latest batch failed, while none has written since and no probe
        write (``probe_writes``) has committed since; else None. A batch that failed in the
        last ``fresh_failure_s`` says so whatever a probe said: on a full disk the probe's
        one small row fitted in the WAL space failed batches had taken, and readiness said
        "ok" between two failed produces while every one of them failed."""
        failing = self.writer.failing
        if failing is None:
            return None
        if self.writes_failed_recently:
            return failing
        if self._probed_after != self.writer.failed_batches:
            return failing
        return self.disk_short()  # a probe committed: unless the disk is still (nearly) full

    @property
    def writes_failed_recently(self) -> bool:
        return time.monotonic() - self.writer.failed_at < self.fresh_failure_s

    def disk_short(self) -> str | None:
        """The writer's latest batch failed for a full disk, and an embedded database's disk
        still has less than ``min_free_bytes`` free: said as a reason, else None. On a full
        disk a probe's one small row still fitted in WAL space failed batches had taken: with
        writes 15 s apart, readiness said "ok" a third of the time while every produce failed
        (found by a review on a 3 MB tmpfs)."""
        path = db.database_file(self.url) if self.embedded else None
        if path is None or not self.writer.failed_full:
            return None  # a lock held too long, say: the probe says whether writes work
        path = os.path.realpath(path)  # SQLite writes its WAL beside the file, not the link
        try:
            free = shutil.disk_usage(os.path.dirname(path)).free
        except OSError:
            return None
        if free >= self.min_free_bytes:
            return None
        return f"the disk holding {path} has {free} bytes free"

    @property
    def write_busy_for(self) -> float:
        """Seconds the writer's current transaction has run (see ``Writer.busy_for``)."""
        return self.writer.busy_for

    async def probe_writes(self) -> None:
        """Raise unless a small write commits, on a connection of its own: through the
        writer, its success told the writer its writes worked again while larger ones still
        failed (a full disk), and the log went back to a failure and a recovery per probe.
        Its success ends ``writes_failing`` until the writer's next failed batch (the log
        waits for a write of the writer's own): else an idle server said writes failed,
        and probed on every readiness check, long after the disk had room again."""
        failed = self.writer.failed_batches

        def probe() -> None:
            with self.read_engine.begin() as conn:
                db.probe_write(conn)

        await asyncio.get_running_loop().run_in_executor(self._readers, probe)
        self._probed_after = failed

    @staticmethod
    def unavailable(exc: BaseException) -> bool:
        """Whether ``exc`` means the database (or its disk) failed: see ``db.unavailable``."""
        return db.unavailable(exc)

    def read_sync(self, fn: Callable[[Tx], T]) -> T:
        """For tests and tools: run ``fn`` on a read connection, blocking."""
        with self.read_engine.connect() as conn:
            return fn(conn)
