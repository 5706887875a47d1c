"""The group-commit writer at its edges: a failed reconnect, a stop with writes still
arriving."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stations.errors import Unavailable
from stations.store import db
from stations.store.writer import Writer


class _TailWanted:
    """Checkpoints that want the WAL's tail copied before every batch."""

    tail_wanted = True

    def committed(self) -> None:
        self.tail_wanted = True

    def copy_tail(self, dbapi_conn: object) -> None:
        self.tail_wanted = False


def test_a_failed_reconnect_before_a_tail_copy_fails_one_batch_not_the_writer(
    tmp_path: Path,
) -> None:
    """The writer reconnects (its connection was invalidated) to copy the WAL's tail; should
    that fail once, that batch hears the error and later writes are served (the thread died
    before: every later write waited for ever)."""

    async def run() -> None:
        engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}", writer=True)
        writer = Writer(engine, lambda changed: None, checkpoints=_TailWanted())  # type: ignore[arg-type]
        writer.start()
        try:
            assert await writer.submit(lambda batch: "first") == "first"
            assert writer._conn is not None
            writer._conn.invalidate()
            connect, calls = engine.connect, []

            def flaky() -> Any:
                calls.append(1)
                if len(calls) == 1:
                    raise sqlite3.OperationalError("unable to open database file")
                return connect()

            engine.connect = flaky  # type: ignore[method-assign]
            with pytest.raises(sqlite3.OperationalError):
                await asyncio.wait_for(writer.submit(lambda batch: "lost"), 10)
            assert await asyncio.wait_for(writer.submit(lambda batch: "served"), 10) == "served"
        finally:
            await writer.stop()
            engine.dispose()

    asyncio.run(run())


def test_a_write_handed_over_while_the_writer_stops_is_refused(tmp_path: Path) -> None:
    """Once stopping, the writer refuses new ops (503): run on the event loop's thread one
    would race the writer's thread closing the connection; queued behind the end, none would
    ever be answered."""

    async def run() -> None:
        engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}", writer=True)
        writer = Writer(engine, lambda changed: None)
        writer.start()
        try:
            assert await writer.submit(lambda batch: "before") == "before"
            stopping = asyncio.ensure_future(writer.stop())
            await asyncio.sleep(0)  # the stop has begun
            late = writer.enqueue(lambda batch: "late", small=True)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(late, 5)
            await stopping
        finally:
            engine.dispose()

    asyncio.run(run())
