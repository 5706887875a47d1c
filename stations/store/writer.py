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
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from stations.errors import OutcomeUnknown, StationsError, Unavailable
from stations.records import StreamState
from stations.repeats import Repeats, first_line
from stations.store import db, sql
from stations.store.checkpoints import Checkpoints
from stations.store.clock import now_ms
from stations.store.pgnotify import CHANNEL
from stations.store.schema import messages
from stations.store.streams import load

log = logging.getLogger("stations.store.writer")

# An op is a function run inside the batch's transaction; it returns the request's answer or
# raises a StationsError, and must not write anything before it has decided to succeed.
Op = Callable[["Batch"], Any]
MAX_BATCH = 512
# A batch of at most this many small ops, handed over while the writer thread has nothing in
# hand, whose commit does not wait for the disk, runs on the event loop's own thread when the
# database is embedded (SQLite: its statements and such a commit are local work that returns at
# once). Handing it to the writer thread and the answer back costs two thread wake-ups, more
# than the transaction itself when the server is otherwise idle. Everything else runs on the
# writer thread, so the event loop never waits for the disk (fsync) or for another process
# (PostgreSQL).
INLINE_OPS = 4
NOTIFY = "SELECT pg_notify(%s, %s)"
# PostgreSQL aborts one of two transactions that wait on each other's row locks (deadlock
# detected) or that cannot be serialized; its documentation's answer is to run the aborted one
# again. Several processes on one database meet this, e.g. a dead letter that locks its
# station and then the station it forwards to, beside a transaction locking the two the other
# way round. Nothing of an aborted transaction happened (its RAM effects are undone too).
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001"})
TRANSIENT_TRIES = 5
# How long the writer tries to learn whether a commit whose connection was lost happened.
OUTCOME_WAIT_S = 10.0


class LostBeforeCommit(Exception):
    """The connection was lost before the transaction's COMMIT was sent (its cause)."""


def transient(exc: BaseException) -> bool:
    """Whether the database aborted this transaction's work, to be run again (deadlock,
    serialization failure). SQLAlchemy wraps the driver's error; the hot paths' raw cursors
    do not."""
    return getattr(getattr(exc, "orig", exc), "sqlstate", None) in TRANSIENT_SQLSTATES


class Notice:
    """An after-commit hook that nothing the next transaction reads depends on (a count, a
    timer armed, an answer): the writer starts that transaction without waiting for the event
    loop to have run it. Other hooks put in RAM what the next transaction must see (the ids
    just stored), and it waits for them. Waiting for every append's count kept the writer
    idle while the event loop read the next requests."""

    __slots__ = ("hook",)

    def __init__(self, hook: Callable[[], None]) -> None:
        self.hook = hook

    def __call__(self) -> None:
        self.hook()


def _must_wait_for(hooks: list[Callable[[], None]]) -> bool:
    return not all(isinstance(h, Notice) for h in hooks)


