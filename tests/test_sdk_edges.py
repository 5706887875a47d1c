"""Edges of the Python SDK's exactly-once promises, found by an adversarial review: answers that
say "nothing was decided" (503 with Retry-After, from ``FaultProxy``) must be retried where that
is safe, and must not make a later "duplicate" answer look like this producer's own."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Any

import pytest

from stations.client import (
    Client,
    EpochInUse,
    GroupNotFound,
    IdempotentProducer,
    StationNotFound,
    StationsError,
    read_stream,
)
from stations.client.consumer import Consumer
from stations.client.sync import SyncClient
from tests.harness import Server
from tests.test_sdk import (  # noqa: F401
    FaultProxy,
    client,
    read_all,
    stations,
    stream_head,
    unique,
)

__all__ = ["client", "stations"]


async def test_a_rerun_whose_first_attempt_got_503_still_stops_with_epoch_in_use(
    client: Client,  # noqa: F811
) -> None:
    """A run restarted under a used (producer id, epoch) is caught by the 204 its first batch
    gets. A 503 ("nothing was decided") before that marked the batch as maybe stored, so the
    204 was taken as its own success and the message was silently dropped."""
    name = unique("rerun503")
    await client.create_station(name)
    first = client.station(name).producer("job", epoch=2)
    first.append("a")
    await first.detach()

    errors: list[StationsError] = []
    async with FaultProxy(client.url) as proxy:
        proxy.reject_503 = {1: None}  # the rerun's first POST: refused, nothing stored
        rerun = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}",
            "job",
            epoch=2,
            content_type="application/json",
            on_error=errors.append,
        )
        rerun.append("b")
        with pytest.raises(EpochInUse):
            await rerun.flush()
        assert proxy.rejected == 1 and proxy.post_statuses == [204]
        await rerun.detach()
    assert errors and isinstance(errors[0], EpochInUse)
    assert await read_all(client.stream_url(name)) == ["a"]


async def test_produce_without_ids_is_retried_after_a_503(client: Client) -> None:  # noqa: F811
    """Without message ids a retry after a lost answer could store twice, so it is not made;
    but a 503 (or 429) says nothing was stored, and giving up then lost the message to a
    momentary overload."""
    name = unique("p503")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy, Client(proxy.url) as via_proxy:
        proxy.reject_503 = {proxy.posts + 1: None}
        produced = await via_proxy.station(name).produce({"n": 1})
        assert produced.duplicate is False and proxy.rejected == 1
    page = await client.station(name).browse()
    assert [m.data for m in page.messages] == [{"n": 1}]


async def test_a_transaction_is_retried_after_a_503(client: Client) -> None:  # noqa: F811
    """A commit whose outcome is unknown is not sent again; one answered 503 is known not to
    have committed, and is (the README's pipeline raised ServerError out of ``async with``)."""
    source, sink = unique("tx-in"), unique("tx-out")
    await client.create_station(source)
    await client.create_station(sink)
    await client.station(source).produce({"order": 1})
    async with (
        FaultProxy(client.url) as proxy,
        Client(proxy.url) as via_proxy,
        via_proxy.station(source).consumer("billing", consumer="b1", wait_ms=0) as consumer,
    ):
        (msg,) = await consumer.fetch(10)
        proxy.reject_503 = {proxy.posts + 1: None}
        async with consumer.transaction() as tx:
            tx.produce(sink, {"invoice": msg.data["order"]})
            tx.ack(msg)
        assert proxy.rejected == 1
        assert tx.result is not None and tx.result.acked == 1
    page = await client.station(sink).browse()
    assert [m.data for m in page.messages] == [{"invoice": 1}]
    (group,) = await client.station(source).groups()
    assert group.pending == 0 and group.in_flight == 0


async def test_leaving_the_client_delivers_what_its_producers_and_consumers_hold(
    client: Client,  # noqa: F811
) -> None:
    """``append()`` and ``ack()`` only queue; a producer or consumer that was never closed
    lost both when its ``Client`` closed (the message never stored, the ack never sent, so the
    message was processed again). Closing the client now flushes them first."""
    name = unique("leave")
    await client.create_station(name)
    async with Client(client.url) as other:
        producer = other.station(name).producer("p")
        producer.append({"n": 1})
    assert await read_all(client.stream_url(name)) == [{"n": 1}]

    async with Client(client.url) as other:
        consumer = other.station(name).consumer("g", consumer="c", wait_ms=0)
        (msg,) = await consumer.fetch()
        await msg.ack()  # queued
    (group,) = await client.station(name).groups()
    assert group.in_flight == 0 and group.pending == 0


def test_leaving_the_sync_client_delivers_what_its_producers_hold(
    stations: Server,  # noqa: F811
) -> None:
    name = unique("leave-sync")
    with SyncClient(stations.url) as sync:
        sync.create_station(name)
        producer = sync.station(name).producer("p", linger_ms=1000)
        producer.append("x")
    with SyncClient(stations.url) as sync:
        assert [m.data for m in sync.station(name).browse().messages] == ["x"]


def test_an_interrupted_sync_fetch_does_not_run_on_behind_the_caller(
    stations: Server,  # noqa: F811
) -> None:
    """Ctrl-C while a ``SyncClient`` fetch waits: the call went on running on the client's
    loop, and leased the next message for nobody (the caller's next fetch got nothing until
    that lease expired)."""
    name = unique("sync-interrupt")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with SyncClient(stations.url) as sync:
            sync.create_station(name)
            station = sync.station(name)
            consumer = station.consumer("g", max_ack_time_ms=60_000)
            assert consumer.fetch(wait_ms=0) == []
            main = threading.main_thread().ident
            assert main is not None
            timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                consumer.fetch(wait_ms=10_000)
            time.sleep(0.3)
            station.produce("x")
            assert [m.data for m in consumer.fetch(wait_ms=3000)] == ["x"]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_sync_face_called_from_its_own_loop_raises_instead_of_hanging(
    stations: Server,  # noqa: F811
) -> None:
    """``on_error`` runs on the sync client's loop thread; a blocking call made there waited
    for that same loop, forever. It raises instead."""
    name = unique("sync-reentry")
    seen: list[BaseException] = []
    outcome: list[BaseException] = []

    def run() -> None:
        with SyncClient(stations.url) as sync:
            sync.create_station(name)
            station = sync.station(name)

            def on_error(error: StationsError) -> None:
                try:
                    station.info()  # a blocking call on the loop's own thread
                except RuntimeError as exc:
                    seen.append(exc)

            producer = station.producer("p", on_error=on_error, content_type="application/json")
            sync.delete_station(name)
            producer.append("x")
            try:
                producer.flush()
            except StationsError as exc:
                outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the sync client hung"
    assert len(seen) == 1 and "event loop" in str(seen[0])
    assert len(outcome) == 1 and isinstance(outcome[0], StationNotFound)


async def test_an_ack_that_came_after_the_message_was_delivered_again_is_reported(
    client: Client,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lease of a slow consumer expires and another consumer processes and acks the
    message; the slow one's batched ack then comes back ``unknown``. The message was processed
    twice, and the SDK said nothing (nor can it extend a lease: the contract has no such call)."""
    name = unique("late-ack")
    await client.create_station(name)
    station = client.station(name)
    await station.produce({"n": 1})
    slow = station.consumer("g", consumer="slow", wait_ms=0, max_ack_time_ms=200)
    fast = station.consumer("g", consumer="fast", wait_ms=2000)
    (late,) = await slow.fetch()
    (again,) = await fast.fetch()  # waits for the lease to expire
    assert again.offset == late.offset and again.delivery_count == 2
    assert await again.ack(wait=True) is True
    caplog.set_level("WARNING", logger="stations.client.consumer")
    await late.ack()  # batched: nobody waits for the answer
    await slow.close()
    await fast.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "stations.client.consumer"]
    assert any("delivered again" in w and late.offset in w for w in warnings), warnings


async def test_acks_of_a_cancelled_flush_are_sent_by_close(client: Client) -> None:  # noqa: F811
    """``fetch()`` sends the queued acks first, in the caller's task. Cancelled there (a
    timeout around the fetch, a shutdown), the acks taken off the queue were never sent, not
    even by ``close()``: the messages came again and were processed twice."""
    name = unique("cancel-ack")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    async with Client(client.url) as other:
        async with FaultProxy(client.url) as proxy:
            other.url = proxy.url
            consumer = other.station(name).consumer(
                "g", consumer="c", wait_ms=0, ack_batch_size=1, ack_interval_ms=60_000
            )
            (msg,) = await consumer.fetch()
            await msg.ack()  # queued; the next fetch sends it first
            proxy.gate.clear()  # the server stalls: the ack request waits in the proxy
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consumer.fetch(), 0.5)
        other.url = client.url  # the proxy and the request it held are gone; the network is back
        await consumer.close()
    (group,) = await client.station(name).groups()
    assert group.in_flight == 0 and group.pending == 0


def test_closing_the_sync_client_ends_a_call_another_thread_waits_in(
    stations: Server,  # noqa: F811
) -> None:
    """A worker thread tails a station (a live read) while the main thread closes the
    ``SyncClient`` (a shutdown): the loop stopped under the waiting call, and the worker waited
    forever."""
    name = unique("sync-close")
    sync = SyncClient(stations.url)
    sync.create_station(name)
    reader = sync.station(name).read(offset="-1", live="long-poll")
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            for _batch in reader:
                pass
        except RuntimeError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    time.sleep(0.3)  # the read waits on the server
    sync.close()
    worker.join(10)
    assert not worker.is_alive(), "the worker waits forever"
    assert len(outcome) == 1 and "closed" in str(outcome[0]), outcome


async def test_a_consumer_iterating_when_its_client_closes_ends(client: Client) -> None:  # noqa: F811
    """A task iterates a consumer (long-polling) while the program leaves ``async with
    Client``: the fetch lost its connection and retried on a new session, forever."""
    name = unique("iter-close")
    await client.create_station(name)
    received: list[object] = []

    async def work(consumer: Consumer) -> None:
        async for msg in consumer:
            received.append(msg.data)

    async with Client(client.url) as other:
        consumer = other.station(name).consumer("g", consumer="w", wait_ms=20_000)
        await consumer.start()
        task = asyncio.create_task(work(consumer))
        await asyncio.sleep(0.3)  # the fetch waits on the server
    done, _ = await asyncio.wait([task], timeout=5)
    if not done:
        task.cancel()
    assert done, "the consumer went on fetching after its client closed"
    task.result()
    assert received == []


@pytest.mark.parametrize("final", [None, "last"])
async def test_a_close_whose_answer_was_lost_is_retried_to_success(
    client: Client,  # noqa: F811
    final: str | None,
) -> None:
    """The server closed the stream (with or without a final message) and the answer was
    lost: the retry must report success, with the final message stored once."""
    name = unique("close-lost")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy:
        producer = IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}", "p", content_type="application/json"
        )
        producer.append("a")
        await producer.flush()
        proxy.drop_after = {proxy.posts + 1}
        offset = await (producer.close() if final is None else producer.close(final))
        assert proxy.dropped == 1 and offset
    expected = ["a"] if final is None else ["a", "last"]
    assert await read_all(client.stream_url(name)) == expected


async def test_an_ack_queued_before_a_seek_does_not_settle_the_replay(
    client: Client,  # noqa: F811
) -> None:
    """``ack()`` queues; ``seek()`` went out first, the replay was fetched, and then the old ack
    settled the replayed delivery (by offset), which had not been processed: a crash then and
    the replay never had it."""
    name = unique("seek-ack")
    await client.create_station(name)
    await client.station(name).produce({"n": 1})
    consumer = client.station(name).consumer(
        "g", consumer="c", wait_ms=0, ack_interval_ms=60_000, max_msg_deliveries=5
    )
    (msg,) = await consumer.fetch()
    await msg.ack()  # queued
    await consumer.seek("earliest")
    (replayed,) = await consumer.fetch()
    assert replayed.offset == msg.offset
    await consumer.flush_acks()  # sends what was queued (before the fix: the old ack)
    (group,) = await client.station(name).groups()
    assert group.in_flight == 1  # the replay is still leased, waiting for its own ack
    await replayed.ack()
    await consumer.close()
    (group,) = await client.station(name).groups()
    assert group.in_flight == 0 and group.pending == 0


async def test_leaving_the_producer_block_waits_for_a_close_whose_caller_gave_up(
    client: Client,  # noqa: F811
) -> None:
    """``close()`` runs on in its own task when its caller is cancelled (a timeout around it);
    leaving ``async with`` then closed the session under it and returned at once, so a program
    ending there lost the message and left the stream open."""
    name = unique("close-timeout")
    await client.create_station(name)
    async with FaultProxy(client.url) as proxy:
        async with IdempotentProducer(
            f"{proxy.url}/v1/stream/{name}", "p", content_type="application/json"
        ) as producer:
            producer.append("a")
            proxy.gate.clear()  # the server stalls
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(producer.close(), 0.3)
            proxy.gate.set()  # and recovers while the block ends
        assert (await stream_head(client.stream_url(name))).get("Stream-Closed") == "true"
    assert await read_all(client.stream_url(name)) == ["a"]


async def test_a_reader_tailing_when_its_client_closes_fails_clearly(
    client: Client,  # noqa: F811
) -> None:
    """A task tails a station while the program leaves ``async with Client``: the read lost
    its connection and retried on a new session (never closed), forever."""
    name = unique("tail-close")
    await client.create_station(name)

    async def tail(other: Client) -> None:
        async for _batch in other.station(name).read(offset="-1", live="long-poll"):
            pass

    async with Client(client.url) as other:
        task = asyncio.create_task(tail(other))
        await asyncio.sleep(0.3)  # the read waits on the server
    done, _ = await asyncio.wait([task], timeout=5)
    if not done:
        task.cancel()
    assert done, "the reader went on reading after its client closed"
    with pytest.raises(StationsError, match="closed"):
        task.result()


def test_a_patient_retry_keeps_its_longest_pause_for_ever() -> None:
    """Readers and consumers retry with no give-up: the float power of the backoff overflowed
    at the 1,024th attempt (an hour into an outage), an OverflowError out of the read."""
    from stations.client.retry import PATIENT_RETRY, RetryPolicy

    for attempt in (0, 10, 1_100, 10**9):
        assert 0 < PATIENT_RETRY.delay(attempt) <= PATIENT_RETRY.max_delay
    assert RetryPolicy(initial_delay=1, max_delay=7, multiplier=10).delay(5_000) <= 7


def test_a_transactions_missing_group_is_group_not_found() -> None:
    """The transactions API names the item's field (``ack.0.group``): that 404 was taken for
    a missing station."""
    from stations.client.errors import error_for

    body = json.dumps(
        {"error": {"code": "not_found", "message": "group g not found", "field": "ack.0.group"}}
    ).encode()
    assert isinstance(error_for(404, {}, body), GroupNotFound)
    station = json.dumps({"error": {"code": "not_found", "message": "no", "field": "station"}})
    assert not isinstance(error_for(404, {}, station.encode()), GroupNotFound)


@pytest.mark.parametrize("url", ["localhost:4437", "ftp://localhost", "http://", "127.0.0.1"])
def test_a_url_without_http_is_refused_at_once(url: str) -> None:
    """``Client("localhost:4437")``: aiohttp's refusal of the URL was taken for a failed
    connection and retried, for ever by a reader."""
    with pytest.raises(ValueError, match="url"):
        Client(url)
    with pytest.raises(ValueError, match="url"):
        read_stream(f"{url}/v1/stream/x")
    with pytest.raises(ValueError, match="url"):
        IdempotentProducer(f"{url}/v1/stream/x", "p")


@pytest.mark.parametrize("ending", ["\r", "\n", "\r\n"])
async def test_sse_lines_may_end_in_a_lone_cr(ending: str) -> None:
    """The SSE format ends a line in CRLF, LF or CR alone; a Durable Streams server that ends
    its lines in CR gave the reader nothing (it split on LF only). Sent a byte at a time, so a
    CRLF falls across two chunks too."""
    from aiohttp import web

    events = [
        ("data", '[{"n": 1},'),
        ("data", ' {"n": 2}]'),
        ("control", '{"streamNextOffset": "2", "upToDate": true}'),
        ("data", '[{"n": 3}]'),
        ("control", '{"streamNextOffset": "3", "upToDate": true, "streamClosed": true}'),
    ]
    # The first event's data comes in two data lines (joined by a line feed), and a comment
    # line stands before the second event.
    body = f"event: data{ending}data: {events[0][1]}{ending}data:{events[1][1]}{ending}{ending}"
    body += f": keep-alive{ending}"
    body += "".join(f"event: {e}{ending}data: {d}{ending}{ending}" for e, d in events[2:])

    async def stream(request: web.Request) -> web.StreamResponse:
        if request.method == "HEAD":
            return web.Response(content_type="application/json")
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for byte in body.encode():
            await answer.write(bytes([byte]))
            await asyncio.sleep(0)
        return answer

    app = web.Application()
    app.router.add_route("*", "/v1/stream/s", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/stream/s"

    async def read() -> list[tuple[list[Any], str, bool]]:
        # Without the line ends it saw no event and reconnected for ever.
        return [(b.items, b.offset, b.closed) async for b in read_stream(url, live="sse")]

    try:
        got = await asyncio.wait_for(read(), 10)
    finally:
        await runner.cleanup()
    assert got == [([{"n": 1}, {"n": 2}], "2", False), ([{"n": 3}], "3", True)]
