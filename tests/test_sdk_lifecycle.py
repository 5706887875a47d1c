"""The SDK's consumer and producer lifecycle: when queued acks and appends go out, what closing
a client waits for, and where failures in background work surface. Real servers, through
``FaultProxy`` where a stall or a lost answer is needed."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest

from stations.client import Client, IdempotentProducer, StationsError
from stations.client.consumer import Consumer
from stations.client.sync import SyncClient
from tests.harness import Server
from tests.test_sdk import (  # noqa: F401
    FaultProxy,
    client,
    create_stream,
    read_all,
    stations,
    unique,
)

__all__ = ["client", "stations"]

# More offsets than the server settles in one request (it refuses past 10,000).
OVER_SETTLE_LIMIT = 10_001


async def _settled(client: Client, name: str) -> bool:  # noqa: F811
    (group,) = await client.station(name).groups()
    return group.in_flight == 0 and group.pending == 0


# -- ack(wait=True) ---------------------------------------------------------------------------


async def test_ack_wait_sends_at_once(client: Client) -> None:  # noqa: F811
    """``ack(wait=True)`` waited out ``ack_interval_ms`` before the ack was even sent: a caller
    that asks for the server's answer wants it now."""
    name = unique("ack-now")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    async with client.station(name).consumer(
        "g", consumer="c", wait_ms=0, ack_interval_ms=60_000
    ) as consumer:
        (msg,) = await consumer.fetch()
        started = time.monotonic()
        assert await asyncio.wait_for(msg.ack(wait=True), 10) is True
        assert time.monotonic() - started < 5
        assert await _settled(client, name)


async def test_waited_acks_made_together_go_in_one_request(client: Client) -> None:  # noqa: F811
    """Sending at once still batches what is acked in the same moment."""
    name = unique("ack-now-many")
    await client.create_station(name)
    await client.station(name).produce_many([{"n": n} for n in range(20)])
    async with (
        FaultProxy(client.url) as proxy,
        Client(proxy.url) as via_proxy,
        via_proxy.station(name).consumer(
            "g", consumer="c", wait_ms=0, batch_size=20, ack_interval_ms=60_000
        ) as consumer,
    ):
        messages = await consumer.fetch()
        assert len(messages) == 20
        answers = await asyncio.wait_for(asyncio.gather(*(m.ack(wait=True) for m in messages)), 10)
        assert answers == [True] * 20
        assert len([p for _, p in proxy.requests if p.endswith("/ack")]) == 1
    assert await _settled(client, name)


def test_ack_wait_sends_at_once_on_the_sync_client(stations: Server) -> None:  # noqa: F811
    name = unique("ack-now-sync")
    with SyncClient(stations.url) as sync:
        sync.create_station(name)
        station = sync.station(name)
        station.produce({"n": 1})
        with station.consumer("g", consumer="c", wait_ms=0, ack_interval_ms=10_000) as consumer:
            (msg,) = consumer.fetch()
            started = time.monotonic()
            assert msg.ack(wait=True) is True
            assert time.monotonic() - started < 5
            (group,) = station.groups()
            assert group.in_flight == 0 and group.pending == 0


def test_extend_on_the_sync_client_takes_its_messages(stations: Server) -> None:  # noqa: F811
    """``consumer.extend([msg])`` with the sync client's messages: the SDK called a method of
    the blocking view from its own event loop, which raised (it would wait for itself)."""
    name = unique("extend-sync")
    with SyncClient(stations.url) as sync:
        sync.create_station(name)
        station = sync.station(name)
        station.produce({"n": 1})
        with station.consumer("g", consumer="c", wait_ms=0, max_ack_time_ms=1000) as consumer:
            (msg,) = consumer.fetch()
            before = msg.ack_deadline
            assert consumer.extend([msg], 5000) == 1
            assert msg.ack_deadline > before
            assert msg.extend(6000) is True
            with consumer.transaction() as tx:  # by the lease's new deadline
                tx.ack(msg)
            (group,) = station.groups()
            assert group.in_flight == 0 and group.pending == 0


# -- Client.close() and objects made directly ----------------------------------------------


async def test_closing_the_client_delivers_what_directly_made_objects_hold(
    client: Client,  # noqa: F811
) -> None:
    """``Consumer(station, ...)`` and ``IdempotentProducer(station, ...)`` use the client's
    session like those ``station.consumer()`` / ``station.producer()`` make, but closing the
    client did not flush them: the append never stored, the ack never sent."""
    name = unique("direct")
    await client.create_station(name)
    await client.station(name).produce({"n": 0})
    async with Client(client.url) as other:
        consumer = Consumer(
            other.station(name), "g", consumer="c", wait_ms=0, ack_interval_ms=60_000
        )
        (msg,) = await consumer.fetch()
        await msg.ack()  # queued
        producer = IdempotentProducer(other.station(name), "p", linger_ms=60_000)
        producer.append({"n": 1})  # pending
    assert await read_all(client.stream_url(name)) == [{"n": 0}, {"n": 1}]
    (group,) = await client.station(name).groups()
    assert group.in_flight == 0 and group.pending == 1  # {"n": 1}, produced after the fetch


