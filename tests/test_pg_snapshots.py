"""PostgreSQL, several processes: a read sees one state of the database, and a group's PUT is
answered as applied when another process deletes the group right after it (a review of
2026-11-29, two ``stations serve`` on one database).

A read transaction ran at READ COMMITTED: each statement saw what other processes had committed
before it. A catch-up read took its bounds in one statement and its rows in the next, so a
retention that committed in between answered an offset retention had dropped with a 200 from
later messages instead of a 410; ``/metrics`` listed groups and then their figures, and a
group deleted in between failed the whole scrape with a 500. A group's PUT was answered by a
read after its commit: another process's delete in between gave a 404 (or a 500) for a change
that had been applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy

from stations.domain.service import Service
from stations.store import db


@pytest.fixture
async def svc(pg_url: str) -> AsyncIterator[Service]:
    service = Service(pg_url)
    await service.start()
    try:
        await service.create_station({"name": "s"})
        for n in range(10):  # ten rows (a request's messages are stored in one)
            await service.produce("s", {"messages": [{"data": n}]})
        yield service
    finally:
        await service.close()


def _count(conn: Any) -> int:
    return int(conn.exec_driver_sql("SELECT count(*) FROM messages").scalar_one())


async def test_a_read_sees_one_state_of_the_database(svc: Service, pg_url: str) -> None:
    other = sqlalchemy.create_engine(db.normalize_url(pg_url), isolation_level="AUTOCOMMIT")
    try:

        def read(conn: Any) -> tuple[int, int]:
            first = _count(conn)
            with other.connect() as retention:  # another process commits meanwhile
                retention.exec_driver_sql(
                    "DELETE FROM messages WHERE seq = (SELECT min(seq) FROM messages)"
                )
            return first, _count(conn)

        first, second = await svc.read_db(read)
        assert first == 10
        assert second == first, "the read's second statement saw another commit"
        assert await svc.read_db(_count) == 9  # the next read sees it
    finally:
        other.dispose()


async def test_a_groups_put_deleted_right_after_is_answered_as_applied(
    svc: Service, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = sqlalchemy.create_engine(db.normalize_url(pg_url), isolation_level="AUTOCOMMIT")
    written = svc.write

    async def then_deleted(*args: Any, **kwargs: Any) -> Any:
        result = await written(*args, **kwargs)
        with other.connect() as conn:  # another process deletes the group after the commit
            conn.exec_driver_sql("DELETE FROM groups WHERE name = 'g'")
        return result

    monkeypatch.setattr(svc, "write", then_deleted)
    try:
        view, created = await asyncio.wait_for(
            svc.ensure_group("s", "g", {"maxAckTimeMs": 30_000}), 30
        )
    finally:
        other.dispose()
    assert created
    assert view["name"] == "g" and view["maxAckTimeMs"] == 30_000


async def test_a_forks_replay_waits_for_its_sources_retention(svc: Service, pg_url: str) -> None:
    """Another process's retention on the source, committing while a replay on the fork runs:
    the replay read the source's head without a lock, before that commit, and put back (and
    deleted the entries of) messages the retention dropped: each entry was its only copy."""
    from stations.domain.lifecycle import CreateRequest

    await svc.create(CreateRequest("fk", "application/json", {}, fork_from="s", fork_offset=10))
    await svc.ensure_group("fk", "g", {})
    fetched = await svc.fetch("fk", "g", 10, 0, "c")
    seqs = [m.seq for m in fetched.messages]
    assert len(seqs) == 10
    dead, _ = await svc.dead_letter("fk", "g", seqs, "x")
    assert dead == 10
    other = sqlalchemy.create_engine(db.normalize_url(pg_url))
    try:
        retention = other.connect()
        retention.begin()  # the other process's retention, not committed yet
        retention.exec_driver_sql("UPDATE streams SET head = 10 WHERE name = 's'")
        replay = asyncio.ensure_future(svc.replay("fk", {"all": True}))
        await asyncio.sleep(0.5)  # it reaches the source's row (and waits there, now)
        retention.commit()
        retention.close()
        replayed = await asyncio.wait_for(replay, 20)
    finally:
        other.dispose()
    assert replayed == 0
    entries = await svc.read_db(
        lambda conn: conn.exec_driver_sql("SELECT count(*) FROM dls").scalar_one()
    )
    assert entries == 10
