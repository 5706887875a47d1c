"""The load generator: one aiohttp client, the same code for every server.

Each scenario takes a base URL and returns a :class:`Result`. Messages are JSON objects of about
100 bytes, ``{"i":<n>,"pad":"<letters>"}``, distinct by ``i``.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import orjson

JSON = "application/json"
MESSAGE_BYTES = 100
_PAD = b"abcdefghijklmnopqrstuvwxyz" * 8


def message(i: int) -> bytes:
    """One JSON message of MESSAGE_BYTES bytes (for i < 10**9)."""
    head = b'{"i":%d,"pad":"' % i
    start = i % 26
    return head + _PAD[start : start + MESSAGE_BYTES - len(head) - 2] + b'"}'


def batch(first: int, count: int) -> bytes:
    """A JSON array of ``count`` messages numbered from ``first``: the bytes of
    ``b"[" + b",".join(map(message, range(first, first + count))) + b"]"``.

    Built by one %-format of a cached template when every number has as many digits (so each
    message's padding is known from its position alone): a message at a time took the load
    generator 0.22 ms per 1000-message body, the server's own CPU per such POST is ~0.7 ms,
    and the producers' POSTs, answered together by one commit, wait for each other's bodies."""
    last = first + count - 1
    if count <= 0 or len(str(first)) != len(str(last)):
        return b"[" + b",".join(message(i) for i in range(first, first + count)) + b"]"
    template = _template(len(str(first)), first % 26, count)
    return template % tuple(range(first, first + count))


@functools.lru_cache(maxsize=64)
def _template(digits: int, phase: int, count: int) -> bytes:
    """``batch``'s format for ``count`` numbers of ``digits`` digits, the first ``phase``
    letters into the padding's cycle."""
    head = len(b'{"i":,"pad":"') + digits
    parts = []
    for k in range(count):
        start = (phase + k) % 26
        pad = _PAD[start : start + MESSAGE_BYTES - head - 2]  # letters: no "%" to escape
        parts.append(b'{"i":%d,"pad":"' + pad + b'"}')
    return b"[" + b",".join(parts) + b"]"


@dataclass
class Result:
    messages: int = 0  # messages the server acknowledged as newly stored
    seconds: float = 0.0
    requests: int = 0  # HTTP requests sent, resends included
    responses: int = 0  # read responses (catch-up scenario)
    resent: int = 0  # POSTs answered 409 (sequence gap) and sent again
    duplicates: int = 0  # 204 answers to producer POSTs (already stored)
    errors: Counter[str] = field(default_factory=Counter)
    stored: int | None = None  # messages found in the stream(s) afterwards
    expected: int | None = None  # what `stored` must be, when not `messages`
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def verified(self) -> bool | None:
        if self.stored is None:
            return None
        want = self.messages if self.expected is None else self.expected
        return self.stored == want

    def error(self, what: str) -> None:
        self.errors[what] += 1

    def add(self, other: Result) -> None:
        """Fold another run of the same scenario into this one."""
        self.messages += other.messages
        self.seconds += other.seconds
        self.requests += other.requests
        self.responses += other.responses
        self.resent += other.resent
        self.duplicates += other.duplicates
        self.errors.update(other.errors)
        if self.stored is not None and other.stored is not None:
            self.stored += other.stored
            mine = self.messages - other.messages if self.expected is None else self.expected
            theirs = other.messages if other.expected is None else other.expected
            self.expected = mine + theirs
        else:
            self.stored = self.expected = None
        self.notes += [n for n in other.notes if n not in self.notes]


class Client:
    """One HTTP session against one server."""

    def __init__(self, base: str, connections: int, gzip: bool = False) -> None:
        self.base = base
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, force_close=False),
            timeout=aiohttp.ClientTimeout(total=600),
            headers={"Accept-Encoding": "gzip" if gzip else "identity"},
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        await self.session.close()

    def url(self, stream: str) -> str:
        return f"{self.base}/v1/stream/{stream}"

    async def create(self, stream: str) -> None:
        async with self.session.put(self.url(stream), headers={"Content-Type": JSON}) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"PUT {stream}: {r.status} {await r.text()}")

    async def count(self, stream: str) -> tuple[int, int, list[bytes]]:
        """Read the whole stream: (messages, responses, raw bodies)."""
        bodies = await self.read_all(stream)
        return sum(len(orjson.loads(b)) for b in bodies if b), len(bodies), bodies

    async def read_all(self, stream: str) -> list[bytes]:
        """GET from offset -1, following Stream-Next-Offset until Stream-Up-To-Date: true."""
        bodies: list[bytes] = []
        offset = "-1"
        while True:
            async with self.session.get(self.url(stream), params={"offset": offset}) as r:
                if r.status != 200:
                    raise RuntimeError(f"GET {stream} offset={offset}: {r.status} {await r.text()}")
                bodies.append(await r.read())
                offset = r.headers["Stream-Next-Offset"]
                if r.headers.get("Stream-Up-To-Date", "").lower() == "true":
                    return bodies


