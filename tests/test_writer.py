"""The group-commit writer at its edges: a failed reconnect, a stop with writes still
arriving."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
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


def _notice_then_next(tmp_path: Path, hook_kind: str) -> bool:
    """Whether the writer ran a second op while the event loop, blocked, had not yet run the
    first op's after-commit hook (of ``hook_kind``: a Notice, or a plain RAM hook)."""
    from stations.store.writer import Notice

    first_running, release = threading.Event(), threading.Event()
    second_ran = threading.Event()

    def first(batch: Any) -> str:
        first_running.set()
        release.wait(10)
        hook = (lambda: None) if hook_kind == "ram" else Notice(lambda: None)
        batch.after_commit.append(hook)
        return "first"

    def second(batch: Any) -> str:
        second_ran.set()
        return "second"

    async def run() -> bool:
        engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}", writer=True)
        writer = Writer(engine, lambda changed: None, fsync=True)
        writer.start()
        try:
            one = asyncio.ensure_future(writer.submit(first))
            await asyncio.sleep(0)  # handed over: the thread runs it
            assert await asyncio.to_thread(first_running.wait, 10)
            two = asyncio.ensure_future(writer.submit(second))
            await asyncio.sleep(0.05)  # handed over while the first op still runs
            release.set()
            # The event loop is blocked here: the first batch's hook cannot run meanwhile.
            ran = second_ran.wait(3)
            assert await asyncio.wait_for(one, 10) == "first"
            assert await asyncio.wait_for(two, 10) == "second"
            return ran
        finally:
            await writer.stop()
            engine.dispose()

    return asyncio.run(run())


def test_the_next_transaction_does_not_wait_for_a_notice_hook(tmp_path: Path) -> None:
    """A count or a timer after a commit (``Notice``) does not hold the writer: it waited for
    the event loop to run every append's count before it took the next batch, idle a third
    of its time under single appends."""
    assert _notice_then_next(tmp_path, "notice")


def test_the_next_transaction_waits_for_a_ram_hook(tmp_path: Path) -> None:
    """A hook that puts in RAM what the next transaction must see (ids just stored) is run
    before that transaction starts."""
    assert not _notice_then_next(tmp_path, "ram")
