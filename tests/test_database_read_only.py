"""The database turns read-only or is found damaged while the server runs (a review of
2026-11-29): the outage is a 503 with Retry-After, logged without a traceback, and readiness
says so steadily.

PostgreSQL demoted to a standby (or ``default_transaction_read_only`` on) refused writes with
SQLSTATE 25006, an InternalError the server took for a bug: every write a 500 with a traceback
in the log. And an idle scheduler's batch, which commits without writing, counted as the
writer's recovery: ``/readyz`` flapped between 200 and 503 every second. A SQLite file damaged
in the middle answered its writes 500 with a traceback each."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy

from stations.store import db
from tests.harness import Server


def _set_read_only(pg_url: str, on: bool) -> None:
    url = sqlalchemy.engine.make_url(db.normalize_url(pg_url))
    engine = sqlalchemy.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
            conn.exec_driver_sql(f'ALTER DATABASE "{url.database}" {setting}')
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (url.database,),
            )
    finally:
        engine.dispose()


def test_a_database_turned_read_only_is_an_outage_not_a_bug(pg_url: str, make_server: Any) -> None:
    server: Server = make_server(pg_url)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put("/v1/stream/z", headers={"Content-Type": "application/json"}).status_code
        _set_read_only(pg_url, True)
        try:
            for _ in range(3):
                r = http.post("/v1/stream/z", json=[1])
                assert r.status_code == 503, r.text
                assert "Retry-After" in r.headers
            # Several scheduler rounds (one a second): readiness says the same each time.
            answers = []
            for _ in range(12):
                answers.append(http.get("/readyz").status_code)
                time.sleep(0.25)
            assert set(answers) == {503}, answers
        finally:
            _set_read_only(pg_url, False)
        deadline = time.monotonic() + 20
        while http.post("/v1/stream/z", json=[2]).status_code not in (200, 204):
            assert time.monotonic() < deadline, "writes did not come back"
            time.sleep(0.2)
    assert "Traceback" not in server.log(), server.log()


def test_a_damaged_sqlite_file_is_an_outage_not_a_bug(tmp_path: Path, make_server: Any) -> None:
    path = tmp_path / "stations-data" / "stations.db"
    server: Server = make_server(f"sqlite:///{path}")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        body = {"messages": [{"data": "x" * 3000} for _ in range(50)]}
        for n in range(4):
            assert http.put(f"/v1/stream/s{n}", json=[]).status_code == 201
            assert http.post(f"/api/stations/s{n}/messages", json=body).status_code == 200
    server.stop()
    with open(path, "r+b") as f:  # pages 4 and 5 overwritten, as a bad disk block would
        f.seek(3 * 4096)
        f.write(b"\xff" * 8192)
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        statuses = [http.put(f"/v1/stream/n{n}", json=[]).status_code for n in range(3)] + [
            http.post(f"/api/stations/s{n}/messages", json=body).status_code for n in range(4)
        ]
    assert 500 not in statuses, statuses
    assert "Traceback" not in server.log(), server.log()


def test_corruption_in_an_extended_code_is_an_outage(tmp_path: Path) -> None:
    """SQLite reports extended codes: a damaged index is SQLITE_CORRUPT_INDEX (779), which
    the check of the plain code (11) missed."""
    import sqlite3

    path = tmp_path / "broken.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT); CREATE INDEX tb ON t (b);"
        "CREATE TABLE u (x TEXT); CREATE INDEX ux ON u (x);"
    )
    conn.executemany("INSERT INTO t (b) VALUES (?)", [(f"v{k}",) for k in range(2000)])
    conn.executemany("INSERT INTO u (x) VALUES (?)", [(f"w{k}",) for k in range(10)])
    conn.commit()
    # t's index pointed at u's pages: it no longer matches its table, as a bad block would.
    (root,) = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'ux'").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_schema SET rootpage = ? WHERE name = 'tb'", (root,))
    conn.commit()
    conn.close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE t SET b = 'zz' WHERE a = 7")
        conn.commit()
    except sqlite3.DatabaseError as exc:
        assert exc.sqlite_errorcode != sqlite3.SQLITE_CORRUPT  # an extended code
        assert db.unavailable(exc)
    else:
        raise AssertionError("the damaged index was not found")
    finally:
        conn.close()


def test_a_lost_listen_connection_is_reported(pg_url: str, make_server: Any) -> None:
    """The LISTEN connection cannot be made again while the pooled ones still work (at the
    database's max_connections, say): waits for other processes' appends then end only at
    their timeouts, and nothing said so (readiness and every metric were fine)."""
    from stations.store.pgnotify import APPLICATION_NAME

    server: Server = make_server(pg_url)
    url = sqlalchemy.engine.make_url(db.normalize_url(pg_url))
    admin = sqlalchemy.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def failing() -> str:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return next(
            line.split()[-1]
            for line in text.splitlines()
            if line.startswith("stations_notifications_failing ")
        )

    try:
        assert failing() == "0.0"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS false')
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name = %s",
                (url.database, APPLICATION_NAME),
            )
        deadline = time.monotonic() + 20
        while failing() != "1.0":
            assert time.monotonic() < deadline, "the lost LISTEN was not reported"
            time.sleep(0.2)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS true')
        deadline = time.monotonic() + 20
        while failing() != "0.0":
            assert time.monotonic() < deadline, "the LISTEN's return was not reported"
            time.sleep(0.2)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS true')
        admin.dispose()
