"""SQLite checkpoints run by a thread of their own, never inside the writer's commits: the WAL
is still copied into the database file and started over, so it stays bounded, and everything
written reads back after a restart."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import orjson
import pytest

from stations.domain.service import Service
from stations.store import checkpoints


def _wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_the_wal_is_copied_by_the_checkpoint_thread_and_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stations.db"
    # A checkpoint every 64 frames, so a few hundred commits need several.
    monkeypatch.setattr("stations.store.db.WAL_AUTOCHECKPOINT_PAGES", 64)
    payload = os.urandom(3000).hex()  # 6 KB: two pages per message at least

    async def write() -> None:
        svc = Service(f"sqlite:///{path}")
        await svc.start()
        try:
            cp = svc.db.checkpoints
            assert cp is not None, "no checkpoint thread on an SQLite file"
            # The writer's connection never checkpoints inside a commit.
            raw = svc.db.writer._connection().connection.dbapi_connection
            assert raw is not None
            assert raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
            await svc.create_station({"name": "s"})
            largest = 0
            for k in range(300):
                await svc.produce("s", {"messages": [{"data": {"k": k, "pad": payload}}]})
                largest = max(largest, _wal_bytes(path))
            assert cp.passes > 0, "the checkpoint thread never ran"
            # 300 commits of >= 2 pages: ~2.5 MB of frames went through a WAL that SQLite
            # started over again and again (4 KB pages: 64 frames are ~260 KB).
            assert largest < 2_000_000, f"the WAL grew to {largest} bytes"
        finally:
            await svc.close()

    asyncio.run(write())

    async def read_back() -> None:
        svc = Service(f"sqlite:///{path}")
        await svc.start()
        try:
            page = await svc.browse("s", 0, 1000)
            assert page.count == 300
            assert [orjson.loads(m.data)["k"] for m in page.messages] == list(range(300))
        finally:
            await svc.close()

    asyncio.run(read_back())


def test_without_a_readable_wal_index_sqlite_checkpoints_in_commits(tmp_path: Path) -> None:
    """The fallback: no -shm to read (here: a path that is not the database's), no thread."""
    conn = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    cp = checkpoints.Checkpoints(str(tmp_path / "nowhere.db"), lambda: conn, 64)
    assert cp.start() is False
    assert cp.waiting() == 0
    cp.stop()
