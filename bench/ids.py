"""``python3 -m bench.ids``: producing with message ids, on an empty id window and on a window
holding millions of ids, beside NATS JetStream (``Nats-Msg-Id``) as the anchor.

1. The workload: ``POST /api/stations/{name}/messages`` with 100 messages per request (about
   100-byte JSON payloads, random 128-bit hex ids), 10% of each request's ids repeats of ids
   sent earlier in the run (inside the window), 4 requests in flight, to one station with a 24 h
   ``idempotencyWindowMs``. The same messages go to a JetStream stream with a 24 h duplicate
   window: per "request" 100 async publishes with ``Nats-Msg-Id`` awaited together, 4 such
   requests in flight. Both stores are checked afterwards: stored == unique ids.
2. The id table at scale: one station's window is filled with ``--ids`` distinct ids through the
   same API (5000 per request, 4 in flight, ``{"i":n}`` payloads), then the workload runs again
   against that station, interleaved with runs on a fresh station of the same database and on
   JetStream. Figures: msg/s against the empty-window runs (part 1, and the interleaved fresh
   station), the Stations server's peak RSS over the whole run (``VmHWM``, and the largest
   sampled ``VmRSS``) and its disk reads and writes (``/proc/PID/io``).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import load, servers
from bench.cli import cpu_seconds, load_average, uvloop_available
from bench.servers import Server

WINDOW_MS = 24 * 3600 * 1000
NATS_URL = "nats://127.0.0.1:4222"
SLOWDOWN_TARGET = 0.8  # the run on the full window keeps >= 80% of the empty-window msg/s
RSS_TARGET_MB = 500.0
PG_TARGET = 0.5  # msg-id produce on PostgreSQL against JetStream
FLAT_SPAN = 10_000  # part 3 compares the first and the last this many messages


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.ids", description=__doc__.split("\n")[0])
    p.add_argument("--ids", type=int, default=10_000_000, help="ids to fill the window with")
    p.add_argument("--quick", action="store_true", help="fill with 1,000,000 ids instead")
    p.add_argument("--messages", type=int, default=200_000, help="messages per workload run")
    p.add_argument("--batch", type=int, default=100, help="messages per request")
    p.add_argument("--repeat", type=float, default=0.10, help="share of repeated ids per request")
    p.add_argument("--in-flight", type=int, default=4, help="requests in flight")
    p.add_argument("--rounds", type=int, default=3, help="workload runs per target and phase")
    p.add_argument("--fill-batch", type=int, default=5000, help="ids per fill request")
    p.add_argument("--fill-in-flight", type=int, default=4, help="fill requests in flight")
    p.add_argument("--durability", choices=("fsync", "process"), default="fsync")
    p.add_argument("--nats", default=NATS_URL, help="JetStream anchor (default %(default)s)")
    p.add_argument("--no-anchor", action="store_true", help="skip JetStream")
    p.add_argument("--data-root", type=Path, help="where the fresh data dir goes (default /tmp)")
    p.add_argument("--keep-data", action="store_true", help="leave the data dir behind")
    p.add_argument(
        "--pg-url",
        default="postgresql://postgres@127.0.0.1:5432",
        help="PostgreSQL server for part 3: a fresh database is made there and dropped",
    )
    p.add_argument("--pg-messages", type=int, default=200_000, help="messages of part 3's run")
    p.add_argument("--no-pg", action="store_true", help="skip part 3 (PostgreSQL)")
    p.add_argument("--only-pg", action="store_true", help="run part 3 (PostgreSQL) alone")
    args = p.parse_args(argv)
    if args.quick:
        args.ids = 1_000_000
    if not 0 <= args.repeat < 1 or args.batch < 1 or args.messages < args.batch:
        p.error("need 0 <= --repeat < 1 and --messages >= --batch >= 1")
    return args


# -- the workload -----------------------------------------------------------------------------


def random_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


@dataclass
class Workload:
    """Requests of ``(msg_id, payload)``; a repeated id carries its first payload again."""

    requests: list[list[tuple[str, bytes]]]
    unique: set[str]

    @property
    def sent(self) -> int:
        return sum(len(r) for r in self.requests)


def workload(args: argparse.Namespace, seed: int) -> Workload:
    """``--messages`` messages in requests of ``--batch``. A request repeats ``--repeat`` of its
    ids from requests sent at least ``--in-flight`` requests before it, so the original has
    normally been acknowledged (a retry after a lost answer); the first requests are all new."""
    rng = random.Random(seed)
    repeats = round(args.batch * args.repeat)
    earlier: list[tuple[str, bytes]] = []  # everything sent up to ``in_flight`` requests back
    requests: list[list[tuple[str, bytes]]] = []
    unique: set[str] = set()
    n = 0
    for k in range(args.messages // args.batch):
        if k > args.in_flight:
            earlier.extend(requests[k - args.in_flight - 1])
        again = rng.sample(earlier, repeats) if earlier and repeats <= len(earlier) else []
        fresh = []
        for _ in range(args.batch - len(again)):
            msg_id = random_id(rng)
            unique.add(msg_id)
            fresh.append((msg_id, load.message(seed * 10_000_000 + n)))
            n += 1
        request = fresh + again
        rng.shuffle(request)
        requests.append(request)
    return Workload(requests, unique)


def produce_body(request: list[tuple[str, bytes]]) -> bytes:
    items = (b'{"id":"%s","data":%s}' % (msg_id.encode(), data) for msg_id, data in request)
    return b'{"messages":[' + b",".join(items) + b"]}"


@dataclass
class Run:
    target: str
    phase: str
    sent: int = 0
    new: int = 0  # answered as stored
    duplicates: int = 0  # answered as duplicates
    unique: int = 0  # distinct ids in the workload
    seconds: float = 0.0
    started: float = 0.0  # perf_counter() when the first request went out
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    stored: int | None = None  # stats.messages (Stations) / state.messages (JetStream) growth
    read_back: int | None = None  # messages read back (Stations)
    ids_match: bool | None = None  # the ids read back are exactly the unique ids
    in_window: int | None = None  # stats.idsInWindow growth (Stations)
    disk_read: int | None = None  # bytes the server read from / wrote to the block layer
    disk_written: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    @property
    def unique_rate(self) -> float:
        return self.unique / self.seconds if self.seconds else 0.0

    @property
    def verified(self) -> bool:
        checks = [self.stored == self.unique, self.new == self.unique]
        checks += [self.duplicates == self.sent - self.unique]
        if self.read_back is not None:
            checks += [self.read_back == self.unique, self.ids_match is True]
        if self.in_window is not None:
            checks.append(self.in_window == self.unique)
        return all(checks) and not self.errors


# -- Stations ---------------------------------------------------------------------------------


class Stations:
    def __init__(self, server: Server, connections: int) -> None:
        self.server = server
        self.base = f"{server.url}/api/stations"
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=600),
            headers={"Accept-Encoding": "identity"},
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        await self.session.close()

    async def create(self, name: str) -> None:
        body = {"name": name, "idempotencyWindowMs": WINDOW_MS}
        async with self.session.post(self.base, json=body) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"create {name}: {r.status} {await r.text()}")

    async def stats(self, name: str) -> dict[str, Any]:
        async with self.session.get(f"{self.base}/{name}") as r:
            if r.status != 200:
                raise RuntimeError(f"GET station {name}: {r.status} {await r.text()}")
            view = await r.json(loads=orjson.loads)
        stats: dict[str, Any] = view["stats"]
        return stats

    async def produce(self, name: str, body: bytes) -> list[dict[str, Any]]:
        url = f"{self.base}/{name}/messages"
        headers = {"Content-Type": "application/json"}
        async with self.session.post(url, data=body, headers=headers) as r:
            raw = await r.read()
            if r.status != 200:
                raise RuntimeError(f"produce: {r.status} {raw[:300]!r}")
        results: list[dict[str, Any]] = orjson.loads(raw)["results"]
        return results

    async def read_ids(self, name: str, offset: str) -> list[str | None]:
        """The id of every message from ``offset`` to the tail, 1000 per page."""
        ids: list[str | None] = []
        url = f"{self.base}/{name}/messages"
        while True:
            async with self.session.get(url, params={"offset": offset, "limit": "1000"}) as r:
                if r.status != 200:
                    raise RuntimeError(f"browse {name}: {r.status} {await r.text()}")
                page = orjson.loads(await r.read())
            ids += [m["id"] for m in page["messages"]]
            offset = page["nextOffset"]
            if page["upToDate"]:
                return ids


async def stations_run(
    client: Stations,
    name: str,
    work: Workload,
    in_flight: int,
    phase: str,
    *,
    others: tuple[Stations, ...] = (),
    done: list[float] | None = None,
) -> Run:
    """The workload on one station. With ``others`` (servers sharing one database) the
    requests in flight are spread over all servers; ``done`` collects each request's end."""
    run = Run("Stations", phase, sent=work.sent, unique=len(work.unique))
    bodies = [produce_body(r) for r in work.requests]
    before = await client.stats(name)
    todo = iter(bodies)
    clients = (client, *others)

    async def worker(via: Stations) -> None:
        for body in todo:
            try:
                results = await via.produce(name, body)
            except (aiohttp.ClientError, RuntimeError) as exc:
                run.errors.append(str(exc)[:200])
                continue
            dups = sum(1 for x in results if x["duplicate"])
            run.duplicates += dups
            run.new += len(results) - dups
            if done is not None:
                done.append(time.perf_counter())

    pids = [c.server.pid for c in clients]
    s0, c0 = sum(cpu_seconds(pid) for pid in pids), time.process_time()
    io0 = disk_io(client.server.pid)
    start = run.started = time.perf_counter()
    await asyncio.gather(*(worker(clients[k % len(clients)]) for k in range(in_flight)))
    run.seconds = time.perf_counter() - start
    io1 = disk_io(client.server.pid)
    run.disk_read, run.disk_written = io1[0] - io0[0], io1[1] - io0[1]
    run.server_cpu = (sum(cpu_seconds(pid) for pid in pids) - s0) / run.seconds
    run.client_cpu = (time.process_time() - c0) / run.seconds

    after = await client.stats(name)
    run.stored = after["messages"] - before["messages"]
    run.in_window = after["idsInWindow"] - before["idsInWindow"]
    ids = await client.read_ids(name, before["tailOffset"])
    run.read_back = len(ids)
    run.ids_match = len(ids) == len(work.unique) and set(ids) == work.unique
    return run


