"""What the scheduler leaves in the log: what an operator must see, not what is by design."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_skipped_run_of_a_busy_job_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """APScheduler warns each time a job is still running when its next run falls due: four
    lines a second under load, for what is by design (the next run does the work)."""
    import logging

    from stations.domain.scheduler import _quiet_skips

    _quiet_skips()
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    with caplog.at_level(logging.WARNING, logger="apscheduler.scheduler"):
        scheduler_log.warning(
            'Execution of job "%s" skipped: maximum number of running instances reached (%d)',
            "Scheduler.sweep_ids",
            1,
        )
        scheduler_log.warning('Run time of job "%s" was missed by %s', "x", "0:00:01")
    assert [r.getMessage()[:20] for r in caplog.records] == ['Run time of job "x" ']


def test_a_lease_tick_stopped_while_it_waits_for_the_writer_ends_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop that found the lease timer's tick waiting for the writer (busy, or waiting for
    a lock) left an ERROR and a CancelledError traceback from APScheduler: the tick let the
    cancellation out, where the scheduler's other jobs end with it quietly."""
    import asyncio
    import logging
    import sqlite3

    from stations.domain.service import Service

    path = tmp_path / "s.db"

    async def run() -> None:
        svc = Service(f"sqlite:///{path}")
        await svc.start()
        blocker = sqlite3.connect(path, timeout=30, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer's next transaction waits for it
        try:
            tick = asyncio.create_task(svc.leases.tick())
            await asyncio.sleep(0.3)
            assert not tick.done()
            tick.cancel()
            assert await tick is None
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
            await svc.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    # A pending accept of another test's server on this worker, garbage-collected now, is
    # logged by asyncio whichever test runs at the time ("Task was destroyed but it is
    # pending ... _accept_connection2"): not this test's doing (seen in a CI run).
    assert not [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and "_accept_connection2" not in r.getMessage()
    ]