# -- more than the server settles in one request ---------------------------------------------


async def _fill(client: Client, name: str, count: int) -> None:  # noqa: F811
    await client.create_station(name)
    producer = client.station(name).producer("fill")
    for n in range(count):
        await producer.wait_for_capacity()
        producer.append(n)
    await producer.detach()


async def test_more_acks_than_one_settle_request_takes_are_all_sent(
    client: Client,  # noqa: F811
) -> None:
    """With ``ack_batch_size`` above 10,000 the queued acks went in one request, which the
    server refuses (400): none was settled, and every message came again."""
    name = unique("many-acks")
    await _fill(client, name, OVER_SETTLE_LIMIT)
    consumer = client.station(name).consumer(
        "g", consumer="c", wait_ms=0, batch_size=1000, ack_batch_size=20_000, ack_interval_ms=60_000
    )
    messages = []
    while len(messages) < OVER_SETTLE_LIMIT:
        messages += await consumer.fetch()
    for msg in messages[:-1]:
        await msg.ack()  # queued: fewer than ack_batch_size
    assert await asyncio.wait_for(messages[-1].ack(wait=True), 30) is True
    await consumer.close()
    assert await _settled(client, name)


def test_more_acks_than_one_settle_request_takes_on_the_sync_client(
    stations: Server,  # noqa: F811
) -> None:
    name = unique("many-acks-sync")
    with SyncClient(stations.url) as sync:
        sync.create_station(name)
        filler = sync.station(name).producer("fill")
        for n in range(OVER_SETTLE_LIMIT):
            filler.append(n)
            if n % 1000 == 0:
                filler.wait_for_capacity()
        filler.detach()
        station = sync.station(name)
        with station.consumer(
            "g", consumer="c", wait_ms=0, batch_size=1000, ack_batch_size=20_000
        ) as consumer:
            got = 0
            while got < OVER_SETTLE_LIMIT:
                for msg in consumer.fetch():
                    msg.ack()
                    got += 1
        (group,) = station.groups()
        assert group.in_flight == 0 and group.pending == 0


async def test_a_waited_ack_taken_by_a_cancelled_flush_is_still_answered(
    client: Client,  # noqa: F811
) -> None:
    """Another task's flush (a ``fetch()`` sends the queued acks first) took a waited ack and
    was cancelled (a timeout around it): the ack was queued again, but nothing sent it until
    the consumer was used again, and ``ack(wait=True)`` waited all that time, maybe forever."""
    name = unique("requeued-wait")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as via_proxy:
        consumer = via_proxy.station(name).consumer(
            "g", consumer="c", wait_ms=0, ack_interval_ms=60_000
        )
        (msg,) = await consumer.fetch()
        proxy.gate.clear()  # the server stalls

        # The worker's ack(wait=True) queues first (tasks start in order), then the other
        # task's flush takes it before the flush the ack scheduled runs, and stalls.
        waiting = asyncio.ensure_future(msg.ack(wait=True))
        flushing = asyncio.create_task(consumer.flush_acks())
        await asyncio.sleep(0.3)
        flushing.cancel()
        await asyncio.gather(flushing, return_exceptions=True)
        proxy.gate.set()  # the proxy forwards the cancelled request too: the answer may be
        # False, "acked already" (as for any ack retried after a lost answer), but it comes
        assert await asyncio.wait_for(waiting, 10) in (True, False)
        await consumer.close()
    assert await _settled(client, name)


# -- close() racing with a flush in flight ------------------------------------------------------


@pytest.mark.parametrize("how", ["flush_acks", "close"])
async def test_closing_the_client_waits_for_an_ack_in_flight(
    client: Client,  # noqa: F811
    how: str,
) -> None:
    """Another task's ack request is on its way (an explicit ``flush_acks()``, or the
    consumer's own ``close()``) when the client closes: ``close()`` found nothing queued, a
    second ``close()`` returned at once, and the session was closed under the request; the
    ack was lost and the message processed again."""
    name = unique(f"race-{how}")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    async with FaultProxy(client.url) as proxy:
        other = Client(proxy.url)
        consumer = other.station(name).consumer(
            "g", consumer="c", wait_ms=0, ack_interval_ms=60_000
        )
        (msg,) = await consumer.fetch()
        await msg.ack()  # queued
        proxy.gate.clear()  # the server stalls: the ack request waits in the proxy
        sending = asyncio.create_task(getattr(consumer, how)())
        await asyncio.sleep(0.2)
        asyncio.get_running_loop().call_later(0.5, proxy.gate.set)  # and recovers
        await asyncio.wait_for(other.close(), 20)
        await asyncio.wait_for(sending, 20)
    assert await _settled(client, name)


# -- failures in background work ----------------------------------------------------------------


