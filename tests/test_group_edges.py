"""Consumer groups where a seek, a DLS replay and retention meet: an acked message is never
delivered again, and a delivery whose message retention dropped is never answered with another
message. Each case was found by a review and failed on the code before its fix."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from stations.domain import groups, reads
from stations.domain.service import Service


def _service(tmp_path: Path) -> Service:
    return Service(f"sqlite:///{tmp_path / 's.db'}")


def test_a_replay_after_a_seek_back_never_redelivers_what_was_acked(tmp_path: Path) -> None:
    """After a seek back, a DLS replay of a message the log will deliver again used to queue a
    second copy of it beside the log's lease: the ack took one, the other came back."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            await svc.produce("s", {"messages": [{"data": k} for k in range(5)]})
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 300, "maxMsgDeliveries": 5})
            first = [d.seq for d in (await svc.fetch("s", "g", 5, 0, "c")).messages]
            assert await svc.dead_letter("s", "g", [3], "bad") == (1, [])
            assert (await svc.ack("s", "g", [s for s in first if s != 3]))[0] == 4
            await svc.seek("s", "g", groups.parse_seek({"to": "earliest"}))
            assert await svc.replay("s", {"all": True}) == 1
            again = (await svc.fetch("s", "g", 10, 0, "c")).messages
            assert [(d.seq, d.delivery_count) for d in again] == [(s, 1) for s in range(1, 6)]
            assert await svc.ack("s", "g", [d.seq for d in again]) == (5, [])
            await asyncio.sleep(0.6)  # past the lease time: nothing may come back
            assert (await svc.fetch("s", "g", 10, 0, "c")).messages == []
            (view,) = await svc.groups("s")
            assert (view["inFlight"], view["pending"], view["deadLettered"]) == (0, 0, 0)
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_waiting_delivery_retention_dropped_is_not_answered_with_another_message(
    tmp_path: Path,
) -> None:
    """Message 1, nacked with a delay, is dropped by retention while it waits: the fetch used
    to hand out the first kept message in its place (twice in one answer), and later fetches
    failed for good."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "s", "retention": {"maxMessages": 3}})
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 60_000, "maxMsgDeliveries": 5})
            await svc.produce("s", {"messages": [{"data": "m1"}]})
            assert [d.seq for d in (await svc.fetch("s", "g", 1, 0, "c")).messages] == [1]
            assert await svc.nack("s", "g", [1], 1000) == (1, [])
            for k in range(2, 8):
                await svc.produce("s", {"messages": [{"data": f"m{k}"}]})
            await asyncio.sleep(2.5)  # retention (a job each second) keeps 5..7; 1 falls due
            got = (await svc.fetch("s", "g", 1, 0, "c")).messages
            assert [(d.seq, d.data) for d in got] == [(5, b'"m5"')]
            got = (await svc.fetch("s", "g", 10, 0, "c")).messages
            assert [(d.seq, d.data) for d in got] == [(6, b'"m6"'), (7, b'"m7"')]
            assert await svc.ack("s", "g", [5, 6, 7]) == (3, [])
            await svc.produce("s", {"messages": [{"data": "m8"}]})
            assert [d.seq for d in (await svc.fetch("s", "g", 10, 0, "c")).messages] == [8]
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_last_delivery_retention_dropped_leaves_no_dls_entry_of_another_message(
    tmp_path: Path,
) -> None:
    """A lease at its last delivery expires after retention dropped its message: the DLS
    entry (and what ``forwardTo`` appends) used to carry the first kept message's data."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "fw"})
            config = {"name": "s", "retention": {"maxMessages": 3}, "dls": {"forwardTo": "fw"}}
            await svc.create_station(config)
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 1500, "maxMsgDeliveries": 1})
            await svc.produce("s", {"messages": [{"data": "m1"}]})
            assert [d.seq for d in (await svc.fetch("s", "g", 1, 0, "c")).messages] == [1]
            for k in range(2, 8):
                await svc.produce("s", {"messages": [{"data": f"m{k}"}]})
            await asyncio.sleep(3)
            entries, _ = await svc.dls_entries("s", None, 10, None)
            assert all(e["data"] == "m1" for e in entries), entries
            forwarded = (await svc.browse("fw", 0, 10)).messages
            assert all(m.data == b'"m1"' for m in forwarded), forwarded
        finally:
            await svc.close()

    asyncio.run(run())


