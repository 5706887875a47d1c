"""What the scheduler leaves in the log: what an operator must see, not what is by design."""

from __future__ import annotations

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
