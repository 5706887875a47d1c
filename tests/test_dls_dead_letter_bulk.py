"""Dead-lettering many messages at once (an explicit dead-letter, a nack or a lease expiry of
their last delivery): it ran a few statements per message in the writer's transaction (2,500
messages held every append back for seconds on PostgreSQL). The entries, and what the
station's DLS settings make of them, must stay what they were message by message."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from sqlalchemy import update

from stations.domain import dls, groups, reads, retention
from stations.domain.lifecycle import CreateRequest
from stations.domain.log import AppendRequest
from stations.domain.offsets import decode, encode
from stations.domain.service import Service
from stations.store import schema
from stations.store.db import Tx
from stations.store.writer import Batch


async def _station(svc: Service, name: str, count: int, **config: Any) -> None:
    """``count`` text messages with ids and headers (one row each), and group g."""
    await svc.create_station({"name": name, "contentType": "text/plain", **config})
    await svc.append(
        AppendRequest(
            name,
            "text/plain",
            [b"m%d" % k for k in range(1, count + 1)],
            msg_ids=[f"id-{k}" for k in range(1, count + 1)],
            headers=[json.dumps({"k": str(k)}) for k in range(1, count + 1)],
        )
    )


async def _lease(svc: Service, station: str, count: int, consumer: str = "c") -> list[int]:
    seqs: list[int] = []
    while len(seqs) < count:
        got = await svc.fetch(station, "g", min(1000, count - len(seqs)), 0, consumer)
        assert got.messages
        seqs += [m.seq for m in got.messages]
    return seqs


def _entries(svc: Service, station: str) -> Any:
    return svc.dls_entries(station, None, 1000, None)


async def _messages(svc: Service, station: str, upto: int) -> list[reads.Message]:
    def read(tx: Tx) -> list[reads.Message]:
        state = reads.open_stream(tx, station, 2**62)
        return reads.messages_at(tx, state, list(range(1, upto + 1)))

    return await svc.read_db(read)


def _redrive_now(batch: Batch) -> int | None:
    """The DLS redrives their policy's delay holds back, made due and run now."""
    batch.conn.execute(
        update(schema.dls).where(schema.dls.c.redrive_at.is_not(None)).values(redrive_at=0)
    )
    return dls.redrive_due(batch)


def _view(e: dict[str, Any]) -> tuple[Any, ...]:
    return (
        e["group"],
        decode(e["offset"]) + 1,
        e["msgId"],
        e["headers"],
        e["data"],
        e["deliveryCount"],
        e["reason"],
        e["error"],
        e["redrives"],
        e["redriveAt"] is not None,
    )


