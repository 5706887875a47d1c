"""Background upkeep on APScheduler: expired streams, expired message ids, retention and DLS
expiry, lease expiry, idle producer sessions, the database's statistics.

Each job is a writer op, so upkeep commits like any other write and never races an append.
Each asks the store for what is due (``stations.store.upkeep``) rather than visiting every
station, so idle stations cost nothing. The id sweep's period follows the smallest window in
use: a 1 s window is swept about every quarter second, a 24 h window once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from stations.domain import catalog, groups, lifecycle, producers, retention
from stations.domain.idwindow import IdWindow
from stations.domain.isolate import each_station
from stations.errors import Unavailable
from stations.repeats import Repeats
from stations.store import upkeep
from stations.store.clock import SYNC_S, local_s, now_ms
from stations.store.writer import Batch

logger = logging.getLogger("stations.domain.scheduler")
MIN_SWEEP_S = 0.25
MAX_SWEEP_S = 60.0
STATISTICS_S = 5.0
T = TypeVar("T")


class Host(Protocol):
    """What the scheduler needs of the service (which starts it): the id window and the
    writer. A protocol, so the scheduler does not import the service that imports it."""

    ids: IdWindow
    producer_expiry_ms: int  # 0: sessions are kept for ever

    async def write(
        self, fn: Callable[..., T], *args: Any, sort_key: Any = None, alone: bool = False
    ) -> T: ...

    async def refresh_statistics(self) -> None: ...

    async def sync_clock(self) -> None: ...


class _NotSkips(logging.Filter):
    """A job still running when its next run falls due is not run twice, by design (the next
    run does its work): APScheduler warns of each, four times a second under load."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in str(record.msg)


def _quiet_skips() -> None:
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    if not any(isinstance(f, _NotSkips) for f in scheduler_log.filters):
        scheduler_log.addFilter(_NotSkips())


class LeaseTimer:
    """One date job at the earliest moment a lease expires or a nacked message falls due.

    Each tick settles what is due (redelivery or the DLS), wakes waiting fetchers and arms the
    next tick from the database, so nothing polls while nothing is due.
    """

    def __init__(self, service: Host, sched: AsyncIOScheduler) -> None:
        self.service = service
        self._sched = sched
        self._at: float | None = None
        self._last = 0
        self._failures = Repeats(logger, "lease expiry")

    def arm(self, when_ms: int | None) -> None:
        if when_ms is None:
            return
        when = local_s(when_ms) + 0.005  # APScheduler's date is on this machine's clock
        # APScheduler drops a date job from its store once it fires, so a stale ``_at`` never
        # holds back a new one.
        if self._at is not None and self._at <= when and self._sched.get_job("leases"):
            return
        self._at = when
        self._sched.add_job(
            self.tick,
            "date",
            run_date=datetime.fromtimestamp(when, UTC),
            id="leases",
            replace_existing=True,
            misfire_grace_time=None,
            # A tick arms the next one while it is still running; with the default of one
            # instance per job id APScheduler would skip (and so lose) a job that falls due
            # before the running tick has returned. Ticks are idempotent: let them overlap.
            max_instances=1_000_000,
        )

    async def tick(self) -> None:
        since, self._last = self._last, now_ms()
        try:
            self.arm(await self.service.write(groups.expire_all, since, alone=True))
            self._failures.succeeded()
        except asyncio.CancelledError:
            # Stopping: the tick ends with the scheduler (it was an ERROR and a traceback when
            # a stop found it waiting for the writer).
            return
        except Exception as exc:
            self._failures.failed(exc, traceback=not isinstance(exc, Unavailable))
            # Nothing was settled: the next tick looks back this far again, so the fetchers
            # whose messages fell due meanwhile are still woken.
            self._last = min(self._last, since)
            self.arm(now_ms() + 1000)


# How often the id sweep drops this process's id caches of stations deleted elsewhere (ms).
LET_GO_EVERY_MS = 60_000