async def test_a_waited_ack_whose_background_flush_fails_raises(
    stations: Server,  # noqa: F811
) -> None:
    """A flush that failed with anything but a ``StationsError`` (here: the caller's own
    aiohttp session, closed) ended its background task with the acks dropped and the waiter's
    future never resolved: ``ack(wait=True)`` waited forever."""
    name = unique("bg-ack")
    async with Client(stations.url) as setup:
        await setup.create_station(name)
        await setup.station(name).produce({"n": 1})
    session = aiohttp.ClientSession()
    own = Client(stations.url, session=session)
    consumer = own.station(name).consumer("g", consumer="c", wait_ms=0)
    (msg,) = await consumer.fetch()
    await session.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(msg.ack(wait=True), 10)
    await own.close()


async def test_a_producer_whose_content_type_lookup_fails_stops_with_an_error(
    stations: Server,  # noqa: F811
) -> None:
    """The lookup of the stream's content type runs in a background task; anything but a
    ``StationsError`` there ended it silently, and ``flush()`` waited forever."""
    name = unique("bg-head")
    async with Client(stations.url) as setup:
        await setup.create_station(name)
    session = aiohttp.ClientSession()
    own = Client(stations.url, session=session)
    producer = own.station(name).producer("p")  # content type not known yet
    await session.close()
    producer.append({"n": 1})
    with pytest.raises(StationsError, match="closed"):
        await asyncio.wait_for(producer.flush(), 10)
    assert producer.error is not None
    await own.close()


# -- the sync client from several threads ---------------------------------------------------------


def test_closing_the_sync_client_from_several_threads_at_once(
    stations: Server,  # noqa: F811
) -> None:
    """Worker threads that each close the shared ``SyncClient`` when done (a shutdown): the
    second ``close()`` passed the "closed already?" check while the first was under way, and
    raised from a loop the first had stopped and closed."""
    name = unique("sync-close-threads")
    for round in range(3):
        sync = SyncClient(stations.url)
        sync.create_station(name)
        sync.station(name).producer(f"p{round}", linger_ms=60_000).append("x")
        start = threading.Barrier(4)
        errors: list[BaseException] = []
        workers = [
            threading.Thread(target=_close_together, args=(sync, start, errors), daemon=True)
            for _ in range(4)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(20)
        assert not any(w.is_alive() for w in workers), "a close() hangs"
        assert errors == []
    with SyncClient(stations.url) as sync:
        assert [m.data for m in sync.station(name).browse().messages] == ["x", "x", "x"]


def _close_together(
    sync: SyncClient, start: threading.Barrier, errors: list[BaseException]
) -> None:
    start.wait()
    try:
        sync.close()
    except BaseException as exc:  # the test reports any
        errors.append(exc)


async def test_a_consumer_close_that_fails_inside_client_close_is_reported(
    stations: Server,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Client.close()`` closes its consumers and gathers their outcomes; one that failed with
    anything but a ``StationsError`` (giving back prefetched messages on the caller's own,
    closed, aiohttp session) vanished without a word."""
    name = unique("close-fails")
    async with Client(stations.url) as setup:
        await setup.create_station(name)
        await setup.station(name).produce_many([{"n": 1}, {"n": 2}])
    session = aiohttp.ClientSession()
    own = Client(stations.url, session=session)
    consumer = own.station(name).consumer("g", consumer="c", wait_ms=0, batch_size=2)
    await anext(consumer)  # the other message stays prefetched
    await session.close()
    caplog.set_level("WARNING", logger="stations.client")
    await own.close()
    failures = [r for r in caplog.records if r.name == "stations.client" and r.exc_info]
    assert failures and "closed" in str(failures[0].exc_info[1]), caplog.records


async def test_a_blocking_producer_never_reuses_the_seq_of_an_unknown_outcome(
    stations: Server,  # noqa: F811
) -> None:
    """An append whose answer was lost may be stored: another body sent next went under its
    Producer-Seq, was answered as a duplicate, and was dropped (``append`` returned False)."""
    from stations.client.blocking import BlockingHttp, BlockingProducer
    from stations.client.errors import ConnectionFailed
    from stations.client.retry import RetryPolicy
    from stations.client.session import ProducerSession

    url = f"{stations.url}/v1/stream/{unique('blocking')}"
    await create_stream(url, "application/octet-stream")
    async with FaultProxy(stations.url) as proxy:
        proxy.drop_after = {1, 2, 3, 4, 5, 6, 7, 8}  # stored, every answer lost
        policy = RetryPolicy(initial_delay=0.01, max_delay=0.02, give_up_after=0.1)
        producer = BlockingProducer(
            BlockingHttp(proxy.url), url.replace(stations.url, proxy.url),
            ProducerSession("p", content_type="application/octet-stream"), policy,
        )  # fmt: skip
        try:
            with pytest.raises(ConnectionFailed):
                await asyncio.to_thread(producer.append, b"first,")
            proxy.drop_after = set()
            with pytest.raises(StationsError, match="same body"):
                await asyncio.to_thread(producer.append, b"second,")
            assert await asyncio.to_thread(producer.append, b"first,") is False  # it was stored
            assert await asyncio.to_thread(producer.append, b"second,") is True
        finally:
            producer.close()
    async with aiohttp.ClientSession() as http, http.get(url, params={"offset": "-1"}) as r:
        assert await r.read() == b"first,second,"
