"""The Stations service: the domain's async face, used by the HTTP layer.

It owns the database (``stations.store.database``: engines, the group-commit writer, the
readers' threads), the wake-ups and the scheduler. Everything it answers is a domain object; it
knows nothing of HTTP nor of SQL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cachetools import TTLCache

from stations.domain import (
    catalog,
    cursors,
    dls,
    figures,
    groups,
    lifecycle,
    log,
    messages,
    producers,
    reads,
    transactions,
)
from stations.domain.budget import ByteBudget
from stations.domain.groups import Fetched, Named, SeekResult
from stations.domain.idwindow import CACHE_SIZE, IdWindow
from stations.domain.lifecycle import CreateRequest, CreateResult
from stations.domain.log import AppendRequest, AppendResult, SequenceGap
from stations.domain.notify import Notifier
from stations.domain.offsets import EARLIEST, Start
from stations.domain.pages import Page
from stations.domain.reads import ReadResult
from stations.domain.scheduler import Scheduler
from stations.errors import Forbidden, Gone, NotFound, StationsError, Unavailable
from stations.records import StreamState
from stations.repeats import Repeats, first_line
from stations.store.checkpoints import WalFigures
from stations.store.clock import now_ms
from stations.store.database import Database
from stations.store.db import Tx
from stations.store.idruns import SPILL_AT, IdRuns
from stations.store.writer import Batch, Notice

logger = logging.getLogger("stations")
T = TypeVar("T")


def _then(fn: Callable[..., T], then: Callable[[T], None]) -> Callable[..., T]:
    """``fn`` as a writer op that has ``then(result)`` run after its transaction commits: the
    writer runs it, on the event loop, whether or not anyone still awaits the op (aiohttp
    cancels the handler of a client that left, and what follows its ``await`` never runs).
    Every ``then`` is a count or a timer armed: a ``Notice``, which the next transaction does
    not wait for."""

    def op(batch: Batch, *args: Any, **kwargs: Any) -> T:
        result = fn(batch, *args, **kwargs)
        batch.after_commit.append(Notice(lambda: then(result)))
        return result

    return op


# Every read meets an outage: one line when it starts, a count a minute, one when it ends.
# Writes are the writer's to tell (``stations.store.writer``): with one tracker for both, a
# full disk logged two failures and two recoveries per write, a read between them counting
# as the database working again.
_reads = Repeats(logger, "reading the database")


async def _committed(work: Awaitable[T], outage: Repeats | None = None) -> T:
    """Await database work; a database or disk failure becomes ``Unavailable`` (told to
    ``outage``, if any)."""
    try:
        done = await work
    except Exception as exc:
        failure = _unavailable(exc, outage)
        if failure is exc:
            raise
        raise failure from exc
    if outage is not None:
        outage.succeeded()
    return done


def _unavailable(exc: Exception, outage: Repeats | None = None) -> Exception:
    """A database or disk failure becomes ``Unavailable`` (503 with Retry-After); anything
    else is raised as it is."""
    if isinstance(exc, StationsError) or not Database.unavailable(exc):
        return exc
    if outage is not None:
        outage.failed(exc, traceback=False)
    # The driver's words apart (``detail``): they may name the database's host, port, name and
    # role, which the HTTP layer tells only whom it may (``stations.api.errors.answer``).
    return Unavailable("the database is unavailable, retry later", detail=first_line(exc))


# Writes this small may run on the event loop's thread when the server is idle (see
# ``stations.store.writer.INLINE_OPS``): an append of this many bytes, a fetch or an ack of
# this many messages.
SMALL_APPEND_BYTES = 64 * 1024
SMALL_FETCH = 100
BROWSE_BYTES = 8 << 20  # a management page of messages carries at most about this much data
SMALL_ACK = 1000

# How long a pipelined producer request that arrived ahead of its turn waits for the missing
# ones before it is answered 409 (the reference server answers 409 at once).
GAP_HOLD_S = 2.0
# A write transaction running this long makes the service unready ("writes stalled"): batches
# take milliseconds, and one waiting for a lock holds up every write of the process.
WRITES_STALLED_S = 5.0


def _tail_state(result: ReadResult) -> StreamState | None:
    """A page that reached the tail tells later readers of its generation where the tail is."""
    return result.state if result.next >= result.state.tail else None


# What the fetches of one writer batch leased, in bytes of data (``_fetch_within_budget``).
_FETCHED_BYTES = "fetched bytes"


def _data_bytes(out: Fetched) -> int:
    return sum(len(d.data) for d in out.messages)


# What a round leased: each fetch served with its messages, the first empty answer, and the
# fetches refused on their own (a scope that does not reach the station's dls.forwardTo).
_Round = tuple[list[tuple["_Parked", Fetched]], Fetched | None, list[tuple["_Parked", Forbidden]]]


def _lease_in_turn(
    batch: Batch,
    station: str,
    group: str,
    waiting: list[_Parked],
    fetch: Callable[..., Fetched],
) -> _Round:
    """A writer op: lease to ``waiting`` fetches of one group in turn, until one gets nothing
    (the group has nothing more for any of them). A fetch whose client left or whose time ran
    out is passed over; one its own scope refuses (``reach``) is answered so, and the others
    lease on. What was served, the empty answer if one was, and the refusals."""
    served: list[tuple[_Parked, Fetched]] = []
    refused: list[tuple[_Parked, Forbidden]] = []
    for parked in waiting:
        if parked.answer.done():
            continue
        try:
            out = fetch(batch, station, group, parked.max_count, parked.consumer, parked.reach)
        except Forbidden as exc:
            # This fetch's own scope, checked before it wrote anything: the others lease on.
            refused.append((parked, exc))
            continue
        except StationsError:
            if not served:
                raise  # refused before it wrote anything: every waiting fetch hears why
            break  # what was leased stands; the others hear it when they look again
        if not out.messages:
            return served, out, refused
        served.append((parked, out))
    return served, None, refused


@dataclass
class _Parked:
    """A fetch waiting for messages. ``answer`` gets what a transaction leased for it: an
    append's, which ran the fetch itself (once ``served``, nothing else completes it), or a
    round's (``Service._round``), which answers only a fetch it leased messages to; or None
    when its time ran out first. The waiting request awaits ``answer`` itself, so the commit
    that serves it resumes it at once."""

    group: str
    max_count: int
    consumer: str
    reach: dls.Reach | None
    answer: asyncio.Future[Fetched | None]
    served: bool = False  # a transaction that may lease to it is under way: it answers
    expired: bool = False  # its time ran out meanwhile

    def give_up(self, *_: object) -> None:
        if self.served:
            self.expired = True  # what the transaction leases it still gets
        elif not self.answer.done():
            self.answer.set_result(None)


class Service:
    def __init__(
        self,
        url: str | None = None,
        *,
        durability: str = "fsync",
        read_threads: int = 4,
        id_cache_size: int | None = None,
        recent_ids: int = SPILL_AT,
        read_budget_bytes: int = 64 << 20,
        producer_expiry_ms: int | None = None,
    ) -> None:
        self.db = Database(url, durability=durability, read_threads=read_threads)
        # Idle producer sessions are forgotten after this (0: never; ``producers``).
        self.producer_expiry_ms = (
            producers.DEFAULT_EXPIRY_MS if producer_expiry_ms is None else producer_expiry_ms
        )
        self.url = self.db.url
        self.durability = durability
        self.notifier = Notifier()
        # Bytes of read pages in memory across all connections (see stations.domain.budget).
        self.budget = ByteBudget(read_budget_bytes)
        self.read_transactions = 0  # exported as a metric
        # Sorted runs of older ids need one writer process (see stations.store.idruns).
        runs = IdRuns(recent_ids, recent_ids // 2) if self.db.embedded else None
        self.ids = IdWindow(id_cache_size or CACHE_SIZE, runs)
        self._started = False
        self.tally = figures.Tally()  # counters for monitoring (see stations.domain.figures)
        self._parked: dict[str, list[_Parked]] = {}  # station → fetches waiting for messages
        self.ending = False  # a shutdown: waits end now (``end_all_waits``)
        # When each TTL stream was last touched here (loop time); entries leave after an hour,
        # which costs at most one extra touch.
        self._touched: TTLCache[str, float] = TTLCache(100_000, 3600)
        # (station, group) of the rounds in flight, and of those to run again after them.
        self._rounds: set[tuple[str, str]] = set()
        self._rounds_again: set[tuple[str, str]] = set()
        self.notifier.listeners.append(self._changed)
        # Changes may have been missed (PostgreSQL's LISTEN connection came back): every
        # parked fetch looks again.
        self.notifier.resync.append(lambda: self._changed(set(self._parked)))
        # Groups and the DLS keep per-station rows: delete them with the station, count them
        # in its stats.
        if groups.purge_stream not in lifecycle.purge_hooks:
            lifecycle.purge_hooks += [groups.purge_stream, dls.purge_stream]
            catalog.stats_providers += [groups.stats, dls.stats]

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.db.open(
            self.notifier.fire,
            self.ids.runs,
            on_batch=self.tally.batch,
            on_listen=self.notifier.fire_all,
            lock_in_order=dls.lock_in_order,
        )
        self.scheduler = Scheduler(self)
        self.leases = self.scheduler.leases
        self.scheduler.start()
        self._started = True

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        self.scheduler.stop()
        await self.db.close()

    # -- plumbing ---------------------------------------------------------------------------

    async def write(
        self,
        fn: Callable[..., T],
        *args: Any,
        sort_key: Any = None,
        relaxed: bool = False,
        small: bool = False,
        then: Callable[[T], None] | None = None,
        locks: tuple[str, ...] = (),
        alone: bool = False,
    ) -> T:
        """Run ``fn(batch, *args)`` in the writer's next transaction (``relaxed``, ``small``,
        ``locks``, ``alone``: see ``Writer.enqueue``); ``then(result)`` once it committed
        (see ``_then``)."""
        op = _then(fn, then) if then is not None else fn
        with self.notifier.writing():  # held readers' answers wait for it (producers first)
            return await _committed(
                self.db.write(
                    lambda batch: op(batch, *args),
                    sort_key,
                    relaxed,
                    small=small,
                    locks=locks,
                    alone=alone,
                )
            )

    @property
    def relaxed_commits(self) -> int:
        """Commits that did not wait for the disk: batches of lease-only ops (monitoring)."""
        return self.db.writer.relaxed_commits

    @property
    def notifications_failing(self) -> bool:
        """Whether this process hears no other process's commits now (monitoring)."""
        return self.db.notifications_failing

    @property
    def writes_failing(self) -> bool:
        """Whether the writer's latest batch failed and none has written since (monitoring)."""
        return self.db.writes_failing is not None

    def wal(self) -> WalFigures | None:
        """SQLite's WAL and its checkpoints (monitoring); None on PostgreSQL."""
        return self.db.wal()

    async def refresh_statistics(self) -> None:
        await _committed(self.db.refresh_statistics(), _reads)

    async def sync_clock(self) -> None:
        await _committed(self.db.sync_clock(), _reads)

    async def read_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(tx, *args)`` in a read transaction on a reader thread."""
        self.read_transactions += 1
        return await _committed(self.db.read(fn, *args, **kwargs), _reads)

    async def ping(self, timeout: float = 2.0) -> tuple[str, str] | None:
        """None if the database answers within ``timeout`` seconds and takes writes, else
        (``"unreachable"`` or ``"writes failing"``, why). Reads alone answered while every
        write failed (a full disk): the service said it was ready. While the writer's writes
        fail, a small probe write says whether any write is taken now (nothing else might
        write on an idle server)."""
        try:
            await asyncio.wait_for(self.db.ping(), timeout)
        except TimeoutError:
            return "unreachable", f"the database did not answer within {timeout:g} s"
        except Exception as exc:
            if not self.db.unavailable(exc):
                raise
            return "unreachable", first_line(exc)
        busy = self.db.write_busy_for
        if busy > WRITES_STALLED_S:
            # A lock held elsewhere (PostgreSQL), a disk that stopped answering: every write
            # waits behind this transaction, while SELECT 1 answers at once.
            return "writes stalled", f"a write transaction has been waiting for {busy:.0f} s"
        failing = self.db.writes_failing
        if failing is None:
            return None
        if self.db.writes_failed_recently:  # the writer's own evidence, fresher than a probe's
            return "writes failing", failing
        short = self.db.disk_short()
        if short is not None:  # a probe's small row could fit where the writer's did not
            return "writes failing", short
        try:
            await asyncio.wait_for(self.db.probe_writes(), timeout)
        except TimeoutError:
            return "writes failing", f"a write did not commit within {timeout:g} s"
        except Exception as exc:
            if not self.db.unavailable(exc):
                raise
            return "writes failing", first_line(exc)
        return None

    # -- streams ----------------------------------------------------------------------------

    async def create(self, req: CreateRequest) -> CreateResult:
        return await self.write(lifecycle.create, self.ids, req)

    async def delete(self, name: str, created_at: int | None = None) -> None:
        """``created_at``: delete only the stream created then (see ``lifecycle.remove``)."""
        await self.write(
            lifecycle.remove, self.ids, name, created_at, then=lambda _: self.tally.forget(name)
        )

    async def stream(self, name: str) -> StreamState:
        return await self.read_db(reads.open_stream, name, now_ms())

    async def touch(self, state: StreamState, *, again: bool = False) -> None:
        """Start a TTL stream's countdown again. ``again``: a waiting reader's renewal, every
        half TTL, which one done by any reader in the last quarter TTL stands for (each of
        300 readers of a 1 s TTL stream wrote its own: 8.6% of a core at rest)."""
        ttl = state.ttl_seconds
        if ttl is None:
            return
        now = asyncio.get_running_loop().time()
        if again and now - self._touched.get(state.name, -math.inf) < ttl / 4:
            return
        self._touched[state.name] = now
        await self.write(lifecycle.touch, state.name, locks=(state.name,))

    async def append(self, req: AppendRequest) -> AppendResult:
        """Append; a producer request ahead of its turn waits briefly for the missing ones."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GAP_HOLD_S
        key = None
        if req.producer is not None:
            key = (req.name, req.producer.id, req.producer.epoch, req.producer.seq)

        def tallied(result: AppendResult) -> None:
            self.tally.appended(req.name, result.results, result.producer_duplicate)

        while True:
            woken = self.notifier.subscribe(req.name)
            try:
                appended = self.db.enqueue(
                    _then(functools.partial(log.append, window=self.ids, req=req), tallied),
                    sort_key=key,
                    small=sum(map(len, req.messages)) <= SMALL_APPEND_BYTES,
                    locks=(req.name,),
                )
                self._serve_parked(req.name)
                result: AppendResult = await _committed(appended)
                return result
            except SequenceGap:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise
                await self.notifier.wait(woken, remaining)
            finally:
                self.notifier.unsubscribe(req.name, woken)

    async def read(
        self,
        name: str,
        position: Start | None,
        *,
        max_bytes: int,
        alive: Callable[[], bool] = lambda: True,
    ) -> ReadResult:
        """A catch-up page, within the memory budget (a smaller page when it runs short).

        ``alive``: whether the asker is still there (it is not served once it left)."""
        grant = await self.budget.take(max_bytes, alive)
        try:
            result = await self.read_db(reads.read, name, position, now=now_ms(), max_bytes=grant)
        except BaseException:
            self.budget.give(grant)
            raise
        size = sum(map(len, result.parts))
        if size - grant > self.budget.free:
            # One message larger than the grant (a page holds at least one), and no room for
            # the rest: let the page go, wait for room for all of it, and read it again.
            self.budget.give(grant)
            del result
            grant = await self.budget.take(size, alive, whole=True)
            try:
                result = await self.read_db(
                    reads.read, name, position, now=now_ms(), max_bytes=grant
                )
            except BaseException:
                self.budget.give(grant)
                raise
            size = sum(map(len, result.parts))
        self.budget.hold(result, grant, size)
        return result

    async def read_or_wait(
        self,
        name: str,
        position: Start | None,
        timeout: float,
        *,
        max_bytes: int,
        stream: tuple[int, int] | None = None,
    ) -> ReadResult:
        """Long-poll: return at once if there is data (or EOF), else wait up to ``timeout``.

        Readers share reads (``Notifier.shared``): the readers an append wakes at one position
        cost one read together, and a reader arriving at the tail such a read saw costs none.
        With many readers on the station, an answer that reached the tail is held for the
        station's next release and read again (``Notifier.pace``); ``timeout`` 0 never waits.
        ``stream``: the stream the reader's offsets belong to, as ``(id, created_at)`` (by
        default, the first read's); should the name come to be another stream's (deleted and
        created again while the reader waited), the offset is not one of it: 410. ``EARLIEST``
        stays the earliest retained message through the wait; a position the client named is 410 once retention dropped it, before
        or while it waits (``reads._begin``).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        paced = timeout <= 0
        renewing = False  # the first touch is this request's own (when the server began it)
        self.notifier.attach(name)
        try:
            while True:
                woken = self.notifier.subscribe(name)
                try:
                    result = self._at_known_tail(name, position)
                    if result is None:
                        read = functools.partial(self.read, name, position, max_bytes=max_bytes)
                        result = await self.notifier.shared(
                            name, (position, max_bytes), read, _tail_state
                        )
                    seen = (result.state.id, result.state.created_at)
                    if stream is None:
                        stream = seen
                    elif seen != stream:
                        raise Gone(
                            f"stream {name} was deleted and created again: the offset is not "
                            "one of the new stream",
                            "offset",
                        )
                    if position is None:
                        position = result.start
                    if result.count or result.closed:
                        if paced or result.closed or not result.up_to_date or self.ending:
                            return result
                        paced = True
                        release = self.notifier.pace(name)
                        if release is None:
                            return result
                        del result  # its page is not held (nor budgeted) while it waits
                        await release
                        continue  # read again: the answer takes what came meanwhile
                    wait_s = deadline - loop.time()
                    if self.ending:  # a shutdown: answered as at its timeout
                        return result
                    ttl = result.state.ttl_seconds
                    if ttl is not None and wait_s > 0:
                        # A stream with a live reader does not expire (PROTOCOL.md §5.1): its
                        # TTL starts again when the wait does, and again every half TTL.
                        await self.touch(result.state, again=renewing)
                        renewing = True
                        wait_s = min(wait_s, max(ttl / 2, 0.5))
                    expires_at = result.state.expires_at
                    if expires_at is not None:
                        # ... but its Stream-Expires-At stands: the wait ends then, with a 404
                        # (a 204 answered after it invited a poll of a stream gone).
                        wait_s = min(wait_s, max(0.0, (expires_at - now_ms()) / 1000) + 0.001)
                    if not await self.notifier.wait(woken, wait_s):
                        if expires_at is not None and now_ms() >= expires_at:
                            raise NotFound(f"stream {name} not found")  # as a read now says
                        if loop.time() < deadline:
                            continue
                        return result
                finally:
                    self.notifier.unsubscribe(name, woken)
        finally:
            self.notifier.detach(name)

    def _at_known_tail(self, name: str, position: Start | None) -> ReadResult | None:
        """An empty page at ``position`` if a read of this generation ended there; else None."""
        state: StreamState | None = self.notifier.snapshot(name)
        if state is None:
            return None
        try:
            log.live_stream(state, name, now_ms())  # a TTL or Expires-At may have passed
        except StationsError:
            return None  # let a real read answer (another reader may have renewed the TTL)
        if position is None:
            position = state.tail
        elif position is EARLIEST:
            position = state.head  # nothing retained, or nothing yet: the start is the tail
        if position != state.tail:
            return None
        return ReadResult(state, position, position, True)

    # -- stations (management API) -----------------------------------------------------------

    async def create_station(self, raw: Any) -> tuple[dict[str, Any], bool]:
        result = await self.write(catalog.create_station, self.ids, raw)
        return await self.station(result.state.name), result.created

    async def patch_station(
        self, name: str, raw: Any, created_at: int | None = None
    ) -> dict[str, Any]:
        """``created_at``: change only the stream created then (see ``catalog.patch_station``)."""
        await self.write(catalog.patch_station, self.ids, name, raw, created_at, locks=(name,))
        return await self.station(name)

    async def station(self, name: str) -> dict[str, Any]:
        return await self.read_db(catalog.view_of, now_ms(), name)

    async def stations(self, page: Page | None = None) -> list[dict[str, Any]]:
        """Every station's view, or a ``page`` of them (one more than its limit)."""
        return await self.read_db(catalog.views, now_ms(), None, page)

    async def produce(
        self, name: str, body: Any, max_messages: int = messages.MAX_BATCH
    ) -> tuple[AppendResult, StreamState]:
        """Messages with ids and headers, as one append (one transaction)."""
        messages.check_count(body, max_messages)  # before the request waits for the writer

        def tallied(out: tuple[AppendResult, StreamState]) -> None:
            self.tally.appended(name, out[0].results, out[0].producer_duplicate)

        produced = self.db.enqueue(
            _then(
                functools.partial(
                    messages.produce,
                    window=self.ids,
                    name=name,
                    body=body,
                    max_messages=max_messages,
                ),
                tallied,
            ),
            locks=(name,),
        )
        self._serve_parked(name)  # waiting fetches ride on this transaction
        result, state = await _committed(produced)
        return result, state

    async def browse(
        self, name: str, position: Start, limit: int, max_bytes: int = BROWSE_BYTES
    ) -> ReadResult:
        """Up to ``limit`` messages, about ``max_bytes`` of data (one message at least)."""
        result: ReadResult = await self.read_db(
            reads.read_messages, name, position, now=now_ms(), limit=limit, max_bytes=max_bytes
        )
        await self.touch(result.state)  # a read, as on the Durable Streams path
        return result

    # -- reader cursors --------------------------------------------------------------------------

    async def cursors(self, station: str, page: Page | None = None) -> list[dict[str, Any]]:
        """The station's reader cursors, or a ``page`` of them (one more than its limit)."""
        return await self.read_db(cursors.views, station, now_ms(), page)

    async def cursor(self, station: str, name: str) -> dict[str, Any]:
        return await self.read_db(cursors.one, station, name, now_ms())

    async def commit_cursor(self, station: str, name: str, raw: Any) -> dict[str, Any]:
        return await self.write(cursors.commit, station, name, raw, locks=(station,))

    async def delete_cursor(self, station: str, name: str) -> None:
        await self.write(cursors.remove, station, name, locks=(station,))

    async def offset_at(self, station: str, time_ms: int) -> dict[str, Any]:
        return await self.read_db(cursors.offset_at, station, time_ms, now_ms())

    async def cursor_lags(self, limit: int) -> list[tuple[str, str, int]]:
        return await self.read_db(cursors.lags, limit)

    # -- consumer groups and the DLS ------------------------------------------------------------

    async def ensure_group(
        self,
        station: str,
        name: str,
        raw: Any,
        exists: bool | None = None,
        reach: dls.Reach | None = None,
    ) -> tuple[dict[str, Any], bool]:
        group, created = await self.write(
            functools.partial(groups.ensure, reach=reach),
            station,
            name,
            raw,
            exists,
            locks=(station,),
        )
        # Its figures are read on a reader's thread, not in the writer's transaction: they
        # count the group's dead letters, which on a station with a large DLS held up every
        # write for each consumer's start (the SDK PUTs its group each time).
        try:
            return await self.read_db(groups.view, station, now_ms(), group.name), created
        except (NotFound, Gone):
            # Deleted since the commit (another process): 404 or 500 said the PUT failed.
            return groups.written_view(group), created

    async def delete_group(self, station: str, name: str) -> None:
        forget = functools.partial(self.tally.forget, station, name)
        await self.write(groups.remove, station, name, then=lambda _: forget(), locks=(station,))

    async def groups(self, station: str, page: Page | None = None) -> list[dict[str, Any]]:
        """The station's groups, or a ``page`` of them (one more than its limit; ordered by
        lag, the ``limit`` furthest behind)."""
        return await self.read_db(groups.views, station, now_ms(), page)

    async def fetch(
        self,
        station: str,
        group: str,
        max_count: int,
        wait_s: float,
        consumer: str,
        reach: dls.Reach | None = None,
    ) -> Fetched:
        """Lease up to ``max_count`` messages, waiting up to ``wait_s`` for the first;
        ``reach``: the stations the request may write to (see ``groups.fetch``), checked by
        every lease, a waiting fetch's included.

        A waiting fetch is parked: an append to its station in this process queues a lease
        for it right behind itself, so both run in one transaction and the fetch is answered
        by the append's own commit (one commit from append to delivery, not two). Any other
        change (another process's append, a nack's delay, an expiry) runs one round per group
        of the station's parked fetches, which leases to them in turn until the group has
        nothing more: a fetch that gets nothing stays parked, unwoken. (Every parked fetch
        leased again on every append: with 1,000 of them, 2,000 writer ops per message.)"""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        woken = self.notifier.subscribe(station)
        try:
            out = await self._lease(station, group, max_count, consumer, reach)
            while not out.messages and not out.closed:
                remaining = deadline - loop.time()
                if remaining <= 0 or self.ending:
                    break
                if woken.done():  # a change no round has run for this fetch: look again
                    self.notifier.unsubscribe(station, woken)
                    woken = self.notifier.subscribe(station)
                    out = await self._lease(station, group, max_count, consumer, reach)
                    continue
                parked = _Parked(group, max_count, consumer, reach, loop.create_future())
                self._parked.setdefault(station, []).append(parked)
                timer = loop.call_later(remaining, parked.give_up)
                try:
                    # Cancelled (the client left): so is ``answer``, and the writer drops a
                    # fetch queued behind an append that has not run yet, so it leases
                    # nothing nobody will get.
                    served = await _committed(parked.answer)
                except Unavailable:
                    # Its lease rode on another request's transaction (an append's), which
                    # the database refused (a full disk): that request hears it, and this
                    # fetch, which wrote nothing, waits on (every waiting consumer got a 503
                    # at once and came back at once). A round of leases of its own that
                    # failed is waited out the same way: the consumer's next fetch hears it.
                    served = out
                finally:
                    timer.cancel()
                    waiting = self._parked.get(station)
                    if waiting is not None and parked in waiting:
                        waiting.remove(parked)
                        if not waiting:
                            del self._parked[station]
                if served is None:  # its time ran out
                    break
                out = served  # empty: an append's transaction had nothing for this group
            if out.messages:  # in the read budget until the answer (which holds ``out``) is sent
                self.budget.charge(out, _data_bytes(out))
            return out
        finally:
            self.notifier.unsubscribe(station, woken)

    def end_all_waits(self) -> None:
        """A shutdown's drain: waiting reads and fetches answer now with what they have, as at
        their timeout (a long-poll's 204, a fetch's empty page), and later ones do not wait.
        Cut off unanswered instead, their clients saw an error (the CLI's ``group fetch
        --wait``: "cannot reach") for a planned restart."""
        self.ending = True
        for waiting in list(self._parked.values()):
            for parked in list(waiting):
                parked.give_up()  # one a transaction is leasing to gets what it leases
        self.notifier.wake_all()

    async def _lease(
        self, station: str, group: str, max_count: int, consumer: str, reach: dls.Reach | None
    ) -> Fetched:
        # A lease lost to a power cut costs one more delivery of a message nobody acked, never
        # an acked one (an ack waits for the disk, and so for every lease before it): fetches
        # alone need not wait for an fsync (README, Durability).
        return await self.write(
            self._fetch_within_budget,
            station,
            group,
            max_count,
            consumer,
            reach,
            relaxed=True,
            small=max_count <= SMALL_FETCH,
            then=self._delivered(station, group),
            locks=(station,),
        )

    def _fetch_within_budget(
        self,
        batch: Batch,
        station: str,
        group: str,
        max_count: int,
        consumer: str,
        reach: dls.Reach | None,
    ) -> Fetched:
        """``groups.fetch`` (a writer op) whose answer carries at most what the read budget
        has free, less what the batch's earlier fetches leased, up to
        ``groups.MAX_FETCH_BYTES`` (one message at least). Answers are counted in the budget
        until sent (``fetch``), so answers that clients do not read cannot pin much more
        memory than it (one batch's, one message each beyond it). A fetch does not wait for
        room, as a read does: its leases would run on while it waited."""
        leased = batch.shared.get(_FETCHED_BYTES, 0)
        room = max(1, min(groups.MAX_FETCH_BYTES, self.budget.free - leased))
        out = groups.fetch(batch, station, group, max_count, consumer, room, reach=reach)
        batch.shared[_FETCHED_BYTES] = leased + _data_bytes(out)
        return out

    def _delivered(self, station: str, group: str) -> Callable[[Fetched], None]:
        def then(out: Fetched) -> None:
            self.tally.delivered(station, group, (d.delivery_count for d in out.messages))
            if out.messages:  # their leases expire on time, whoever still waits for them
                self.leases.arm(out.messages[0].ack_deadline)
            else:  # a consumer may wait here for leases or delays of another process
                self.leases.arm(out.next_due)

        return then

    def _serve_parked(self, station: str) -> None:
        """Queue leases for the parked fetches of ``station`` right behind an append just
        queued, answered before it: a round per group (a lone fetch: its own lease)."""
        for group in {p.group for p in self._parked.get(station, ())}:
            self._round(station, group, first=True)

    def _changed(self, stations: set[str]) -> None:
        """A commit changed ``stations`` (notifier listener): their parked fetches look again,
        one round per group."""
        for station in stations:
            for group in {p.group for p in self._parked.get(station, ())}:
                self._round(station, group, first=False)

    def _round(self, station: str, group: str, *, first: bool) -> None:
        key = (station, group)
        if key in self._rounds:  # one round at a time: a change meanwhile runs one more after
            self._rounds_again.add(key)
            return
        waiting = [
            p
            for p in self._parked.get(station, ())
            if p.group == group and not p.served and not p.answer.done()
        ]
        if not waiting:
            return
        small = sum(p.max_count for p in waiting) <= SMALL_FETCH
        if first and len(waiting) == 1:
            # A lone fetch (the latency path): the lease answers it directly, in the step that
            # settles the commit, even when empty.
            parked = waiting[0]
            parked.served = True
            op = _then(
                functools.partial(
                    self._fetch_within_budget,
                    station=station,
                    group=group,
                    max_count=parked.max_count,
                    consumer=parked.consumer,
                    reach=parked.reach,
                ),
                self._delivered(station, group),
            )
            self.db.enqueue(
                op,
                relaxed=True,
                small=small,
                first=True,
                future=parked.answer,
                locks=(station,),
            )
            return
        self._rounds.add(key)
        for parked in waiting:  # its timer must not answer it while the round may lease to it
            parked.served = True
        done = self.db.enqueue(
            functools.partial(
                _lease_in_turn,
                station=station,
                group=group,
                waiting=waiting,
                fetch=self._fetch_within_budget,
            ),
            relaxed=True,
            small=small,
            first=first,
            locks=(station,),
        )
        done.add_done_callback(functools.partial(self._round_done, key, waiting))

    def _round_done(
        self, key: tuple[str, str], waiting: list[_Parked], done: asyncio.Future[_Round]
    ) -> None:
        station, group = key
        self._rounds.discard(key)
        again = key in self._rounds_again
        self._rounds_again.discard(key)
        failure = None if done.cancelled() else done.exception()
        served: dict[int, Fetched] = {}
        empty: Fetched | None = None
        refused: dict[int, Forbidden] = {}
        if failure is None and not done.cancelled():
            pairs, empty, refusals = done.result()
            served = {id(parked): out for parked, out in pairs}
            refused = {id(parked): exc for parked, exc in refusals}
        delivered = self._delivered(station, group)
        for parked in waiting:
            parked.served = False
            if parked.answer.done():  # its client left: what it was leased comes again later
                if id(parked) in served:
                    delivered(served[id(parked)])
                continue
            if failure is not None:  # the group or station is gone, the database failed
                parked.answer.set_exception(failure)
            elif id(parked) in refused:
                parked.answer.set_exception(refused[id(parked)])
            elif id(parked) in served:
                delivered(served[id(parked)])
                parked.answer.set_result(served[id(parked)])
            elif empty is not None and empty.closed:  # nothing more will come: say so now
                parked.answer.set_result(empty)
            elif parked.expired:
                parked.answer.set_result(None)
        if empty is not None:
            delivered(empty)  # arms the lease timer for what falls due next
        if again or (failure is None and empty is None and served):
            # A change meanwhile, or every fetch served with more perhaps left: look again.
            self._round(station, group, first=False)

    async def transact(
        self, req: transactions.TxRequest, reach: dls.Reach | None = None
    ) -> transactions.TxResult:
        """Settle and produce across stations in one transaction (see domain.transactions);
        ``reach``: the stations the request may write to."""

        def then(result: transactions.TxResult) -> None:
            # Produced messages count like any produce's (duplicates by id, per station).
            by_station: dict[str, list[tuple[int | None, bool]]] = {}
            for station, offset, duplicate in result.produced:
                by_station.setdefault(station, []).append((offset, duplicate))
            for station, results in by_station.items():
                self.tally.appended(station, results, False)
            if result.nack_due is not None or result.dead_lettered:
                self.leases.arm(result.nack_due or now_ms())

        locks = tuple(sorted(req.stations("settle").keys() | req.stations("produce").keys()))
        done: transactions.TxResult = await self.write(
            transactions.run, self.ids, req, reach, then=then, locks=locks
        )
        return done

    async def seek(self, station: str, group: str, target: tuple[str, Any]) -> SeekResult:
        return await self.write(groups.seek, station, group, target, locks=(station,))

    async def ack(
        self, station: str, group: str, seqs: list[int], named: Named | None = None
    ) -> tuple[int, list[str]]:
        return await self.write(
            groups.ack,
            station,
            group,
            seqs,
            named,
            small=len(seqs) <= SMALL_ACK,
            locks=(station,),
        )

    async def extend(
        self,
        station: str,
        group: str,
        seqs: list[int],
        lease_ms: int | None,
        consumer: str | None,
        named: Named | None = None,
    ) -> tuple[int, int, list[str]]:
        # A deadline moved sooner (a leaseMs shorter than what was left) needs the lease
        # timer then; one moved later finds the timer early, and it arms itself for the next.
        def arm(out: tuple[int, int, list[str]]) -> None:
            if out[0]:
                self.leases.arm(out[1])

        return await self.write(
            groups.extend,
            station,
            group,
            seqs,
            lease_ms,
            consumer,
            named,
            small=len(seqs) <= SMALL_ACK,
            then=arm,
            locks=(station,),
        )

    async def nack(
        self,
        station: str,
        group: str,
        seqs: list[int],
        delay_ms: int,
        named: Named | None = None,
        reach: dls.Reach | None = None,
    ) -> tuple[int, list[str]]:
        # A last delivery nacked goes to the DLS, where a redrive policy may time it.
        def arm(_: object) -> None:
            self.leases.arm(now_ms() + delay_ms if delay_ms else now_ms())

        return await self.write(
            functools.partial(groups.nack, reach=reach),
            station,
            group,
            seqs,
            delay_ms,
            named,
            then=arm,
            locks=(station,),
        )

    async def dead_letter(
        self,
        station: str,
        group: str,
        seqs: list[int],
        reason: str | None,
        named: Named | None = None,
        reach: dls.Reach | None = None,
    ) -> tuple[int, list[str]]:
        # The tick arms itself for a redrive the entry may await.
        return await self.write(
            functools.partial(groups.dead_letter, reach=reach),
            station,
            group,
            seqs,
            reason,
            named,
            then=lambda _: self.leases.arm(now_ms()),
            locks=(station,),
        )

    async def dls_entries(
        self,
        station: str,
        group: str | None,
        limit: int,
        after: int | None,
        max_bytes: int = dls.MAX_PAGE_BYTES,
    ) -> tuple[list[dict[str, Any]], str | None]:
        return await self.read_db(dls.entries, station, now_ms(), group, limit, after, max_bytes)

    async def replay(self, station: str, raw: Any) -> int:
        delay = raw.get("delayMs") if isinstance(raw, dict) else None

        def arm(replayed: int) -> None:
            if replayed and isinstance(delay, int) and delay > 0:
                self.leases.arm(now_ms() + delay)  # wake fetchers when the replay falls due

        return await self.write(dls.replay, station, raw, then=arm, locks=(station,))

    async def drop(self, station: str, raw: Any) -> int:
        return await self.write(dls.drop, station, raw, locks=(station,))

    async def figures(self, limit: int) -> figures.Snapshot:
        """Stations' and groups' gauges for monitoring, read now (at most ``limit`` stations)."""
        snap = await self.read_db(figures.snapshot, now_ms(), limit)
        self.tally.forget_except(snap.live)  # the counts of stations that are gone go too
        return snap

    def run_sync(self, fn: Callable[[Tx], T]) -> T:
        """For tests and tools: run ``fn`` in a read transaction, blocking."""
        return self.db.read_sync(fn)
