"""One station's upkeep share is isolated from the others' (``stations.domain.isolate``), but a
transaction the database aborted (a deadlock between two processes on PostgreSQL) is nobody's
share: it runs again whole, so the abort must reach the writer, not be logged as the next
station's failure (it became ``RuntimeError: generator didn't yield``, which the writer does not
run again)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, create_engine

from stations.domain.isolate import each_station, per_station
from stations.store.writer import Batch, transient


class Deadlock(Exception):
    sqlstate = "40P01"  # what psycopg's DeadlockDetected carries


@pytest.fixture
def conn() -> Iterator[Connection]:
    engine = create_engine("sqlite://")
    with engine.connect() as connection, connection.begin():
        yield connection
    engine.dispose()


def test_a_deadlock_in_one_share_reaches_the_writer(conn: Connection) -> None:
    batch = Batch(conn, 0)
    with pytest.raises(Deadlock), per_station(batch, "retention", "a"):
        raise Deadlock("deadlock detected")
    assert batch.aborted is not None and transient(batch.aborted)
    # The next station's share does not run, and is not blamed.
    ran: list[str] = []
    with pytest.raises(Deadlock), per_station(batch, "retention", "b"):
        ran.append("b")
    assert ran == []


def test_each_station_lets_a_deadlock_through(conn: Connection) -> None:
    batch = Batch(conn, 0)

    def work(name: str) -> None:
        if name == "b":
            raise Deadlock("deadlock detected")

    with pytest.raises(Deadlock):
        each_station(batch, "id sweep", ["a", "b", "c"], str, work)


def test_a_stations_own_failure_stays_its_own(conn: Connection) -> None:
    batch = Batch(conn, 0)
    done: list[str] = []
    for name in ("a", "b", "c"):
        with per_station(batch, "retention", name):
            if name == "b":
                raise ValueError("a bad stored setting")
            done.append(name)
    assert done == ["a", "c"] and batch.aborted is None