async def fill(client: Stations, name: str, total: int, per_request: int, in_flight: int) -> float:
    """Store ``total`` distinct ids with small payloads; returns the seconds it took."""
    rng = random.Random(0xF111)
    starts = iter(range(0, total, per_request))
    done = 0
    step = max(total // 10, 1)
    shown = step
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done, shown
        for first in starts:
            count = min(per_request, total - first)
            items = (
                b'{"id":"%s","data":{"i":%d}}' % (random_id(rng).encode(), first + j)
                for j in range(count)
            )
            body = b'{"messages":[' + b",".join(items) + b"]}"
            results = await client.produce(name, body)
            dups = sum(1 for x in results if x["duplicate"])
            if dups:
                raise RuntimeError(f"fill: {dups} fresh ids answered as duplicates")
            done += count
            if done >= shown:
                shown += step
                secs = time.perf_counter() - start
                print(
                    f"    fill {done:>12,} ids  {secs:7.1f} s  {done / secs:>9,.0f} ids/s  "
                    f"server RSS {rss_mb(client.server.pid, 'VmRSS'):6.0f} MB",
                    flush=True,
                )

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - start


# -- JetStream --------------------------------------------------------------------------------


class JetStream:
    """The anchor: one connection to a JetStream server, one stream per run."""

    def __init__(self, nc: Any, server: subprocess.Popen[bytes] | None, how: str) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.own_server = server
        self.how = how
        self.streams: list[str] = []

    @classmethod
    async def connect(cls, url: str, root: Path) -> JetStream | str:
        """Connect to ``url``, or else start a private ``nats-server -js``; a reason if neither."""
        try:
            import nats
        except ImportError:
            return "nats-py is not installed (pip install nats-py)"
        try:
            nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
            await nc.jetstream().account_info()
            return cls(nc, None, f"{url}, nats-server {nc.connected_server_version}")
        except Exception as exc:  # not there, or no JetStream: try our own below
            reason = f"{url}: {type(exc).__name__} {exc}"
        binary = shutil.which("nats-server")
        if binary is None:
            return f"{reason}; no nats-server binary to start one"
        port = servers.free_port()
        store = root / "nats"
        store.mkdir(parents=True, exist_ok=True)
        command = [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                nc = await nats.connect(
                    f"nats://127.0.0.1:{port}", connect_timeout=1, max_reconnect_attempts=0
                )
                await nc.jetstream().account_info()
            except Exception:
                await asyncio.sleep(0.1)
                continue
            how = f"own nats-server -js on port {port} ({url} unreachable), {store}"
            return cls(nc, proc, f"{how}, nats-server {nc.connected_server_version}")
        proc.kill()
        proc.wait()
        return f"{reason}; a private nats-server did not come up"

    async def create(self, name: str) -> None:
        from nats.js.api import StorageType, StreamConfig

        config = StreamConfig(
            name=name,
            subjects=[name],
            storage=StorageType.FILE,
            duplicate_window=WINDOW_MS / 1000,
        )
        await self.js.add_stream(config)
        self.streams.append(name)

    async def messages(self, name: str) -> int:
        info = await self.js.stream_info(name)
        return int(info.state.messages)

    async def close(self) -> None:
        """Delete every stream this run made (nothing else), then disconnect."""
        for name in self.streams:
            try:
                await self.js.delete_stream(name)
            except Exception as exc:
                print(f"  could not delete JetStream stream {name}: {exc}", flush=True)
        await self.nc.close()
        if self.own_server is not None:
            self.own_server.terminate()
            self.own_server.wait(10)


async def jetstream_run(js: JetStream, work: Workload, in_flight: int, phase: str) -> Run:
    run = Run("JetStream", phase, sent=work.sent, unique=len(work.unique))
    name = f"bench-ids-{uuid.uuid4().hex[:10]}"
    await js.create(name)
    todo = iter(work.requests)

    async def worker() -> None:
        for request in todo:
            futures = [
                await js.js.publish_async(name, data, headers={"Nats-Msg-Id": msg_id})
                for msg_id, data in request
            ]
            try:
                acks = await asyncio.wait_for(asyncio.gather(*futures), 60)
            except Exception as exc:
                run.errors.append(f"{type(exc).__name__} {exc}"[:200])
                continue
            dups = sum(1 for a in acks if a.duplicate)
            run.duplicates += dups
            run.new += len(acks) - dups

    c0 = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    run.seconds = time.perf_counter() - start
    run.client_cpu = (time.process_time() - c0) / run.seconds
    run.server_cpu = float("nan")
    run.stored = await js.messages(name)
    return run


# -- memory and disk --------------------------------------------------------------------------


def disk_io(pid: int | None) -> tuple[int, int]:
    """``read_bytes`` and ``write_bytes`` of a process (all threads): what it made the block
    layer fetch and write, so page-cache hits are not counted."""
    got = {"read_bytes": 0, "write_bytes": 0}
    if pid is not None:
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in got:
                    got[key] = int(value)
        except OSError:
            pass
    return got["read_bytes"], got["write_bytes"]


def rss_mb(pid: int | None, key: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of a process, in MB (10^6 bytes)."""
    if pid is None:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return 0.0


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every ``interval`` seconds until stopped."""

    def __init__(self, pid: int | None, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0.0
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.peak = max(self.peak, rss_mb(self.pid, "VmRSS"))
            self.samples += 1

    def stop(self) -> None:
        self._done.set()
        self.join()


# -- report -----------------------------------------------------------------------------------


def fmt(run: Run) -> str:
    parts = [
        f"  {run.target:<9} {run.rate:>9,.0f} msg/s sent  {run.unique_rate:>9,.0f} unique/s",
        f"{run.sent:>8,} sent ({run.duplicates:,} dup) in {run.seconds:5.2f} s",
    ]
    cpu = "" if run.server_cpu != run.server_cpu else f"server CPU {run.server_cpu:4.0%}  "
    parts.append(f"{cpu}client CPU {run.client_cpu:4.0%}")
    checks = f"stored {run.stored:,}"
    if run.read_back is not None:
        checks += f", read back {run.read_back:,} (ids {'match' if run.ids_match else 'DIFFER'})"
    if run.in_window is not None:
        checks += f", idsInWindow +{run.in_window:,}"
    parts.append(f"{checks}; unique {run.unique:,}")
    if run.disk_read is not None and run.disk_written is not None and run.sent:
        parts.append(
            f"server disk read {run.disk_read / 1e6:,.0f} MB, written "
            f"{run.disk_written / 1e6:,.0f} MB ({run.disk_written / run.sent / 1e3:.1f} kB/msg)"
        )
    if run.errors:
        parts.append(f"ERRORS x{len(run.errors)}: {run.errors[0]}")
    return "  ".join(parts)


def total(runs: list[Run]) -> Run:
    """All rounds of one target and phase as one run (rates over the summed time)."""
    out = Run(runs[0].target, runs[0].phase, stored=0)
    for r in runs:
        out.sent += r.sent
        out.new += r.new
        out.duplicates += r.duplicates
        out.unique += r.unique
        out.server_cpu = (out.server_cpu * out.seconds + r.server_cpu * r.seconds) / (
            out.seconds + r.seconds
        )
        out.client_cpu = (out.client_cpu * out.seconds + r.client_cpu * r.seconds) / (
            out.seconds + r.seconds
        )
        out.seconds += r.seconds
        out.stored = None if out.stored is None or r.stored is None else out.stored + r.stored
        if r.read_back is not None:
            out.read_back = (out.read_back or 0) + r.read_back
            out.ids_match = (out.ids_match is not False) and r.ids_match is True
        if r.in_window is not None:
            out.in_window = (out.in_window or 0) + r.in_window
        if r.disk_read is not None and r.disk_written is not None:
            out.disk_read = (out.disk_read or 0) + r.disk_read
            out.disk_written = (out.disk_written or 0) + r.disk_written
        out.errors += r.errors
    return out


def summary(runs: list[Run]) -> Run:
    line = total(runs)
    rounds = " / ".join(f"{r.rate:,.0f}" for r in runs)
    ok = "yes" if all(r.verified for r in runs) else "NO"
    print(fmt(line), flush=True)
    print(f"            rounds (msg/s sent): {rounds};  stored == unique: {ok}", flush=True)
    if all(r.disk_written is not None and r.sent for r in runs):
        written = " / ".join(f"{(r.disk_written or 0) / r.sent / 1e3:.2f}" for r in runs)
        print(f"            rounds (kB written per message): {written}", flush=True)
    if line.target == "JetStream" and line.client_cpu >= 0.85:
        print(
            f"            (the load generator used {line.client_cpu:.0%} of a core on JetStream: "
            "its figure is bounded by nats-py, JetStream itself may go faster)",
            flush=True,
        )
    return line


def header(args: argparse.Namespace) -> str:
    try:
        from importlib.metadata import version

        nats_py = version("nats-py")
    except Exception:
        nats_py = "not installed"
    repeats = round(args.batch * args.repeat)
    return "\n".join(
        [
            "Stations message-id benchmark (python3 -m bench.ids)",
            f"machine: {servers.cpu_count()} CPUs (nproc), {servers.cpu_model()}, "
            f"{platform.system()} {platform.release()}",
            f"load generator: Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
            f"nats-py {nats_py}, {'uvloop' if uvloop_available() else 'asyncio'} event loop, "
            "one process",
            f"stations: {servers.git_revision()}, SQLite, --durability {args.durability}"
            + (
                " (WAL, synchronous=FULL: every commit fsynced)"
                if args.durability == "fsync"
                else ""
            ),
            f"workload: {args.messages:,} messages per run, {args.batch} per request "
            f"({repeats} of them repeats of earlier ids), {args.in_flight} requests in flight, "
            f"{load.MESSAGE_BYTES}-byte JSON payloads, random 128-bit hex ids, "
            f"window {WINDOW_MS // 3_600_000} h; {args.rounds} rounds per target",
            f"fill: {args.ids:,} distinct ids, {args.fill_batch} per request, "
            f'{args.fill_in_flight} in flight, payload {{"i":n}}',
            f"load average before the run: {load_average()}",
        ]
    )


# -- part 3: PostgreSQL ---------------------------------------------------------------------------


def segment_rates(done: list[float], start: float, batch: int) -> tuple[float, float]:
    """msg/s over the first and over the last ``FLAT_SPAN`` messages of a run."""
    k = max(1, FLAT_SPAN // batch)
    if len(done) <= 2 * k:
        return float("nan"), float("nan")
    done = sorted(done)
    return k * batch / (done[k - 1] - start), k * batch / (done[-1] - done[-k - 1])


async def postgres_part(args: argparse.Namespace, root: Path, js: JetStream | None) -> bool:
    """msg-id produce against PostgreSQL (autovacuum as the server has it), flat as ids
    accumulate, beside JetStream; then two processes sharing the database. Returns ok."""
    from bench.consumers import pg_create, pg_drop

    print(f"\n== 3. PostgreSQL: {args.pg_messages:,} messages on a fresh station ==")
    try:
        pg_db, version = pg_create(args.pg_url)
    except Exception as exc:
        print(f"  PostgreSQL unavailable at {args.pg_url}: {exc}")
        return False
    url = f"{args.pg_url}/{pg_db}"
    made: list[Server] = []
    clients: list[Stations] = []
    ok = True
    try:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        print(f"  PostgreSQL {version}, database {pg_db}, autovacuum {row[0] if row else '?'}")
        for k in range(2):
            port = servers.free_port()
            command = [sys.executable, "-m", "stations", "serve", "--port", str(port)]
            command += ["--db", url, "--durability", args.durability]
            server = Server(f"stations-pg-{k}", "postgresql", command, root / f"pg-{k}", port)
            server.start()
            made.append(server)
            clients.append(Stations(server, args.in_flight + 2))
        work = argparse.Namespace(**{**vars(args), "messages": args.pg_messages})
        name = f"bench-ids-pg-{uuid.uuid4().hex[:8]}"
        await clients[0].create(name)
        done: list[float] = []
        one = await stations_run(
            clients[0], name, workload(work, 9_001), args.in_flight, "pg", done=done
        )
        # From the first request sent: the time before it (the bodies of the whole run built,
        # the station's figures read) made the first 10k look three times slower than the rest.
        first, last = segment_rates(done, one.started, args.batch)
        line = summary([one])
        anchor = None
        if js is not None:
            anchor = summary([await jetstream_run(js, workload(work, 9_002), args.in_flight, "pg")])
        name2 = f"bench-ids-pg2-{uuid.uuid4().hex[:8]}"
        await clients[0].create(name2)
        print(
            "  the same workload on another fresh station through two processes sharing the "
            "database (requests in flight spread over both):"
        )
        two = summary(
            [
                await stations_run(
                    clients[0],
                    name2,
                    workload(work, 9_003),
                    args.in_flight,
                    "pg x2",
                    others=(clients[1],),
                )
            ]
        )
        ok = one.verified and two.verified and (anchor is None or anchor.verified)
        print("  PostgreSQL results:")
        print(f"    one process   {line.rate:>9,.0f} msg/s")
        print(f"    two processes {two.rate:>9,.0f} msg/s (report only: 2 CPUs)")
        flat = last / first if first == first and first else float("nan")
        print(
            f"    first {FLAT_SPAN:,} messages {first:,.0f} msg/s, last {FLAT_SPAN:,} "
            f"{last:,.0f} msg/s: last/first {flat:.2f} (flat as ids accumulate: >= ~0.9)"
        )
        if anchor is not None:
            ratio = line.rate / anchor.rate if anchor.rate else 0.0
            verdict = "meets target" if ratio >= PG_TARGET else "BELOW TARGET"
            print(
                f"    Stations (PostgreSQL)/JetStream: {ratio:.2f}x "
                f"(target >= {PG_TARGET}: {verdict})"
            )
        else:
            print("    Stations (PostgreSQL)/JetStream: anchor unavailable")
    finally:
        for client in clients:
            await client.close()
        for server in made:
            server.stop()
        try:
            pg_drop(args.pg_url, pg_db)
        except Exception as exc:
            print(f"  could not drop database {pg_db}: {exc}")
    return ok


async def only_postgres(args: argparse.Namespace, root: Path) -> int:
    js: JetStream | None = None
    try:
        if not args.no_anchor:
            got = await JetStream.connect(args.nats, root)
            js = None if isinstance(got, str) else got
            if js is None:
                print(f"anchor unavailable: {got}")
        ok = await postgres_part(args, root, js)
        print(f"load average after the run: {load_average()}")
        return 0 if ok else 1
    finally:
        if js is not None:
            await js.close()
        shutil.rmtree(root, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="stations-bench-ids-", dir=args.data_root))
    if args.only_pg:
        return await only_postgres(args, root)
    server = servers.stations("stations", args.durability, root / "stations")
    js: JetStream | None = None
    sampler: RssSampler | None = None
    client: Stations | None = None
    failed = False
    try:
        server.start()
        sampler = RssSampler(server.pid)
        sampler.start()
        print(f"started stations pid {server.pid} on {server.url}, data {server.data_dir}")
        if not args.no_anchor:
            got = await JetStream.connect(args.nats, root)
            if isinstance(got, str):
                print(f"anchor unavailable: {got}")
            else:
                js = got
                print(
                    f"anchor: JetStream at {js.how}; file storage, duplicate_window 24 h "
                    "(JetStream acknowledges before fsync: its file store syncs on an interval)"
                )
        else:
            print("anchor unavailable: --no-anchor")
        client = Stations(server, max(args.in_flight, args.fill_in_flight) + 2)
        seed = iter(range(1, 10_000))

        async def stations_fresh(phase: str) -> Run:
            assert client is not None
            name = f"bench-ids-{uuid.uuid4().hex[:10]}"
            await client.create(name)
            return await stations_run(
                client, name, workload(args, next(seed)), args.in_flight, phase
            )

        # Warm-up (untimed, not reported): a tenth of a run on each target.
        warm = argparse.Namespace(
            **{**vars(args), "messages": max(args.messages // 10, args.batch)}
        )
        name = f"bench-ids-warm-{uuid.uuid4().hex[:8]}"
        await client.create(name)
        await stations_run(client, name, workload(warm, next(seed)), args.in_flight, "warm-up")
        if js is not None:
            await jetstream_run(js, workload(warm, next(seed)), args.in_flight, "warm-up")

        print(f"\n== 1. produce with ids, empty window: {args.messages:,} messages per round ==")
        empty: list[Run] = []
        anchor: list[Run] = []
        for _ in range(args.rounds):
            empty.append(await stations_fresh("empty"))
            if js is not None:
                anchor.append(
                    await jetstream_run(js, workload(args, next(seed)), args.in_flight, "empty")
                )
        empty_line = summary(empty)
        anchor_line = summary(anchor) if anchor else None
        if anchor_line is not None:
            print(
                f"  Stations/JetStream: {empty_line.rate / anchor_line.rate:.2f}x "
                f"(msg/s sent, same workload, same run)"
            )
        else:
            print("  Stations/JetStream: anchor unavailable")

        print(f"\n== 2. the same workload with {args.ids:,} ids in the station's window ==")
        big = f"bench-ids-big-{uuid.uuid4().hex[:8]}"
        await client.create(big)
        io0 = disk_io(server.pid)
        fill_s = await fill(client, big, args.ids, args.fill_batch, args.fill_in_flight)
        io1 = disk_io(server.pid)
        stats = await client.stats(big)
        print(
            f"  fill: {args.ids:,} ids in {fill_s:.1f} s = {args.ids / fill_s:,.0f} ids/s "
            f"(msg/s); station now holds {stats['messages']:,} messages, "
            f"idsInWindow {stats['idsInWindow']:,}; server RSS {rss_mb(server.pid, 'VmRSS'):.0f} MB; "
            f"server disk read {(io1[0] - io0[0]) / 1e6:,.0f} MB, "
            f"written {(io1[1] - io0[1]) / 1e6:,.0f} MB"
        )
        if stats["messages"] != args.ids or stats["idsInWindow"] != args.ids:
            print("  FILL COUNT MISMATCH")
            failed = True
        # Each round: the full station, a fresh station in the same database at the same time
        # (its window empty), JetStream: background load on the box falls on all three alike.
        full: list[Run] = []
        fresh: list[Run] = []
        anchor2: list[Run] = []
        for _ in range(args.rounds):
            full.append(
                await stations_run(client, big, workload(args, next(seed)), args.in_flight, "full")
            )
            fresh.append(await stations_fresh("empty again"))
            if js is not None:
                anchor2.append(
                    await jetstream_run(js, workload(args, next(seed)), args.in_flight, "after")
                )
        full_line = summary(full)
        print("  Stations, a fresh station (empty window) in the same database, interleaved:")
        fresh_line = summary(fresh)
        anchor2_line = None
        if anchor2:
            print("  JetStream again, interleaved (compare with part 1 for drift of the box):")
            anchor2_line = summary(anchor2)

        sampler.stop()
        hwm = rss_mb(server.pid, "VmHWM")
        rss_now = rss_mb(server.pid, "VmRSS")
        peak = max(hwm, sampler.peak)
        verified = all(r.verified for r in empty + anchor + full + fresh + anchor2)
        failed = failed or not verified

        print("\n== results (msg/s: all messages sent, duplicates included; unique/s: stored) ==")
        rows = [
            ("Stations, empty window (part 1)", empty_line),
            ("Stations, empty window (part 2)", fresh_line),
            (f"Stations, {args.ids:,} ids in window", full_line),
        ]
        if anchor_line is not None and anchor2_line is not None:
            rows += [("JetStream (part 1)", anchor_line), ("JetStream (part 2)", anchor2_line)]
        for label, line in rows:
            print(f"  {label:<38} {line.rate:>9,.0f} msg/s  {line.unique_rate:>9,.0f} unique/s")
        if anchor_line is not None and anchor2_line is not None:
            print(
                f"  Stations/JetStream: empty window {empty_line.rate / anchor_line.rate:.2f}x "
                f"(part 1), {fresh_line.rate / anchor2_line.rate:.2f}x (part 2); "
                f"{args.ids:,} ids in window {full_line.rate / anchor2_line.rate:.2f}x (part 2)"
            )
        else:
            print("  Stations/JetStream: anchor unavailable")
        for label, base in (("part 1", empty_line), ("part 2, interleaved", fresh_line)):
            slow = full_line.rate / base.rate if base.rate else 0.0
            verdict = "meets target" if slow >= SLOWDOWN_TARGET else "BELOW TARGET"
            print(
                f"  {args.ids:,} ids / empty window ({label}): {slow:.2f} "
                f"(target >= {SLOWDOWN_TARGET}: {verdict})"
            )
        verdict = "meets target" if peak < RSS_TARGET_MB else "OVER TARGET"
        print(
            f"  server peak RSS: {peak:.0f} MB (VmHWM {hwm:.0f} MB, largest of "
            f"{sampler.samples} VmRSS samples {sampler.peak:.0f} MB, now {rss_now:.0f} MB; "
            f"target < {RSS_TARGET_MB:.0f} MB: {verdict})"
        )
        print(f"  fill: {fill_s:.1f} s, {args.ids / fill_s:,.0f} msg/s")
        print(f"  stored == unique: {'yes' if verified else 'no'}")
        if not args.no_pg:
            failed = not await postgres_part(args, root, js) or failed
        print(f"load average after the run: {load_average()}")
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if client is not None:
            await client.close()
        if js is not None:
            await js.close()
        server.stop()
        if args.keep_data:
            print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(header(args), flush=True)
    if uvloop_available():
        import uvloop

        return uvloop.run(main_async(args))
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
