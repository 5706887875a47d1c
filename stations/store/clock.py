"""The clock that every deadline, window and timestamp is reckoned on.

On SQLite one process owns the database and its own clock is the only one. Several processes
on one PostgreSQL database may run on machines whose clocks disagree, and then each reckoning
on its own clock breaks the guarantees between them: a process whose clock runs ahead takes a
lease from its holder before its deadline, or forgets a message id still inside its window and
stores the retry a second time. So a process on a shared database reckons on the database's
clock: it measures how far the database's clock is from its own (the sample with the shortest
round trip of a few, to within half of it) when it starts and every ``SYNC_S`` seconds, and
adds that to its own.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine

from stations.store.db import shared

SYNC_S = 30.0  # how often the offset is measured again (clocks drift, NTP steps them)
SAMPLES = 3
# A measurement is only as good as its round trip (the offset is known to within half of it):
# one taken while the database answers slowly is kept only if its round trip is within this
# much of the best seen, or after this many in a row were set aside (the network got slower
# for good), so a slow moment does not move every deadline by up to half its round trip.
SLACK_S = 0.005
SET_ASIDE_AT_MOST = 10
_DATABASE_MS = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"

_offset_ms = 0  # the database's clock minus this process's, in ms
_best_round_trip: float | None = None  # seconds, of the measurements kept
_set_aside = 0


def now_ms() -> int:
    """Milliseconds since the epoch on the database's clock."""
    return int(time.time() * 1000) + _offset_ms


def local_s(when_ms: int) -> float:
    """``when_ms`` (on the database's clock) as a time on this process's clock, in seconds,
    for timers that take the local wall clock."""
    return (when_ms - _offset_ms) / 1000


def sync(engine: Engine) -> int:
    """Measure the database's clock against this process's (only where several processes may
    share the database); returns the offset now in use, in ms."""
    global _offset_ms, _best_round_trip, _set_aside
    if not shared(engine):
        return _offset_ms
    round_trip, offset = measure(engine)
    best = _best_round_trip
    if best is not None and round_trip > 2 * best + SLACK_S and _set_aside < SET_ASIDE_AT_MOST:
        _set_aside += 1
        return _offset_ms
    _offset_ms, _set_aside = offset, 0
    _best_round_trip = round_trip if best is None else min(best, round_trip)
    return _offset_ms


def measure(engine: Engine) -> tuple[float, int]:
    """The shortest of ``SAMPLES`` round trips (s) and the offset (ms) measured in it."""
    best: tuple[float, int] | None = None
    with engine.connect() as conn:
        for _ in range(SAMPLES):
            sent = time.time()
            database_ms = int(conn.exec_driver_sql(_DATABASE_MS).scalar_one())
            received = time.time()
            # The database read its clock somewhere inside the round trip: in the middle, to
            # within half of it.
            offset = database_ms - round((sent + received) * 500)
            if best is None or received - sent < best[0]:
                best = (received - sent, offset)
        conn.rollback()
    assert best is not None
    return best
