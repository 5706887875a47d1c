"""One station's share of an upkeep job, isolated from the others'.

Retention, DLS expiry and the id sweep each walk every station in one writer transaction. A
station whose state makes its share fail (a setting stored before its bound existed, a database
error on its rows) must not stop the job for the rest: its share runs under a savepoint, and a
failure rolls back that share only, is logged once, and the job goes on with the next station.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stations.store.writer import Batch

logger = logging.getLogger("stations.domain.upkeep")
# (job, station) pairs whose last run failed: logged in full once, then quietly until they heal.
_failing: set[tuple[str, str]] = set()


@contextmanager
def per_station(batch: Batch, job: str, station: str) -> Iterator[None]:
    key = (job, station)
    try:
        with batch.conn.begin_nested():
            yield
    except Exception:
        if key in _failing:
            logger.debug("%s still fails for station %s", job, station, exc_info=True)
        else:
            _failing.add(key)
            logger.exception("%s failed for station %s; the other stations go on", job, station)
    else:
        if key in _failing:
            _failing.discard(key)
            logger.warning("%s works again for station %s", job, station)