def test_one_groups_failing_lease_expiry_does_not_hold_back_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler settles expired leases of every group in one transaction; each group runs
    in a savepoint of its own, so one group whose expiry fails (here: made to raise) leaves the
    others' expiry committed, and its own is done once it works again."""
    settle = groups._settle_expired

    def failing_for_g1(batch, state, group, expired=None):  # type: ignore[no-untyped-def]
        if group.name == "g1":
            raise RuntimeError("g1's expiry fails")
        return settle(batch, state, group, expired)

    async def views(svc: Service) -> dict[str, tuple[int, int]]:
        return {v["name"]: (v["inFlight"], v["pending"]) for v in await svc.groups("s")}

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            await svc.produce("s", {"messages": [{"data": "m"}]})
            for name in ("g1", "g2"):
                await svc.ensure_group("s", name, {"maxAckTimeMs": 300, "maxMsgDeliveries": 5})
                assert len((await svc.fetch("s", name, 1, 0, "c")).messages) == 1
            monkeypatch.setattr(groups, "_settle_expired", failing_for_g1)
            deadline = asyncio.get_running_loop().time() + 5
            while (await views(svc))["g2"] != (0, 1):
                assert asyncio.get_running_loop().time() < deadline, await views(svc)
                await asyncio.sleep(0.1)
            assert (await views(svc))["g1"] == (1, 0)  # its share rolled back alone
            monkeypatch.setattr(groups, "_settle_expired", settle)
            # Nothing wakes the scheduler for a failed share: the next regular tick retries it.
            deadline = asyncio.get_running_loop().time() + 15
            while (await views(svc))["g1"] != (0, 1):
                assert asyncio.get_running_loop().time() < deadline, await views(svc)
                await asyncio.sleep(0.1)
            again = (await svc.fetch("s", "g2", 1, 0, "c")).messages
            assert [d.delivery_count for d in again] == [2]
        finally:
            await svc.close()

    asyncio.run(run())


def test_a_fetch_answer_is_bounded_in_bytes(tmp_path: Path) -> None:
    """A fetch of up to 1000 messages could answer 1000 large ones at once (a 50 MB body for
    12 x 4 MB, held in memory with no read budget; found by a review). What does not fit in
    MAX_FETCH_BYTES is not leased and comes with the next fetch; one message always comes."""

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            big = "x" * (1 << 20)
            for k in range(12):
                await svc.produce("s", {"messages": [{"data": f"{k}{big}"}]})
            await svc.ensure_group("s", "g", {})
            read: list[int] = []
            pieces_at = reads.pieces_at

            def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                out = pieces_at(*args, **kwargs)
                read.append(len(out))
                return out

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(reads, "pieces_at", counted)
                first = (await svc.fetch("s", "g", 1000, 0, "c")).messages
            assert 1 <= len(first) < 12
            assert read == [len(first) + 1]  # reading stopped with the first that did not fit
            assert sum(len(d.data) for d in first) <= groups.MAX_FETCH_BYTES
            (view,) = await svc.groups("s")
            assert (view["inFlight"], view["pending"]) == (len(first), 12 - len(first))
            rest = (await svc.fetch("s", "g", 1000, 0, "c")).messages
            assert [d.seq for d in first + rest] == list(range(1, 13))
            monkeypatch = pytest.MonkeyPatch()
            monkeypatch.setattr(groups, "MAX_FETCH_BYTES", 10)
            await svc.produce("s", {"messages": [{"data": big}, {"data": big}]})
            try:
                one = (await svc.fetch("s", "g", 1000, 0, "c")).messages
            finally:
                monkeypatch.undo()
            assert [d.seq for d in one] == [13]  # larger than the cap alone: still comes
        finally:
            await svc.close()

    asyncio.run(run())