@dataclass
class Batch:
    """The unit of work of one transaction: loaded state plus the rows to write at commit."""

    conn: Connection
    # The time of what the batch stores, read again from ``clock`` after each station it
    # locks and before it writes message ids (see ``stream`` and ``flush``); it only ever
    # moves forward. Without a clock it stands still (tests give a batch a time of their own).
    now: int
    # False when the commit may not wait for the disk (every op was enqueued ``relaxed``): an
    # op then writes nothing a power cut must not lose.
    durable: bool = True
    clock: Callable[[], int] | None = None
    streams: dict[str, StreamState | None] = field(default_factory=dict)
    # Other rows this transaction read under a lock, kept in step by the ops that change them
    # (a consumer group's row: ``stations.domain.groups``).
    locked: dict[Any, Any] = field(default_factory=dict)
    dirty: dict[int, StreamState] = field(default_factory=dict)
    # Rows to insert at commit, as tuples in column order (see _INSERT_MESSAGE / _INSERT_ID).
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    ids: list[tuple[int, str, int]] = field(default_factory=list)  # (stream id, msg id, seq)
    ids_at: int = 0  # the store time the last flush gave the ids it wrote
    sessions: dict[tuple[int, str], Any] = field(default_factory=dict)
    dirty_sessions: set[tuple[int, str]] = field(default_factory=set)
    # Ids stored by this batch, until it commits: stream id -> {msg_id: position}.
    pending_ids: dict[int, dict[str, int]] = field(default_factory=dict)
    # SQLite: the ids of this batch per station, written as one id_blocks row each at flush.
    id_blocks: dict[int, Any] = field(default_factory=dict)
    block_writer: Callable[[Batch], None] | None = None
    # SQLite: per station, the newest id block a sweep of this batch deleted (they leave RAM
    # after the commit; a spill in the batch must not move them into a run).
    swept_blocks: dict[int, int] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # stream names whose readers must wake
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    # RAM changes an op had to make at once (the rest of the batch must see them), undone in
    # reverse order should the transaction, or the savepoint they were made in, roll back.
    undo: list[Callable[[], None]] = field(default_factory=list)
    # Run once after the ops, inside the transaction (keyed, so an op may ask more than once).
    before_commit: dict[Any, Callable[[Batch], None]] = field(default_factory=dict)
    # A deadlock or serialization failure met inside a savepoint (see ``savepoint``).
    aborted: Exception | None = None
    # What the domain's ops of this batch tell each other (the bytes its fetches leased).
    shared: dict[str, Any] = field(default_factory=dict)

    def stream(self, name: str) -> StreamState | None:
        if name not in self.streams:
            self.streams[name] = load(self.conn, name, lock=True)
            # The lock may have been waited for (another process's transaction): what this
            # batch stores from now on is stored after every earlier write of the station,
            # so its store time must be too (retention and seeks by time take store times
            # to rise with positions).
            self.read_clock()
        return self.streams[name]

    @property
    def row_locks(self) -> bool:
        """Whether ``stream`` locks rows other processes wait on (PostgreSQL; SQLite's one
        writer holds the whole database): then the order of locking matters."""
        return db.shared(self.conn)

    def read_clock(self) -> None:
        if self.clock is not None:
            self.now = max(self.now, self.clock())

    def peek(self, name: str) -> StreamState | None:
        """A station's row as it is, without locking it (``stream`` locks)."""
        return self.streams.get(name) or load(self.conn, name)

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
        if self.ids or self.id_blocks:
            # An id is remembered for its window from when its message was stored: stamped
            # when the batch began, a long batch (a large append beside it, a lock waited
            # for) had it run out early, and a retry right after the answer was stored again.
            self.read_clock()
            self.ids_at = self.now
        if self.ids:
            sql.insert_ids(self.conn, self.ids, self.ids_at)
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

    def undo_since(self, mark: int) -> None:
        """Undo the RAM changes recorded since ``len(self.undo)`` was ``mark``, newest first:
        the transaction, or the savepoint they were made in, rolled back."""
        while len(self.undo) > mark:
            self.undo.pop()()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested transaction: what runs inside it is rolled back alone if it raises, in the
        database and in this batch. It flushes first, so that rows queued in RAM at a rollback
        are its own (they go: a dead letter's forwarded copy must not outlive its entry), and
        after a rollback cached rows are read again: the database undid what was written
        inside and (PostgreSQL) released the row locks taken inside.

        A deadlock or serialization failure is not the savepoint's alone: whoever catches it
        (upkeep goes on with the next station) would skip that work until its next run. It is
        recorded (``aborted``) and the whole transaction runs again."""
        if self.aborted is not None:  # the transaction runs again anyway: no more work now
            raise self.aborted
        self.flush()
        try:
            with self.conn.begin_nested():
                yield
        except Exception as exc:
            self.rows.clear()
            self.ids.clear()
            self.dirty.clear()
            self.dirty_sessions.clear()
            self.forget()
            if self.aborted is None and transient(exc):
                self.aborted = exc
            raise

    def forget(self) -> None:
        """Drop cached state after a structural change (create, delete)."""
        self.streams.clear()
        self.sessions.clear()
        self.locked.clear()


@dataclass
class _Pending:
    op: Op
    future: asyncio.Future[Any]
    sort_key: Any = None
    relaxed: bool = False
    small: bool = False
    first: bool = False
    locks: tuple[str, ...] = ()  # the stations whose rows it locks, as far as known
    alone: bool = False  # finds the stations it locks as it runs (see ``enqueue``)


def _take(waiting: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
    """The next transaction's ops and those left waiting: up to MAX_BATCH, in order, and an
    op that must run alone (see ``Writer.enqueue``) in a transaction of its own."""
    taken = waiting[:MAX_BATCH]
    alone = next((k for k, p in enumerate(taken) if p.alone), None)
    if alone is not None:
        taken = taken[: max(alone, 1)]
    return taken, waiting[len(taken) :]


def _locks(batch: list[_Pending]) -> list[str]:
    """The stations a batch's ops will lock, in name order: the order every transaction takes
    them in (see ``Writer._transaction``)."""
    return sorted({name for p in batch for name in p.locks})


def _lock_sorted(batch: Batch, names: list[str]) -> None:
    for name in names:  # already in name order
        batch.stream(name)


def _run_hooks(hooks: list[Callable[[], None]]) -> None:
    for hook in hooks:
        hook()


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


def _strict(batch: list[_Pending]) -> bool:
    """Whether the batch's commit waits for the disk: unless every op may lose its writes to a
    power cut."""
    return not all(p.relaxed for p in batch)


class Writer:
    """The group-commit writer. Its thread runs one transaction after another on its own, as
    long as ops are waiting: the next transaction starts the moment the last one committed,
    not after the event loop came round to it. The event loop only hands ops over and settles
    the answers."""

    def __init__(
        self,
        engine: Engine,
        on_commit: Callable[[set[str]], None],
        on_batch: Callable[[int, float], None] | None = None,
        *,
        fsync: bool = True,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self._engine = engine
        # SQLite: the WAL is copied into the database file by a thread of its own, not in
        # our commits (we copy only its last frames, between two transactions).
        self._checkpoints = checkpoints
        self._fsync = fsync  # a strict commit waits for the disk (--durability fsync)
        self._on_commit = on_commit
        self._on_batch = on_batch  # (ops, seconds to run and commit) for monitoring
        # Ops queued in this step of the event loop, handed to the thread together at its end.
        self._staged: list[_Pending] = []
        self._inbox: queue.SimpleQueue[list[_Pending] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="stations-writer", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Ops handed to the thread and not settled yet (read and written on the event loop
        # only): while any are, the thread owns the connection and the order of commits.
        self._unsettled = 0
        self._conn: Connection | None = None
        self._pg = db.shared(engine)  # other processes hear of commits through NOTIFY
        # PostgreSQL: whether a transaction of the batch being run wrote (had an id assigned).
        self._assigned = False
        self.backend_pid: int | None = None
        self.relaxed_commits = 0  # commits that did not wait for the disk (monitoring)
        # Locks a batch's stations up front (see ``_transaction``); the domain adds the
        # stations their ops may also write (dead letters forwarded elsewhere).
        self.lock_in_order: Callable[[Batch, list[str]], None] = _lock_sorted
        self.transient_retries = 0  # transactions the database aborted and we ran again
        self._stopped = False  # ops handed over from now on are refused
        # The database or its disk away: every batch fails alike, logged once and counted.
        self._failures = Repeats(log, "write batch")
        self.failed_batches = 0  # batches the database failed whole, ever (see Database)
        self.failed_at = -math.inf  # when the latest of them failed (time.monotonic())
        self.failed_full = False  # whether it failed for a full disk (SQLITE_FULL, 53100)
        self._running_since: float | None = None  # when the thread's current batch began

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._hand_over()
        # Later ops are refused: on the event loop's thread one would race the writer's
        # thread closing the connection, and in the queue behind the end none would run.
        self._stopped = True
        self._inbox.put(None)
        await asyncio.to_thread(self._thread.join)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def enqueue(
        self,
        op: Op,
        sort_key: Any = None,
        relaxed: bool = False,
        *,
        small: bool = False,
        first: bool = False,
        future: asyncio.Future[Any] | None = None,
        locks: tuple[str, ...] = (),
        alone: bool = False,
    ) -> asyncio.Future[Any]:
        """Queue ``op`` now; ops queued in one step of the event loop share a transaction
        (unless the batch is full), in the order they were queued.

        ``relaxed``: what ``op`` writes may be lost by a power cut (never by a crash of this
        process); a batch of such ops alone commits without waiting for an fsync (see
        ``db.relaxed_transaction``). For leases, whose loss costs a redelivery, not an
        answered write. ``small``: a few statements on a few rows (see ``INLINE_OPS``).
        ``first``: answered before the other ops of its commit (a consumer waiting for the
        messages the commit brings). ``future``: the one to answer, if the caller awaits one
        already (no extra step of the event loop between the commit and the caller).
        ``locks``: the stations whose rows ``op`` locks (see ``_transaction``). ``alone``:
        ``op`` finds the stations it locks as it runs (housekeeping: the stations that are
        due); on a database other processes share it runs in a transaction of its own, as a
        batch locks its ops' declared stations up front, in name order, and ``op`` would lock
        others after them: two processes doing so deadlocked, and PostgreSQL took a second to
        break each deadlock while every request of both batches waited."""
        loop = asyncio.get_running_loop()
        if future is None:
            future = loop.create_future()
        if not self._staged:
            loop.call_soon(self._hand_over)
        self._staged.append(
            _Pending(op, future, sort_key, relaxed, small, first, locks, alone and self._pg)
        )
        return future

    async def submit(
        self,
        op: Op,
        sort_key: Any = None,
        relaxed: bool = False,
        *,
        small: bool = False,
        locks: tuple[str, ...] = (),
        alone: bool = False,
    ) -> Any:
        return await self.enqueue(op, sort_key, relaxed, small=small, locks=locks, alone=alone)

    def _hand_over(self) -> None:
        staged, self._staged = self._staged, []
        if not staged:
            return
        if self._stopped:
            for p in staged:
                if not p.future.done():
                    p.future.set_exception(Unavailable("the server is shutting down"))
            return
        if self._unsettled == 0 and self._inline(staged):
            self._run_here(staged)
            return
        self._unsettled += len(staged)
        self._inbox.put(staged)

    def _inline(self, staged: list[_Pending]) -> bool:
        """Whether these ops run on the event loop's thread (see ``INLINE_OPS``). Not while
        the WAL's last frames wait to be copied: the writer's thread copies them first (a
        checkpoint waits for the disk), or the WAL could never start over."""
        return (
            not self._pg
            and not (self._checkpoints is not None and self._checkpoints.tail_wanted)
            and len(staged) <= INLINE_OPS
            and all(p.small for p in staged)
            and not (self._fsync and not all(p.relaxed for p in staged))
        )

    def _run_here(self, staged: list[_Pending]) -> None:
        batch = _in_producer_order([p for p in staged if not p.future.cancelled()])
        if not batch:
            return
        started = time.perf_counter()
        outcome: Any
        try:
            before = db.rows_changed(self._conn)
            self._assigned = False
            outcome = self._execute(
                [p.op for p in batch], _strict(batch), _run_hooks, _locks(batch)
            )
            self._wrote(before)
        except Exception as exc:  # the database itself failed: every request hears it
            self._failed(exc)
            outcome = exc
        self._settle(batch, 0, outcome, time.perf_counter() - started, None)
        if self._checkpoints is not None:
            self._checkpoints.committed()

    @property
    def busy_for(self) -> float:
        """Seconds the thread's current transaction has run (0 between transactions): one
        waiting for a lock holds up every write of this process."""
        since = self._running_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def failing(self) -> str | None:
        """Why the latest batch failed, while no batch has written since; else None."""
        return self._failures.failing

    def _wrote(self, before: int | None) -> None:
        """A batch committed: the writes work again if it changed rows. A batch that changed
        none (a job with nothing due, ops all refused) commits on a full disk too: each one
        logged the outage over, and it started again at the next write. On PostgreSQL one
        that wrote had a transaction id assigned: on a database turned read-only an idle
        scheduler's batch "recovered" the writer every second, and readiness flapped."""
        after = db.rows_changed(self._conn)
        if before is not None and after is not None:
            wrote = after > before
        else:
            wrote = self._assigned or not self._pg
        if wrote:
            self._failures.succeeded()

    def _failed(self, exc: Exception) -> None:
        """A batch failed whole: logged once per outage (a traceback only for what is no
        outage of the database's, nor a commit whose outcome it would not tell)."""
        self.failed_batches += 1
        self.failed_at = time.monotonic()
        self.failed_full = db.disk_full(exc)
        known = db.unavailable(exc) or isinstance(exc, OutcomeUnknown)
        self._failures.failed(exc, traceback=not known)

    def _serve(self) -> None:
        """The writer thread: each transaction takes every op that waits (up to MAX_BATCH)."""
        assert self._loop is not None
        loop = self._loop
        waiting: list[_Pending] = []
        stopping = False
        while not stopping or waiting:
            if not waiting:
                chunk = self._inbox.get()
                if chunk is None:
                    break
                waiting = chunk
            while len(waiting) < MAX_BATCH and not stopping:
                try:
                    chunk = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if chunk is None:
                    stopping = True
                else:
                    waiting += chunk
            taken, waiting = _take(waiting)
            batch = _in_producer_order([p for p in taken if not p.future.cancelled()])
            checkpoints = self._checkpoints
            started = time.perf_counter()
            outcome: Any = ([], set(), [])
            try:
                # Inside the try: should reconnecting fail, this batch hears it and the thread
                # lives on to serve the next.
                if batch and checkpoints is not None and checkpoints.tail_wanted:
                    checkpoints.copy_tail(self._connection().connection.dbapi_connection)
                if batch:
                    self._running_since = time.monotonic()
                    before = db.rows_changed(self._conn)
                    self._assigned = False
                    outcome = self._execute(
                        [p.op for p in batch], _strict(batch), self._hooks_on_loop, _locks(batch)
                    )
                    self._wrote(before)
            except Exception as exc:  # the database itself failed: every request hears it
                self._failed(exc)
                outcome = exc
            finally:
                self._running_since = None
            seconds = time.perf_counter() - started
            # Hooks put in memory what the next transaction must see (the ids just stored):
            # it waits until the event loop has run them (not for a ``Notice``).
            settled = (
                threading.Event()
                if isinstance(outcome, tuple) and _must_wait_for(outcome[2])
                else None
            )
            try:
                loop.call_soon_threadsafe(
                    self._settle, batch, len(taken), outcome, seconds, settled
                )
            except RuntimeError:  # the event loop is closed: no one is waiting any more
                break
            if checkpoints is not None:
                checkpoints.committed()
            if settled is not None:
                settled.wait()
        self._close_conn()

    def _settle(
        self,
        batch: list[_Pending],
        handed: int,
        outcome: Any,
        seconds: float,
        settled: threading.Event | None,
    ) -> None:
        """On the event loop: answer the batch's requests (the consumers waiting for what it
        brings first), run its hooks, wake its readers. ``handed``: how many ops the thread
        took for it (cancelled ones included)."""
        self._unsettled -= handed
        try:
            if not batch:
                return
            if isinstance(outcome, BaseException):
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(outcome)
                return
            outcomes, changed, hooks = outcome
            if self._on_batch is not None:
                self._on_batch(len(batch), seconds)
            answers = sorted(zip(batch, outcomes, strict=True), key=lambda a: not a[0].first)
            for p, (ok, value) in answers:
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
        finally:
            if settled is not None:
                settled.set()

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._engine.connect()
            if self._checkpoints is not None:
                db.checkpoint_in_commits(self._conn, 0)
            if self._pg:  # to tell this process's NOTIFYs from other processes' (pgnotify)
                info = self._conn.connection.dbapi_connection.info  # type: ignore[union-attr]
                self.backend_pid = info.backend_pid
        return self._conn

    def _hooks_on_loop(self, hooks: list[Callable[[], None]]) -> None:
        """From the writer's thread: run ``hooks`` on the event loop, and wait for them."""
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            try:
                _run_hooks(hooks)
            finally:
                done.set()

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the event loop is closed: no one is waiting any more
            return
        done.wait()

    def _execute(
        self,
        ops: list[Op],
        strict: bool,
        run_hooks: Callable[[list[Callable[[], None]]], None],
        locks: list[str],
    ) -> tuple[list[tuple[bool, Any]], set[str], list[Any]]:
        """``run_hooks``: runs after-commit hooks on the event loop's thread, from the thread
        this runs on. ``locks``: the stations the ops lock, in name order."""
        if not strict:
            self.relaxed_commits += 1
        try:
            if len(ops) == 1:
                return self._transaction_again_if_aborted(ops, strict)
            # Several ops in one transaction lock their stations first, in name order; should
            # one lock rows beyond those (a station that a dead letter is forwarded to) and be
            # aborted as deadlocked, the batch goes op by op at once.
            try:
                return self._transaction(ops, strict, locks)
            except LostBeforeCommit:
                return self._transaction(ops, strict, locks)  # once more, on a new connection
        except Exception as caught:
            failure = caught.__cause__ or caught if isinstance(caught, LostBeforeCommit) else caught
            if isinstance(failure, OutcomeUnknown):
                raise  # each op may be done: none may run again
            timed_out = db.lock_timed_out(failure)
            if len(ops) == 1 or (
                db.unavailable(failure) and not transient(failure) and not timed_out
            ):
                # The database or its disk is away (or a connection could not be made): each
                # op alone would wait for the same, a connect timeout each, for nothing. (A
                # deadlock is the database's too, but one op by one op is its cure.)
                raise failure from None
            # One op tripped the database (a lost race with another process, say): run each op
            # alone so the others are not failed with it.
            if transient(failure):  # a deadlock with another process: no fault of the code's
                state = getattr(getattr(failure, "orig", failure), "sqlstate", None)
                log.info("batch of %d aborted by the database (%s); one by one", len(ops), state)
            elif timed_out:
                log.warning(
                    "a lock another session holds stopped a batch of %d (%s); one by one",
                    len(ops),
                    first_line(failure),
                )
            else:
                log.warning("batch of %d failed; retrying one by one", len(ops), exc_info=True)
            outcomes: list[tuple[bool, Any]] = []
            changed: set[str] = set()
            # A lock another session holds (PostgreSQL's lock_timeout) failed the whole batch:
            # each op alone, waiting only briefly, so that those the lock does not hold up (an
            # append to another station) are answered and only the others get 503.
            for op in ops:
                try:
                    (outcome,), ch, hooks = self._transaction_again_if_aborted(
                        [op], strict, brief_lock_waits=timed_out
                    )
                except Exception as exc:
                    outcome = (False, exc)
                    ch, hooks = set(), []
                # Before the next op's transaction: what this one committed must be in RAM
                # for it (SQLite's recent message ids are only there), or a retry of the same
                # id in the next op would be stored a second time.
                run_hooks(hooks)
                outcomes.append(outcome)
                changed |= ch
            return outcomes, changed, []

    def _transaction_again_if_aborted(
        self, ops: list[Op], strict: bool, *, brief_lock_waits: bool = False
    ) -> tuple[list[tuple[bool, Any]], set[str], list[Any]]:
        for attempt in range(1, TRANSIENT_TRIES + 1):
            try:
                return self._transaction(ops, strict, brief_lock_waits=brief_lock_waits)
            except LostBeforeCommit as lost:
                if attempt > 1:  # a connection made just now, lost again: the database is away
                    raise lost.__cause__ or lost from None
                log.info("the database ended the connection; running the transaction again")
                continue
            except Exception as exc:
                if not transient(exc) or attempt == TRANSIENT_TRIES:
                    raise
                self.transient_retries += 1
                state = getattr(getattr(exc, "orig", exc), "sqlstate", None)
                log.info("transaction aborted by the database (%s); running it again", state)
        raise AssertionError("unreachable")

    def _transaction(
        self,
        ops: list[Op],
        strict: bool = True,
        locks: list[str] | None = None,
        *,
        brief_lock_waits: bool = False,
    ) -> tuple[list[tuple[bool, Any]], set[str], list[Any]]:
        conn = self._connection()
        outcomes: list[tuple[bool, Any]] = []
        batch = Batch(conn, now_ms(), durable=strict, clock=now_ms)
        committing = False
        xid: int | None = None
        backend = self.backend_pid  # the server process of this connection (PostgreSQL)
        try:
            with conn.begin() if strict else db.relaxed_transaction(conn):
                if brief_lock_waits:
                    db.wait_briefly_for_locks(conn)
                if locks and len(ops) > 1 and batch.row_locks:
                    # Each op locks its stations in name order, but a batch ran its ops in the
                    # order they came: two processes' batches took the same stations in
                    # opposite orders and PostgreSQL aborted one after deadlock_timeout (1 s),
                    # every request of both batches waiting (two processes, 8 stations: 53
                    # produces/s against 748 with one). The batch takes them all first, in
                    # name order, as every transaction does.
                    self.lock_in_order(batch, locks)
                for op in ops:
                    try:
                        outcomes.append((True, op(batch)))
                    except StationsError as exc:
                        # Without its traceback: that holds this frame, which holds the
                        # outcomes and the batch, a cycle that kept every result of the batch
                        # (fetched pages counted in the read budget) until a full collection.
                        exc.__context__ = None
                        outcomes.append((False, exc.with_traceback(None)))
                if batch.aborted is not None:  # in a savepoint someone caught: run it all again
                    raise batch.aborted
                batch.flush()
                for hook in batch.before_commit.values():
                    hook(batch)
                if self._pg and batch.changed:  # one pipelined round trip for all
                    sql.execute(conn, NOTIFY, [(CHANNEL, name) for name in batch.changed])
                xid = db.transaction_id(conn)
                self._assigned = self._assigned or xid is not None
                committing = True
        except BaseException as exc:
            lost = db.connection_lost(conn, exc)
            if lost:
                self._conn = None
            committed = False
            try:
                if lost and committing and xid is not None:  # the COMMIT was under way
                    committed = self._committed_after_all(xid, exc, backend)
            finally:
                # Not committed, or unknown (OutcomeUnknown): RAM forgets it, so that a retry
                # asks the database (which knows the ids and producer sequences it stored).
                if not committed:
                    batch.undo_since(0)
            if committed:
                return outcomes, batch.changed, batch.after_commit
            if lost:
                # PostgreSQL ended the connection (a restart, a failover, an idle timeout)
                # before the COMMIT was sent, or while it was and the transaction did not
                # commit: nothing of this happened, and a new connection may run it again
                # (the first write after answered 503).
                raise LostBeforeCommit() from exc
            raise
        return outcomes, batch.changed, batch.after_commit

    def _committed_after_all(self, xid: int, lost: BaseException, backend: int | None) -> bool:
        """The connection was lost while transaction ``xid`` committed: ask PostgreSQL on a
        new connection whether it did. True: it did (answer its requests as done); False: it
        did not (it may run again). When that cannot be learned within ``OUTCOME_WAIT_S``,
        raises ``OutcomeUnknown``: answering 503 ("nothing decided, retry") could have a
        client store twice what was stored once. ``backend``: the lost connection's server
        process, ended should it still hold the transaction open (its COMMIT never arrived)."""
        deadline = time.monotonic() + OUTCOME_WAIT_S
        pause = 0.01
        why = first_line(lost)
        # A bounded poll: nothing tells when the old backend finishes its commit or when the
        # database is reachable again.
        while True:
            try:
                conn = self._connection()
                status = db.outcome(conn, xid)
                if status == "committed":
                    log.warning("the connection was lost during a COMMIT that succeeded (%s)", why)
                    return True
                if status == "aborted":
                    return False
                if status is None:  # no such transaction as far as this server knows
                    why = f"PostgreSQL does not know transaction {xid}"
                else:
                    # In progress: the old backend is committing, or it never got the COMMIT
                    # and waits for a client that is gone, its locks held. Ended, it commits
                    # (if it was at it) or rolls back: either answers the next look.
                    why = f"transaction {xid} still in progress"
                    if backend is not None:
                        db.end_backend(conn, backend)
            except Exception as exc:
                self._conn = None
                if not db.unavailable(exc):  # e.g. an id from a server before a failover
                    log.error("asking for the outcome of transaction %d failed", xid, exc_info=exc)
                    break
                why = first_line(exc)
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        log.error("the outcome of transaction %d is unknown: %s", xid, why)
        raise OutcomeUnknown(
            "the database connection was lost while committing and whether the commit "
            "happened could not be learned: the request may have been carried out; "
            "send it again only if it is idempotent (message ids, producer headers)",
            detail=why,
        ) from lost
