"""SQLite checkpoints run by a thread of their own, never inside the writer's commits: the WAL
is still copied into the database file and started over, so it stays bounded, and everything
written reads back after a restart."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import orjson
import pytest

from stations.domain.log import AppendRequest
from stations.domain.service import Service
from stations.store import checkpoints


def _wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


@pytest.mark.parametrize("durability", ["fsync", "process"])
def test_the_wal_is_copied_by_the_checkpoint_thread_and_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """With ``--durability process`` the small commits of a lone producer run on the event
    loop's thread, which never copies the WAL's tail: the thread alone must keep up."""
    path = tmp_path / "stations.db"
    # A checkpoint every 64 frames, so a few hundred commits need several.
    monkeypatch.setattr("stations.store.db.WAL_AUTOCHECKPOINT_PAGES", 64)
    # Small appends (the event loop's thread runs such commits when the server is otherwise
    # idle), yet a page of the WAL each.
    pad = b"x" * 800

    async def write() -> None:
        svc = Service(f"sqlite:///{path}", durability=durability)
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
            for k in range(600):
                body = b'{"k":%d,"pad":"%s"}' % (k, pad)
                await svc.append(AppendRequest("s", "application/json", [body]))
                largest = max(largest, _wal_bytes(path))
            assert cp.passes > 0, "the checkpoint thread never ran"
            # The writer copied each pass's tail: that is what lets SQLite start the WAL over.
            figures = svc.wal()
            assert figures is not None and figures.passes == cp.passes
            assert figures.tail_copies > 0
            # 600 commits of a few pages each: several MB of frames went through a WAL that
            # SQLite started over again and again (4 KB pages: 64 frames are ~260 KB).
            assert largest < 1_000_000, f"the WAL grew to {largest} bytes"
        finally:
            await svc.close()

    asyncio.run(write())

    async def read_back() -> None:
        svc = Service(f"sqlite:///{path}")
        await svc.start()
        try:
            page = await svc.browse("s", 0, 1000)
            assert page.count == 600
            assert [orjson.loads(m.data)["k"] for m in page.messages] == list(range(600))
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
