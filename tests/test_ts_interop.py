"""Interoperability, the other way round: the official TypeScript client
(``@durable-streams/client`` 0.2.7, pinned in tests/node/package-lock.json) against a live
``stations serve`` on both engines, with the Durable Streams reference server
(``@durable-streams/server`` 0.3.7) as the yardstick.

``tests/node/ts-client-interop.mjs`` creates a JSON stream, follows it live (long-poll and SSE)
while its ``IdempotentProducer`` appends 300 messages in many pipelined batches and closes the
stream with a final message, then reads it again with a catch-up ``stream()``. It prints what
every read saw; on Stations that must be what the reference shows: the same messages in the same
order, no duplicates, the closure seen, the reads ending by themselves. A stream written by our
Python ``IdempotentProducer`` must read back identically through the TypeScript client.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from stations.client import Client, IdempotentProducer
from tests.harness import Server
from tests.nodekit import NODE_DIR, reference_server, require_node

SCRIPT = NODE_DIR / "ts-client-interop.mjs"
MESSAGES = 300
READS = ("longPoll", "sse", "catchup")
Summary = dict[str, Any]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _node(*args: str, timeout: float = 60) -> Any:
    """Run the script; its one line of JSON on stdout, parsed."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(SCRIPT),
        "--messages",
        str(MESSAGES),
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 0 and lines, f"{args}: exit {proc.returncode}\n{out!r}\n{err!r}"
    result = json.loads(lines[-1])
    assert "error" not in result, result["error"]
    return result


async def run_ts_client(base: str, stream: str, *extra: str) -> Summary:
    summary: Summary = await _node("--base", base, "--stream", stream, *extra)
    return summary


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from reference_server(tmp_path_factory)


@pytest.fixture(scope="module")
async def expected() -> list[Any]:
    """The messages the script appends, its final "bye" included."""
    require_node()
    messages: list[Any] = await _node("--print-messages")
    assert len(messages) == MESSAGES + 1 and messages[-1] == "bye"
    return messages


@pytest.fixture(scope="module")
async def reference_summary(reference: str, expected: list[Any]) -> Summary:
    summary = await run_ts_client(reference, _unique("ts"))
    check_reference(summary, expected)
    return summary


# -- checks -----------------------------------------------------------------------------------


def check_summary(summary: Summary, expected: list[Any], *, reads: tuple[str, ...] = READS) -> None:
    """What any correct server must show: every read saw exactly ``expected`` (so in order and
    without duplicates), saw the closure and ended by itself; offsets only grow and every read
    ends at the stream's final offset."""
    head = summary["head"]
    assert head["streamClosed"] is True and head["contentType"] == "application/json", head
    written = summary["written"]
    if written is not None:
        assert written["messages"] == len(expected) and written["epoch"] == 0, written
        assert written["batches"] > 3, written  # batching was exercised (many seqs)
        assert written["finalOffset"] == written["lastSuccessfulOffset"] == head["offset"]
    for mode in reads:
        read = summary["reads"][mode]
        assert read["items"] == expected, mode
        assert read["streamClosed"] is True and read["ended"] is True, (mode, read["batches"])
        assert read["offset"] == head["offset"], mode
        batches = read["batches"]
        assert sum(b["count"] for b in batches) == len(expected), mode
        offsets = [b["offset"] for b in batches if b["count"]]
        assert offsets == sorted(set(offsets)), (mode, offsets)  # strictly increasing
        assert batches[-1]["streamClosed"] is True, mode
        assert not any(b["streamClosed"] for b in batches[:-1]), mode


def check_reference(summary: Summary, expected: list[Any]) -> None:
    check_summary(summary, expected, reads=("sse", "catchup"))
    # Reference 0.3.7 quirk: a long-poll waiting at the tail when the stream is closed *with a
    # final message* is answered 204 Stream-Closed at the old tail, so that reader never gets the
    # final message (a catch-up read from there would). Stations answers 200 with the message.
    long_poll = summary["reads"]["longPoll"]
    assert long_poll["items"] in (expected, expected[:-1]), long_poll["batches"]
    assert long_poll["streamClosed"] is True and long_poll["ended"] is True


def comparable(summary: Summary) -> Summary:
    """A summary without what is each server's own business: offset tokens (the reference counts
    bytes, Stations messages), how reads and appends were cut into batches, and whether the
    last SSE control event repeats ``upToDate`` beside ``streamClosed`` (both allowed)."""
    written = summary["written"]
    return {
        "written": None if written is None else {"messages": written["messages"], "epoch": 0},
        "head": {k: summary["head"][k] for k in ("streamClosed", "contentType")},
        "reads": {
            mode: {k: read[k] for k in ("items", "streamClosed", "ended")}
            for mode, read in summary["reads"].items()
        },
    }


# -- the tests ----------------------------------------------------------------------------------


async def test_ts_client_on_stations_matches_reference(
    expected: list[Any], reference_summary: Summary, server: Server
) -> None:
    ours = await run_ts_client(server.url, _unique("ts"))
    check_summary(ours, expected)
    theirs = comparable(reference_summary)
    theirs["reads"]["longPoll"]["items"] = expected  # the reference quirk above, set right
    assert comparable(ours) == theirs


async def test_python_producer_stream_reads_back_through_ts_client(
    expected: list[Any], server: Server
) -> None:
    written_by_ts = await run_ts_client(server.url, _unique("ts"))
    name = _unique("py")
    async with Client(server.url) as client:
        await client.create_station(name)  # a JSON stream, as DurableStream.create made above
    producer = IdempotentProducer(
        f"{server.url}/v1/stream/{name}", "py-interop", max_batch_bytes=1024
    )
    for value in expected[:-1]:
        producer.append(value)
    final = await producer.close(expected[-1])
    assert producer.next_seq > 4  # several batches, then the close

    ours = await run_ts_client(server.url, name, "--read-only")
    assert ours["written"] is None
    check_summary(ours, expected)
    assert ours["head"]["offset"] == final == written_by_ts["head"]["offset"]
    assert comparable(ours)["reads"] == comparable(written_by_ts)["reads"]
