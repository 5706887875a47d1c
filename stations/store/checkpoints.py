"""SQLite checkpoints away from the commits.

In WAL mode a commit appends pages to the WAL and a *checkpoint* copies them into the database
file. SQLite's automatic checkpoint runs inside the commit that crossed ``wal_autocheckpoint``
pages, so that commit's requests waited while ~40 MB were copied and fsynced: 90-110 ms, about
once a second under load (batched appends, 2026-11-25), when the commit itself takes ~1 ms.

Here the writer's connection never checkpoints on its own. A thread with a connection of its
own copies the WAL with PASSIVE checkpoints (the writer keeps committing meanwhile), once more
while many frames arrived during a pass, then asks the writer to copy the last few before its
next transaction. SQLite starts the WAL over only when every frame of it has been copied; under
steady writes only the writer, between two of its transactions, can see to that. The WAL so
stays about as large as with SQLite's own checkpoints, and no commit waits for a big copy.

How many frames wait is read from the WAL index's header (the ``-shm`` file, a documented
stable format: https://www.sqlite.org/walformat.html): ``mxFrame - nBackfill``. A torn read
only makes one decision a commit early or late.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any

from stations.repeats import Repeats
from stations.store import db

log = logging.getLogger("stations.store.checkpoints")

# The WAL index header (48 bytes, twice) and the checkpoint information after it, in the
# machine's byte order: mxFrame at 16, nBackfill at 96.
_MX_FRAME = struct.Struct("=I")
_MX_FRAME_AT, _BACKFILL_AT, _HEADER_BYTES = 16, 96, 136
# A background pass is repeated while this many frames arrived during the last one; the writer
# copies what is left (a few hundred pages: about a millisecond).
TAIL_FRAMES = 512
MAX_PASSES = 4
# Should the thread fall this far behind (a reader holding an old snapshot, a slow disk), the
# writer copies before its next transaction itself, as SQLite would have: the WAL stays bounded.
BEHIND = 4


@dataclass(frozen=True)
class WalFigures:
    """What an operator watches of the WAL (exported as metrics)."""

    frames_waiting: int  # pages in the WAL not yet copied into the database file
    passes: int  # checkpoints run by the thread
    tail_copies: int  # checkpoints run by the writer, between two of its transactions


class Checkpoints:
    """Checkpoints of one SQLite database, run by a thread of their own (see the module)."""

    def __init__(self, database: str, connect: Any, every: int) -> None:
        """``database``: the file's path; ``connect()``: a new DB-API connection to it (in WAL
        mode, with the writer's ``synchronous``, no transaction open); ``every``: frames
        waiting that start a checkpoint."""
        self._connect = connect
        self.every = every
        self._conn: Any = None
        self._index: mmap.mmap | None = None
        self._fd: int | None = None
        self._shm = database + "-shm"
        self._wake = threading.Event()
        self._stopping = False
        self._running = False  # the thread is copying (read and written under the GIL)
        # A full disk fails every checkpoint, and one is tried after every batch: logged once,
        # then counted (a traceback each was hundreds a second).
        self._failures = Repeats(log, "checkpoint")
        self.tail_wanted = False  # the writer copies the last frames before its next transaction
        self.passes = 0  # checkpoints run by the thread
        self.tail_copies = 0  # checkpoints run by the writer (copy_tail)
        self._thread = threading.Thread(
            target=self._serve, name="stations-checkpoints", daemon=True
        )

    def start(self) -> bool:
        """Open the thread's connection and the WAL index; False (and SQLite keeps its own
        checkpoints) when the index cannot be read."""
        # Our connection stays open while we read the index: SQLite deletes the -shm file
        # when its last connection closes, and a mapping of a deleted file would go stale.
        self._conn = self._connect()
        # Closing any descriptor of a file drops every POSIX lock this process holds on it,
        # SQLite's included: its lock that says "this index is in use" would go, and another
        # process opening the database would rebuild the index under our connections (seen:
        # SIGBUS). So the descriptor (and the mapping's own) stays open until ``release``,
        # after every connection to the database has closed.
        try:
            self._fd = os.open(self._shm, os.O_RDONLY)
            self._index = mmap.mmap(self._fd, _HEADER_BYTES, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            log.warning("WAL index %s unreadable: SQLite checkpoints on its own", self._shm)
            self._conn.close()
            self._conn = None
            return False
        self._thread.start()
        return True

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stopping = True
            self._wake.set()
            self._thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def release(self) -> None:
        """Close the WAL index once no connection to the database is open (see ``start``)."""
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def waiting(self) -> int:
        """Frames in the WAL not yet copied into the database file."""
        index = self._index
        if index is None:
            return 0
        frames: int = _MX_FRAME.unpack_from(index, _MX_FRAME_AT)[0]
        copied: int = _MX_FRAME.unpack_from(index, _BACKFILL_AT)[0]
        return max(0, frames - copied)

    def figures(self) -> WalFigures:
        return WalFigures(self.waiting(), self.passes, self.tail_copies)

    def committed(self) -> None:
        """After each commit (whichever thread ran it): start a checkpoint when one is due.
        Commits run on the event loop's thread (small ones on an idle server) never copy the
        tail, so the thread is woken whether or not a tail is wanted."""
        waiting = self.waiting()
        # Also while the thread is "running": woken but not scheduled yet, it may copy nothing
        # for tens of milliseconds while the event loop's thread keeps committing (seen: 60
        # commits, the WAL 2.7 MB with 64 frames to a checkpoint).
        if waiting >= self.every * BEHIND:
            self.tail_wanted = True
        if self._running:
            return
        if waiting >= self.every:
            self._running = True
            self._wake.set()

    def copy_tail(self, dbapi_conn: Any) -> None:
        """On the writer's thread, between two transactions (its connection idle): copy what
        the thread left, so the next transaction can start the WAL over."""
        self.tail_wanted = False
        try:
            if _checkpoint(dbapi_conn):
                self.tail_copies += 1
            self._failures.succeeded()
        except Exception as exc:  # the frames stay in the WAL; the next checkpoint copies them
            self._failures.failed(exc, traceback=not db.unavailable(exc))

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                for _ in range(MAX_PASSES):
                    if _checkpoint(self._conn):
                        self.passes += 1
                    if self._stopping or self.waiting() <= TAIL_FRAMES:
                        break
                # Even when this pass copied every frame: a transaction that began during it
                # read the WAL as it was and cannot start it over; the writer's short pass before
                # its next transaction lets that one.
                self.tail_wanted = True
                self._failures.succeeded()
            except Exception as exc:  # the frames stay in the WAL; the next checkpoint copies them
                self._failures.failed(exc, traceback=not db.unavailable(exc))
            finally:
                self._running = False


def _checkpoint(dbapi_conn: Any) -> bool:
    """A PASSIVE checkpoint: copies what it can without waiting for readers or the writer.
    False when another checkpoint was running (SQLite runs one at a time): nothing copied."""
    cursor = dbapi_conn.cursor()
    try:
        busy, _frames, _copied = cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        cursor.close()
    return not busy
