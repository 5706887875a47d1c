"""The SDK and the CLI as a user meets them (the review of 2026-11-29): an idempotent producer
with a producer token, a consumer closed while its fetch waits, and the CLI's refusals of
input and output it cannot handle."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from stations.client import Client
from tests import clikit
from tests.clikit import failed
from tests.harness import Server
from tests.module_server import module_server
from tests.test_sdk import unique

ADMIN, PRODUCER = "admin-review6", "producer-review6"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work: Path = tmp_path_factory.mktemp("review6")
    tokens = [
        {"token": ADMIN, "role": "admin"},
        {"token": PRODUCER, "role": "producer", "stations": ["shop-*"]},
    ]
    (work / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    yield from module_server("sqlite", tmp_path_factory, "--tokens", str(work / "tokens.json"))


@pytest.fixture
async def admin(srv: Server) -> AsyncIterator[Client]:
    async with Client(srv.url, token=ADMIN) as client:
        yield client


async def test_an_idempotent_producer_works_with_a_producer_token(
    srv: Server, admin: Client
) -> None:
    """It asks the station's content type with a HEAD, which only consumers could send: a
    producer token, the one such a producer is given, was refused (403) at the first batch."""
    name = unique("shop-")
    await admin.create_station(name)
    async with Client(srv.url, token=PRODUCER) as client:
        producer = client.station(name).producer("p1")
        producer.append({"n": 1})
        await producer.flush()
        await producer.close()
    page = await admin.station(name).browse()
    assert [m.data for m in page.messages] == [{"n": 1}]


async def test_closing_a_consumer_whose_fetch_waits_uses_no_delivery(admin: Client) -> None:
    """close() returned while another task's fetch went on waiting; a message produced then
    was leased and given back at once: a delivery used up unread (with one delivery allowed,
    straight to the DLS)."""
    name = unique("shop-")
    await admin.create_station(name)
    station = admin.station(name)
    consumer = station.consumer("g", wait_ms=5000, batch_size=1, max_msg_deliveries=1)
    await consumer.start()
    got: list[object] = []

    async def iterate() -> None:
        async for message in consumer:
            got.append(message)

    task = asyncio.create_task(iterate())
    await asyncio.sleep(0.3)  # the fetch waits
    await consumer.close()
    await station.produce({"n": 1})
    await asyncio.wait_for(task, 10)
    assert got == []
    # Still undelivered: a new consumer of the group gets it as a first delivery.
    fresh = station.consumer("g", wait_ms=2000, batch_size=1)
    (message,) = await fresh.fetch()
    assert message.delivery_count == 1 and message.data == {"n": 1}
    await message.ack()
    await fresh.close()
    assert (await station.dead_letters()).entries == []


def test_produce_refuses_nan_and_infinity_before_sending(srv: Server) -> None:
    """Python's json took NaN, Infinity and 1e999; the SDK then failed on them with a
    traceback, after earlier lines were stored and without listing them."""
    name = unique("shop-")
    clikit.ok(clikit.run("station", "create", name, url=srv.url, token=ADMIN))
    for line in ("NaN", "-Infinity", "1e999"):
        proc = clikit.run("produce", name, url=srv.url, token=ADMIN, stdin=f"{line}\n")
        failed(proc, 2, "line 1", "not JSON")
    # After a line that may have been sent already: what was stored is said, as for any bad
    # line (exit 1), or nothing was (exit 2).
    proc = clikit.run("produce", name, url=srv.url, token=ADMIN, stdin="1\nNaN\n")
    read = clikit.ok(clikit.run("read", name, url=srv.url, token=ADMIN)).splitlines()
    read = [line.split()[-1] for line in read]  # offset, id, data: the data
    if proc.returncode == 1:
        failed(proc, 1, "line 2", "not JSON", "the first 1 messages were stored")
        assert read == ["1"]
    else:
        failed(proc, 2, "line 2", "not JSON")
        assert read == []


def test_produce_takes_off_one_line_end_only(srv: Server) -> None:
    name = unique("shop-")
    created = clikit.run(
        "station", "create", name, "--content-type", "text/plain", url=srv.url, token=ADMIN
    )
    clikit.ok(created)
    clikit.ok(clikit.run("produce", name, url=srv.url, token=ADMIN, stdin="cr\r\r\nlf\n"))
    stored = httpx.get(
        f"{srv.url}/v1/stream/{name}?offset=-1", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert stored.content == b"cr\rlf"


def test_a_command_with_standard_output_closed_says_so(srv: Server) -> None:
    """Python drops every print when it starts with fd 1 closed: ``read`` printed nothing and
    exited 0."""
    name = unique("shop-")
    clikit.ok(clikit.run("station", "create", name, url=srv.url, token=ADMIN))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    env.update(STATIONS_URL=srv.url, STATIONS_TOKEN=ADMIN)
    proc = subprocess.run(
        [sys.executable, "-m", "stations", "read", name],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=lambda: os.close(1),
        timeout=60,
    )
    assert proc.returncode == 7, (proc.returncode, proc.stderr)
    assert "standard output is closed" in proc.stderr
