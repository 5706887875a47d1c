"""SQLite checkpoints run by a thread of their own, never inside the writer's commits: the WAL
is still copied into the database file and started over, so it stays bounded, and everything
written reads back after a restart."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
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
            # 600 commits of a few pages each: ~7 MB of frames went through a WAL that SQLite
            # started over again and again. Its bound by design: once the thread falls
            # ``BEHIND`` (4 x 64 frames of 4 KB, ~1 MB, also when it was woken but has not
            # run yet), the writer copies before its next transaction; should a pass of the
            # thread hold the copy off (SQLite runs one checkpoint at a time), the pass's end
            # asks again: about twice that on a quiet box (seen: up to 1.3 MB), more when other
            # processes hold the CPU and the thread's passes run late (2.4 MB once, with the
            # suite run beside six other test runs on 2 cores). A WAL that is not started over
            # grew to 6 MB here.
            bound = 3 * checkpoints.BEHIND * 64 * (4096 + 24)
            assert largest < bound, f"the WAL grew to {largest} bytes"
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


# Asked from another process: is the WAL index's "in use" byte locked (SQLite's unix VFS: the
# DMS lock, byte 128 of the -shm file), and by whom? (struct flock on Linux.)
_DMS_PROBE = r"""
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0)
kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, lock))
print(0 if kind == fcntl.F_UNLCK else pid)
"""


def test_reading_the_wal_index_keeps_sqlites_locks_on_it(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops all of the process's POSIX locks on it. Had the
    checkpoints closed theirs on the -shm file, another process opening the database (a
    backup, ``sqlite3`` by hand) would find the index unused and rebuild it under the server's
    connections (a reviewer's run: SIGBUS)."""
    path = tmp_path / "stations.db"

    async def check() -> None:
        svc = Service(f"sqlite:///{path}")
        await svc.start()
        try:
            assert svc.db.checkpoints is not None
            await svc.create_station({"name": "s"})
            probe = subprocess.run(
                [sys.executable, "-c", _DMS_PROBE, f"{path}-shm"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert int(probe.stdout) == os.getpid(), "SQLite's lock on the WAL index is gone"
        finally:
            await svc.close()

    asyncio.run(check())
