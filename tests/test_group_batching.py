"""Consumer groups on the writer's transactions: a waiting fetch is served by the commit of the
append that brings its message (no second transaction), and fetch/ack settle exactly what they
should when several consumers share one commit. Runs the service in-process on both engines."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from stations.domain import groups, messages
from stations.domain.lifecycle import CreateRequest
from stations.domain.offsets import encode
from stations.domain.service import Service
from stations.domain.station import default_config
from stations.errors import Forbidden
from stations.store.streams import load
from stations.store.writer import Batch


async def _wait_parked(svc: Service, station: str, count: int) -> None:
    """Until ``count`` fetches wait on ``station`` (bounded: 10 s)."""
    stop = time.monotonic() + 10
    while len(svc._parked.get(station, ())) < count:
        assert time.monotonic() < stop, "the fetches never started waiting"
        await asyncio.sleep(0.01)


def _run(db_url: str, scenario):  # type: ignore[no-untyped-def]
    async def main() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await scenario(svc)
        finally:
            await svc.close()

    asyncio.run(main())


def test_waiting_fetch_is_answered_by_the_appends_commit(db_url: str) -> None:
    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.ensure_group("s", "g", {})
        for k in range(3):
            waiting = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "c"))
            await _wait_parked(svc, "s", 1)
            # On PostgreSQL the LISTEN relay of earlier commits may still wake the fetch for a
            # look of its own: let it settle back into waiting first.
            await asyncio.sleep(0.3)
            await _wait_parked(svc, "s", 1)
            await svc.produce("s", {"messages": [{"data": k}]})
            # The fetch ran in the append's transaction: its answer is already there, with no
            # database work left to do (a second transaction would need the writer thread).
            for _ in range(3):
                await asyncio.sleep(0)
            assert waiting.done(), "the waiting fetch needed a transaction of its own"
            (got,) = waiting.result().messages
            assert got.data == str(k).encode() and got.delivery_count == 1
            assert await svc.ack("s", "g", [got.seq]) == (1, [])

    _run(db_url, scenario)


def test_two_waiters_one_message_each(db_url: str) -> None:
    """Both waiters' fetches join the append; one wins the message, the other keeps waiting
    and takes the next one."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.ensure_group("s", "g", {})
        first = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "a"))
        second = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "b"))
        await _wait_parked(svc, "s", 2)
        await svc.produce("s", {"messages": [{"data": 0}]})
        done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1
        (winner,) = done
        (other,) = pending
        assert [d.data for d in winner.result().messages] == [b"0"]
        await _wait_parked(svc, "s", 1)
        await svc.produce("s", {"messages": [{"data": 1}]})
        got = await asyncio.wait_for(other, 10)
        assert [(d.data, d.delivery_count) for d in got.messages] == [(b"1", 1)]

    _run(db_url, scenario)


