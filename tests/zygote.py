"""Start ``stations serve`` processes by forking one that has imported the server already.

A server spends most of its start importing (aiohttp, SQLAlchemy, the application: about a
second of CPU on the CI machine), and the suite starts several hundred of them. Each test worker
keeps one such process (the zygote, single-threaded, no event loop, no database); a server is a
fork of it that runs ``stations.cli.main(argv)`` in the test's directory with its output in the
test's log, as ``python -m stations serve ...`` would. It is a process of its own, with its
own pid: signals, ``kill -9`` and its exit status behave as a child of the test's.

The test side talks to the zygote over its stdin/stdout, a JSON line each way:
``{"argv", "cwd", "log", "env"}`` → ``{"pid"}``; ``{"poll": pid}`` → ``{"status": code|null}``.
The zygote is the servers' parent, so it reaps them and tells their exit status.

The CLI tests' commands (``tests.clikit.run``) are forked the same way: ``stations station ls``
spent 0.7 s of CPU importing aiohttp and the SDK before its one request, 4.6 CPU-minutes over
the suite's ~380 commands on a 2-core box whose CPUs bound the suite. Such a child ends as
``python -m stations`` does (the interpreter's own shutdown: threads joined, ``atexit`` and
finalisers run, so a warning printed at exit is still seen), not with ``os._exit``.
``stations pipeline`` is not forked (it starts a JVM; the fork would save little of its time).

``STATIONS_TEST_FORK=0`` starts every server and command with ``subprocess`` instead.

This file runs as a script (``python tests/zygote.py``), so that ``stations`` is found where a
server started with ``python -m stations`` finds it (``PYTHONPATH``, the installed package),
not beside ``tests/``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve()


# -- the test's side ----------------------------------------------------------------------------


def enabled() -> bool:
    return os.environ.get("STATIONS_TEST_FORK", "1") != "0"


class _Zygote:
    """This test worker's zygote, started on first use; one request at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen(
                    [sys.executable, str(HERE)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=HERE.parent,
                )
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the test zygote exited with {self.proc.wait()}")
            answer: dict[str, Any] = json.loads(line)
            return answer


_ZYGOTE = _Zygote()


class Forked:
    """The parts of ``subprocess.Popen`` the tests use, for a server forked by the zygote."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = _ZYGOTE.ask({"poll": self.pid})["status"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["stations", "serve"], timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(argv: list[str], cwd: Path, log: IO[bytes]) -> Forked:
    """``python -m stations *argv`` in ``cwd``, its output appended to ``log``'s file."""
    answer = _ZYGOTE.ask({"argv": argv, "cwd": str(cwd), "log": log.name, "env": dict(os.environ)})
    return Forked(answer["pid"])


