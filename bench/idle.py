"""``python3 -m bench.idle``: does housekeeping grow with idle stations?

Two fresh ``stations serve`` processes (SQLite, ``--durability fsync``), one after the other:
one with a single station, one with ``--stations`` (10,000) stations, each station with a
consumer group. After the creates and ``--settle`` seconds, each server is measured at rest:

1. CPU: the server process's CPU time (all threads, ``/proc/PID/stat``) over ``--idle-seconds``
   (20) with no request at all, as a share of one core;
2. produce latency: one message with a message id per request, one request at a time, paced at
   ``--rate`` per second for ``--produce-seconds`` (20), to one station; p50 and p99.

The many-station figures are printed beside the single-station ones, with the ratio. Targets:
CPU at rest at most 2% of a core with 10,000 stations, produce p99 within 1.5x of one station's.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import servers
from bench.cli import cpu_seconds, load_average

GROUP = "idle"
JSON = {"Content-Type": "application/json"}


@dataclass
class Figures:
    stations: int
    cpu: float  # share of one core at rest
    p50_ms: float
    p99_ms: float
    setup_s: float


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.idle", description=__doc__)
    p.add_argument("--stations", type=int, default=10_000, help="stations in the big run")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="CPU measured at rest")
    p.add_argument("--produce-seconds", type=float, default=20.0, help="produce latency run")
    p.add_argument("--rate", type=float, default=50.0, help="produce requests per second")
    p.add_argument("--settle", type=float, default=5.0, help="pause after the creates")
    p.add_argument("--in-flight", type=int, default=32, help="concurrent creates")
    p.add_argument("--data-root", type=Path, help="where the fresh data dirs go (default /tmp)")
    return p.parse_args(argv)


async def create(session: aiohttp.ClientSession, base: str, count: int, in_flight: int) -> None:
    """``count`` stations, each with a consumer group."""
    names = iter(range(count))

    async def worker() -> None:
        for k in names:
            name = f"idle-{k:05d}"
            async with session.post(f"{base}/api/stations", json={"name": name}) as r:
                if r.status != 201:
                    raise RuntimeError(f"create {name}: {r.status} {await r.text()}")
            async with session.put(f"{base}/api/stations/{name}/groups/{GROUP}", json={}) as r:
                if r.status not in (200, 201):
                    raise RuntimeError(f"group on {name}: {r.status} {await r.text()}")

    await asyncio.gather(*(worker() for _ in range(in_flight)))


async def produce_latencies(
    session: aiohttp.ClientSession, base: str, seconds: float, rate: float
) -> list[float]:
    """Seconds per produce request, one request at a time, paced at ``rate``."""
    async with session.post(f"{base}/api/stations", json={"name": "hot"}) as r:
        assert r.status == 201, await r.text()
    url = f"{base}/api/stations/hot/messages"
    out: list[float] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    n = 0
    while loop.time() - start < seconds:
        body = {"messages": [{"id": f"m-{n}", "data": {"n": n, "pad": "x" * 64}}]}
        t0 = time.perf_counter()
        async with session.post(url, json=body, headers=JSON) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"produce: {r.status}")
        out.append(time.perf_counter() - t0)
        n += 1
        # Paced by the clock, so a slow request is not followed by a burst.
        await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(count: int, args: argparse.Namespace, root: Path) -> Figures:
    server = servers.stations(f"{count} stations", "fsync", root / f"s{count}").start()
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=args.in_flight)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            t0 = time.monotonic()
            await create(session, server.url, count, min(args.in_flight, count))
            setup = time.monotonic() - t0
            await asyncio.sleep(args.settle)
            before, t1 = cpu_seconds(server.pid), time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            cpu = (cpu_seconds(server.pid) - before) / (time.monotonic() - t1)
            lat = await produce_latencies(session, server.url, args.produce_seconds, args.rate)
        return Figures(count, cpu, percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000, setup)
    finally:
        server.stop()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="stations-idle-", dir=args.data_root))
    try:
        print(
            f"# bench.idle: {servers.cpu_count()} CPUs ({servers.cpu_model()}), "
            f"revision {servers.git_revision()}, load average {load_average()}",
            flush=True,
        )
        one = await measure(1, args, root)
        print(f"1 station: set up in {one.setup_s:.1f} s", flush=True)
        many = await measure(args.stations, args, root)
        print(f"{many.stations} stations: set up in {many.setup_s:.1f} s", flush=True)
        print(f"load average after: {load_average()}")
        print(f"{'figure':<28}{many.stations:>12} st.{1:>10} st.{'ratio':>9}  target")
        print(
            f"{'server CPU at rest':<28}{many.cpu:>15.2%}{one.cpu:>14.2%}"
            f"{ratio(many.cpu, one.cpu):>9}  <= 2.00% ({'met' if many.cpu <= 0.02 else 'MISSED'})"
        )
        print(
            f"{'produce p50 (ms)':<28}{many.p50_ms:>15.2f}{one.p50_ms:>14.2f}"
            f"{ratio(many.p50_ms, one.p50_ms):>9}"
        )
        met = many.p99_ms <= 1.5 * one.p99_ms
        print(
            f"{'produce p99 (ms)':<28}{many.p99_ms:>15.2f}{one.p99_ms:>14.2f}"
            f"{ratio(many.p99_ms, one.p99_ms):>9}  <= 1.50x ({'met' if met else 'MISSED'})"
        )
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
