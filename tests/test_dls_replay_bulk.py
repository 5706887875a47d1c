"""A DLS replay of many entries: it ran a few statements per entry in the writer's transaction
(20,000 entries held every append back for seconds) and bound one parameter per entry, which
PostgreSQL's driver refuses past 65,535 (a 500 for ``{"all": true}`` on a large DLS)."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from sqlalchemy import event

from stations.domain import dls
from stations.domain.log import AppendRequest
from stations.domain.service import Service
from stations.store import dls as dls_store
from stations.store import groups as group_store
from stations.store.writer import Batch


async def _dead_letters(svc: Service, station: str, count: int) -> None:
    """``count`` messages of ``station``, each fetched once and dead-lettered by group g."""
    await svc.create_station({"name": station, "contentType": "text/plain"})
    for first in range(0, count, 10_000):
        bodies = [b"m%d" % k for k in range(first, min(count, first + 10_000))]
        await svc.append(AppendRequest(station, "text/plain", bodies))
    await svc.ensure_group(station, "g", {"maxMsgDeliveries": 1})
    left = count
    while left:
        got = await svc.fetch(station, "g", min(left, 1000), 0, "c")
        seqs = [m.seq for m in got.messages]
        n, unknown = await svc.dead_letter(station, "g", seqs, "bad")
        assert (n, unknown) == (len(seqs), [])
        left -= len(seqs)


def test_a_replay_costs_the_same_statements_for_5_or_500_entries(db_url: str) -> None:
    async def run() -> tuple[tuple[int, int], tuple[int, int]]:
        svc = Service(db_url)
        await svc.start()
        try:
            await _dead_letters(svc, "few", 5)
            await _dead_letters(svc, "many", 500)
            few = await svc.write(_replay_counted, "few")
            many = await svc.write(_replay_counted, "many")
            (view,) = await svc.groups("many")
            assert view["pending"] == 500  # every entry is back in the queue, due at once
            again = await svc.fetch("many", "g", 1000, 0, "c2")
            assert sorted(m.seq for m in again.messages) == list(range(1, 501))
            return few, many
        finally:
            await svc.close()

    few, many = asyncio.run(run())
    assert few[1] == 5 and many[1] == 500
    assert many[0] == few[0], (few, many)


def _replay_counted(batch: Batch, station: str) -> tuple[int, int]:
    sent: list[object] = []
    raw: Any = batch.conn.connection.dbapi_connection
    sqlite = isinstance(raw, sqlite3.Connection)

    def seen(*args: Any) -> None:
        sent.append(args[2])

    if sqlite:
        raw.set_trace_callback(sent.append)
    else:
        event.listen(batch.conn, "before_cursor_execute", seen)
    try:
        replayed = dls.replay(batch, station, {"all": True})
    finally:
        if sqlite:
            raw.set_trace_callback(None)
        else:
            event.remove(batch.conn, "before_cursor_execute", seen)
    return len(sent), replayed


def test_70000_entries_at_once_on_postgresql(pg_url: str) -> None:
    """The steps of a replay of 70,000 entries (more than the driver's 65,535 parameters):
    back in the queue, settled, their entries dropped, each in one statement."""
    count = 70_000

    def steps(batch: Batch) -> tuple[tuple[int, int], tuple[int, int], int]:
        state = batch.stream("big")
        assert state is not None
        group_id = group_store.ids_of_stream(batch.conn, state.id).pop()
        group_store.change(batch.conn, group_id, cursor=count)
        group_store.requeue(batch.conn, group_id, [(s, 1) for s in range(1, count + 1)], 0)
        queued = group_store.queue_sizes(batch.conn, group_id)
        group_store.forget(batch.conn, group_id, list(range(1, count + 1)))
        left = group_store.queue_sizes(batch.conn, group_id)
        return queued, left, dls_store.drop_ids(batch.conn, list(range(1, count + 1)))

    async def run() -> None:
        svc = Service(pg_url)
        await svc.start()
        try:
            await svc.create_station({"name": "big"})
            await svc.ensure_group("big", "g", {})
            queued, left, dropped = await svc.write(steps)
            assert queued == (count, 0) and left == (0, 0) and dropped == 0
        finally:
            await svc.close()

    asyncio.run(run())