class Scheduler:
    def __init__(self, service: Host) -> None:
        self.service = service
        self._sched = AsyncIOScheduler()
        self.leases = LeaseTimer(service, self._sched)
        self._next_let_go = 0  # when the id sweep next drops caches of deleted stations
        self._failures: dict[str, Repeats] = {}

    @contextlib.contextmanager
    def _reported(self, job: str) -> Iterator[None]:
        """A job's failure is logged, not raised (the next run tries again): in full once,
        then quietly while it repeats; a database outage without a traceback."""
        repeats = self._failures.setdefault(job, Repeats(logger, job))
        try:
            yield
        except asyncio.CancelledError:
            return  # stopping: the job ends with the scheduler (APScheduler logged a traceback)
        except Exception as exc:
            repeats.failed(exc, traceback=not isinstance(exc, Unavailable))
        else:
            repeats.succeeded()

    def start(self) -> None:
        _quiet_skips()
        self._sched.add_job(self.sweep_ids, "interval", seconds=1.0, id="ids")
        self._sched.add_job(self.expire_streams, "interval", seconds=5.0, id="expiry")
        self._sched.add_job(self.enforce_retention, "interval", seconds=1.0, id="retention")
        if self.service.producer_expiry_ms > 0:
            # A session outlives its expiry by at most a quarter of it (a minute at most).
            period = min(MAX_SWEEP_S, max(MIN_SWEEP_S, self.service.producer_expiry_ms / 4000))
            self._sched.add_job(self.expire_producers, "interval", seconds=period, id="producers")
        # Leases taken by another process (PostgreSQL) or before a restart: re-arm from the
        # database now and then, so their expiry never depends on one process staying up.
        self._sched.add_job(self.leases.tick, "interval", seconds=5.0, id="leases-rearm")
        self._sched.add_job(self.leases.tick, id="leases-start")
        # The database's query plans follow the tables' growth without relying on its own
        # autoanalyze (which may be off).
        self._sched.add_job(self.refresh_statistics, "interval", seconds=STATISTICS_S, id="stats")
        self._sched.add_job(self.refresh_statistics, id="stats-start")
        # Deadlines and windows are reckoned on the database's clock (stations.store.clock).
        self._sched.add_job(self.sync_clock, "interval", seconds=SYNC_S, id="clock")
        self._sched.start()
        catalog.window_listeners.append(self.window_set)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            catalog.window_listeners.remove(self.window_set)
        self._sched.shutdown(wait=False)

    def _set_sweep_period(self, period: float, *, only_shorter: bool) -> None:
        period = max(MIN_SWEEP_S, min(MAX_SWEEP_S, period))
        job = self._sched.get_job("ids")
        if job is None:
            return
        current = job.trigger.interval.total_seconds()
        if abs(current - period) > 0.01 and (period < current or not only_shorter):
            self._sched.reschedule_job("ids", trigger="interval", seconds=period)

    def window_set(self, window_ms: int) -> None:
        """A station was given ``window_ms``: sweep at least as often as that window needs at
        once, rather than after the current (possibly minute-long) period. The sweep itself
        lengthens the period again once no station needs it that short."""
        if self._sched.running:
            self._set_sweep_period(window_ms / 4000, only_shorter=True)

    async def sweep_ids(self) -> None:
        ids = self.service.ids

        def op(batch: Batch) -> float:
            # Only stations holding ids that left their window: idle ones cost nothing. One
            # station's failure stays its own.
            # In Python's order of names, as every process locks (a collation may differ).
            due = sorted(upkeep.ids_due(batch.conn, batch.now), key=lambda s: s.name)
            each_station(batch, "id sweep", due, lambda s: s.name, lambda s: ids.sweep(batch, s))
            if batch.now >= self._next_let_go:  # now and then: the sweep may run every 25 ms
                self._next_let_go = batch.now + LET_GO_EVERY_MS
                ids.let_go_of_gone(batch)
            return (upkeep.smallest_window(batch.conn) or 240_000) / 4000

        with self._reported("id sweep"):
            period = await self.service.write(op, alone=True)
            self._set_sweep_period(period, only_shorter=False)

    async def refresh_statistics(self) -> None:
        with self._reported("refreshing statistics"):
            await self.service.refresh_statistics()

    async def sync_clock(self) -> None:
        with self._reported("measuring the database's clock"):
            await self.service.sync_clock()

    async def expire_streams(self) -> None:
        with self._reported("expiry sweep"):
            await self.service.write(lifecycle.expired_streams, self.service.ids, alone=True)

    async def expire_producers(self) -> None:
        with self._reported("producer expiry"):
            idle_ms = self.service.producer_expiry_ms
            # A chunk per writer transaction, until one is not full.
            while (
                await self.service.write(producers.expire_idle, idle_ms, alone=True)
                == producers.EXPIRE_CHUNK
            ):
                pass

    async def enforce_retention(self) -> None:
        with self._reported("retention"):
            # Message retention and DLS expiry of the stations that are due, a chunk of them
            # per writer transaction: appends queued meanwhile go between two chunks.
            after: str | None = None
            while True:
                _, after = await self.service.write(retention.enforce_chunk, after, alone=True)
                if after is None:
                    break
