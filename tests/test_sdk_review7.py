"""The SDK as a user meets it (the seventh review): an idempotent producer against a server whose
``--max-append-messages`` is below its batch size, a ``SyncClient`` the script never closed, and
closing a consumer's client with the server down."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stations.client import Client, IdempotentProducer, RetryPolicy
from tests.harness import Server
from tests.module_server import module_server
from tests.test_sdk import FAST_RETRY, read_all, unique

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 100  # the server's --max-append-messages


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that takes at most ``LIMIT`` messages in one append."""
    yield from module_server(
        "sqlite",
        tmp_path_factory,
        "--max-append-messages",
        str(LIMIT),
        "--long-poll-timeout-ms",
        "500",
    )


def tricky(n: int) -> dict[str, Any]:
    """A value whose text holds commas and brackets: a batch is split between values, not at
    every comma."""
    return {"n": n, "s": f"a,b],[{n}", "deep": [1, {"x": ",", "y": [None, 2.5]}]}


async def test_a_batch_over_the_servers_message_limit_is_split_not_dropped(
    capped: Server,
) -> None:
    """A 413 (more messages than --max-append-messages) stored nothing: the producer stopped for
    good, dropped every batch and flush() raised. Now the batch goes in parts, in order, and
    later batches are no larger than the limit the server named."""
    name = unique("cap")
    async with Client(capped.url, retry=FAST_RETRY) as client:
        await client.create_station(name)
        station = client.station(name)
        errors: list[Exception] = []
        producer = station.producer("p", on_error=errors.append)  # max_batch_messages 100,000
        for n in range(1000):
            producer.append(tricky(n))
        await producer.flush()
        assert producer.max_batch_messages == LIMIT
        for n in range(1000, 1250):  # sealed at the new size: no 413 any more
            producer.append(tricky(n))
        await producer.flush()
        assert errors == [] and producer.error is None
        assert producer.next_seq == 13  # 10 parts, then 100 + 100 + 50
        assert await read_all(station.url) == [tricky(n) for n in range(1250)]


async def test_split_batches_keep_their_order_among_batches_in_flight(capped: Server) -> None:
    """Several oversized batches pipelined (max_in_flight 5), each refused: the ones sent after
    a refused batch give their seqs up to its parts, and every message is stored once, in
    order."""
    name = unique("cap")
    async with Client(capped.url, retry=FAST_RETRY) as client:
        await client.create_station(name)
        station = client.station(name)
        producer = station.producer("p", max_batch_messages=250, linger_ms=1, max_in_flight=5)
        for n in range(3000):
            await producer.wait_for_capacity()
            producer.append(n if n % 3 else f"text, {n}")
        await producer.flush()
        assert producer.error is None and producer.max_batch_messages == LIMIT
        expected = [n if n % 3 else f"text, {n}" for n in range(3000)]
        assert await read_all(station.url) == expected


async def test_split_batch_appended_before_the_content_type_was_known(capped: Server) -> None:
    """A producer on a stream URL queues its first messages before it learnt the stream's
    content type (kept as separate items): split the same way."""
    name = unique("cap")
    async with Client(capped.url) as client:
        await client.create_station(name)
        url = client.station(name).url
    producer = IdempotentProducer(url, "p", retry=FAST_RETRY)
    values: list[Any] = [f"s{n}" if n % 2 else {"n": n} for n in range(250)]
    for value in values:
        producer.append(value)
    await producer.close()
    assert await read_all(url) == values


async def test_closing_with_the_server_down_takes_one_give_up_after(
    make_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer with a queued ack and prefetched messages, its server gone: the ack retried
    for give_up_after, then the give-back (a nack) for another give_up_after, where the README
    says close() waits up to give_up_after. The give-back is skipped once the acks got no
    answer in time: the leases expire anyway."""
    server = make_server(f"sqlite:///{tmp_path / 'down.db'}")
    give_up = 2.0
    retry = RetryPolicy(initial_delay=0.02, max_delay=0.2, give_up_after=give_up)
    client = Client(server.url, retry=retry)
    name = unique("down")
    await client.create_station(name)
    station = client.station(name)
    await station.produce_many([{"n": n} for n in range(10)])
    consumer = station.consumer("g", batch_size=10, ack_interval_ms=60_000)
    message = await consumer.__anext__()
    await message.ack()  # queued
    server.kill()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "stations.client.consumer"):
        await client.close()
    elapsed = time.monotonic() - started
    assert elapsed < give_up + 1.0, elapsed
    assert "not giving back 9 prefetched messages" in caplog.text


EXIT_SCRIPT = """
import gc, sys, weakref
from stations.client.sync import SyncClient

url, name = sys.argv[1], sys.argv[2]
closed = SyncClient(url)
ref = weakref.ref(closed)
closed.close()
del closed
gc.collect()
assert ref() is None, "the exit hook kept a closed SyncClient alive"

client = SyncClient(url)
client.get_station(name)  # the session is open
producer = client.station(name).producer("left-open", linger_ms=60_000)
for n in range(10):
    producer.append({"n": n})
print("exiting without close", flush=True)
"""


async def test_a_sync_client_left_open_is_flushed_at_exit(capped: Server) -> None:
    """A script that ends without closing its SyncClient: the producers' queued batches were
    lost without a word (the loop's daemon thread stopped with the interpreter, exit status 0)
    and aiohttp complained of an unclosed session. At exit it is closed as close() would."""
    name = unique("exit")
    async with Client(capped.url) as client:
        await client.create_station(name)
        url = client.station(name).url
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", EXIT_SCRIPT, capped.url, name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "exiting without close" in done.stdout
    stored = await read_all(url)
    assert "Unclosed" not in done.stderr, done.stderr
    assert stored == [{"n": n} for n in range(10)]
