"""Background upkeep on APScheduler: expired streams, expired message ids, retention.

Each job is a writer op, so upkeep commits like any other write and never races an append.
The id sweep's period follows the smallest window in use: a 1 s window is swept about every
quarter second, a 24 h window once a minute.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import select

from stations.domain import catalog, dls, groups, lifecycle, retention
from stations.domain.isolate import each_station
from stations.domain.streams import StreamState
from stations.store.schema import streams
from stations.store.writer import Batch, now_ms

if TYPE_CHECKING:
    from stations.domain.service import Service

logger = logging.getLogger("stations.domain.scheduler")
MIN_SWEEP_S = 0.25
MAX_SWEEP_S = 60.0


def _live(batch: Batch) -> list[StreamState]:
    rows = batch.conn.execute(select(streams).where(streams.c.deleted.is_(False))).all()
    return [StreamState.from_row(r) for r in rows]


class LeaseTimer:
    """One date job at the earliest moment a lease expires or a nacked message falls due.

    Each tick settles what is due (redelivery or the DLS), wakes waiting fetchers and arms the
    next tick from the database, so nothing polls while nothing is due.
    """

    def __init__(self, service: Service, sched: AsyncIOScheduler) -> None:
        self.service = service
        self._sched = sched
        self._at: float | None = None
        self._last = 0

    def arm(self, when_ms: int | None) -> None:
        if when_ms is None:
            return
        when = when_ms / 1000 + 0.005
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
            self.arm(await self.service.write(groups.expire_all, since))
        except Exception:
            logger.exception("lease expiry failed")
            self.arm(now_ms() + 1000)


class Scheduler:
    def __init__(self, service: Service) -> None:
        self.service = service
        self._sched = AsyncIOScheduler()
        self.leases = LeaseTimer(service, self._sched)

    def start(self) -> None:
        self._sched.add_job(self.sweep_ids, "interval", seconds=1.0, id="ids")
        self._sched.add_job(self.expire_streams, "interval", seconds=5.0, id="expiry")
        self._sched.add_job(self.enforce_retention, "interval", seconds=1.0, id="retention")
        # Leases taken by another process (PostgreSQL) or before a restart: re-arm from the
        # database now and then, so their expiry never depends on one process staying up.
        self._sched.add_job(self.leases.tick, "interval", seconds=5.0, id="leases-rearm")
        self._sched.add_job(self.leases.tick, id="leases-start")
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
            live = _live(batch)
            smallest = min((state.window_ms for state in live), default=240_000)
            each_station(batch, "id sweep", live, lambda s: s.name, lambda s: ids.sweep(batch, s))
            return smallest / 4000

        try:
            period = await self.service.write(op)
        except Exception:
            logger.exception("id sweep failed")
            return
        self._set_sweep_period(period, only_shorter=False)

    async def expire_streams(self) -> None:
        try:
            await self.service.write(lifecycle.expired_streams, self.service.ids)
        except Exception:
            logger.exception("expiry sweep failed")

    async def enforce_retention(self) -> None:
        try:
            await self.service.write(retention.enforce)
            await self.service.write(dls.expire)
        except Exception:
            logger.exception("retention failed")
