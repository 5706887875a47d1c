"""One station's share of an upkeep job, isolated from the others'.

Retention, DLS expiry and the id sweep each walk every station in one writer transaction. A
station whose state makes its share fail (a setting stored before its bound existed, a database
error on its rows) must not stop the job for the rest: its share runs under a savepoint, and a
failure rolls back that share only (with the after-commit hooks it queued), is logged once, and
the job goes on with the next station. Savepoints cost a round trip each on PostgreSQL, so jobs
open one only for the stations that have work to do, or (``each_station``) one for all of them,
falling back to one per station only after a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from stations.store.writer import Batch

logger = logging.getLogger("stations.domain.upkeep")
T = TypeVar("T")
# (job, station) pairs whose last run failed: logged in full once, then quietly until they heal.
_failing: set[tuple[str, str]] = set()


@contextmanager
def per_station(batch: Batch, job: str, station: str) -> Iterator[None]:
    key = (job, station)
    if batch.aborted is not None:
        # The database aborted this transaction (a deadlock): it runs again whole, so no
        # share is this station's failure, and none may be swallowed.
        raise batch.aborted
    hooks, undone = len(batch.after_commit), len(batch.undo)
    try:
        with batch.savepoint():
            yield
    except Exception:
        del batch.after_commit[hooks:]  # what the rolled-back share meant to do after commit
        batch.undo_since(undone)  # and what it did in RAM at once
        if batch.aborted is not None:
            raise batch.aborted from None
        if key in _failing:
            logger.debug("%s still fails for station %s", job, station, exc_info=True)
        else:
            _failing.add(key)
            logger.exception("%s failed for station %s; the other stations go on", job, station)
    else:
        if key in _failing:
            _failing.discard(key)
            logger.warning("%s works again for station %s", job, station)


def each_station(
    batch: Batch,
    job: str,
    items: Iterable[T],
    name: Callable[[T], str],
    work: Callable[[T], object],
) -> None:
    """``work(item)`` for every item: all under one savepoint first, and only if that fails,
    again one savepoint per item, so that only the failing station's share is lost."""
    items = list(items)
    hooks, undone = len(batch.after_commit), len(batch.undo)
    try:
        with batch.savepoint():
            for item in items:
                work(item)
        return
    except Exception:
        del batch.after_commit[hooks:]
        batch.undo_since(undone)
        if batch.aborted is not None:
            raise batch.aborted from None
    for item in items:
        with per_station(batch, job, name(item)):
            work(item)
