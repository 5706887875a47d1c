"""``python3 -m bench``: start Stations and the reference server, load both, print the figures."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import load, servers
from bench.load import Result
from bench.servers import Server

SCENARIOS = ("single", "batched", "pipelined", "read")
# Issue 12: single appends at least 5x the reference, batched and pipelined producers 1.2x.
TARGETS = {"single": 5.0, "batched": 1.2, "pipelined": 1.2, "read": 1.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma list of: %(default)s")
    p.add_argument("--rounds", type=int, default=3, help="timed runs per server, interleaved")
    p.add_argument("--seconds", type=float, default=5, help="length of each timed append run")
    p.add_argument("--warmup", type=float, default=2, help="untimed run before each append run")
    p.add_argument("--in-flight", type=int, default=32, help="single: concurrent POSTs")
    p.add_argument("--single-requests", type=int, default=10**9, help="single: stop after M")
    p.add_argument("--batch-size", type=int, default=1000, help="messages per batched POST")
    p.add_argument("--producers", type=int, default=4, help="batched: producers, 1 stream each")
    p.add_argument(
        "--batches", type=int, default=10**9, help="stop after M POSTs (batched: per producer)"
    )
    p.add_argument("--pipeline", type=int, default=4, help="pipelined: POSTs in flight")
    p.add_argument("--read-messages", type=int, default=1_000_000, help="read: stream length")
    p.add_argument("--no-process", action="store_true", help="skip Stations --durability process")
    p.add_argument("--gzip", action="store_true", help="accept gzip (the reference compresses)")
    p.add_argument("--data-root", type=Path, help="where the fresh data dirs go (default /tmp)")
    p.add_argument("--keep-data", action="store_true", help="leave the data dirs behind")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return args


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process and all its threads."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ)


@dataclass
class Line:
    scenario: str
    server: str
    mode: str
    result: Result
    server_cpu: float  # fraction of one core over the run
    client_cpu: float
    wall: float
    rates: list[float] = field(default_factory=list)  # msg/s of each round

    def add(self, other: Line) -> None:
        wall = self.wall + other.wall
        self.server_cpu = (self.server_cpu * self.wall + other.server_cpu * other.wall) / wall
        self.client_cpu = (self.client_cpu * self.wall + other.client_cpu * other.wall) / wall
        self.wall = wall
        self.result.add(other.result)
        self.rates += other.rates

    def as_dict(self) -> dict[str, object]:
        r = self.result
        return {
            "scenario": self.scenario,
            "server": self.server,
            "durability": self.mode,
            "msg_per_s": round(r.rate, 1),
            "messages": r.messages,
            "seconds": round(r.seconds, 3),
            "requests": r.requests,
            "responses_per_read": r.responses // max(len(self.rates), 1),
            "resent_after_409": r.resent,
            "duplicates": r.duplicates,
            "errors": dict(r.errors),
            "stored": r.stored,
            "round_msg_per_s": [round(r, 1) for r in self.rates],
            "server_cpu": round(self.server_cpu, 2),
            "client_cpu": round(self.client_cpu, 2),
            "notes": r.notes,
        }


Run = Callable[[Server], Awaitable[Result]]


def describe(args: argparse.Namespace, scenario: str) -> str:
    size = f"{load.MESSAGE_BYTES}-byte JSON messages"
    if scenario == "single":
        return f"1. single appends: {args.in_flight} POSTs in flight, 1 {size[:-1]} per POST, one stream"
    if scenario == "batched":
        return (
            f"2a. batched producers: {args.producers} idempotent producers, each on its own stream, "
            f"{args.batch_size} x {size} per POST, 1 POST in flight per producer"
        )
    if scenario == "pipelined":
        return (
            f"2b. pipelined producer: 1 idempotent producer, {args.pipeline} POSTs in flight, "
            f"{args.batch_size} x {size} per POST; 409s resent in order"
        )
    return (
        f"3. catch-up read: {args.read_messages:,} x {size} preloaded in batches of "
        f"{args.batch_size}, one reader from offset -1 to Stream-Up-To-Date"
    )


def runner(args: argparse.Namespace, scenario: str, seconds: float) -> Run:
    gz = args.gzip
    if scenario == "single":
        return lambda s: load.single_appends(
            s.url,
            in_flight=args.in_flight,
            seconds=seconds,
            max_requests=args.single_requests,
            gzip=gz,
        )
    if scenario == "batched":
        return lambda s: load.batched_producers(
            s.url,
            producers=args.producers,
            batch_size=args.batch_size,
            seconds=seconds,
            max_batches=args.batches,
            gzip=gz,
        )
    return lambda s: load.pipelined_producer(
        s.url,
        in_flight=args.pipeline,
        batch_size=args.batch_size,
        seconds=seconds,
        max_batches=args.batches,
        gzip=gz,
    )


async def measure(scenario: str, server: Server, run: Callable[[], Awaitable[Result]]) -> Line:
    """Run once; CPU use is over the whole run (the read scenario parses after its clock stops,
    so its client CPU figure is over its timed part plus parsing)."""
    s0, c0, t0 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
    result = await run()
    wall = time.perf_counter() - t0
    s1, c1 = cpu_seconds(server.pid), time.process_time()
    cpu = ((s1 - s0) / wall, (c1 - c0) / wall)
    return Line(scenario, server.label, server.mode, result, *cpu, wall, [result.rate])


async def run_scenario(
    args: argparse.Namespace, scenario: str, targets: list[Server]
) -> list[Line]:
    """Prepare every server (warm-up, or preload for the read), then run ``--rounds`` rounds,
    each server once per round in turn, so a change in background load hits all alike."""
    print(f"\n== {describe(args, scenario)} ==", flush=True)
    runs: list[Callable[[], Awaitable[Result]]] = []
    notes: list[str] = []
    for server in targets:
        if scenario == "read":
            stream, preload_s = await load.prepare_read(
                server.url, total=args.read_messages, batch_size=args.batch_size
            )
            rate = args.read_messages / preload_s if preload_s else 0.0
            notes.append(f"(preload took {preload_s:.1f} s, {rate:,.0f} msg/s)")
            runs.append(
                lambda server=server, stream=stream: load.catch_up_read(
                    server.url, stream, total=args.read_messages, gzip=args.gzip
                )
            )
        else:
            if args.warmup > 0:
                await runner(args, scenario, args.warmup)(server)
            run = runner(args, scenario, args.seconds)
            runs.append(lambda run=run, server=server: run(server))
    rounds: list[list[Line]] = [[] for _ in targets]
    for _ in range(max(args.rounds, 1)):
        for server, run, got in zip(targets, runs, rounds, strict=True):
            if not server.alive():
                raise RuntimeError(f"{server.label} ({server.mode}) died:\n{server.log()}")
            got.append(await measure(scenario, server, run))
    done = [got[0] for got in rounds]
    for line, got in zip(done, rounds, strict=True):
        for later in got[1:]:
            line.add(later)
    for i, line in enumerate(done):
        if notes:
            line.result.notes.insert(0, notes[i])
        print(format_line(line), flush=True)
    print(ratio_line(scenario, done), flush=True)
    return done


def fmt_rate(value: float) -> str:
    return f"{value:>10,.0f}"


def format_line(line: Line) -> str:
    r = line.result
    parts = [
        f"  {line.server:<9} {('(' + line.mode + ')'):<10}{fmt_rate(r.rate)} msg/s",
        f"{r.messages:>11,} msgs in {r.seconds:6.2f} s",
        "rounds " + " / ".join(f"{x:,.0f}" for x in line.rates),
        f"{r.requests:>7,} POSTs"
        if line.scenario != "read"
        else f"{r.responses // len(line.rates):>4,} responses per read",
    ]
    if line.scenario == "pipelined":
        parts.append(f"409-resent {r.resent}")
    parts.append(f"server CPU {line.server_cpu:4.0%}  client CPU {line.client_cpu:4.0%}")
    if r.verified is not None:
        want = r.messages if r.expected is None else r.expected
        parts.append("count verified" if r.verified else f"COUNT {r.stored:,} != {want:,}")
    if r.duplicates:
        parts.append(f"duplicates(204) {r.duplicates}")
    if r.errors:
        parts.append("ERRORS " + ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items())))
    parts += r.notes
    return "  ".join(parts)


def ratio(lines: list[Line], scenario: str, mode: str) -> float | None:
    mine = [
        ln
        for ln in lines
        if ln.scenario == scenario and ln.server == "stations" and ln.mode == mode
    ]
    ref = [ln for ln in lines if ln.scenario == scenario and ln.server == "reference"]
    if not mine or not ref or not ref[0].result.rate:
        return None
    return mine[0].result.rate / ref[0].result.rate


def ratio_line(scenario: str, lines: list[Line]) -> str:
    fsync, process = ratio(lines, scenario, "fsync"), ratio(lines, scenario, "process")
    if fsync is None:
        return "  ratio: n/a"
    target = TARGETS[scenario]
    verdict = "meets target" if fsync >= target else "BELOW TARGET"
    text = f"  Stations/reference: {fsync:.2f}x at fsync (target >= {target:g}x: {verdict})"
    if process is not None:
        text += f"; {process:.2f}x with Stations at --durability process"
    return text


def table(lines: list[Line], scenarios: list[str]) -> str:
    head = (
        f"{'scenario':<10} {'stations fsync':>15} {'stations process':>17} {'reference':>12} "
        f"{'ratio fsync':>12} {'ratio process':>14} {'target':>7}  result"
    )
    rows = [head, "-" * len(head)]
    for scenario in scenarios:
        got = {(ln.server, ln.mode): ln.result for ln in lines if ln.scenario == scenario}

        def cell(key: tuple[str, str], width: int, got: dict[tuple[str, str], Result] = got) -> str:
            r = got.get(key)
            return f"{r.rate:>{width},.0f}" if r else f"{'-':>{width}}"

        fsync, process = ratio(lines, scenario, "fsync"), ratio(lines, scenario, "process")
        target = TARGETS[scenario]
        verdict = "-" if fsync is None else ("ok" if fsync >= target else "BELOW")
        rows.append(
            f"{scenario:<10} {cell(('stations', 'fsync'), 15)} {cell(('stations', 'process'), 17)} "
            f"{cell(('reference', 'fsync'), 12)} "
            f"{(f'{fsync:.2f}x' if fsync else '-'):>12} {(f'{process:.2f}x' if process else '-'):>14} "
            f"{f'>={target:g}x':>7}  {verdict}"
        )
    extra = [ln for ln in lines if ln.scenario in ("pipelined", "read")]
    for ln in extra:
        r = ln.result
        what = (
            f"409-resent {r.resent} of {r.requests} POSTs"
            if ln.scenario == "pipelined"
            else (f"{r.responses // len(ln.rates):,} responses per read of the whole stream")
        )
        rows.append(f"  {ln.scenario:<10} {ln.server} ({ln.mode}): {what}")
    rows.append("all figures are msg/s; ratio = Stations / reference from this same run")
    return "\n".join(rows)


def header(args: argparse.Namespace) -> str:
    return "\n".join(
        [
            "Stations benchmark (python3 -m bench)",
            f"machine: {servers.cpu_count()} CPUs (nproc), {servers.cpu_model()}, "
            f"{platform.system()} {platform.release()}",
            f"load generator: Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
            f"{'uvloop' if uvloop_available() else 'asyncio'} event loop, one process",
            f"stations: {servers.git_revision()} (SQLite, python {platform.python_version()}); "
            f"reference: @durable-streams/server 0.3.7 file-backed store, node {servers.node_version()}",
            f"load average before the run: {load_average()} (other work on this box skews figures)",
            f"responses {'may be gzip' if args.gzip else 'uncompressed (Accept-Encoding: identity)'}; "
            f"{args.rounds} interleaved rounds per scenario; timed append runs of {args.seconds:g} s "
            f"after a {args.warmup:g} s warm-up",
        ]
    )


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


async def main_async(args: argparse.Namespace) -> list[Line]:
    root = Path(tempfile.mkdtemp(prefix="stations-bench-", dir=args.data_root))
    targets = [servers.stations("stations", "fsync", root / "stations-fsync")]
    if not args.no_process:
        targets.append(servers.stations("stations", "process", root / "stations-process"))
    targets.append(servers.reference(root / "reference"))
    lines: list[Line] = []
    try:
        for server in targets:
            server.start()
            print(
                f"started {server.label} ({server.mode}) pid {server.pid} on {server.url}, "
                f"data {server.data_dir}",
                flush=True,
            )
        for scenario in args.only:
            chosen = [s for s in targets if not (scenario == "read" and s.mode == "process")]
            lines += await run_scenario(args, scenario, chosen)
    finally:
        for server in targets:
            server.stop()
        if args.keep_data:
            print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(header(args), flush=True)
    if uvloop_available():
        import uvloop

        lines = uvloop.run(main_async(args))
    else:
        lines = asyncio.run(main_async(args))
    print("\n" + table(lines, [s for s in SCENARIOS if s in args.only]))
    print(f"load average after the run: {load_average()}")
    if args.json:
        args.json.write_text(json.dumps([ln.as_dict() for ln in lines], indent=2) + "\n")
    problems = [ln for ln in lines if ln.result.errors or ln.result.verified is False]
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
