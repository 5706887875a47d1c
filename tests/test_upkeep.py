"""Housekeeping does work in proportion to what is due, not to how many stations exist.

The store's statements (``stations.store.upkeep``) must name exactly the stations that are due:
over a count rule, past their ``upkeep_at``, or holding ids that left their window; idle
stations never. Then, over HTTP, the rules by time still drop what they must, also after a
station had gone empty (its next look was set without any message to date it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from stations.domain import retention
from stations.domain.catalog import patch_station
from stations.domain.idwindow import IdWindow
from stations.domain.lifecycle import CreateRequest, create
from stations.domain.log import AppendRequest, append
from stations.domain.station import parse_config
from stations.store import db, upkeep
from stations.store.writer import Batch

T0 = 1_000_000_000  # the test's clock, in ms


@pytest.fixture
def store(db_url: str) -> Iterator[Engine]:
    engine = db.make_engine(db_url, writer=True)
    db.upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def write(engine: Engine, now: int, *ops: Any) -> list[Any]:
    with engine.connect() as conn, conn.begin():
        batch = Batch(conn, now)
        out = [op(batch) for op in ops]
        batch.flush()
        return out


def station(name: str, **config: Any) -> Any:
    req = CreateRequest(
        name, "application/json", parse_config({"name": name, **config}), compare_config=True
    )
    return lambda batch: create(batch, IdWindow(), req)


def produce(name: str, n: int, ids: bool = False) -> Any:
    messages = [b'{"k":%d}' % k for k in range(n)]
    msg_ids: list[str | None] | None = [f"{name}-{k}" for k in range(n)] if ids else None
    req = AppendRequest(name, "application/json", messages, msg_ids)
    return lambda batch: append(batch, IdWindow(), req)


def due(engine: Engine, now: int) -> list[str]:
    with engine.connect() as conn:
        return upkeep.retention_due(conn, now)


def test_only_stations_with_something_due_are_named(store: Engine) -> None:
    idle = [station(f"idle-{k:03d}") for k in range(200)]
    write(
        store,
        T0,
        *idle,
        station("count", retention={"maxMessages": 2}),
        station("bytes", retention={"maxBytes": 10}),
        station("age", retention={"maxAgeMs": 60_000}),
        station("dls", dls={"retentionMs": 30_000}),
        station("roomy", retention={"maxMessages": 100, "maxBytes": 1_000_000}),
        *(produce(f"idle-{k:03d}", 3) for k in range(0, 200, 10)),
        produce("count", 3, ids=True),  # with ids: one row of 3 messages, 7 bytes each
        produce("bytes", 3, ids=True),
        produce("roomy", 3, ids=True),
    )
    # Rules by time get a first look at once; count rules only once they are exceeded.
    assert due(store, T0) == ["age", "bytes", "count", "dls"]

    assert write(store, T0, retention.enforce) == [1 + 2]  # count keeps 2, bytes keeps 1
    assert due(store, T0) == []
    # "age" holds no message and "dls" no entry: no rule by time will ever drop anything there
    # until something is stored, so neither is looked at again (each was, every maxAgeMs or
    # retentionMs, forever: 3,000 such stations stalled every write for seconds at a time).
    assert due(store, T0 + 10**12) == []
    # A message stored makes the next look the moment it leaves maxAgeMs; later ones do not
    # move it.
    write(store, T0 + 5, produce("age", 2))
    write(store, T0 + 900, produce("age", 1))
    assert due(store, T0 + 60_004) == []
    assert due(store, T0 + 60_005) == ["age"]
    assert write(store, T0 + 60_005, retention.enforce) == [2]
    assert due(store, T0 + 60_899) == []
    assert due(store, T0 + 60_900) == ["age"]
    assert write(store, T0 + 60_900, retention.enforce) == [1]
    assert due(store, T0 + 10**12) == []

    # Appends past a count rule make a station due; so does a PATCH that gives it a rule.
    write(store, T0 + 1, produce("roomy", 200))
    patch = {"retention": {"maxAgeMs": 1_000}}
    write(store, T0 + 1, lambda batch: patch_station(batch, IdWindow(), "idle-005", patch))
    assert due(store, T0 + 1) == ["idle-005", "roomy"]


def test_id_sweep_names_only_stations_with_expired_ids(store: Engine) -> None:
    write(
        store,
        T0,
        *(station(f"quiet-{k:03d}") for k in range(200)),
        station("short", idempotencyWindowMs=1_000),
        station("long", idempotencyWindowMs=3_600_000),
        produce("short", 5, ids=True),
        produce("long", 5, ids=True),
    )
    with store.connect() as conn:
        assert [s.name for s in upkeep.ids_due(conn, T0 + 999)] == []
        assert [s.name for s in upkeep.ids_due(conn, T0 + 1_000)] == ["short"]
        assert upkeep.smallest_window(conn) == 1_000


# -- over HTTP ----------------------------------------------------------------------------------


def eventually(check: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_max_age_drops_old_messages_again_after_the_station_went_empty(server: Any) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/api/stations", json={"name": "aging", "retention": {"maxAgeMs": 2000}})
        assert r.status_code == 201, r.text

        def count() -> int:
            return int(c.get("/api/stations/aging").json()["stats"]["messages"])

        for round_ in range(2):
            body = {"messages": [{"data": {"round": round_, "k": k}} for k in range(3)]}
            assert c.post("/api/stations/aging/messages", json=body).status_code == 200
            assert count() == 3
            eventually(lambda: count() == 0, f"maxAgeMs to drop round {round_}")


def test_rules_by_time_look_again_when_something_is_stored(server: Any) -> None:
    """An empty station has no look planned; what is stored later plans one. A dead letter
    under ``dls.retentionMs`` expires after the DLS had gone empty, and a message under
    ``maxAgeMs`` is dropped in time although the look planned for an older DLS entry is a day
    away."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        # maxAgeMs must hold a produce, a fetch and a dead-letter on a loaded box.
        config = {"retention": {"maxAgeMs": 2000}, "dls": {"retentionMs": 86_400_000}}
        assert c.post("/api/stations", json={"name": "both", **config}).status_code == 201
        assert c.post("/api/stations", json={"name": "dl", "dls": {"retentionMs": 400}}).is_success

        def stats(name: str) -> dict[str, Any]:
            stats: dict[str, Any] = c.get(f"/api/stations/{name}").json()["stats"]
            return stats

        def entries(name: str) -> int:
            return len(c.get(f"/api/stations/{name}/dls").json()["entries"])

        for name in ("both", "dl"):
            assert c.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
        time.sleep(1)  # both empty, looked at, and no look planned since
        for round_ in range(2):
            for name in ("both", "dl"):
                body = {"messages": [{"data": round_}]}
                assert c.post(f"/api/stations/{name}/messages", json=body).status_code == 200
                got = c.post(f"/api/stations/{name}/groups/g/fetch", json={"max": 1}).json()
                offsets = [m["offset"] for m in got["messages"]]
                r = c.post(f"/api/stations/{name}/groups/g/dead-letter", json={"offsets": offsets})
                assert r.json()["deadLettered"] == 1, r.text
            eventually(lambda: entries("dl") == 0, f"dls.retentionMs, round {round_}")
            eventually(lambda: stats("both")["messages"] == 0, f"maxAgeMs, round {round_}")
        # The day-long DLS rule keeps its entries; the second message came and went under
        # maxAgeMs while the look for them was planned a day away.
        assert entries("both") == 2
        body = {"messages": [{"data": "late"}]}
        assert c.post("/api/stations/both/messages", json=body).status_code == 200
        eventually(lambda: stats("both")["messages"] == 0, "maxAgeMs after a dead letter")


def test_a_patch_and_an_append_in_one_transaction_keep_the_look_the_patch_asks(
    store: Engine,
) -> None:
    """A PATCH giving a station with month-old messages ``maxAgeMs`` asks for a look now; an
    append to it later in the same writer transaction planned its own look from the cached row
    (no look yet) and put it off by maxAgeMs, the old messages kept that long."""
    day = 86_400_000
    write(store, T0, station("old"), produce("old", 5))
    patch = {"retention": {"maxAgeMs": day}}
    later = T0 + 30 * day
    write(
        store,
        later,
        lambda batch: patch_station(batch, IdWindow(), "old", patch),
        produce("old", 1),
    )
    assert due(store, later) == ["old"]
    assert write(store, later, retention.enforce) == [5]
