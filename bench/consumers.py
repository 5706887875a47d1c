"""``python3 -m bench.consumers``: consumer groups against NATS JetStream pull consumers.

Two figures per system, from one run on this machine:

1. throughput: one group (one durable pull consumer) over a preloaded station (stream) of
   ``--messages`` ~100-byte JSON messages; ``--consumers`` consumers each fetch ``--fetch``
   messages at a time and ack what they got (Stations: one ack request per fetched batch;
   nats-py: one ack per message, its normal way). Every message must be acked exactly once.
2. latency: a consumer waits in a fetch of one message; the producer appends one message; the
   time from just before the append to the fetch's answer, ``--latency-samples`` times in turn.

Stations runs on SQLite and on PostgreSQL (a fresh database, dropped afterwards); the anchor is
the NATS JetStream server at ``--nats-url`` (or a ``nats-server -js`` started here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import math
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import load, servers
from bench.cli import cpu_seconds, load_average, uvloop_available
from bench.servers import Server

JSON_HEADERS = {"Content-Type": load.JSON}
GROUP = "bench"
ENGINES = ("sqlite", "postgresql")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.consumers", description=__doc__)
    p.add_argument("--messages", type=int, default=200_000, help="throughput: preloaded messages")
    p.add_argument("--latency-samples", type=int, default=300, help="latency: appends timed")
    p.add_argument("--engines", default=",".join(ENGINES), help="Stations engines: %(default)s")
    p.add_argument("--consumers", type=int, default=4, help="throughput: consumers in the group")
    p.add_argument("--fetch", type=int, default=100, help="throughput: messages per fetch")
    p.add_argument("--wait-ms", type=int, default=1000, help="throughput: fetch waitMs / timeout")
    p.add_argument("--preload-batch", type=int, default=1000, help="messages per preload POST")
    p.add_argument(
        "--settle-ms",
        type=float,
        default=50,
        help="latency: pause between sending the fetch and appending, so the fetch is parked",
    )
    p.add_argument(
        "--durability", default="fsync", choices=("fsync", "process"), help="Stations --durability"
    )
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222", help="JetStream server")
    p.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432",
        help="PostgreSQL server (no database part); a fresh database is created and dropped",
    )
    p.add_argument("--data-root", type=Path, help="where the fresh data dirs go (default /tmp)")
    p.add_argument("--keep-data", action="store_true", help="leave the data dirs behind")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engine(s): {', '.join(sorted(unknown))}")
    if args.messages < 1 or args.latency_samples < 1 or args.consumers < 1 or args.fetch < 1:
        p.error("--messages, --latency-samples, --consumers and --fetch must be at least 1")
    return args


# -- results ------------------------------------------------------------------------------------


@dataclass
class Throughput:
    system: str
    messages: int
    preload_s: float = 0.0
    delivered_s: float = 0.0  # from the first fetch to the last message delivered
    acked_s: float = 0.0  # from the first fetch to the last ack answered (NATS: flushed)
    fetches: int = 0
    empty_fetches: int = 0
    ack_requests: int = 0
    delivered: int = 0  # messages handed out, duplicates included
    unique_acked: int = 0
    twice: int = 0  # offsets delivered more than once
    redelivered: int = 0  # deliveries with a delivery count other than 1
    unknown: int = 0  # offsets an ack answered as unknown
    missing: int = 0  # message numbers 0..N-1 never delivered
    server_cpu: float = 0.0  # fraction of one core over the timed part
    client_cpu: float = 0.0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def delivered_rate(self) -> float:
        return self.messages / self.delivered_s if self.delivered_s else 0.0

    @property
    def acked_rate(self) -> float:
        return self.messages / self.acked_s if self.acked_s else 0.0

    @property
    def exactly_once(self) -> bool:
        return (
            self.unique_acked == self.messages
            and self.delivered == self.messages
            and not (self.twice or self.redelivered or self.unknown or self.missing)
        )

    @property
    def ok(self) -> bool:
        return self.exactly_once and not self.errors


@dataclass
class Latency:
    system: str
    samples_ms: list[float] = field(default_factory=list)
    early: int = 0  # fetches that answered before the append was sent (should be none)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile of the samples, in ms."""
        if not self.samples_ms:
            return math.nan
        ordered = sorted(self.samples_ms)
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    @property
    def ok(self) -> bool:
        return bool(self.samples_ms) and not self.errors