def test_dead_lettering_many_keeps_every_rule(db_url: str) -> None:
    """Scattered positions of mixed delivery counts; forwarded copies; a redrive policy and
    its cap; poison-keeping off; messages retention dropped while leased."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "dead", "contentType": "text/plain"})
            await _station(svc, "fw", 40, dls={"forwardTo": "dead"})
            await svc.ensure_group("fw", "g", {"maxMsgDeliveries": 5})
            seqs = await _lease(svc, "fw", 40)
            # Some go round twice: their delivery count is 2.
            await svc.nack("fw", "g", [3, 4, 10], 0)
            again = await _lease(svc, "fw", 3)
            assert sorted(again) == [3, 4, 10]
            chosen = [s for s in seqs if s % 3 != 0]  # runs of two, with gaps
            n, unknown = await svc.dead_letter("fw", "g", list(reversed(chosen)), "bad")
            assert (n, unknown) == (len(chosen), [])
            entries, _ = await _entries(svc, "fw")
            assert [_view(e) for e in entries] == [
                (
                    "g",
                    s,
                    f"id-{s}",
                    {"k": str(s)},
                    f"m{s}",
                    2 if s in (4, 10) else 1,
                    "dead_letter",
                    "bad",
                    0,
                    False,
                )
                for s in chosen
            ]
            forwarded = await _messages(svc, "dead", len(chosen) + 1)
            assert [(m.data, m.msg_id, json.loads(m.headers or "{}")) for m in forwarded] == [
                (
                    f"m{s}".encode(),
                    None,
                    {
                        "k": str(s),
                        "dls-source": "fw",
                        "dls-group": "g",
                        "dls-reason": "dead_letter",
                    },
                )
                for s in chosen
            ]
            # The rest is still leased to the group; none of the chosen is.
            (view,) = await svc.groups("fw")
            assert (view["inFlight"], view["pending"]) == (40 - len(chosen), 0)

            # A redrive policy: first due again (redrives 0), then capped once redriven. The
            # delay keeps the service's own lease timer from redriving them while the test
            # looks (with 0 it sometimes took a few first, on PostgreSQL in CI).
            policy = {"maxRedrives": 1, "delayMs": 600_000, "backoff": 2, "maxDelayMs": 600_000}
            await _station(svc, "rd", 30, dls={"redrive": policy})
            await svc.ensure_group("rd", "g", {"maxMsgDeliveries": 5})
            first = await _lease(svc, "rd", 30)
            assert (await svc.dead_letter("rd", "g", first[:20], None))[0] == 20
            entries, _ = await _entries(svc, "rd")
            assert [_view(e) for e in entries] == [
                ("g", s, f"id-{s}", {"k": str(s)}, f"m{s}", 1, "dead_letter", None, 0, True)
                for s in first[:20]
            ]
            await svc.write(_redrive_now)  # back to the queue, redrives 1
            assert (await _entries(svc, "rd"))[0] == []
            back = await _lease(svc, "rd", 20)
            assert sorted(back) == first[:20]
            assert (await svc.dead_letter("rd", "g", back[::2], "worse"))[0] == 10
            entries, _ = await _entries(svc, "rd")
            capped = ("max_redrives", "dead_letter: worse", 1, False)
            assert [_view(e) for e in entries] == [
                ("g", s, f"id-{s}", {"k": str(s)}, f"m{s}", 1, *capped) for s in back[::2]
            ]

            # Poison-keeping off: an explicit dead letter is still kept, a last nack is not.
            await _station(svc, "np", 20, dls={"poison": False})
            await svc.ensure_group("np", "g", {"maxMsgDeliveries": 1})
            leased = await _lease(svc, "np", 20)
            assert (await svc.nack("np", "g", leased[:10], 0))[0] == 10
            assert (await svc.dead_letter("np", "g", leased[10:], "x"))[0] == 10
            entries, _ = await _entries(svc, "np")
            assert [(decode(e["offset"]) + 1, e["reason"]) for e in entries] == [
                (s, "dead_letter") for s in leased[10:]
            ]
            (view,) = await svc.groups("np")
            assert (view["inFlight"], view["pending"], view["deadLettered"]) == (0, 0, 10)

            # Retention dropped the first 10 while they were leased: no entry, and they answer
            # unknown (they were counted as nacked), but every lease is settled.
            await _station(svc, "rt", 20, retention={"maxMessages": 20})
            await svc.ensure_group("rt", "g", {"maxMsgDeliveries": 1})
            leased = await _lease(svc, "rt", 20)
            await svc.append(AppendRequest("rt", "text/plain", [b"n%d" % k for k in range(10)]))
            await svc.write(retention.enforce)
            dropped = [encode(s - 1) for s in leased[:10]]
            assert (await svc.nack("rt", "g", leased, 0)) == (10, dropped)
            entries, _ = await _entries(svc, "rt")
            assert [(decode(e["offset"]) + 1, e["data"], e["error"]) for e in entries] == [
                (s, f"m{s}", "nacked") for s in range(11, 21)
            ]
            (view,) = await svc.groups("rt")
            assert (view["inFlight"], view["pending"], view["deadLettered"]) == (0, 10, 10)
        finally:
            await svc.close()

    asyncio.run(run())


def test_messages_of_a_multi_message_row(db_url: str) -> None:
    """JSON messages appended together share a row: each entry is its own message."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "j", "contentType": "application/json"})
            body = [b'{"n":%d}' % k for k in range(1, 101)]
            await svc.append(AppendRequest("j", "application/json", body))
            await svc.ensure_group("j", "g", {"maxMsgDeliveries": 3})
            seqs = await _lease(svc, "j", 100)
            chosen = [s for s in seqs if s % 7 in (1, 2, 5)]
            assert (await svc.dead_letter("j", "g", chosen, "r"))[0] == len(chosen)
            entries, _ = await _entries(svc, "j")
            assert [(decode(e["offset"]) + 1, e["data"], e["msgId"]) for e in entries] == [
                (s, {"n": s}, None) for s in chosen
            ]
        finally:
            await svc.close()

    asyncio.run(run())


