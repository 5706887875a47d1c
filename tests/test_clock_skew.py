"""Several ``stations serve`` processes on one PostgreSQL database, on machines whose clocks
disagree: every deadline and window is reckoned on one clock, the database's, so a process whose
clock runs ahead neither takes a lease from its holder early nor forgets a message id early.

One process here runs its clock two minutes ahead (tests/clock/sitecustomize.py); NTP keeps real
machines closer, but a clock that has not synced yet, or a VM resumed from a snapshot, is off by
as much."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine

from stations.store import clock, db
from tests.harness import ClockServer, Server

AHEAD_S = 120
MakeServer = Callable[..., Server]


@pytest.fixture
def clients(
    pg_url: str, make_server: MakeServer, tmp_path: Path
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Clients of two processes on one database: one on time, one ``AHEAD_S`` ahead."""
    honest = make_server(pg_url)
    offset = tmp_path / "clock"
    offset.write_text(str(AHEAD_S))
    ahead = ClockServer(pg_url, tmp_path, clock=offset).start()
    try:
        with (
            httpx.Client(base_url=honest.url, timeout=30) as a,
            httpx.Client(base_url=ahead.url, timeout=30) as b,
        ):
            yield a, b
    finally:
        ahead.kill()


def test_a_process_whose_clock_runs_ahead_does_not_take_a_lease_early(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = clients
    assert a.post("/api/stations", json={"name": "skew"}).status_code == 201
    body = {"maxAckTimeMs": 60_000, "maxMsgDeliveries": 5}
    assert a.put("/api/stations/skew/groups/g", json=body).status_code == 201
    assert a.post("/api/stations/skew/messages", json={"messages": [{"data": 1}]}).is_success
    fetch = {"max": 10, "waitMs": 0, "consumer": "w1"}
    got = a.post("/api/stations/skew/groups/g/fetch", json=fetch).json()["messages"]
    assert [m["deliveryCount"] for m in got] == [1]
    # The lease has 60 s left on the database's clock; the other process's clock says
    # it ran out a minute ago.
    again = b.post("/api/stations/skew/groups/g/fetch", json={**fetch, "consumer": "w2"})
    assert again.json()["messages"] == [], "delivered again while its lease was held"
    acked = a.post("/api/stations/skew/groups/g/ack", json={"offsets": [got[0]["offset"]]})
    assert acked.json() == {"acked": 1, "unknown": []}


def test_a_process_whose_clock_runs_ahead_still_knows_a_recent_message_id(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = clients
    station = {"name": "ids", "idempotencyWindowMs": 60_000}
    assert a.post("/api/stations", json=station).status_code == 201
    one = {"messages": [{"data": "order", "id": "order-1"}]}
    first = a.post("/api/stations/ids/messages", json=one).json()["results"][0]
    assert first["duplicate"] is False
    # The producer's retry lands on the other process a moment later: inside the
    # window on the database's clock, two minutes later on the process's own.
    retry = b.post("/api/stations/ids/messages", json=one).json()["results"][0]
    assert retry["duplicate"] is True, "the retry was stored a second time"
    count = a.get("/api/stations/ids").json()
    assert count["stats"]["messages"] == 1, count


def test_a_measurement_taken_while_the_database_answers_slowly_is_set_aside(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: each sync took its measurement whatever its round trip, so one taken
    while the database answered in 2 s moved every deadline by up to a second for 30 s."""
    engine = create_engine(db.normalize_url(pg_url))
    monkeypatch.setattr(clock, "_offset_ms", 0)
    monkeypatch.setattr(clock, "_best_round_trip", None)
    monkeypatch.setattr(clock, "_set_aside", 0)
    try:
        real = clock.sync(engine)  # the same machine: the database's clock is this one's
        assert abs(real) < 50
        slow = (2.0, real + 1000)  # a 2 s round trip: the offset is anywhere within 1 s
        monkeypatch.setattr(clock, "measure", lambda _engine: slow)
        for _ in range(clock.SET_ASIDE_AT_MOST):
            assert clock.sync(engine) == real
        # As slow ten times in a row: the database is that far away now, take it.
        assert clock.sync(engine) == real + 1000
    finally:
        engine.dispose()