def _text(data: bytes) -> str:
    # As subprocess's text mode reads a pipe: UTF-8 (clikit's encoding), universal newlines.
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def run(
    argv: list[str], cwd: Path | None, env: dict[str, str], stdin: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, stations, *argv], capture_output=True, text=True)`` in a
    fork: standard input from ``stdin`` (else /dev/null), output and errors each to a file
    read back once it ended; ``subprocess.TimeoutExpired`` (and the command killed) past
    ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="stations-cli-") as scratch:
        files = {name: os.path.join(scratch, name) for name in ("stdin", "stdout", "stderr")}
        Path(files["stdin"]).write_bytes((stdin or "").encode("utf-8"))
        request = {
            "argv": argv,
            "cwd": str(cwd or os.getcwd()),
            "env": env,
            "stdin": files["stdin"] if stdin is not None else os.devnull,
            "stdout": files["stdout"],
            "stderr": files["stderr"],
        }
        child = Forked(_ZYGOTE.ask(request)["pid"])
        command = [sys.executable, "-m", "stations", *argv]
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(command, timeout) from None
        out, err = (_text(Path(files[name]).read_bytes()) for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess(command, code, out, err)


# -- the zygote's side ----------------------------------------------------------------------


def _command(request: dict[str, Any]) -> None:
    """In the forked process: become the command ``python -m stations *argv``, standard input,
    output and errors from and to the files named; ends the process through the interpreter's
    own shutdown (``SystemExit`` out of every frame), as that command would."""
    fds = [
        os.open(request["stdin"], os.O_RDONLY),
        os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    _become(request, signal.default_int_handler)  # as Python starts: Ctrl-C raises
    from stations.cli import main

    main(request["argv"])
    raise SystemExit(0)


def _become(request: dict[str, Any], on_interrupt: Any) -> None:
    """The child's signals, directory, environment and ``sys.argv`` as ``python -m stations
    *argv`` started in the request's directory would have them."""
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, on_interrupt)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["stations", *request["argv"]]


def _child(request: dict[str, Any]) -> None:
    """In the forked process: become ``python -m stations *argv``; never returns."""
    if "stdout" in request:
        _command(request)
    code = 1
    try:
        # Standard input from /dev/null, output to the log: over the zygote's pipes (fds 0, 1).
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {null, log} - {0, 1, 2}:
            os.close(fd)
        _become(request, signal.SIG_DFL)
        from stations.cli import main

        main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_forks() -> None:
    # What `stations serve` imports before it serves (stations.cli._require_server, the app),
    # and once it starts: the migrations (Alembic, which imports Mako, which imports Pygments
    # where it is installed, as it is beside pytest; 0.4 s of CPU, the largest part of a
    # server's start), the drivers and the scheduler's parts.
    import alembic.command  # noqa: F401
    import alembic.config  # noqa: F401
    import alembic.runtime.environment  # noqa: F401
    import alembic.runtime.migration  # noqa: F401
    import alembic.script  # noqa: F401
    import apscheduler.executors.asyncio  # noqa: F401
    import apscheduler.triggers.date  # noqa: F401
    import apscheduler.triggers.interval  # noqa: F401
    import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401
    import sqlalchemy.ext.compiler  # noqa: F401

    import stations.api  # noqa: F401
    import stations.api.app  # noqa: F401
    import stations.cli  # noqa: F401
    import stations.commands  # noqa: F401
    import stations.domain.service  # noqa: F401
    import stations.spark.pipeline  # noqa: F401
    import stations.store.db  # noqa: F401

    for optional in ("psycopg", "sqlalchemy.dialects.postgresql.psycopg", "uvloop"):
        # Not installed: the servers that need it say so themselves.
        with contextlib.suppress(ImportError):
            importlib.import_module(optional)

    # A fork copies only the forking thread: a thread started by an import would be missing,
    # and a lock it held, held forever, in every server.
    assert threading.active_count() == 1, threading.enumerate()
    # What was imported is shared with every child until written to, and the collector's
    # passes write to every object they visit: a child's collections, and the last one at its
    # exit, copied most of this process's heap (0.4 CPU-s a command, 0.7 once Alembic was
    # imported here too). Frozen objects are left out of every collection.
    gc.collect()
    gc.freeze()
    sys.stdout.flush()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # Children this process has not reaped yet: their status once they have ended.
    ended: dict[int, int] = {}
    for line in stdin:
        request = json.loads(line)
        if "poll" in request:
            pid = request["poll"]
            if pid not in ended:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    ended[pid] = os.waitstatus_to_exitcode(status)
            answer: dict[str, Any] = {"status": ended.get(pid)}
        else:
            pid = os.fork()
            if pid == 0:
                _child(request)
            answer = {"pid": pid}
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()
    # The test worker ended: its servers end with it, as Popen's children are killed by the
    # fixtures (a server left running would hold its port and database).
    for pid in _unreaped(ended):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _unreaped(ended: dict[int, int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and int(entry.name) not in ended:
            found.append(int(entry.name))
    return found


if __name__ == "__main__":
    _serve_forks()
