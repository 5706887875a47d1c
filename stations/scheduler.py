"""Background upkeep on APScheduler: expired streams, expired message ids, retention.

Each job is a writer op, so upkeep commits like any other write and never races an append.
The id sweep's period follows the smallest window in use: a 1 s window is swept about every
quarter second, a 24 h window once a minute.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import select

from stations import lifecycle, retention
from stations.schema import streams
from stations.streams import StreamState
from stations.writer import Batch

if TYPE_CHECKING:
    from stations.service import Service

logger = logging.getLogger("stations.scheduler")
MIN_SWEEP_S = 0.25
MAX_SWEEP_S = 60.0


def _live(batch: Batch) -> list[StreamState]:
    rows = batch.conn.execute(select(streams).where(streams.c.deleted.is_(False))).all()
    return [StreamState.from_row(r) for r in rows]


class Scheduler:
    def __init__(self, service: Service) -> None:
        self.service = service
        self._sched = AsyncIOScheduler()
        self.extra_jobs: list[tuple[str, float]] = []

    def start(self) -> None:
        self._sched.add_job(self.sweep_ids, "interval", seconds=1.0, id="ids")
        self._sched.add_job(self.expire_streams, "interval", seconds=5.0, id="expiry")
        self._sched.add_job(self.enforce_retention, "interval", seconds=1.0, id="retention")
        self._sched.start()

    def stop(self) -> None:
        self._sched.shutdown(wait=False)

    def add_interval(self, fn, seconds: float, job_id: str) -> None:  # type: ignore[no-untyped-def]
        self._sched.add_job(fn, "interval", seconds=seconds, id=job_id)

    def add_once(self, fn, when, job_id: str) -> None:  # type: ignore[no-untyped-def]
        self._sched.add_job(fn, "date", run_date=when, id=job_id, replace_existing=True)

    async def sweep_ids(self) -> None:
        ids = self.service.ids

        def op(batch: Batch) -> float:
            smallest = None
            for state in _live(batch):
                smallest = min(smallest or state.window_ms, state.window_ms)
                ids.sweep(batch, state)
            return (smallest or 240_000) / 4000

        try:
            period = await self.service.write(op)
        except Exception:
            logger.exception("id sweep failed")
            return
        period = max(MIN_SWEEP_S, min(MAX_SWEEP_S, period))
        job = self._sched.get_job("ids")
        if job is not None and abs(job.trigger.interval.total_seconds() - period) > 0.01:
            self._sched.reschedule_job("ids", trigger="interval", seconds=period)

    async def expire_streams(self) -> None:
        try:
            await self.service.write(lifecycle.expired_streams, self.service.ids)
        except Exception:
            logger.exception("expiry sweep failed")

    async def enforce_retention(self) -> None:
        try:
            await self.service.write(retention.enforce)
        except Exception:
            logger.exception("retention failed")
