"""PostgreSQL query plans that do not depend on the server's autoanalyze.

This machine's PostgreSQL runs with autovacuum off, as some production databases do during
bulk loads. Without statistics on its new tables the planner answered a message-id lookup by
reading every stored id of the station through the (stream_id, stored_at) index. The store
analyzes after migrations and, from the scheduler, whenever a table has grown.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from stations.store import db, idtable

LOOKUP = 100  # ids per lookup: one produce request of the message-id benchmark


def explain_lookup(url: str, station: str, ids: list[str]) -> str:
    """The plan of the id window's lookup, as it sends it, on an engine with the store's own
    session settings (planned afresh with its parameters, as the store has it planned)."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            stream_id = conn.exec_driver_sql(
                "SELECT id FROM streams WHERE name = %s", (station,)
            ).scalar_one()
            cursor = conn.connection.cursor()
            cursor.execute(
                "EXPLAIN " + idtable.LOOKUP_SQL, ("\n".join(ids), stream_id), prepare=False
            )
            rows = cursor.fetchall()
        return "\n".join(r[0] for r in rows)
    finally:
        engine.dispose()


def store_ids(client: httpx.Client, station: str, count: int) -> None:
    r = client.post("/api/stations", json={"name": station, "idempotencyWindowMs": 3_600_000})
    assert r.status_code == 201, r.text
    for start in range(0, count, 1000):
        body = {
            "messages": [{"id": f"{station}-{k}", "data": k} for k in range(start, start + 1000)]
        }
        r = client.post(f"/api/stations/{station}/messages", json=body)
        assert r.status_code == 200, r.text


def test_id_lookup_uses_the_primary_key_on_a_fresh_database(pg_url: str, make_server: Any) -> None:
    server = make_server(pg_url)
    stored = 5000
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/api/stations", json={"name": "plans", "idempotencyWindowMs": 3_600_000})
        assert r.status_code == 201, r.text
        for start in range(0, stored, LOOKUP):
            body = {"messages": [{"id": f"m-{k}", "data": k} for k in range(start, start + LOOKUP)]}
            r = client.post("/api/stations/plans/messages", json=body)
            assert r.status_code == 200, r.text
    # Half of them stored, half of them new, as a producer's retry beside new messages asks.
    ids = [f"m-{k}" for k in range(0, stored, 2 * stored // LOOKUP)][: LOOKUP // 2]
    ids += [f"new-{k}" for k in range(LOOKUP - len(ids))]
    deadline = time.monotonic() + 30
    plan = explain_lookup(pg_url, "plans", ids)
    while "msg_ids_pkey" not in plan and time.monotonic() < deadline:
        time.sleep(0.5)  # the scheduler refreshes statistics every few seconds
        plan = explain_lookup(pg_url, "plans", ids)
    assert "msg_ids_pkey" in plan, plan
    assert "Seq Scan" not in plan and "ix_msg_ids_stored_at" not in plan, plan


def test_statistics_are_refreshed_only_for_tables_that_grew(pg_url: str) -> None:
    engine = db.make_engine(pg_url)
    try:
        db.upgrade(engine)  # analyzes every table: nothing has grown since
        assert db.analyze_grown(engine) == []
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO msg_ids (stream_id, msg_id, seq, stored_at) "
                "SELECT 1, 'id-' || g, g, g FROM generate_series(1, 3000) g"
            )
        deadline = time.monotonic() + 10
        grown: list[str] = []
        while not grown and time.monotonic() < deadline:
            time.sleep(0.2)  # PostgreSQL publishes its table counters about once a second
            grown = db.analyze_grown(engine)
        assert grown == ["msg_ids"]
        with engine.connect() as conn:
            analyzed = conn.exec_driver_sql(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'msg_ids'"
            ).scalar_one()
        assert analyzed < 3000
    finally:
        engine.dispose()


def test_id_lookup_of_a_station_newer_than_the_statistics(pg_url: str, make_server: Any) -> None:
    """Statistics that know one station with many ids, and none of a station created after
    them: given the new station's id, the planner estimated it at about no rows and read all of
    its ids through the (stream_id, stored_at) index for every id looked up."""
    server = make_server(pg_url)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        store_ids(client, "old", 20_000)
        engine = db.make_engine(pg_url)
        try:
            with engine.begin() as conn:
                db.analyze(conn, ["msg_ids", "streams"])
        finally:
            engine.dispose()
        store_ids(client, "new", 2_000)
    plan = explain_lookup(pg_url, "new", [f"new-{k}" for k in range(50)] + ["x"] * 50)
    assert "msg_ids_pkey" in plan, plan
    assert "ix_msg_ids_stored_at" not in plan and "Seq Scan on msg_ids" not in plan, plan
