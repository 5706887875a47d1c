"""SDK throughput: the Python ``IdempotentProducer`` beside the TypeScript client's, on Stations.

``python3 -m bench.sdk [--messages N]`` starts one ``stations serve`` (SQLite, a fresh data dir
in a new temporary directory, removed at the end) and, on a fresh JSON stream each, times

- ``stations.client.IdempotentProducer`` with its default settings: ``append()`` of N messages
  (each a dict that the SDK serialises to exactly 100 bytes, ``{"i":<n>,"pad":"<letters>"}``,
  waiting with ``wait_for_capacity()`` as the README shows), then ``close()`` (flush, then EOF);
- the official TypeScript client's ``IdempotentProducer`` (``@durable-streams/client`` 0.2.7,
  ``tests/node/ts-producer-bench.mjs``), defaults too, ``append(JSON.stringify(...))`` of the
  same messages, then ``close()``.

Both clock the whole run, from the first append to the acknowledged close. Afterwards (untimed)
each stream is checked: the tail offset from HEAD is N, the stream is closed, the station's
stats count N messages and the last message read back (GET from offset N-1) is message N-1.
Prints msg/s for both and the ratio Python/TypeScript (target >= 1.0x); the exit status is 1 if
a run failed or a check did not hold. ``--rounds R`` interleaves R runs of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import servers
from stations.client import Client, IdempotentProducer

NODE_SCRIPT = servers.NODE_DIR / "ts-producer-bench.mjs"
MESSAGE_BYTES = 100
_PAD = "abcdefghijklmnopqrstuvwxyz" * 8


def pads() -> Callable[[int], str]:
    """``pad(i)``: the letters that make message i exactly MESSAGE_BYTES long (as bench/load.py's
    ``message(i)`` and the TypeScript script's), for i < 10**9."""
    cache: dict[tuple[int, int], str] = {}

    def pad(i: int) -> str:
        key = (i % 26, MESSAGE_BYTES - len(f'{{"i":{i},"pad":""}}'))
        text = cache.get(key)
        if text is None:
            text = cache[key] = _PAD[key[0] : key[0] + key[1]]
        return text

    return pad


@dataclass
class Run:
    client: str
    messages: int = 0
    seconds: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    batches: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def add(self, other: Run) -> None:
        self.messages += other.messages
        self.seconds += other.seconds
        self.client_cpu += other.client_cpu
        self.server_cpu += other.server_cpu
        self.batches += other.batches
        self.problems += other.problems


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (all its threads) from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the two producers ----------------------------------------------------------------------------


async def python_producer(base: str, stream: str, total: int) -> Run:
    """The Python SDK's producer, default settings, as a user would drive it."""
    producer = IdempotentProducer(f"{base}/v1/stream/{stream}", "py-bench")
    pad = pads()
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(total):
        await producer.wait_for_capacity()
        producer.append({"i": i, "pad": pad(i)})
    await producer.close()
    seconds = time.perf_counter() - started
    run = Run("python", total, seconds, time.process_time() - cpu)
    run.batches = producer.next_seq - 1  # the close took the last seq
    return run


async def ts_producer(base: str, stream: str, total: int) -> Run:
    """tests/node/ts-producer-bench.mjs: the TypeScript client's producer, default settings."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_SCRIPT),
        "--base",
        base,
        "--stream",
        stream,
        "--messages",
        str(total),
        cwd=servers.NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    run = Run("typescript")
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        run.problems.append(f"node exited {proc.returncode}: {err.decode()[-2000:]}")
        return run
    result = json.loads(lines[-1])
    run.messages, run.seconds = int(result["messages"]), float(result["seconds"])
    run.client_cpu, run.batches = float(result["cpuSeconds"]), int(result["batches"])
    run.problems += [f"producer error: {e}" for e in result["errors"]]
    return run


# -- checks -------------------------------------------------------------------------------------


def offset_of(position: int) -> str:
    """Stations' offset token for a position (stations/offsets.py: 16 + 16 digits)."""
    return f"{position:016d}_{0:016d}"


async def verify(base: str, stream: str, total: int) -> list[str]:
    """The stream holds exactly ``total`` messages, is closed, and ends with message total-1."""
    problems: list[str] = []
    url = f"{base}/v1/stream/{stream}"
    async with aiohttp.ClientSession() as session:
        async with session.head(url) as r:
            tail = r.headers.get("Stream-Next-Offset", "")
            if tail != offset_of(total):
                problems.append(f"HEAD tail offset {tail!r}, expected {offset_of(total)!r}")
            if r.headers.get("Stream-Closed", "").lower() != "true":
                problems.append("HEAD: the stream is not closed")
        params = {"offset": offset_of(total - 1)}
        async with session.get(url, params=params, headers={"Accept-Encoding": "identity"}) as r:
            last = json.loads(await r.read() or b"[]") if r.status == 200 else []
            if [m.get("i") for m in last] != [total - 1]:
                problems.append(f"GET offset {total - 1}: {r.status} {str(last)[:200]}")
    async with Client(base) as client:
        stats = (await client.get_station(stream)).stats
        if stats.messages != total:
            problems.append(f"station stats: {stats.messages} messages, expected {total}")
    return problems


# -- running --------------------------------------------------------------------------------------


Producer = Callable[[str, str, int], Awaitable[Run]]


async def measure(server: servers.Server, client: str, total: int, produce: Producer) -> Run:
    stream = f"sdk-bench-{client}-{uuid.uuid4().hex[:8]}"
    async with Client(server.url) as c:
        await c.create_station(stream)  # a JSON stream with default settings (untimed)
    server_cpu = cpu_seconds(server.pid)
    run = await produce(server.url, stream, total)
    run.server_cpu = cpu_seconds(server.pid) - server_cpu
    if not run.problems:
        run.problems += await verify(server.url, stream, total)
    return run


def describe(run: Run, label: str) -> str:
    check = "count verified" if not run.problems else "FAILED: " + "; ".join(run.problems)
    return (
        f"{label:<34} {run.rate:>10,.0f} msg/s  ({run.messages:,} in {run.seconds:.2f} s, "
        f"{run.batches} batches; CPU: client {run.client_cpu / run.seconds if run.seconds else 0:.2f}, "
        f"server {run.server_cpu / run.seconds if run.seconds else 0:.2f} cores)  {check}"
    )


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="stations-sdk-bench-", dir=args.data_root))
    server = servers.stations("stations", args.durability, root / "stations")
    totals = {"python": Run("python"), "typescript": Run("typescript")}
    try:
        server.start()
        print(f"started stations ({args.durability}) pid {server.pid} on {server.url}", flush=True)
        for n in range(args.rounds):
            producers: list[tuple[str, Producer]] = [("python", python_producer)]
            if not args.no_ts:
                producers.append(("typescript", ts_producer))
            for client, produce in producers:
                run = await measure(server, client, args.messages, produce)
                totals[client].add(run)
                label = f"round {n + 1}: {client} IdempotentProducer"
                print(describe(run, label), flush=True)
    finally:
        server.stop()
        if args.keep_data:
            print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    py, ts = totals["python"], totals["typescript"]
    print()
    print(describe(py, "Python  stations.client"))
    if not args.no_ts:
        print(describe(ts, "TypeScript @durable-streams/client"))
        ratio = py.rate / ts.rate if ts.rate else 0.0
        verdict = "meets" if ratio >= 1.0 else "BELOW"
        print(f"ratio Python/TypeScript: {ratio:.2f}x ({verdict} the >= 1.0x target)")
    return 1 if py.problems or ts.problems else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.sdk", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="messages per run")
    p.add_argument("--rounds", type=int, default=1, help="interleaved runs of each client")
    p.add_argument("--durability", choices=("fsync", "process"), default="fsync")
    p.add_argument("--no-ts", action="store_true", help="only the Python SDK")
    p.add_argument("--data-root", type=Path, help="where the temporary data dir goes")
    p.add_argument("--keep-data", action="store_true", help="leave the data dir behind")
    args = p.parse_args(argv)
    if args.messages < 1 or args.rounds < 1:
        p.error("--messages and --rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_ts and (
        shutil.which("node") is None
        or not (servers.NODE_DIR / "node_modules" / "@durable-streams" / "client").is_dir()
    ):
        print(f"node and the pinned client are needed: cd {servers.NODE_DIR} && npm ci")
        return 2
    print(
        f"SDK producer throughput: {args.messages:,} x {MESSAGE_BYTES}-byte JSON messages per run, "
        f"default producer settings, one fresh stream per run\n"
        f"machine: {servers.cpu_count()} CPUs, {servers.cpu_model()}; load average "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}\n"
        f"Python {platform.python_version()} (asyncio event loop), aiohttp {aiohttp.__version__}; "
        f"node {servers.node_version()}, @durable-streams/client 0.2.7; "
        f"stations {servers.git_revision()} (SQLite, --durability {args.durability})",
        flush=True,
    )
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
