"""``python3 -m bench.transactions``: consume-transform-produce through transactions, beside the
same work without them, in one run on one server.

A station is preloaded with ``--messages`` ~100-byte JSON messages. Each scenario moves all of
them to a fresh output station with ``--workers`` workers, each fetching ``--batch`` messages at a
time from one group:

- **plain** (the anchor): fetch, then produce the transformed batch
  (``POST /api/stations/{out}/messages``), then ack it (``POST .../ack``): at-least-once, a crash
  between the two writes produces twice;
- **transactional**: fetch, then one ``POST /api/transactions`` that produces the batch and acks
  its inputs atomically: exactly-once.

Scenarios alternate for ``--rounds`` rounds (a fresh group and output station each time) and the
best round of each is reported; ratio = transactional / plain, target >= 0.7. Every message must
arrive exactly once in each output station, or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import servers
from bench.cli import load_average

JSON = {"Content-Type": "application/json"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.transactions", description=__doc__)
    p.add_argument("--messages", type=int, default=20_000, help="messages moved per round")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=100, help="messages per fetch")
    p.add_argument("--rounds", type=int, default=3, help="rounds per scenario, alternating")
    p.add_argument("--durability", default="fsync", choices=("fsync", "process"))
    p.add_argument("--url", help="a running server instead of starting one (SQLite, fsync)")
    return p.parse_args(argv)


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> Any:
    async with http.post(url, data=orjson.dumps(body), headers=JSON) as r:
        payload = await r.read()
        if r.status != 200 and r.status != 201:
            raise RuntimeError(f"{url}: {r.status} {payload[:300]!r}")
        return orjson.loads(payload) if payload else None


def transform(m: dict[str, Any]) -> dict[str, Any]:
    return {"data": {"order": m["data"]["n"], "amount": m["data"]["n"] * 3, "src": m["offset"]}}


async def worker(
    http: aiohttp.ClientSession, base: str, group: str, out: str, batch: int, tx: bool
) -> int:
    fetch = f"{base}/api/stations/in/groups/{group}/fetch"
    moved = 0
    while True:
        got = (await post(http, fetch, {"max": batch, "waitMs": 0, "consumer": group}))["messages"]
        if not got:
            return moved
        if tx:
            body = {
                "ack": [
                    {
                        "station": "in",
                        "group": group,
                        "offset": m["offset"],
                        "deliveryCount": m["deliveryCount"],
                    }
                    for m in got
                ],
                "produce": [{"station": out, **transform(m)} for m in got],
            }
            answer = await post(http, f"{base}/api/transactions", body)
            assert answer["acked"] == len(got), answer
        else:
            await post(
                http,
                f"{base}/api/stations/{out}/messages",
                {"messages": [transform(m) for m in got]},
            )
            answer = await post(
                http,
                f"{base}/api/stations/in/groups/{group}/ack",
                {"offsets": [m["offset"] for m in got]},
            )
            assert answer["acked"] == len(got), answer
        moved += len(got)


async def scenario(
    http: aiohttp.ClientSession, base: str, args: argparse.Namespace, tx: bool
) -> float:
    tag = uuid.uuid4().hex[:8]
    group, out = f"g-{tag}", f"out-{tag}"
    await post(http, f"{base}/api/stations", {"name": out})
    async with http.put(
        f"{base}/api/stations/in/groups/{group}", json={"maxAckTimeMs": 60_000}
    ) as r:
        assert r.status == 201, await r.text()
    start = time.perf_counter()
    moved = await asyncio.gather(
        *(worker(http, base, group, out, args.batch, tx) for _ in range(args.workers))
    )
    elapsed = time.perf_counter() - start
    async with http.get(f"{base}/api/stations/{out}") as r:
        stored = (await r.json())["stats"]["messages"]
    if sum(moved) != args.messages or stored != args.messages:
        raise RuntimeError(f"moved {sum(moved)}, stored {stored}, expected {args.messages}")
    return float(args.messages) / elapsed


async def run(base: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    connector = aiohttp.TCPConnector(limit=args.workers * 2)
    async with aiohttp.ClientSession(connector=connector) as http:
        await post(http, f"{base}/api/stations", {"name": "in"})
        for start in range(0, args.messages, 1000):
            n = min(1000, args.messages - start)
            await post(
                http,
                f"{base}/api/stations/in/messages",
                {"messages": [{"data": {"n": start + i, "pad": "x" * 60}} for i in range(n)]},
            )
        plain: list[float] = []
        txs: list[float] = []
        for r in range(args.rounds):
            for tx in (False, True) if r % 2 == 0 else (True, False):
                rate = await scenario(http, base, args, tx)
                (txs if tx else plain).append(rate)
                label = "transactional" if tx else "plain"
                print(f"round {r + 1}: {label:<13} {rate:>10,.0f} msg/s", flush=True)
    return plain, txs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"bench.transactions: {args.messages:,} messages per round, {args.workers} workers, "
        f"batches of {args.batch}, {args.rounds} rounds; Python {platform.python_version()}, "
        f"{platform.machine()}; load average {load_average()}",
        flush=True,
    )
    server = None
    with tempfile.TemporaryDirectory(prefix="bench-tx-") as tmp:
        if args.url:
            base = args.url.rstrip("/")
        else:
            server = servers.stations("stations", args.durability, Path(tmp)).start()
            base = server.url
            print(f"started stations (SQLite, {args.durability}) on {base}", flush=True)
        try:
            plain, txs = asyncio.run(run(base, args))
        finally:
            if server is not None:
                server.stop()
    best_plain, best_tx = max(plain), max(txs)
    ratio = best_tx / best_plain
    print()
    print("| scenario | msg/s (best round) | ratio | target |")
    print("| --- | ---: | ---: | --- |")
    print(f"| plain fetch + produce + ack (anchor) | {best_plain:,.0f} | 1.00× | – |")
    verdict = "met" if ratio >= 0.7 else "missed"
    print(f"| fetch + transaction | {best_tx:,.0f} | **{ratio:.2f}×** | ≥ 0.7× — {verdict} |")
    medians = statistics.median(txs) / statistics.median(plain)
    print(
        f"median rounds: plain {statistics.median(plain):,.0f} msg/s, transactional "
        f"{statistics.median(txs):,.0f} msg/s, ratio {medians:.2f}×"
    )
    print(f"load average after the run: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