def test_what_follows_a_commit_happens_though_the_client_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp cancels the handler of a client that left: code after the ``await`` of a
    committed op never ran, so a fetch's leases were not put on the lease timer (they expired
    only at the next 5 s re-arm) and redeliveries went uncounted (found by a review). Here the
    caller is cancelled just after each commit, as such a handler is."""
    from stations.domain import service as service_module

    committed = service_module._committed

    async def then_cancelled(work):  # type: ignore[no-untyped-def]
        await committed(work)
        raise asyncio.CancelledError

    async def run() -> None:
        svc = _service(tmp_path)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            await svc.produce("s", {"messages": [{"data": 1}]})
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 1000, "maxMsgDeliveries": 5})
            assert len((await svc.fetch("s", "g", 1, 0, "c")).messages) == 1
            await asyncio.sleep(1.2)  # past the lease: it is redelivered (count 2)
            monkeypatch.setattr(service_module, "_committed", then_cancelled)
            svc.leases._at = None  # nothing armed: only this fetch's commit can arm it
            with pytest.raises(asyncio.CancelledError):
                await svc.fetch("s", "g", 1, 0, "c")
            monkeypatch.undo()
            assert svc.tally.redeliveries[("s", "g")] == 1
            assert svc.leases._at is not None  # the second lease's expiry is on the timer
        finally:
            await svc.close()

    asyncio.run(run())


def test_more_expired_leases_than_postgresql_takes_parameters_go_round_again(
    db_url: str,
) -> None:
    """A consumer that fetched 70,000 messages and died: the lease timer released them in one
    statement with a parameter per position, which PostgreSQL's driver refuses past 65,535, so
    its every pass failed (fetches still took expired leases, a fetch's worth at a time)."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            for k in range(7):
                await svc.produce("s", {"messages": [{"data": k} for _ in range(10_000)]})
            # 10 s: the 70 fetches took over 3 s on a loaded box, and with a 1 s lease they
            # took the first batches again (delivery count 4) instead of 70,000 positions.
            await svc.ensure_group("s", "g", {"maxAckTimeMs": 10_000, "maxMsgDeliveries": 5})
            for _ in range(70):
                assert len((await svc.fetch("s", "g", 1000, 0, "c")).messages) == 1000
            (view,) = await svc.groups("s")
            assert view["inFlight"] == 70_000, view
            deadline = time.monotonic() + 60  # the lease timer releases them past 10 s
            while view["inFlight"] and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                (view,) = await svc.groups("s")
            assert (view["inFlight"], view["pending"]) == (0, 70_000), view
            got = (await svc.fetch("s", "g", 1000, 0, "d")).messages
            assert [(d.seq, d.delivery_count) for d in got] == [(s, 2) for s in range(1, 1001)]
        finally:
            await svc.close()

    asyncio.run(run())


def test_an_append_does_not_run_every_waiting_fetch_of_its_group(db_url: str) -> None:
    """100 consumers of one group wait in fetches of one message: each append ran a lease for
    every waiting fetch in its transaction, and each fetch that got nothing leased again when
    the commit woke it: some 200 writer ops per message (a producer fell from 286 to 5.5
    appends a second with 1,000 waiting). Now a round per group leases to waiting fetches in
    turn until the group has nothing more; the others stay parked."""

    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        ops: list[int] = []
        try:
            await svc.create_station({"name": "s"})
            await svc.ensure_group("s", "g", {})
            waiters = [
                asyncio.ensure_future(svc.fetch("s", "g", 1, 30, f"c{k}")) for k in range(100)
            ]
            for _ in range(200):
                if len(svc._parked.get("s", ())) == 100:
                    break
                await asyncio.sleep(0.05)
            assert len(svc._parked["s"]) == 100
            svc.tally.batch_observers.append(lambda n, _s: ops.append(n))
            for k in range(5):
                await svc.produce("s", {"messages": [{"data": k}]})
            for _ in range(200):
                if sum(w.done() for w in waiters) == 5:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # any op still to come
            done = [w.result() for w in waiters if w.done()]
            assert sorted(bytes(d.messages[0].data) for d in done) == [b"0", b"1", b"2", b"3", b"4"]
            assert sum(ops) <= 30, f"{sum(ops)} writer ops for 5 appends"
            assert len(svc._parked["s"]) == 95
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        finally:
            await svc.close()

    asyncio.run(run())
