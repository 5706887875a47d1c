"""The servers under test, each a subprocess on a free loopback port with a fresh data dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE_DIR = REPO / "tests" / "node"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """One running server. ``label`` names it in the report; ``mode`` is its durability."""

    label: str
    mode: str
    command: list[str]
    data_dir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self, timeout: float = 60.0) -> Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited with {self.proc.returncode}:\n{self.log()}"
                )
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.label} did not come up within {timeout:.0f} s:\n{self.log()}")

    def _answers(self) -> bool:
        """Any HTTP answer (a 404 for a stream that does not exist) means it is serving."""
        try:
            urllib.request.urlopen(f"{self.url}/v1/stream/__bench_probe__", timeout=1)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def log(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-4000:]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stations(label: str, durability: str, data_dir: Path) -> Server:
    db = f"sqlite:///{(data_dir / 'stations.db').resolve()}"
    port = free_port()
    command = [sys.executable, "-m", "stations", "serve", "--port", str(port), "--db", db]
    command += ["--durability", durability]
    return Server(label, durability, command, data_dir, port)


def reference(data_dir: Path) -> Server:
    if not (NODE_DIR / "node_modules" / "@durable-streams" / "server").is_dir():
        raise RuntimeError(f"reference server not installed: run `cd {NODE_DIR} && npm ci`")
    port = free_port()
    script = str(NODE_DIR / "reference-server.mjs")
    store = str(data_dir / "ref-data")
    command = ["node", script, "--port", str(port), "--data-dir", store]
    return Server("reference", "fsync", command, data_dir, port)


def node_version() -> str:
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0