# -- statements -----------------------------------------------------------------------------


def _counted(batch: Batch, fn: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """Statements ``fn(batch, *args)`` runs, each row of an executemany counted (SQLite runs
    them row by row; PostgreSQL plans each), and its answer."""
    raw: Any = batch.conn.connection.dbapi_connection
    if isinstance(raw, sqlite3.Connection):
        sent: list[object] = []
        raw.set_trace_callback(sent.append)
        try:
            out = fn(batch, *args)
            return len(sent), out
        finally:
            raw.set_trace_callback(None)
    import psycopg

    runs = [0]

    class Counting(psycopg.Cursor[Any]):  # SQLAlchemy's and the store's own cursors
        def execute(self, *a: Any, **k: Any) -> Any:
            runs[0] += 1
            return super().execute(*a, **k)

        def executemany(self, query: Any, params_seq: Any, **k: Any) -> None:
            params_seq = list(params_seq)
            runs[0] += len(params_seq)
            super().executemany(query, params_seq, **k)

    plain = raw.cursor_factory
    raw.cursor_factory = Counting
    try:
        out = fn(batch, *args)
        return runs[0], out
    finally:
        raw.cursor_factory = plain


def test_statements_do_not_grow_with_the_messages(db_url: str) -> None:
    """An explicit dead letter and a last nack of 5 or of 500 messages (of one or two
    fetches, scattered or not, forwarded or not) cost the same statements."""

    async def run() -> dict[str, list[int]]:
        svc = Service(db_url)
        await svc.start()
        counts: dict[str, list[int]] = {"dead": [], "nack": [], "forward": []}
        try:
            await svc.create_station({"name": "target", "contentType": "text/plain"})
            for size in (5, 500):
                for verb in counts:
                    name = f"{verb}-{size}"
                    config = {"dls": {"forwardTo": "target"}} if verb == "forward" else {}
                    await _station(svc, name, 2 * size, **config)
                    await svc.ensure_group(name, "g", {"maxMsgDeliveries": 1})
                    await _lease(svc, name, size, "c1")
                    await _lease(svc, name, size, "c2")
                    chosen = list(range(1, 2 * size + 1, 2))  # every other one
                    if verb == "nack":
                        n, out = await svc.write(_counted, groups.nack, name, "g", chosen, 0)
                    else:
                        n, out = await svc.write(
                            _counted, groups.dead_letter, name, "g", chosen, "bad"
                        )
                    assert out == (size, [])
                    assert len((await _entries(svc, name))[0]) == size
                    counts[verb].append(n)
            return counts
        finally:
            await svc.close()

    counts = asyncio.run(run())
    for verb, (few, many) in counts.items():
        assert 0 < many == few, (verb, counts)


def test_messages_a_fork_reads_from_its_source(db_url: str) -> None:
    """A fork's positions up to its fork offset are its source's messages."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await _station(svc, "src", 10)
            await svc.create(CreateRequest("fk", "text/plain", {}, fork_from="src", fork_offset=6))
            await svc.append(AppendRequest("fk", "text/plain", [b"f7", b"f8", b"f9", b"f10"]))
            await svc.ensure_group("fk", "g", {})
            seqs = await _lease(svc, "fk", 10)
            chosen = [s for s in seqs if s != 5]
            assert (await svc.dead_letter("fk", "g", chosen, None))[0] == 9
            entries, _ = await _entries(svc, "fk")
            assert [(decode(e["offset"]) + 1, e["data"], e["msgId"]) for e in entries] == [
                (s, f"m{s}" if s <= 6 else f"f{s}", f"id-{s}" if s <= 6 else None) for s in chosen
            ]
        finally:
            await svc.close()

    asyncio.run(run())
