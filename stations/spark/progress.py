"""Progress of a pipeline job: a one-line bar on the terminal, counting the tasks of the
Spark job group the job runs under."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class _Bar:
    """A one-line progress bar on a terminal: tasks done of all tasks of the job group."""

    WIDTH = 30

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = label
        self.stream = stream
        self.started = time.monotonic()

    def draw(self, done: int, total: int) -> None:
        frac = done / total if total else 0.0
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.started
        self.stream.write(
            f"\r{self.label} [{bar}] {frac:4.0%} {done}/{total} tasks {elapsed:6.1f} s"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def task_counts(spark: SparkSession, group: str) -> tuple[int, int]:
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else []:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
    return done, total


@contextmanager
def progress(spark: SparkSession, show: bool | None, group: str, label: str) -> Iterator[None]:
    """A progress bar of the jobs in ``group`` while the block runs (``show`` None: when
    stderr is a terminal)."""
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield
        return
    bar = _Bar(label, sys.stderr)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.5):
            bar.draw(*task_counts(spark, group))

    thread = threading.Thread(target=loop, name="stations-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.draw(*task_counts(spark, group))
        bar.close()