def new_stream(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


# -- 1. single appends ------------------------------------------------------------------------


async def single_appends(
    base: str, *, in_flight: int, seconds: float, max_requests: int, gzip: bool = False
) -> Result:
    """``in_flight`` workers each POST one message at a time to one JSON stream."""
    client = Client(base, in_flight, gzip)
    result = Result()
    stream = new_stream("single")
    try:
        await client.create(stream)
        counter = iter(range(max_requests))
        deadline = time.perf_counter() + seconds
        headers = {"Content-Type": JSON}
        url = client.url(stream)

        async def worker() -> None:
            for i in counter:
                if time.perf_counter() >= deadline:
                    return
                result.requests += 1
                try:
                    async with client.session.post(url, data=message(i), headers=headers) as r:
                        await r.read()
                        if r.status in (200, 204):
                            result.messages += 1
                        else:
                            result.error(f"HTTP {r.status}")
                except aiohttp.ClientError as e:
                    result.error(type(e).__name__)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        result.seconds = time.perf_counter() - start
        result.stored, _, _ = await client.count(stream)
    finally:
        await client.close()
    return result


# -- 2. batched producer appends --------------------------------------------------------------


def producer_headers(producer: str, seq: int) -> dict[str, str]:
    return {
        "Content-Type": JSON,
        "Producer-Id": producer,
        "Producer-Epoch": "0",
        "Producer-Seq": str(seq),
    }


async def batched_producers(
    base: str,
    *,
    producers: int,
    batch_size: int,
    seconds: float,
    max_batches: int,
    gzip: bool = False,
) -> Result:
    """``producers`` idempotent producers, each on its own stream, one POST at a time each."""
    client = Client(base, producers, gzip)
    result = Result()
    streams = [new_stream(f"batched{p}") for p in range(producers)]
    try:
        for stream in streams:
            await client.create(stream)
        deadline = time.perf_counter() + seconds

        async def producer(p: int, stream: str) -> None:
            url, name = client.url(stream), f"bench-producer-{p}"
            for seq in range(max_batches):
                if time.perf_counter() >= deadline:
                    return
                body = batch(seq * batch_size, batch_size)
                result.requests += 1
                async with client.session.post(
                    url, data=body, headers=producer_headers(name, seq)
                ) as r:
                    await r.read()
                    if r.status == 200:
                        result.messages += batch_size
                    elif r.status == 204:
                        result.duplicates += 1
                    else:
                        result.error(f"HTTP {r.status}")
                        return

        start = time.perf_counter()
        await asyncio.gather(*(producer(p, s) for p, s in enumerate(streams)))
        result.seconds = time.perf_counter() - start
        result.stored = 0
        for stream in streams:
            stored, _, _ = await client.count(stream)
            result.stored += stored
    finally:
        await client.close()
    return result


async def pipelined_producer(
    base: str,
    *,
    in_flight: int,
    batch_size: int,
    seconds: float,
    max_batches: int,
    gzip: bool = False,
) -> Result:
    """One idempotent producer with ``in_flight`` POSTs outstanding (seq increasing, sent
    concurrently on separate connections).

    A POST answered 409 (sequence gap: it overtook an earlier one) is resent once every lower
    seq has been acknowledged, so all batches end up stored in order; each resend is counted.
    """
    client = Client(base, in_flight, gzip)
    result = Result()
    stream = new_stream("pipelined")
    name = "bench-pipelined"
    acked: set[int] = set()
    done = -1  # every seq <= done is acknowledged
    progress = asyncio.Condition()
    try:
        await client.create(stream)
        url = client.url(stream)
        seqs = iter(range(max_batches))
        deadline = time.perf_counter() + seconds

        async def ack(seq: int) -> None:
            nonlocal done
            async with progress:
                acked.add(seq)
                while done + 1 in acked:
                    acked.discard(done + 1)
                    done += 1
                progress.notify_all()

        async def send(seq: int, body: bytes) -> None:
            while True:
                result.requests += 1
                async with client.session.post(
                    url, data=body, headers=producer_headers(name, seq)
                ) as r:
                    await r.read()
                    status = r.status
                if status == 200:
                    result.messages += batch_size
                    break
                if status == 204:
                    result.duplicates += 1
                    break
                if status != 409:
                    result.error(f"HTTP {status}")
                    break
                # Sequence gap: wait until everything before this seq is in, then resend.
                result.resent += 1
                async with progress:
                    await progress.wait_for(lambda: done >= seq - 1)
            await ack(seq)

        async def slot() -> None:
            for seq in seqs:
                if time.perf_counter() >= deadline:
                    return
                await send(seq, batch(seq * batch_size, batch_size))

        start = time.perf_counter()
        await asyncio.gather(*(slot() for _ in range(in_flight)))
        result.seconds = time.perf_counter() - start
        result.stored, _, _ = await client.count(stream)
    finally:
        await client.close()
    return result


# -- 3. catch-up read -------------------------------------------------------------------------


async def preload(client: Client, stream: str, total: int, batch_size: int) -> None:
    """Append ``total`` messages in batches, a few POSTs in flight (plain appends)."""
    starts = iter(range(0, total, batch_size))

    async def worker() -> None:
        url = client.url(stream)
        for first in starts:
            body = batch(first, min(batch_size, total - first))
            async with client.session.post(url, data=body, headers={"Content-Type": JSON}) as r:
                if r.status not in (200, 204):
                    raise RuntimeError(f"preload POST: {r.status} {await r.text()}")

    await asyncio.gather(*(worker() for _ in range(4)))


async def prepare_read(base: str, *, total: int, batch_size: int) -> tuple[str, float]:
    """Create a stream and preload ``total`` messages; returns (stream, seconds taken)."""
    client = Client(base, 4)
    stream = new_stream("read")
    try:
        await client.create(stream)
        start = time.perf_counter()
        await preload(client, stream, total, batch_size)
        return stream, time.perf_counter() - start
    finally:
        await client.close()


async def catch_up_read(base: str, stream: str, *, total: int, gzip: bool = False) -> Result:
    """Time one reader from offset -1 to the tail of a preloaded stream.

    Bodies are parsed, and every ``i`` in 0..total-1 checked, after the clock stops.
    """
    client = Client(base, 1, gzip)
    result = Result(expected=total)
    try:
        start = time.perf_counter()
        bodies = await client.read_all(stream)
        result.seconds = time.perf_counter() - start
    finally:
        await client.close()
    result.responses = result.requests = len(bodies)
    seen = bytearray(total)
    for body in bodies:
        if body:
            for item in orjson.loads(body):
                result.messages += 1
                i = item["i"]
                if 0 <= i < total:
                    seen[i] = 1
    result.stored = result.messages
    missing = total - sum(seen)
    if missing:
        result.errors[f"{missing} ids written but not read"] += 1
    sizes = sorted(len(b) for b in bodies)
    result.notes.append(f"response sizes {sizes[0] / 1e6:.2f}..{sizes[-1] / 1e6:.2f} MB")
    return result
