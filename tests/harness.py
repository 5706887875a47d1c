"""Real servers for the tests: ``stations serve`` subprocesses on loopback, on SQLite or on a
fresh PostgreSQL database each, plus helpers to kill and restart them."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests import zygote

PG_ADMIN_URL = os.environ.get("STATIONS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"


# The suite's JVMs (Spark drivers, the standalone cluster's daemons and executors) live for
# seconds to minutes and the 2-core box's CPUs are the suite's limit: C1 alone and the serial
# collector took a third off a pipeline run's CPU (44 -> 29 CPU-s) and a quarter off
# test_spark_review4's. Not the product's default: a long bulk job wants C2.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# Each test process (pytest-xdist worker) takes ports from a range of its own, below Linux's
# ephemeral ports (32768-60999): a port the kernel hands out for binding to 0, or to a client
# connection, or that another worker picks, could otherwise be taken while a server that is
# being restarted (``Server.restart``) is down and still counts on it.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
PORTS = range(20_000 + 1_500 * _WORKER, 20_000 + 1_500 * (_WORKER + 1))
# Each process starts at a random point of its range: two test runs on one box (their gw0s
# share a range) walked the same ports in the same order, and one run's test talked to, or
# restarted onto, the other's server.
_start = random.randrange(len(PORTS))
_next_port = itertools.cycle([*PORTS[_start:], *PORTS[:_start]])


def free_port() -> int:
    """A loopback port nobody listens on, from this process's own range."""
    for _ in PORTS:
        port = next(_next_port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception:
        return False


def waiting_for_locks(url: str, besides: int) -> bool:
    """Whether a backend of the PostgreSQL database at ``url`` other than ``besides`` (the
    caller's, holding the lock) waits for a lock."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> %s",
            (besides,),
        ).fetchall()
    return bool(rows)


def new_pg_database() -> str:
    """A fresh, empty database; returns its URL."""
    import psycopg

    name = f"stations_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_pg_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def metric(url: str, name: str, token: str | None = None) -> float:
    """One unlabelled figure of the server's ``/metrics`` (``token``: one that may read it)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for line in httpx.get(f"{url}/metrics", headers=headers, timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing")


def wait_for_waiting_readers(
    url: str, count: int, token: str | None = None, timeout: float = 15.0
) -> None:
    """Until the server at ``url`` counts at least ``count`` requests parked waiting (long-polls,
    SSE streams, group fetches: ``stations_waiting_readers``), rather than a fixed sleep that a
    busy box can outlast before the requests even arrive."""
    deadline = time.monotonic() + timeout
    while (seen := metric(url, "stations_waiting_readers", token)) < count:
        assert time.monotonic() < deadline, f"{count} waiting readers expected, saw {seen}"
        time.sleep(0.02)


def admin_and_scoped_tokens(workdir: Path, admin: str, scoped: str, stations: str) -> Path:
    """A ``--tokens`` file of an admin token and a consumer token whose scope is ``stations``
    (a pattern such as ``mine-*``): what the tests of scoped pages and commands start with."""
    path = workdir / "tokens.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": admin, "role": "admin"},
                    {"token": scoped, "role": "consumer", "stations": [stations]},
                ]
            }
        )
    )
    return path


@dataclass
class Server:
    db_url: str
    workdir: Path
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | zygote.Forked | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Server:
        # Ready is this process's own "serving" line, not a connection: another test run on
        # the box may hold the port, and a connection to its server passed for this one's.
        # A first start whose port was taken meanwhile moves to another port; a restart
        # keeps its port (clients hold the URL).
        first = self.proc is None
        for _ in range(5):
            path = self.workdir / f"server-{self.port}.log"
            seen = path.stat().st_size if path.exists() else 0
            with open(path, "ab") as log:
                self.proc = self._spawn(log)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                said = path.read_bytes()[seen:]
                if self.proc.poll() is not None:
                    if first and b"already in use" in said:
                        self.port = free_port()
                        break
                    raise RuntimeError(
                        f"stations serve exited with {self.proc.returncode}: {self.log()}"
                    )
                if b"stations: serving http" in said:
                    return self
                time.sleep(0.05)
            else:
                raise RuntimeError(f"stations serve did not come up: {self.log()}")
        raise RuntimeError(f"stations serve found no free port: {self.log()}")

    def _spawn(self, log) -> subprocess.Popen[bytes] | zygote.Forked:  # type: ignore[no-untyped-def]
        argv = ["serve", "--port", str(self.port), "--db", self.db_url, *self.args]
        if zygote.enabled():  # a fork of a process that imported the server already
            return zygote.spawn(argv, self.workdir, log)
        command = [sys.executable, "-m", "stations", *argv]
        return subprocess.Popen(command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        path = self.workdir / f"server-{self.port}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, *, hard: bool = True) -> Server:
        self.kill() if hard else self.stop()
        return self.start()


ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ClockServer(Server):
    """A server whose ``time.time()`` runs as many seconds ahead as the file ``clock`` says
    (tests/clock/sitecustomize.py): a test moves it past a window without sleeping, or gives
    one of several processes a clock of its own."""

    clock: Path = Path("clock")

    def _spawn(self, log) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
        command = [sys.executable, "-m", "stations", "serve", "--port", str(self.port)]
        command += ["--db", self.db_url, *self.args]
        paths = [str(ROOT / "tests" / "clock"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
            "STATIONS_TEST_CLOCK": str(self.clock),
        }
        return subprocess.Popen(
            command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env
        )