def test_concurrent_acks_and_fetches_settle_each_message_once(db_url: str) -> None:
    """Many consumers' fetches and acks in shared transactions: every message is delivered once
    and acked once; a repeated or unknown offset answers unknown."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.produce("s", {"messages": [{"data": k} for k in range(400)]})
        await svc.ensure_group("s", "g", {})
        seen: list[int] = []
        answers: list[tuple[tuple[int, list[str]], tuple[int, list[str]]]] = []

        async def consumer(name: str) -> None:
            while True:
                got = (await svc.fetch("s", "g", 7, 0.0, name)).messages
                if not got:
                    return
                seqs = [d.seq for d in got]
                seen.extend(seqs)
                # The same offsets twice in one ack, then once more: settled once.
                first = await svc.ack("s", "g", seqs + seqs[:1])
                answers.append((first, await svc.ack("s", "g", seqs[:1])))

        await asyncio.wait_for(asyncio.gather(*(consumer(f"c{i}") for i in range(6))), 60)
        assert sorted(seen) == list(range(1, 401))
        firsts = [a for a, _ in answers]
        again = [b for _, b in answers]
        assert sum(n for n, _ in firsts) == 400
        assert all(unknown == [] for _, unknown in firsts)
        assert all(n == 0 and len(unknown) == 1 for n, unknown in again)
        assert await svc.ack("s", "g", [401]) == (0, [encode(400)])
        (view,) = await svc.groups("s")
        assert view["inFlight"] == 0 and view["pending"] == 0

    _run(db_url, scenario)


def test_fetches_alone_commit_without_waiting_for_the_disk(db_url: str) -> None:
    """A batch of fetches commits without an fsync (a lost lease costs a redelivery); any
    batch with another write waits for the disk as before, and the writer's connection is back
    to waiting for the disk after a relaxed commit."""

    def sync_setting(conn: Any) -> str:
        """The writer's own connection's setting, read between its transactions."""
        cur = conn.connection.dbapi_connection.cursor()
        if conn.dialect.name == "sqlite":
            cur.execute("PRAGMA synchronous")
            return {2: "FULL", 1: "NORMAL"}[cur.fetchone()[0]]
        cur.execute("SHOW synchronous_commit")
        return str(cur.fetchone()[0])

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.ensure_group("s", "g", {})
        await svc.produce("s", {"messages": [{"data": k} for k in range(3)]})
        writer = svc.db.writer
        await svc.db.write(lambda batch: None)  # the writer's connection exists
        before = writer.relaxed_commits
        got = (await svc.fetch("s", "g", 1, 0.0, "c")).messages
        assert [d.seq for d in got] == [1]
        assert writer.relaxed_commits == before + 1
        setting = await asyncio.to_thread(sync_setting, writer._conn)  # the writer is idle
        assert setting in ("FULL", "on"), setting
        assert await svc.ack("s", "g", [1]) == (1, [])
        await svc.produce("s", {"messages": [{"data": 3}]})
        assert writer.relaxed_commits == before + 1  # acks and appends wait for the disk
        # A fetch sharing a batch with an append waits for the disk with it.
        fetched = svc.db.enqueue(lambda b: groups.fetch(b, "s", "g", 1, "c"), relaxed=True)
        appended = svc.db.enqueue(
            lambda b: messages.produce(b, svc.ids, "s", {"messages": [{"data": 4}]})
        )
        await asyncio.gather(fetched, appended)
        assert writer.relaxed_commits == before + 1

    _run(db_url, scenario)


def test_a_fetch_alone_leaves_dead_letters_to_a_commit_that_waits_for_the_disk(
    db_url: str,
) -> None:
    """An expired last delivery goes to the DLS in a transaction that waits for the disk (a
    DLS entry, or what dls.forwardTo appends, must not vanish in a power cut after readers saw
    it): a batch of fetches alone only releases leases; the lease timer's tick moves it."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.ensure_group("s", "g", {"maxAckTimeMs": 100, "maxMsgDeliveries": 1})
        await svc.produce("s", {"messages": [{"data": 0}]})
        svc.scheduler._sched.pause()  # no tick meanwhile: only the fetches look at the lease
        assert [d.seq for d in (await svc.fetch("s", "g", 1, 0.0, "c")).messages] == [1]
        await asyncio.sleep(0.3)  # past its deadline
        relaxed = svc.db.writer.relaxed_commits
        assert (await svc.fetch("s", "g", 1, 0.0, "c")).messages == []
        assert svc.db.writer.relaxed_commits == relaxed + 1
        (view,) = await svc.groups("s")
        assert (view["deadLettered"], view["inFlight"]) == (0, 1)  # still an expired lease
        # The same fetch in a batch that waits for the disk moves it.
        fetched = svc.db.enqueue(lambda b: groups.fetch(b, "s", "g", 1, "c"), relaxed=True)
        strict = svc.db.enqueue(lambda b: None)
        await asyncio.gather(fetched, strict)
        (view,) = await svc.groups("s")
        assert (view["deadLettered"], view["inFlight"]) == (1, 0)

    _run(db_url, scenario)


