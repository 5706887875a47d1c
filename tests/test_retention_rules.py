"""Retention's rules together, and what a station leaves behind when it goes. Each case was
found by a review and failed on the code before its fix."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stations.domain import cursors, lifecycle, reads, retention
from stations.domain.idwindow import IdWindow
from stations.domain.lifecycle import CreateRequest
from stations.domain.log import AppendRequest, append
from stations.domain.offsets import EARLIEST, encode
from stations.domain.service import Service
from stations.errors import Conflict, Gone
from stations.store import db
from stations.store.streams import load
from tests.test_upkeep import station, write

T0 = 1_000_000_000


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    db.upgrade(engine)
    yield engine
    engine.dispose()


def _append(name: str, k: int) -> Any:
    request = AppendRequest(name, "application/json", [b'{"k":%05d}' % k])  # 11 bytes
    return lambda batch: append(batch, IdWindow(), request)


def _kept(engine: Any, name: str, now: int) -> list[bytes]:
    with engine.connect() as conn, conn.begin():
        return reads.read(conn, name, EARLIEST, now=now, max_bytes=1 << 20).parts


@pytest.mark.parametrize(
    ("rules", "times"),
    [
        ({"maxMessages": 3, "maxBytes": 35}, [T0] * 5),
        ({"maxAgeMs": 1000, "maxBytes": 35}, [T0, T0, T0 + 900, T0 + 900, T0 + 900]),
    ],
)
def test_two_rules_together_keep_what_each_keeps(
    engine: Any, rules: dict[str, int], times: list[int]
) -> None:
    """Five messages of 11 bytes: either rule alone keeps the last three (33 bytes); the size
    rule counted from where the other left off dropped two more."""
    write(engine, T0, station("a", retention=rules))
    for k, at in enumerate(times):
        write(engine, at, _append("a", k))
    write(engine, T0 + 1500, retention.enforce)
    assert _kept(engine, "a", T0 + 1500) == [b'{"k":00002}', b'{"k":00003}', b'{"k":00004}']


def test_a_deleted_stations_reader_cursors_go_with_it(engine: Any) -> None:
    """A station created later may be given the deleted one's id (SQLite)."""
    write(engine, T0, station("a"))
    for k in range(5):
        write(engine, T0, _append("a", k))
    offset = encode(4)
    write(engine, T0, lambda b: cursors.commit(b, "a", "spark", {"offset": offset}))
    write(engine, T0, lambda b: lifecycle.remove(b, IdWindow(), "a"))
    write(engine, T0, station("a"))
    with engine.connect() as conn:
        assert cursors.views(conn, "a", T0) == []


def test_recreating_an_expired_stream_that_forks_still_read_is_a_conflict(engine: Any) -> None:
    """The expired source stays (soft-deleted) while a fork reads it: a create of its name is
    refused with 409, as once the sweeper got to it (it failed with a 500)."""
    source = CreateRequest("src", "application/json", {}, ttl_seconds=1)
    write(engine, T0, lambda b: lifecycle.create(b, IdWindow(), source))
    write(engine, T0, _append("src", 0))
    fork = CreateRequest("fork", "application/json", {}, fork_from="src", fork_offset=1)
    write(engine, T0, lambda b: lifecycle.create(b, IdWindow(), fork))
    again = CreateRequest("src", "application/json", {})
    with pytest.raises(Conflict):
        write(engine, T0 + 5000, lambda b: lifecycle.create(b, IdWindow(), again))
    with engine.connect() as conn:
        state = load(conn, "src")
        assert state is not None and not state.deleted  # the failed create rolled back


def test_a_fork_answers_gone_for_what_its_sources_retention_dropped(engine: Any) -> None:
    """A fork reads its source up to the fork offset: what the source's retention dropped there
    is gone for the fork too (410, as the source answers), not skipped in silence."""
    write(engine, T0, station("src", retention={"maxMessages": 1}))
    for k in range(3):
        write(engine, T0, _append("src", k))
    fork = CreateRequest("fork", "application/json", {}, fork_from="src", fork_offset=2)
    write(engine, T0, lambda b: lifecycle.create(b, IdWindow(), fork))
    write(engine, T0, _append("fork", 7))
    write(engine, T0 + 1, retention.enforce)  # the source keeps only its third message
    for name in ("src", "fork"):
        with engine.connect() as conn, conn.begin(), pytest.raises(Gone):
            reads.read(conn, name, 1, now=T0 + 1, max_bytes=1 << 20)
    with engine.connect() as conn, conn.begin():
        # From the beginning: what is left, the fork's own message.
        page = reads.read(conn, "fork", EARLIEST, now=T0 + 1, max_bytes=1 << 20)
        assert page.parts == [b'{"k":00007}']


def test_position_zero_is_gone_once_retention_dropped_and_earliest_is_not(engine: Any) -> None:
    """The zero offset names position 0, gone once retention dropped the first message: the
    domain answers 410 for it on every read (catch-up, browse), as for any later dropped
    position; ``EARLIEST`` (``-1``) reads from the earliest message kept. The API told the two
    apart itself, so the management browse started at the earliest kept message in silence."""
    write(engine, T0, station("a", retention={"maxMessages": 2}))
    for k in range(4):
        write(engine, T0, _append("a", k))
    with engine.connect() as conn, conn.begin():  # nothing dropped yet: 0 is the start
        page = reads.read_messages(conn, "a", 0, now=T0, limit=9, max_bytes=1 << 20)
        assert [m.seq for m in page.messages] == [1, 2, 3, 4]
    write(engine, T0 + 1, retention.enforce)
    with engine.connect() as conn, conn.begin():
        for position in (0, 1):
            with pytest.raises(Gone):
                reads.read(conn, "a", position, now=T0 + 1, max_bytes=1 << 20)
            with pytest.raises(Gone):
                reads.read_messages(conn, "a", position, now=T0 + 1, limit=9, max_bytes=1 << 20)
        page = reads.read_messages(conn, "a", EARLIEST, now=T0 + 1, limit=9, max_bytes=1 << 20)
        assert [m.seq for m in page.messages] == [3, 4]
        assert reads.read(conn, "a", 2, now=T0 + 1, max_bytes=1 << 20).count == 2


def test_a_waiting_reader_is_not_carried_into_a_stream_created_again(tmp_path: Path) -> None:
    """A long-poll waits at offset 3 when the stream is deleted and created again (with five
    messages) in one commit: the offset is not one of the new stream's, so 410, not its
    messages 4 and 5."""

    async def run() -> None:
        svc = Service(f"sqlite:///{tmp_path / 'r.db'}")
        await svc.start()
        try:
            await svc.create(CreateRequest("x", "application/json", {}))
            old = [b'{"old":%d}' % k for k in range(1, 4)]
            await svc.append(AppendRequest("x", "application/json", old))
            waiter = asyncio.create_task(svc.read_or_wait("x", 3, 5.0, max_bytes=1 << 20))
            await asyncio.sleep(0.2)
            new = [b'{"new":%d}' % k for k in range(1, 6)]
            again = CreateRequest("x", "application/json", {}, initial=new)
            await asyncio.gather(svc.delete("x"), svc.create(again))
            with pytest.raises(Gone):
                await waiter
        finally:
            await svc.close()

    asyncio.run(run())