# -- Stations -----------------------------------------------------------------------------------


class Stations:
    """HTTP calls of the consumer-group API (CONTRACT.md §4) over one aiohttp session."""

    def __init__(self, base: str, connections: int) -> None:
        self.client = load.Client(base, connections)
        self.base = base

    @property
    def session(self) -> aiohttp.ClientSession:
        return self.client.session

    async def close(self) -> None:
        await self.client.close()

    def group_url(self, station: str, suffix: str = "") -> str:
        return f"{self.base}/api/stations/{station}/groups/{GROUP}{suffix}"

    async def call(self, method: str, url: str, body: Any) -> Any:
        data = None if body is None else orjson.dumps(body)
        async with self.session.request(method, url, data=data, headers=JSON_HEADERS) as r:
            raw = await r.read()
            if r.status not in (200, 201):
                raise RuntimeError(f"{method} {url}: HTTP {r.status} {raw[:300]!r}")
        return orjson.loads(raw) if raw else None

    async def new_station(self, prefix: str) -> str:
        name = load.new_stream(prefix)
        await self.client.create(name)
        return name

    async def create_group(self, station: str) -> None:
        config = {"maxAckTimeMs": 30_000, "maxMsgDeliveries": 2, "startFrom": "earliest"}
        await self.call("PUT", self.group_url(station), config)

    async def fetch(self, station: str, max_count: int, wait_ms: int, consumer: str) -> Any:
        body = {"max": max_count, "waitMs": wait_ms, "consumer": consumer}
        return (await self.call("POST", self.group_url(station, "/fetch"), body))["messages"]

    async def ack(self, station: str, offsets: list[str]) -> Any:
        return await self.call("POST", self.group_url(station, "/ack"), {"offsets": offsets})

    async def group_view(self, station: str) -> dict[str, Any]:
        async with self.session.get(f"{self.base}/api/stations/{station}/groups") as r:
            views = orjson.loads(await r.read())["groups"]
        return next(v for v in views if v["name"] == GROUP)

    async def delete_station(self, station: str) -> None:
        async with self.session.delete(f"{self.base}/api/stations/{station}") as r:
            await r.read()


