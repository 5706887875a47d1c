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

from stations.store import db

LOOKUP = 100  # ids per lookup: one produce request of the message-id benchmark


def explain_lookup(url: str, station: str, ids: list[str]) -> str:
    """The plan of the id window's lookup, as it sends it today, on an engine with the
    store's own session settings."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            stream_id = conn.exec_driver_sql(
                "SELECT id FROM streams WHERE name = %s", (station,)
            ).scalar_one()
            marks = ", ".join(["%s"] * len(ids))
            rows = conn.exec_driver_sql(
                "EXPLAIN SELECT msg_id, seq, stored_at FROM msg_ids "
                f"WHERE stream_id = %s AND msg_id IN ({marks})",
                (stream_id, *ids),
            ).all()
        return "\n".join(r[0] for r in rows)
    finally:
        engine.dispose()


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