def test_the_waiting_consumer_is_answered_before_the_producer(db_url: str) -> None:
    """The commit that brings a waiting fetch its message answers the fetch first: the
    consumer is waiting for it, the producer only for its acknowledgement."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "s"})
        await svc.ensure_group("s", "g", {})
        for k in range(3):
            done: list[str] = []
            fetch = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "c"))
            fetch.add_done_callback(lambda _, done=done: done.append("fetch"))
            await _wait_parked(svc, "s", 1)
            await asyncio.sleep(0.3)  # PostgreSQL: let the LISTEN relay of earlier commits pass
            await _wait_parked(svc, "s", 1)
            produce = asyncio.create_task(svc.produce("s", {"messages": [{"data": k}]}))
            produce.add_done_callback(lambda _, done=done: done.append("produce"))
            await asyncio.gather(fetch, produce)
            assert done == ["fetch", "produce"]
            assert await svc.ack("s", "g", [d.seq for d in fetch.result().messages]) == (1, [])

    _run(db_url, scenario)


def test_small_writes_of_an_idle_server_run_on_the_event_loop_thread(
    engine: str, db_url: str, tmp_path: Path
) -> None:
    """SQLite: a small batch whose commit does not wait for the disk runs on the event loop's
    own thread (no hand-off to the writer thread and back); a commit that waits for the disk,
    a big op, and every PostgreSQL transaction (round trips) run on the writer thread."""

    async def on_loop_thread(svc: Service, **how: bool) -> bool:
        ident = await svc.db.write(lambda batch: threading.get_ident(), **how)
        return ident == threading.get_ident()

    async def main() -> None:
        for durability in ("process", "fsync"):
            url = f"sqlite:///{tmp_path}/{durability}.db" if engine == "sqlite" else db_url
            svc = Service(url, durability=durability)
            await svc.start()
            try:
                await svc.db.write(lambda batch: None)  # the writer's connection exists
                sqlite = engine == "sqlite"
                assert await on_loop_thread(svc, small=False) is False
                assert await on_loop_thread(svc, small=True) is (sqlite and durability == "process")
                # Fetches alone do not wait for the disk in either mode.
                assert await on_loop_thread(svc, small=True, relaxed=True) is sqlite
            finally:
                await svc.close()

    asyncio.run(main())


def test_a_waiting_fetch_is_refused_once_its_scope_misses_the_forward_target(db_url: str) -> None:
    """Two fetches wait; meanwhile the station's dead letters are pointed at a station one of
    them may not write to (its token's scope). A lease settles expired leases first, which
    may dead-letter and so forward them: that fetch is refused by the next lease, made under
    the station's lock, and the other is served as before. Both were allowed when they came."""

    async def scenario(svc: Service) -> None:
        for name in ("s", "t"):
            await svc.create_station({"name": name})
        await svc.ensure_group("s", "g", {})

        def only_s(name: str) -> bool:
            return name == "s"

        scoped = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "a", only_s))
        free = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "b"))
        await _wait_parked(svc, "s", 2)
        await svc.patch_station("s", {"dls": {"forwardTo": "t"}})
        await svc.produce("s", {"messages": [{"data": 0}]})
        got = await asyncio.wait_for(free, 10)
        assert [d.data for d in got.messages] == [b"0"]
        with pytest.raises(Forbidden) as refused:
            await asyncio.wait_for(scoped, 10)
        assert refused.value.field == "dls.forwardTo"
        assert (await svc.station("t"))["stats"]["messages"] == 0

    _run(db_url, scenario)


def _point_dead_letters_quietly(batch: Batch, station: str, target: str | None) -> None:
    """Change ``dls.forwardTo`` as another process would: no commit of this one tells the
    waiting fetches to look again (``patch_station`` does, and their round refuses them)."""
    state = batch.stream(station)
    assert state is not None
    config = {**state.config, "dls": {**state.config["dls"], "forwardTo": target}}
    batch.conn.execute(
        text("UPDATE streams SET config = :config WHERE name = :name"),
        {"config": json.dumps(config), "name": station},
    )


def test_a_lone_waiting_fetch_answered_by_an_append_checks_its_scope(db_url: str) -> None:
    """One fetch waits; an append's commit serves it directly (no round). Its lease checks
    the scope on the row the append locked."""

    async def scenario(svc: Service) -> None:
        for name in ("s", "t"):
            await svc.create_station({"name": name})
        await svc.ensure_group("s", "g", {})
        scoped = asyncio.create_task(svc.fetch("s", "g", 10, 10.0, "a", lambda n: n == "s"))
        await _wait_parked(svc, "s", 1)
        await svc.write(_point_dead_letters_quietly, "s", "t")
        await svc.produce("s", {"messages": [{"data": 0}]})
        with pytest.raises(Forbidden):
            await asyncio.wait_for(scoped, 10)
        # Nothing was leased to it: the message is there for the next fetch.
        got = await svc.fetch("s", "g", 10, 0, "b")
        assert [(d.data, d.delivery_count) for d in got.messages] == [(b"0", 1)]

    _run(db_url, scenario)


def test_a_refused_request_does_not_renew_a_ttl_station(db_url: str) -> None:
    """A request refused for its scope writes nothing: not even the idle countdown of a
    Stream-TTL station, which its use renews (a scoped token kept a station alive by being
    refused over and over)."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "t"})
        config = default_config("s", "application/json")
        await svc.create(CreateRequest("s", "application/json", config, ttl_seconds=60))
        await svc.patch_station("s", {"dls": {"forwardTo": "t"}})
        await svc.ensure_group("s", "g", {})
        await svc.produce("s", {"messages": [{"data": 0}]})
        (leased,) = (await svc.fetch("s", "g", 1, 0, "a")).messages

        async def accessed() -> int:
            state = await svc.read_db(load, "s")
            assert state is not None
            return state.accessed_at

        def only_s(name: str) -> bool:
            return name == "s"

        before = await accessed()
        await asyncio.sleep(0.05)  # a renewal would write a later time
        refused = [
            svc.fetch("s", "g", 1, 0, "b", only_s),
            svc.nack("s", "g", [leased.seq], 0, None, only_s),
            svc.dead_letter("s", "g", [leased.seq], None, None, only_s),
            svc.ensure_group("s", "g", {}, None, only_s),
        ]
        for call in refused:
            with pytest.raises(Forbidden):
                await call
        assert await accessed() == before
        await svc.fetch("s", "g", 1, 0, "b")  # the same fetch, allowed: renews it
        assert await accessed() > before

    _run(db_url, scenario)