class Tally:
    """Bookkeeping shared by the consumers of one throughput run (one event loop, no locks)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.seen = bytearray(total)  # message number i delivered (count, capped)
        self.delivered_keys: set[Any] = set()
        self.acked_keys: set[Any] = set()
        self.last_delivery = 0.0
        self.last_ack = 0.0
        self.last_progress = time.perf_counter()

    def deliver(self, key: Any, count: int, body: bytes | Any, result: Throughput) -> None:
        result.delivered += 1
        if key in self.delivered_keys:
            result.twice += 1
        self.delivered_keys.add(key)
        if count != 1:
            result.redelivered += 1
        i = (orjson.loads(body) if isinstance(body, bytes) else body)["i"]
        if 0 <= i < self.total and self.seen[i] < 255:
            self.seen[i] += 1

    def finish(self, result: Throughput, start: float) -> None:
        result.unique_acked = len(self.acked_keys)
        result.missing = self.total - sum(1 for s in self.seen if s)
        result.delivered_s = self.last_delivery - start if self.last_delivery else 0.0
        result.acked_s = self.last_ack - start if self.last_ack else 0.0

    def done(self) -> bool:
        return len(self.acked_keys) >= self.total

    def give_up(self, stall_s: float) -> bool:
        """After an empty fetch: everything is out, or nothing moved for ``stall_s``."""
        return (
            len(self.delivered_keys) >= self.total
            or time.perf_counter() - self.last_progress > stall_s
        )


async def stations_throughput(server: Server, args: argparse.Namespace) -> Throughput:
    result = Throughput(f"stations {server.mode}", args.messages)
    api = Stations(server.url, args.consumers + 4)
    try:
        station = await api.new_station("consumers")
        t = time.perf_counter()
        await load.preload(api.client, station, args.messages, args.preload_batch)
        result.preload_s = time.perf_counter() - t
        await api.create_group(station)
        tally = Tally(args.messages)

        async def consumer(c: int) -> None:
            name = f"c{c}"
            while not tally.done():
                result.fetches += 1
                got = await api.fetch(station, args.fetch, args.wait_ms, name)
                if not got:
                    result.empty_fetches += 1
                    if tally.give_up(35.0):
                        return
                    continue
                tally.last_delivery = tally.last_progress = time.perf_counter()
                offsets = [m["offset"] for m in got]
                for m in got:
                    tally.deliver(m["offset"], m["deliveryCount"], m["data"], result)
                result.ack_requests += 1
                answer = await api.ack(station, offsets)
                tally.last_ack = tally.last_progress = time.perf_counter()
                unknown = set(answer["unknown"])
                result.unknown += len(unknown)
                if answer["acked"] != len(offsets) - len(unknown):
                    result.errors.append(f"ack answered {answer['acked']} for {len(offsets)}")
                tally.acked_keys.update(o for o in offsets if o not in unknown)

        s0, c0 = cpu_seconds(server.pid), time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(consumer(c) for c in range(args.consumers)))
        tally.finish(result, start)
        wall = time.perf_counter() - start
        result.server_cpu = (cpu_seconds(server.pid) - s0) / wall
        result.client_cpu = (time.process_time() - c0) / wall
        view = await api.group_view(station)
        left = {k: view[k] for k in ("pending", "inFlight", "deadLettered")}
        if any(left.values()):
            result.errors.append(f"group not drained: {left}")
        else:
            result.notes.append("group drained (pending 0, inFlight 0, deadLettered 0)")
        await api.delete_station(station)
    except (RuntimeError, aiohttp.ClientError, KeyError) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await api.close()
    return result


async def stations_latency(server: Server, args: argparse.Namespace) -> Latency:
    result = Latency(f"stations {server.mode}")
    api = Stations(server.url, 4)
    try:
        station = await api.new_station("latency")
        await api.create_group(station)
        url = api.client.url(station)

        async def waiting_fetch() -> tuple[Any, float]:
            got = await api.fetch(station, 1, 5000, "waiter")
            return got, time.perf_counter()

        for k in range(args.latency_samples):
            fetch = asyncio.ensure_future(waiting_fetch())
            await asyncio.sleep(args.settle_ms / 1000)
            if fetch.done():
                result.early += 1
            t0 = time.perf_counter()
            async with api.session.post(url, data=load.message(k), headers=JSON_HEADERS) as r:
                await r.read()
                if r.status not in (200, 204):
                    raise RuntimeError(f"append: HTTP {r.status}")
            got, t1 = await fetch
            if len(got) != 1 or got[0]["data"]["i"] != k or got[0]["deliveryCount"] != 1:
                result.errors.append(f"sample {k}: fetch answered {got!r:.200}")
                continue
            result.samples_ms.append((t1 - t0) * 1000)
            answer = await api.ack(station, [got[0]["offset"]])
            if answer["acked"] != 1:
                result.errors.append(f"sample {k}: ack answered {answer}")
        await api.delete_station(station)
    except (RuntimeError, aiohttp.ClientError, KeyError) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await api.close()
    return result


# -- PostgreSQL ---------------------------------------------------------------------------------


def pg_create(base: str) -> tuple[str, str]:
    """Create a fresh database; returns (its name, the server's version)."""
    import psycopg

    name = f"bench_consumers_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # a generated identifier, nothing to quote
        row = conn.execute("SHOW server_version").fetchone()
    return name, str(row[0]) if row else "?"


def pg_drop(base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def stations_server(engine: str, args: argparse.Namespace, data_dir: Path, db: str) -> Server:
    if engine == "sqlite":
        return servers.stations("stations", args.durability, data_dir)
    port = servers.free_port()
    command = [sys.executable, "-m", "stations", "serve", "--port", str(port), "--db", db]
    command += ["--durability", args.durability]
    return Server("stations", "postgresql", command, data_dir, port)


# -- NATS JetStream -----------------------------------------------------------------------------


@dataclass
class Nats:
    url: str
    version: str
    pid: int | None
    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def nats_probe(url: str) -> str | None:
    """The server's version when it answers with JetStream enabled, else None."""
    import nats

    try:
        nc = await nats.connect(
            url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0
        )
    except Exception:
        return None
    try:
        await nc.jetstream().account_info()
        return str(nc.connected_server_version)
    except Exception:
        return None
    finally:
        await nc.close()


def listening_pid(url: str) -> int | None:
    """The pid listening on the URL's port (for its CPU figure), via ss; None if unknown."""
    port = url.rsplit(":", 1)[-1].strip("/")
    try:
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


async def nats_anchor(args: argparse.Namespace, root: Path) -> Nats | None:
    version = await nats_probe(args.nats_url)
    if version is not None:
        return Nats(args.nats_url, version, listening_pid(args.nats_url))
    binary = shutil.which("nats-server")
    if binary is None:
        return None
    port = servers.free_port()
    store = root / "nats"
    store.mkdir(parents=True, exist_ok=True)
    log = open(store / "nats.log", "ab")  # noqa: SIM115 - kept open for the child's life
    proc = subprocess.Popen(
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"nats://127.0.0.1:{port}"
    started = Nats(url, "?", proc.pid, proc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        version = await nats_probe(url)
        if version is not None:
            started.version = version
            print(f"started nats-server pid {proc.pid} on {url}, store {store}", flush=True)
            return started
        await asyncio.sleep(0.2)
    started.stop()
    return None


async def nats_stream(js: Any, kind: str) -> tuple[str, str, str]:
    """A fresh file-backed stream and its durable explicit-ack pull consumer."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    tag = uuid.uuid4().hex[:10]
    stream, subject, durable = f"BENCH_{kind}_{tag}", f"bench.{kind}.{tag}", f"bench_{tag}"
    await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30,
        max_deliver=2,
        deliver_policy=DeliverPolicy.ALL,
    )
    await js.add_consumer(stream, config=config)
    return stream, subject, durable


async def nats_preload(nc: Any, js: Any, stream: str, subject: str, total: int) -> None:
    """Core publishes into the stream's subject, flushed every 1000; then wait until stored."""
    for first in range(0, total, 1000):
        for i in range(first, min(first + 1000, total)):
            await nc.publish(subject, load.message(i))
        await nc.flush()
    deadline = time.monotonic() + 60
    while True:
        info = await js.stream_info(stream)
        if info.state.messages >= total:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"preload: stream holds {info.state.messages} of {total}")
        await asyncio.sleep(0.05)


async def nats_throughput(anchor: Nats, args: argparse.Namespace) -> Throughput:
    import nats

    result = Throughput("jetstream", args.messages)
    admin = await nats.connect(anchor.url)
    conns: list[Any] = []
    stream = ""
    try:
        js = admin.jetstream()
        stream, subject, durable = await nats_stream(js, "CONSUMERS")
        t = time.perf_counter()
        await nats_preload(admin, js, stream, subject, args.messages)
        result.preload_s = time.perf_counter() - t
        conns = [await nats.connect(anchor.url) for _ in range(args.consumers)]
        subs = [
            await nc.jetstream().pull_subscribe(subject, durable=durable, stream=stream)
            for nc in conns
        ]
        tally = Tally(args.messages)
        timeout = args.wait_ms / 1000

        async def consumer(sub: Any) -> None:
            while not tally.done():
                result.fetches += 1
                try:
                    got = await sub.fetch(args.fetch, timeout=timeout)
                except TimeoutError:  # nats.errors.TimeoutError: nothing came
                    got = []
                if not got:
                    result.empty_fetches += 1
                    if tally.give_up(35.0):
                        return
                    continue
                tally.last_delivery = tally.last_progress = time.perf_counter()
                for m in got:
                    md = m.metadata
                    tally.deliver(md.sequence.stream, md.num_delivered, m.data, result)
                for m in got:
                    await m.ack()
                    result.ack_requests += 1
                    tally.acked_keys.add(m.metadata.sequence.stream)
                if tally.done():
                    # Acks are published without waiting for an answer: the run ends once the
                    # server has read every connection's acks (a PING/PONG after them).
                    await asyncio.gather(*(nc.flush() for nc in conns))
                tally.last_ack = tally.last_progress = time.perf_counter()

        s0, c0 = cpu_seconds(anchor.pid), time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(consumer(s) for s in subs))
        tally.finish(result, start)
        wall = time.perf_counter() - start
        result.server_cpu = (cpu_seconds(anchor.pid) - s0) / wall if anchor.pid else math.nan
        result.client_cpu = (time.process_time() - c0) / wall
        deadline = time.monotonic() + 10
        while True:
            info = await js.consumer_info(stream, durable)
            if (info.num_ack_pending, info.num_pending) == (0, 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        left = {
            "num_pending": info.num_pending,
            "num_ack_pending": info.num_ack_pending,
            "num_redelivered": info.num_redelivered,
        }
        if any(left.values()):
            result.errors.append(f"consumer not drained: {left}")
        else:
            result.notes.append("consumer drained (num_pending 0, num_ack_pending 0)")
    except Exception as exc:  # any nats-py error: report it beside the figures
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for nc in conns:
            await nc.close()
        if stream:
            with contextlib.suppress(Exception):
                await admin.jetstream().delete_stream(stream)
        await admin.close()
    return result


async def nats_latency(anchor: Nats, args: argparse.Namespace) -> Latency:
    import nats

    result = Latency("jetstream")
    producer = await nats.connect(anchor.url)
    waiter = await nats.connect(anchor.url)
    stream = ""
    try:
        js = producer.jetstream()
        stream, subject, durable = await nats_stream(js, "LATENCY")
        sub = await waiter.jetstream().pull_subscribe(subject, durable=durable, stream=stream)

        async def waiting_fetch() -> tuple[list[Any], float]:
            got = await sub.fetch(1, timeout=5)
            return got, time.perf_counter()

        for k in range(args.latency_samples):
            fetch = asyncio.ensure_future(waiting_fetch())
            await asyncio.sleep(args.settle_ms / 1000)
            if fetch.done():
                result.early += 1
            t0 = time.perf_counter()
            await js.publish(subject, load.message(k))  # answered once stored (PubAck)
            try:
                got, t1 = await fetch
            except TimeoutError:
                result.errors.append(f"sample {k}: fetch timed out")
                continue
            m = got[0]
            if orjson.loads(m.data)["i"] != k or m.metadata.num_delivered != 1:
                result.errors.append(f"sample {k}: fetch answered {m.data!r:.200}")
                continue
            result.samples_ms.append((t1 - t0) * 1000)
            await m.ack_sync()
    except Exception as exc:  # any nats-py error: report it beside the figures
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await waiter.close()
        if stream:
            with contextlib.suppress(Exception):
                await producer.jetstream().delete_stream(stream)
        await producer.close()
    return result


# -- report -------------------------------------------------------------------------------------


def format_throughput(r: Throughput) -> str:
    parts = [
        f"  {r.system:<20}{r.acked_rate:>10,.0f} msg/s acked",
        f"{r.delivered_rate:>10,.0f} msg/s delivered",
        f"{r.messages:,} msgs acked in {r.acked_s:.2f} s",
        f"{r.fetches:,} fetches ({r.empty_fetches} empty), {r.ack_requests:,} ack "
        f"{'messages' if r.system == 'jetstream' else 'requests'}",
        f"server CPU {r.server_cpu:4.0%}  client CPU {r.client_cpu:4.0%}",
        f"(preload {r.preload_s:.1f} s)",
    ]
    if r.exactly_once:
        parts.append(f"exactly once: {r.unique_acked:,} unique acked, none twice, all count 1")
    else:
        parts.append(
            f"NOT EXACTLY ONCE: unique acked {r.unique_acked:,} of {r.messages:,}, delivered "
            f"{r.delivered:,}, twice {r.twice}, count!=1 {r.redelivered}, unknown {r.unknown}, "
            f"missing {r.missing}"
        )
    parts += r.notes
    if r.errors:
        parts.append("ERRORS " + "; ".join(r.errors[:5]))
    return "  ".join(parts)


def format_latency(r: Latency) -> str:
    parts = [f"  {r.system:<20}"]
    if r.samples_ms:
        parts += [
            f"p50 {r.percentile(50):7.2f} ms  p99 {r.percentile(99):7.2f} ms",
            f"min {min(r.samples_ms):.2f}  max {max(r.samples_ms):.2f} ms",
            f"{len(r.samples_ms)} samples",
        ]
    if r.early:
        parts.append(f"{r.early} fetches answered before the append (settle too short?)")
    parts += r.notes
    if r.errors:
        parts.append(f"ERRORS ({len(r.errors)}) " + "; ".join(r.errors[:5]))
    return "  ".join(parts)


def table(throughput: list[Throughput], latency: list[Latency]) -> str:
    systems = [t.system for t in throughput if t.system != "jetstream"] or [
        x.system for x in latency if x.system != "jetstream"
    ]
    tp = {t.system: t for t in throughput}
    lat = {x.system: x for x in latency}
    rows_spec: list[tuple[str, Callable[[str], float | None], str]] = [
        ("throughput acked (msg/s)", lambda s: tp[s].acked_rate if s in tp else None, ",.0f"),
        (
            "throughput delivered (msg/s)",
            lambda s: tp[s].delivered_rate if s in tp else None,
            ",.0f",
        ),
        ("append->fetch p50 (ms)", lambda s: lat[s].percentile(50) if s in lat else None, ".2f"),
        ("append->fetch p99 (ms)", lambda s: lat[s].percentile(99) if s in lat else None, ".2f"),
    ]
    cols = [*systems, "jetstream"]
    head = f"{'figure':<30}" + "".join(f"{c:>20}" for c in cols)
    head += "".join(f"{c.replace('stations ', '') + '/JS':>16}" for c in systems)
    rows = [head, "-" * len(head)]
    for label, get, fmt in rows_spec:
        values = [get(c) for c in cols]
        row = f"{label:<30}"
        for v in values:
            row += f"{'-':>20}" if v is None or math.isnan(v) else f"{format(v, fmt):>20}"
        anchor = values[-1]
        for v in values[:-1]:
            if v is None or anchor is None or not anchor or math.isnan(v) or math.isnan(anchor):
                row += f"{'-':>16}"
            else:
                row += f"{v / anchor:>15.2f}x"
        rows.append(row)
    rows.append(
        "ratio = Stations / JetStream from this same run: above 1 is better for throughput, "
        "worse for latency"
    )
    return "\n".join(rows)


def header(args: argparse.Namespace) -> str:
    try:
        nats_py = importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        nats_py = "not installed"
    return "\n".join(
        [
            "Stations consumer-group benchmark (python3 -m bench.consumers)",
            f"machine: {servers.cpu_count()} CPUs (nproc), {servers.cpu_model()}, "
            f"{platform.system()} {platform.release()}",
            f"client: Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
            f"nats-py {nats_py}, {'uvloop' if uvloop_available() else 'asyncio'} event loop, "
            "one process (it shares the CPUs with the servers)",
            f"stations: {servers.git_revision()}, --durability {args.durability}, engines "
            f"{', '.join(args.engines)}",
            f"load average before the run: {load_average()} (other work may be running on this "
            "box; it skews every figure)",
            f"throughput: {args.messages:,} x ~{load.MESSAGE_BYTES}-byte JSON messages preloaded, "
            f"one group, {args.consumers} consumers each fetching {args.fetch} (waitMs "
            f"{args.wait_ms}) and acking what it got; latency: {args.latency_samples} appends, "
            f"each to a consumer already waiting in a fetch of 1 (waitMs 5000), one at a time",
        ]
    )


# -- main ---------------------------------------------------------------------------------------


def check_alive(server: Server) -> None:
    if not server.alive():
        raise RuntimeError(f"stations ({server.mode}) died:\n{server.log()}")


async def main_async(args: argparse.Namespace) -> tuple[list[Throughput], list[Latency]]:
    root = Path(tempfile.mkdtemp(prefix="stations-consumers-", dir=args.data_root))
    throughput: list[Throughput] = []
    latency: list[Latency] = []
    targets: list[Server] = []
    pg_db: str | None = None
    anchor: Nats | None = None
    try:
        for engine in args.engines:
            db = ""
            if engine == "postgresql":
                pg_db, pg_version = pg_create(args.pg_url)
                db = f"{args.pg_url}/{pg_db}"
                print(f"created PostgreSQL {pg_version} database {pg_db}", flush=True)
            server = stations_server(engine, args, root / f"stations-{engine}", db)
            server.mode = engine  # the engine names the figure; durability is in the header
            server.start()
            targets.append(server)
            print(f"started stations ({engine}) pid {server.pid} on {server.url}", flush=True)
        anchor = await nats_anchor(args, root)
        if anchor is None:
            print("anchor unavailable: no JetStream server answers and no nats-server binary")
        else:
            where = f"pid {anchor.pid}" if anchor.pid else "pid unknown"
            print(f"anchor: NATS JetStream {anchor.version} at {anchor.url} ({where})", flush=True)

        print(f"\n== 1. consumer throughput: {args.messages:,} messages, one group ==", flush=True)
        for server in targets:
            check_alive(server)
            t = await stations_throughput(server, args)
            throughput.append(t)
            print(format_throughput(t), flush=True)
        if anchor is not None:
            t = await nats_throughput(anchor, args)
            throughput.append(t)
            print(format_throughput(t), flush=True)
        print(
            f"\n== 2. append -> delivery to a waiting fetch: {args.latency_samples} samples ==",
            flush=True,
        )
        for server in targets:
            check_alive(server)
            x = await stations_latency(server, args)
            latency.append(x)
            print(format_latency(x), flush=True)
        if anchor is not None:
            x = await nats_latency(anchor, args)
            latency.append(x)
            print(format_latency(x), flush=True)
        if anchor is not None:
            print(
                "  notes: JetStream file store defaults (no fsync per message); nats-py acks are "
                "published without waiting for the server (the run ends after a flush); Stations "
                f"answers each ack after its transaction commits (--durability {args.durability})",
                flush=True,
            )
    finally:
        for server in targets:
            server.stop()
        if anchor is not None:
            anchor.stop()
        if pg_db is not None:
            try:
                pg_drop(args.pg_url, pg_db)
                print(f"dropped database {pg_db}")
            except Exception as exc:
                print(f"could not drop database {pg_db}: {exc}")
        if args.keep_data:
            print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return throughput, latency


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(header(args), flush=True)
    if uvloop_available():
        import uvloop

        throughput, latency = uvloop.run(main_async(args))
    else:
        throughput, latency = asyncio.run(main_async(args))
    print("\n" + table(throughput, latency))
    print(f"load average after the run: {load_average()}")
    if args.json:
        out = {
            "throughput": [
                asdict(t)
                | {"acked_msg_per_s": t.acked_rate, "delivered_msg_per_s": t.delivered_rate}
                for t in throughput
            ],
            "latency": [
                asdict(x) | {"p50_ms": x.percentile(50), "p99_ms": x.percentile(99)}
                for x in latency
            ],
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    ok = all(t.ok for t in throughput) and all(x.ok for x in latency)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
