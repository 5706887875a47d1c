"""Writes the database refuses while reads still work (a full disk), on embedded SQLite.

A full disk is played by SQLite itself, on the writer's own connection: ``max_page_count``
at the file's size fails every write that grows it with SQLITE_FULL ("database or disk is
full"), and ``query_only`` fails every write whatever its size (found by a review on real
full filesystems)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from stations.api.access import AccessFile
from stations.domain.log import AppendRequest
from stations.domain.service import Service
from stations.errors import Unavailable
from stations.store import db
from stations.store.checkpoints import Checkpoints
from stations.store.writer import Batch

BIN = "application/octet-stream"


def _raw(svc: Service) -> Any:
    """The writer's own SQLite connection (the writer is idle whenever a test calls this)."""
    conn = svc.db.writer._conn
    assert conn is not None
    return conn.connection.dbapi_connection


def _cap(batch: Batch) -> None:
    """From now on, no write may grow the database file."""
    raw = batch.conn.connection.dbapi_connection
    assert raw is not None
    (pages,) = raw.execute("PRAGMA page_count").fetchone()
    raw.execute(f"PRAGMA max_page_count = {pages}")


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_full_disk_is_logged_once_until_a_write_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed write logged two ERROR lines and two "works again" (a read between them,
    or a scheduler batch that wrote nothing, counted as the database working again): 131
    lines for 60 failed writes. Now one line when writes start failing, one when a write has
    stored something again."""

    async def run() -> None:
        svc = Service(f"sqlite:///{tmp_path / 'd' / 's.db'}")
        await svc.start()
        try:
            await svc.create_station({"name": "s", "contentType": BIN})
            await svc.write(_cap)
            caplog.clear()
            for _ in range(6):
                with pytest.raises(Unavailable, match="disk is full"):
                    await svc.append(AppendRequest("s", BIN, [b"x" * 200_000]))
                await svc.read_db(lambda tx: 1)  # reads work meanwhile
                assert svc.writes_failing
            await asyncio.sleep(2.5)  # the scheduler's batches, which write nothing, commit
            assert svc.writes_failing
            assert len(_lines(caplog, "failed")) == 1, _lines(caplog, "failed")
            assert _lines(caplog, "works again") == []
            _raw(svc).execute("PRAGMA max_page_count = 1000000000")  # space is freed
            await svc.append(AppendRequest("s", BIN, [b"x" * 200_000]))
            assert not svc.writes_failing
            assert len(_lines(caplog, "works again")) == 1, _lines(caplog, "works again")
        finally:
            await svc.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(run())


async def test_readiness_says_writes_fail_and_sees_them_work_again(tmp_path: Path) -> None:
    """/readyz and /healthz ran SELECT 1 only: 200 "ok" while every write failed, and no
    series told. While the writer's batches fail they answer 503 "writes failing"
    (``stations_writes_failing`` 1), and a small probe write on a connection of its own
    (nothing else may write on an idle server) says when writes are taken again, to the
    checks and the gauge alike; the log waits for a write of the writer's own."""
    from aiohttp.test_utils import TestClient, TestServer

    from stations.api import make_app

    def read_only(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA query_only = 1")

    svc = Service(f"sqlite:///{tmp_path / 'd' / 's.db'}")
    async with TestClient(TestServer(make_app(svc))) as client:
        r = await client.put("/v1/stream/s", data=b"x", headers={"Content-Type": BIN})
        assert r.status == 201
        assert (await client.get("/readyz")).status == 200
        # No write of any size is taken, on the writer's connection or any other.
        _raw(svc).execute("PRAGMA query_only = 1")
        event.listen(svc.db.read_engine, "connect", read_only)
        svc.db.read_engine.dispose()
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": BIN})
        assert r.status == 503, await r.text()
        for probe in ("/readyz", "/healthz", "/readyz"):
            r = await client.get(probe)
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert await r.json() == {
                "status": "unavailable",
                "database": "writes failing",
                "error": "attempt to write a readonly database",
            }
        assert "stations_writes_failing 1.0" in await (await client.get("/metrics")).text()
        event.remove(svc.db.read_engine, "connect", read_only)
        svc.db.read_engine.dispose()
        _raw(svc).execute("PRAGMA query_only = 0")
        svc.db.fresh_failure_s = 0  # the writer's failure is old: the probe decides
        probes: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
            if statement.startswith("UPDATE alembic_version"):
                probes.append(statement)

        event.listen(svc.db.read_engine, "before_cursor_execute", count)
        r = await client.get("/readyz")  # without any other write
        assert (r.status, await r.json()) == (200, {"status": "ok"})
        # One probe write said writes are taken: the gauge says so, and the next checks
        # do not write again (both waited for a write of the writer's own before).
        assert "stations_writes_failing 0.0" in await (await client.get("/metrics")).text()
        for _ in range(3):
            assert (await client.get("/readyz")).status == 200
        assert len(probes) == 1
        event.remove(svc.db.read_engine, "before_cursor_execute", count)
        # The writer failing again after the probe says so again.
        _raw(svc).execute("PRAGMA query_only = 1")
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": BIN})
        assert r.status == 503, await r.text()
        assert "stations_writes_failing 1.0" in await (await client.get("/metrics")).text()
        _raw(svc).execute("PRAGMA query_only = 0")
        r = await client.post("/v1/stream/s", data=b"z", headers={"Content-Type": BIN})
        assert r.status in (200, 204), await r.text()
        assert "stations_writes_failing 0.0" in await (await client.get("/metrics")).text()


async def test_a_probe_that_commits_does_not_hide_the_writers_fresh_failures(
    tmp_path: Path,
) -> None:
    """On a real full disk the probe's one small row fitted in WAL space the failed batches
    had taken: /readyz answered 200 "ok" and the gauge said 0 between two produces that
    both failed (a review on a 3 MB tmpfs). Played here by a writer connection that takes no
    write while the probe's connection takes them: while the writer's failure is fresh, it is
    what the checks and the gauge say; an idle server's probe decides once it is old."""
    from aiohttp.test_utils import TestClient, TestServer

    from stations.api import make_app

    svc = Service(f"sqlite:///{tmp_path / 'd' / 's.db'}")
    async with TestClient(TestServer(make_app(svc))) as client:
        r = await client.put("/v1/stream/s", data=b"x", headers={"Content-Type": BIN})
        assert r.status == 201
        _raw(svc).execute("PRAGMA query_only = 1")
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": BIN})
        assert r.status == 503, await r.text()
        for probe in ("/readyz", "/healthz", "/readyz"):
            r = await client.get(probe)
            assert r.status == 503, await r.text()
            assert (await r.json())["database"] == "writes failing"
            assert "stations_writes_failing 1.0" in await (await client.get("/metrics")).text()
        svc.db.fresh_failure_s = 0  # as if the failure were older than the threshold
        # The disk's free space counts after a full disk only: here the writer failed for
        # another reason (a lock held too long, say), and the probe decides.
        svc.db.min_free_bytes = 1 << 62  # more than any disk has
        r = await client.get("/readyz")
        assert (r.status, await r.json()) == (200, {"status": "ok"})
        _raw(svc).execute("PRAGMA query_only = 0")
        # Writes 15 s apart on a real full disk: the probe's row fitted in WAL space the failed
        # batches had taken, and readiness said ok a third of the time. After a full disk, one
        # with less free than the bound (played by a bound above any disk) says writes fail.
        await svc.write(_cap)
        r = await client.post("/v1/stream/s", data=b"y" * 200_000, headers={"Content-Type": BIN})
        assert r.status == 503, await r.text()
        for probe in ("/readyz", "/healthz"):
            r = await client.get(probe)
            assert r.status == 503, await r.text()
            body = await r.json()
            assert body["database"] == "writes failing" and "bytes free" in body["error"], body
        assert "stations_writes_failing 1.0" in await (await client.get("/metrics")).text()
        svc.db.min_free_bytes = 0
        r = await client.get("/readyz")
        assert (r.status, await r.json()) == (200, {"status": "ok"})


async def test_the_open_probes_tell_the_databases_words_to_an_admin_only(
    tmp_path: Path,
) -> None:
    """With tokens, /readyz and /healthz (open to all, as the contract has it), and every
    route's 503, answered the database driver's error text, which names PostgreSQL's host,
    port, database and role (found by reviews). Without a token, or with one of another role,
    they say the state only; an admin token, or a server without tokens, gets the words too."""
    from aiohttp.test_utils import TestClient, TestServer

    from stations.api import make_app
    from stations.tokens import Token, digest_of

    tokens = [
        Token(digest_of("admin-secret"), "admin"),
        Token(digest_of("prod-secret"), "producer"),
        Token(digest_of("tenant-secret"), "admin", ("tenant-*",)),  # a tenant's admin
    ]
    svc = Service(f"sqlite:///{tmp_path / 'd' / 's.db'}")
    async with TestClient(TestServer(make_app(svc, tokens=tokens))) as client:
        admin = {"Authorization": "Bearer admin-secret"}
        r = await client.put("/v1/stream/s", data=b"x", headers={"Content-Type": BIN, **admin})
        assert r.status == 201
        _raw(svc).execute("PRAGMA query_only = 1")
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": BIN, **admin})
        assert r.status == 503, await r.text()
        said = (await r.json())["error"]["message"]
        assert said.endswith("retry later (attempt to write a readonly database)"), said
        # Every route's 503 alike (a produce, a read): the state, not the database's words.
        producer = {"Authorization": "Bearer prod-secret"}
        r = await client.post("/v1/stream/s", data=b"y", headers={"Content-Type": BIN, **producer})
        assert r.status == 503
        assert (await r.json())["error"]["message"] == "the database is unavailable, retry later"
        for probe in ("/readyz", "/healthz"):
            for secret in (None, "prod-secret", "tenant-secret"):
                headers = {"Authorization": f"Bearer {secret}"} if secret else {}
                r = await client.get(probe, headers=headers)
                assert r.status == 503
                assert await r.json() == {"status": "unavailable", "database": "writes failing"}
            r = await client.get(probe, headers=admin)
            assert (await r.json())["error"] == "attempt to write a readonly database"
        _raw(svc).execute("PRAGMA query_only = 0")


def test_a_waiting_fetch_waits_on_when_an_append_fails(tmp_path: Path) -> None:
    """A waiting fetch's lease rides on the append that wakes it: when the disk refused that
    append, the fetch, which wrote nothing, was answered 503 too (every waiting consumer at
    once). It waits on, and gets the next append that is stored."""

    async def run() -> None:
        svc = Service(f"sqlite:///{tmp_path / 'd' / 's.db'}")
        await svc.start()
        try:
            await svc.create_station({"name": "s", "contentType": BIN})
            await svc.ensure_group("s", "g", {})
            fetch = asyncio.ensure_future(svc.fetch("s", "g", 1, 10.0, "c"))
            await asyncio.sleep(0.2)  # parked
            await svc.write(_cap)
            with pytest.raises(Unavailable, match="disk is full"):
                await svc.append(AppendRequest("s", BIN, [b"x" * 200_000]))
            await asyncio.sleep(0.2)
            assert not fetch.done(), fetch
            _raw(svc).execute("PRAGMA max_page_count = 1000000000")
            await svc.append(AppendRequest("s", BIN, [b"stored"]))
            got = await asyncio.wait_for(fetch, 5)
            assert [m.data for m in got.messages] == [b"stored"]
        finally:
            await svc.close()

    asyncio.run(run())


def test_failing_checkpoints_are_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint is tried after every batch once one is due; on a full disk each failed
    with a traceback at ERROR: hundreds a second."""
    path = str(tmp_path / "s.db")
    checkpoints = Checkpoints(path, lambda: sqlite3.connect(path), 1)
    broken = sqlite3.connect(path)
    broken.close()  # every statement on it fails
    with caplog.at_level(logging.INFO):
        for _ in range(50):
            checkpoints.copy_tail(broken)
    failures = [r for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]


def test_a_start_on_a_full_disk_says_so(tmp_path: Path) -> None:
    """The migrations' commit failing with SQLITE_FULL was told as "cannot reach the
    database", the words of a network outage."""
    path = tmp_path / "s.db"
    engine = db.make_engine(f"sqlite:///{path}", writer=True)

    @event.listens_for(engine, "connect")
    def full(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA max_page_count = 2")

    try:
        with pytest.raises(db.Unusable, match=f"the disk holding {path} is full"):
            db.upgrade(engine)
    finally:
        engine.dispose()


def test_an_access_log_on_a_full_disk_is_told_once(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """--access-log FILE on a full disk: the logging module printed a traceback on stderr for
    every request ("--- Logging error ---"). Told once on the server's log, then counted."""
    logger = logging.getLogger("stations.access.test")
    logger.propagate = False
    handler = AccessFile("/dev/full")  # every write: ENOSPC
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="stations"):
            for n in range(30):
                logger.warning("GET /x %d", n)
    finally:
        logger.removeHandler(handler)
        handler.close()
    told = [r.getMessage() for r in caplog.records if "access log" in r.getMessage()]
    assert told == [
        "writing the access log /dev/full failed: OSError: [Errno 28] No space left on device"
    ]
    assert "Logging error" not in capsys.readouterr().err
