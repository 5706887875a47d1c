"""Group commit: every write goes through one writer, which runs whatever has queued up in a
single transaction and fsync, then answers each request.

While one transaction commits, the next requests queue; they share the next commit. Concurrent
single appends therefore cost one fsync per *batch*, not per append, yet nothing is acknowledged
before its commit returns. The database work runs in one dedicated thread so the event loop
keeps serving reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from stations.domain.errors import StationsError
from stations.domain.streams import StreamState
from stations.store import db, sql
from stations.store.pgnotify import CHANNEL
from stations.store.schema import messages
from stations.store.streams import load

log = logging.getLogger("stations.store.writer")

# An op is a function run inside the batch's transaction; it returns the request's answer or
# raises a StationsError, and must not write anything before it has decided to succeed.
Op = Callable[["Batch"], Any]
MAX_BATCH = 512
NOTIFY = "SELECT pg_notify(%s, %s)"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Batch:
    """The unit of work of one transaction: loaded state plus the rows to write at commit."""

    conn: Connection
    now: int
    streams: dict[str, StreamState | None] = field(default_factory=dict)
    dirty: dict[int, StreamState] = field(default_factory=dict)
    # Rows to insert at commit, as tuples in column order (see _INSERT_MESSAGE / _INSERT_ID).
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    ids: list[tuple[Any, ...]] = field(default_factory=list)
    sessions: dict[tuple[int, str], Any] = field(default_factory=dict)
    dirty_sessions: set[tuple[int, str]] = field(default_factory=set)
    # Ids stored by this batch, until it commits: stream id -> {msg_id: position}.
    pending_ids: dict[int, dict[str, int]] = field(default_factory=dict)
    # SQLite: the ids of this batch per station, written as one id_blocks row each at flush.
    id_blocks: dict[int, Any] = field(default_factory=dict)
    block_writer: Callable[[Batch], None] | None = None
    changed: set[str] = field(default_factory=set)  # stream names whose readers must wake
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    # Run once after the ops, inside the transaction (keyed, so an op may ask more than once).
    before_commit: dict[Any, Callable[[Batch], None]] = field(default_factory=dict)

    def stream(self, name: str) -> StreamState | None:
        if name not in self.streams:
            self.streams[name] = load(self.conn, name, lock=True)
        return self.streams[name]

    def touch(self, state: StreamState) -> None:
        self.dirty[state.id] = state
        self.changed.add(state.name)

    def flush(self) -> None:
        """Write what the batch holds; ops that change structure call this first."""
        # The bulk inserts go to the driver's executemany directly: SQLAlchemy's per-row
        # parameter processing would cost more than the insert itself on this hot path.
        if self.rows:
            sql.insert_rows(self.conn, messages, self.rows)
            self.rows = []
        if self.ids:
            sql.insert_ids(self.conn, self.ids)
            self.ids = []
        if self.id_blocks and self.block_writer is not None:
            self.block_writer(self)
        if self.dirty:
            sql.run(
                self.conn,
                "update",
                [
                    (*[state.column(c) for c in sql.STREAM_UPDATES], state.id)
                    for state in self.dirty.values()
                ],
            )
        self.dirty.clear()
        if self.dirty_sessions:
            sql.run(
                self.conn,
                "upsert_session",
                [
                    (
                        sid,
                        pid,
                        self.sessions[(sid, pid)].epoch,
                        self.sessions[(sid, pid)].last_seq,
                        self.now,
                    )
                    for sid, pid in self.dirty_sessions
                ],
            )
        self.dirty_sessions.clear()

    def savepoint(self) -> contextlib.AbstractContextManager[Any]:
        """A nested transaction: what runs inside it is rolled back alone if it raises."""
        return self.conn.begin_nested()

    def forget(self) -> None:
        """Drop cached state after a structural change (create, delete)."""
        self.streams.clear()
        self.sessions.clear()


@dataclass
class _Pending:
    op: Op
    future: asyncio.Future[Any]
    sort_key: Any = None


def _in_producer_order(batch: list[_Pending]) -> list[_Pending]:
    """Pipelined requests of one producer may arrive out of order; apply them by seq.

    Only requests carrying a sort key (stream, producer, epoch, seq) move, and only among the
    slots that requests of the same producer already hold, so nothing else is reordered.
    """
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(batch):
        if p.sort_key is not None:
            groups.setdefault(p.sort_key[:2], []).append(i)
    out = list(batch)
    for slots in groups.values():
        if len(slots) > 1:
            ordered = sorted((batch[i] for i in slots), key=lambda p: p.sort_key)
            for slot, p in zip(slots, ordered, strict=True):
                out[slot] = p
    return out


class Writer:
    def __init__(
        self,
        engine: Engine,
        on_commit: Callable[[set[str]], None],
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._engine = engine
        self._on_commit = on_commit
        self._on_batch = on_batch  # (ops, seconds to run and commit) for monitoring
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stations-writer")
        self._task: asyncio.Task[None] | None = None
        self._conn: Connection | None = None
        self._pg = db.shared(engine)  # other processes hear of commits through NOTIFY
        self.backend_pid: int | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close_conn)
        self._thread.shutdown(wait=True)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def enqueue(self, op: Op, sort_key: Any = None) -> asyncio.Future[Any]:
        """Queue ``op`` now; ops queued in one step of the event loop share a transaction
        (unless the batch is full), in the order they were queued."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(op, future, sort_key))
        return future

    async def submit(self, op: Op, sort_key: Any = None) -> Any:
        return await self.enqueue(op, sort_key)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = _in_producer_order([p for p in batch if not p.future.cancelled()])
            if not batch:
                continue
            started = time.perf_counter()
            try:
                outcomes, changed, hooks = await loop.run_in_executor(
                    self._thread, self._execute, [p.op for p in batch]
                )
                if self._on_batch is not None:
                    self._on_batch(len(batch), time.perf_counter() - started)
            except Exception as exc:  # the database itself failed: every request hears it
                log.exception("write batch failed")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, (ok, value) in zip(batch, outcomes, strict=True):
                if p.future.done():
                    continue
                if ok:
                    p.future.set_result(value)
                else:
                    p.future.set_exception(value)
            for hook in hooks:
                hook()
            if changed:
                self._on_commit(changed)

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._engine.connect()
            if self._pg:  # to tell this process's NOTIFYs from other processes' (pgnotify)
                info = self._conn.connection.dbapi_connection.info  # type: ignore[union-attr]
                self.backend_pid = info.backend_pid
        return self._conn

    def _execute(self, ops: list[Op]) -> tuple[list[tuple[bool, Any]], set[str], list[Any]]:
        try:
            return self._transaction(ops)
        except Exception:
            if len(ops) == 1:
                raise
            # One op tripped the database (a lost race with another process, say): run each op
            # alone so the others are not failed with it.
            log.warning("batch of %d failed; retrying one by one", len(ops), exc_info=True)
            outcomes: list[tuple[bool, Any]] = []
            changed: set[str] = set()
            hooks: list[Any] = []
            for op in ops:
                try:
                    (outcome,), ch, hk = self._transaction([op])
                except Exception as exc:
                    outcome = (False, exc)
                    ch, hk = set(), []
                outcomes.append(outcome)
                changed |= ch
                hooks.extend(hk)
            return outcomes, changed, hooks

    def _transaction(self, ops: list[Op]) -> tuple[list[tuple[bool, Any]], set[str], list[Any]]:
        conn = self._connection()
        outcomes: list[tuple[bool, Any]] = []
        try:
            with conn.begin():
                batch = Batch(conn, now_ms())
                for op in ops:
                    try:
                        outcomes.append((True, op(batch)))
                    except StationsError as exc:
                        outcomes.append((False, exc))
                batch.flush()
                for hook in batch.before_commit.values():
                    hook(batch)
                if self._pg and batch.changed:  # one pipelined round trip for all
                    sql.execute(conn, NOTIFY, [(CHANNEL, name) for name in batch.changed])
        except DBAPIError:
            if conn.invalidated:
                self._conn = None
            raise
        return outcomes, batch.changed, batch.after_commit
