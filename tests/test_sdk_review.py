"""Faults of the Python SDK found by a review of its failure behaviour: a producer whose start
failed kept its session open, an ack made after close was dropped with only a log line, a
blocking live reader interrupted by Ctrl-C ended silently when iterated again, and a
``SyncClient`` whose arguments were refused left its loop thread running. Real servers."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest

from stations.client import (
    Client,
    ConnectionFailed,
    ConsumerClosed,
    IdempotentProducer,
    StationNotFound,
    StationsError,
)
from stations.client.retry import RetryPolicy
from stations.client.sync import SyncClient
from tests.harness import Server
from tests.test_sdk import (  # noqa: F401
    FaultProxy,
    client,
    stations,
    unique,
)

__all__ = ["client", "stations"]


def _session_open(producer: IdempotentProducer) -> bool:
    session = producer._http._session
    return session is not None and not session.closed


async def _group_counts(client: Client, name: str) -> tuple[int, int]:  # noqa: F811
    (group,) = await client.station(name).groups()
    return group.pending, group.in_flight


# -- 1. a producer that owns its session ----------------------------------------------------------


@pytest.mark.parametrize("how", ["async with", "start()"])
async def test_a_producer_whose_start_fails_closes_its_session(
    client: Client,  # noqa: F811
    how: str,
) -> None:
    """A producer given a stream URL makes its own session; ``__aexit__`` never runs after a
    failed ``__aenter__`` (nor does a caller that drops the producer close it), so the session
    stayed open ("Unclosed client session")."""
    producer = IdempotentProducer(client.stream_url(unique("missing")), "p")
    with pytest.raises(StationNotFound):
        if how == "async with":
            async with producer:
                pass
        else:
            await producer.start()
    assert not _session_open(producer)


async def test_a_producer_whose_start_is_cancelled_closes_its_session(
    client: Client,  # noqa: F811
) -> None:
    """A timeout around ``async with`` while the content-type lookup waits on the server: the
    lookup went on in the background and the session stayed open."""
    name = unique("start-cancel")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy:
        producer = IdempotentProducer(f"{proxy.url}/v1/stream/{name}", "p")
        proxy.gate.clear()  # the HEAD waits in the proxy

        async def enter() -> None:
            async with producer:
                pass

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(enter(), 0.3)
        assert not _session_open(producer)
        proxy.gate.set()
        await asyncio.sleep(0.1)  # a lookup still running would open the session again
        assert not _session_open(producer)


# -- 2. acks after close ----------------------------------------------------------------------


async def test_an_ack_after_the_client_closed_raises(client: Client) -> None:  # noqa: F811
    """The SIGTERM pattern: a worker acks after another task closed the client. The batched
    ack returned normally and only a log line said it failed, so the worker believed the
    message settled and it was processed again after its lease."""
    name = unique("ack-closed-client")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    other = Client(client.url)
    (msg,) = await other.station(name).consumer("g", consumer="c", wait_ms=0).fetch()
    await other.close()
    with pytest.raises(ConsumerClosed) as raised:
        await msg.ack()
    assert isinstance(raised.value, StationsError)
    with pytest.raises(ConsumerClosed):
        await msg.ack(wait=True)
    assert await _group_counts(client, name) == (0, 1)  # still leased: it comes again


async def test_an_ack_after_the_consumer_closed_raises(client: Client) -> None:  # noqa: F811
    name = unique("ack-closed-consumer")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    consumer = client.station(name).consumer("g", consumer="c", wait_ms=0)
    (msg,) = await consumer.fetch()
    await consumer.close()
    with pytest.raises(ConsumerClosed):
        await msg.ack()


async def test_an_ack_made_while_the_consumer_closes_is_still_sent(
    client: Client,  # noqa: F811
) -> None:
    """Refusing acks after close must not refuse those made while close() still runs: close()
    sends them."""
    name = unique("ack-during-close")
    await client.create_station(name)
    await client.station(name).produce_many([{"n": 1}, {"n": 2}])
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as other:
        consumer = other.station(name).consumer(
            "g", consumer="c", wait_ms=0, ack_interval_ms=60_000
        )
        first, second = await consumer.fetch()
        await first.ack()
        proxy.gate.clear()  # close()'s ack request waits in the proxy
        closing = asyncio.create_task(consumer.close())
        await asyncio.sleep(0.2)
        assert not closing.done()
        await second.ack()  # accepted: close() is still running
        proxy.gate.set()
        await asyncio.wait_for(closing, 10)
    assert await _group_counts(client, name) == (0, 0)


async def test_a_consumer_closed_while_its_fetch_waits_hands_nothing_out(
    client: Client,  # noqa: F811
) -> None:
    """``close()`` gives back the prefetched messages it holds; a fetch still waiting on the
    server then answered with a message, and ``async for`` handed it out after close (its ack
    would be refused). It is given back instead, so another consumer gets it at once."""
    name = unique("late-fetch")
    await client.create_station(name)
    station = client.station(name)
    consumer = station.consumer("g", consumer="a", wait_ms=10_000)
    await consumer.start()
    received: list[Any] = []

    async def work() -> None:
        async for msg in consumer:
            received.append(msg.data)

    task = asyncio.create_task(work())
    await asyncio.sleep(0.3)  # the fetch waits on the server
    await consumer.close()
    await station.produce({"n": 1})
    await asyncio.wait_for(task, 10)
    assert received == []
    other = station.consumer("g", consumer="b", wait_ms=3000)
    got = await other.fetch()  # well before the 30 s lease of the late fetch would end
    assert [m.data for m in got] == [{"n": 1}]
    await got[0].ack(wait=True)
    await other.close()


# -- 3. a live reader interrupted ---------------------------------------------------------------


async def test_a_live_reader_whose_wait_was_cancelled_goes_on_from_its_offset(
    client: Client,  # noqa: F811
) -> None:
    """A cancellation (a timeout) ended the reader's generator; iterating again answered
    ``StopAsyncIteration`` as if the stream had ended."""
    name = unique("reader-cancel")
    await client.create_station(name)
    station = client.station(name)
    await station.produce({"n": 1})
    reader = station.read(offset="-1", live="long-poll")
    assert (await anext(reader)).items == [{"n": 1}]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(reader), 0.3)
    assert not reader.closed
    await station.produce({"n": 2})
    batch = await asyncio.wait_for(anext(reader), 10)
    assert batch.items == [{"n": 2}]
    await reader.aclose()


def test_a_blocking_live_reader_interrupted_by_ctrl_c_goes_on_when_iterated_again(
    stations: Server,  # noqa: F811
) -> None:
    """A notebook user interrupts a cell tailing a station and runs it again: the second loop
    ended at once with nothing, as if the stream had been closed."""
    name = unique("sync-reader-ctrlc")
    main = threading.main_thread().ident
    assert main is not None
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    got: list[Any] = []
    try:
        with SyncClient(stations.url) as sync:
            sync.create_station(name)
            station = sync.station(name)
            reader = station.read(offset="-1", live="long-poll")
            threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
            with pytest.raises(KeyboardInterrupt):
                for _batch in reader:
                    pass
            station.produce({"n": 1})
            # A reader that never answered would hang the suite: interrupt it late instead.
            guard = threading.Timer(15, signal.pthread_kill, (main, signal.SIGINT))
            guard.start()
            try:
                for batch in reader:
                    got.extend(batch.items)
                    break
            finally:
                guard.cancel()
            assert not reader.closed
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == [{"n": 1}]


# -- 4. SyncClient with refused arguments ---------------------------------------------------------


def _loop_threads() -> int:
    return sum(t.name == "stations-sync" and t.is_alive() for t in threading.enumerate())


def test_a_sync_client_whose_arguments_are_refused_leaves_no_thread() -> None:
    before = _loop_threads()
    for _ in range(3):
        with pytest.raises(ValueError):
            SyncClient("127.0.0.1:4437")  # no http://
    deadline = time.monotonic() + 5
    while _loop_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _loop_threads() == before


@pytest.mark.parametrize("verb", ["nack", "dead_letter"])
async def test_a_stale_lease_settles_nothing(client: Client, verb: str) -> None:  # noqa: F811
    """A consumer whose lease expired nacked (or dead-lettered) by offset the delivery another
    consumer was processing: the message went to a third consumer at once, or into the DLS
    while it was being processed (found by a review). A message is settled by its lease."""
    name = unique(f"stale-{verb}")
    await client.create_station(name)
    station = client.station(name)
    await station.ensure_group("g", max_ack_time_ms=1000)
    await station.produce({"n": 1})
    (first,) = await station.consumer("g", consumer="a", wait_ms=0).fetch()
    await asyncio.sleep(1.3)  # a's lease expires
    b = station.consumer("g", consumer="b", wait_ms=5000)
    (second,) = await b.fetch()
    assert second.delivery_count == 2
    settle = first.nack() if verb == "nack" else first.dead_letter("stale says bad")
    assert await settle is False
    third = await station.consumer("g", consumer="c", wait_ms=0).fetch()
    assert third == []  # b still holds it
    assert await second.ack(wait=True) is True
    assert await _group_counts(client, name) == (0, 0)
    (group,) = await station.groups()
    assert group.dead_lettered == 0
    # A lease still held is settled as before.
    await station.produce({"n": 2})
    (held,) = await b.fetch()
    assert await (held.nack() if verb == "nack" else held.dead_letter("bad")) is True


async def test_a_producer_that_gives_up_says_its_batch_may_be_stored(
    client: Client,  # noqa: F811
) -> None:
    """The first attempt was stored and its answer lost, the retries were refused a
    connection: the producer gave up with the last attempt's ConnectionFailed, sent=False
    ("the server surely did nothing"), and a caller trusting it sent the batch again under
    another epoch: stored twice (found by a review)."""
    name = unique("gave-up")
    await client.create_station(name)
    retry = RetryPolicy(initial_delay=0.05, max_delay=0.1, give_up_after=1.0)
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as other:
        producer = other.station(name).producer("p1", retry=retry, linger_ms=0)
        await producer.start()
        proxy.drop_after = {proxy.posts + 1}  # stored; its answer lost ...
        producer.append({"n": 1})
        while proxy.dropped == 0:
            await asyncio.sleep(0.01)
        assert proxy._server is not None
        proxy._server.close()  # ... and every retry refused a connection
        with pytest.raises(ConnectionFailed) as raised:
            await producer.flush()
        with pytest.raises(ConnectionFailed):  # it stopped for good, and says so again
            await producer.close()
    assert raised.value.sent is True
    assert any("may have been stored" in note for note in raised.value.__notes__)
    page = await client.station(name).browse()
    assert [m.data for m in page.messages] == [{"n": 1}]  # stored, once


async def test_a_transaction_whose_answer_was_lost_is_not_committed_twice(
    client: Client,  # noqa: F811
) -> None:
    """A produce-only transaction whose answer was lost could be committed again on the same
    object, storing its message twice (found by a review). Without message ids a second
    commit is refused; with them it is answered as a duplicate."""
    name = unique("tx-lost")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as other:
        for msg_id in (None, "invoice-1"):
            tx = other.transaction()
            tx.produce(name, {"msg_id": msg_id}, msg_id=msg_id)
            proxy.drop_after = {proxy.posts + 1}
            with pytest.raises(ConnectionFailed):
                await tx.commit()
            if msg_id is None:
                with pytest.raises(RuntimeError, match="could store them twice"):
                    await tx.commit()
            else:
                result = await tx.commit()
                assert [p.duplicate for p in result.produced] == [True]
    page = await client.station(name).browse()
    assert [m.data for m in page.messages] == [{"msg_id": None}, {"msg_id": "invoice-1"}]


async def test_the_clients_retry_policy_bounds_produce_commit_and_acks() -> None:
    """With Client(timeout=1) a produce with a message id went on retrying a server that never
    answered for two minutes (a fixed policy; found by a review). Client(retry=) sets it for
    produce, a transaction's commit, a consumer's acks and its stations' producers (produce
    and the producers' policy are checked here)."""

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    retry = RetryPolicy(initial_delay=0.05, max_delay=0.1, give_up_after=0.5)
    try:
        async with Client(url, timeout=0.3, retry=retry) as client:
            station = client.station("s")
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                await asyncio.wait_for(station.produce({"n": 1}, msg_id="a"), 10)
            assert time.monotonic() - started < 3
            tx = client.transaction()
            tx.produce("s", {"n": 1}, msg_id="b")
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                await asyncio.wait_for(tx.commit(), 10)
            assert time.monotonic() - started < 3
            assert station.producer("p").retry is retry
            # A commit cancelled (a timeout) after it was sent may have been carried out too.
            blind = client.transaction()
            blind.produce("s", {"n": 2})
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(blind.commit(), 0.1)
            with pytest.raises(RuntimeError, match="could store them twice"):
                await blind.commit()
    finally:
        server.close()
