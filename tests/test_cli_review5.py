"""The management CLI, as a fifth review found it:

- ``token new --add`` put the entry in the file before it printed the secret: an output that
  failed (stdout closed, its reader gone, a full disk) lost the secret and kept the entry;
- ``backup``: tracebacks for a --db that is no URL, an output that failed after the copy, and
  Ctrl-C; an in-memory database was told to use pg_dump;
- arguments and input that are not UTF-8, output the locale cannot encode;
- a closed stdin or Ctrl-C in ``token``; an empty ``--offsets-from -`` / ``--leases-from -``;
  a --msg-id too many on stdin; stderr closed; a refusal whose field is not a string;
- ``tail`` against a server that holds a long-poll longer than the SDK waits;
- ``produce`` printed its rows only once stdin ended.

Commands whose standard streams are closed or odd run as real processes (not forks of the
test zygote), with the streams set up here.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import clikit
from tests.clikit import failed, ok
from tests.harness import Server, free_port
from tests.module_server import module_server

OFFSET0 = "0000000000000000_0000000000000000"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def cli(url: str | None, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return clikit.run(*args, url=url, stdin=stdin, env={"PYTHONIOENCODING": "utf-8"})


def _env(url: str | None = None, **more: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    if url is not None:
        environment["STATIONS_URL"] = url
    environment.update(more)
    return environment


def raw(
    *args: str | bytes,
    url: str | None = None,
    cwd: Path | None = None,
    stdin: Any = subprocess.DEVNULL,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    close: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    python: list[str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """``python -m stations *args`` as a process of its own, with the standard streams given
    (``close``: descriptors closed in it, as a shell's ``>&-``); ``python``: what runs
    instead of ``-m stations`` (a script that patches something first)."""

    def closed() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run(
        [sys.executable, *(python or ["-m", "stations"]), *args],
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=_env(url, **(env or {})),
        preexec_fn=closed if close else None,
        timeout=60,
    )


def one_error(proc: subprocess.CompletedProcess[bytes], code: int, *fragments: str) -> str:
    """The process's one ``stations: error:`` line on stderr, its exit code checked."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == code, (proc.returncode, proc.stdout, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stations: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def broken_pipe() -> int:
    """A pipe's write end whose reader has left: a write to it fails at once (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def wait_blocked(proc: subprocess.Popen[bytes], wchan: str, timeout: float = 30) -> None:
    """Wait until ``proc`` sleeps in the kernel function ``wchan`` names part of (a pipe's
    read, a file lock), so that a signal sent then finds it there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with open(f"/proc/{proc.pid}/wchan") as file:
            if wchan in file.read():
                return
        time.sleep(0.05)
    raise AssertionError(f"the command never waited in {wchan}")


# -- 3. token new: the secret is out before the entry is in --------------------------------------


@pytest.mark.parametrize("output", ["closed", "full", "broken"])
def test_token_new_whose_output_fails_adds_no_entry(tmp_path: Path, output: str) -> None:
    """The entry was added, then the secret printed nowhere: exit 0 (closed, broken) or a
    traceback (full), a token in the file nobody has."""
    tokens = tmp_path / "tokens.json"
    streams: dict[str, Any] = {}
    if output == "closed":
        streams = {"stdout": subprocess.DEVNULL, "close": (1,)}
        code, said = 7, "standard output is closed"
    elif output == "full":
        streams = {"stdout": open("/dev/full", "w")}  # noqa: SIM115 - closed below
        code, said = 7, "No space left on device"
    else:
        streams = {"stdout": broken_pipe()}
        code, said = 141, "cannot write the output"
    try:
        proc = raw("token", "new", "--role", "admin", "--add", str(tokens), **streams)
    finally:
        if output == "full":
            streams["stdout"].close()
        elif output == "broken":
            os.close(streams["stdout"])
    one_error(proc, code, said)
    assert not tokens.exists()


def test_token_ls_to_a_full_disk_is_one_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    assert clikit.run("token", "new", "--role", "admin", "--add", str(tokens)).returncode == 0
    with open("/dev/full", "w") as full:
        proc = raw("token", "ls", str(tokens), stdout=full)
    one_error(proc, 7, "No space left on device")


def test_token_new_on_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    """A tokens file that is not UTF-8 was a UnicodeDecodeError traceback; like any file the
    entry could not go into, it is refused before a secret is shown."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"tokens": ["\xff"]}')
    proc = clikit.run("token", "new", "--role", "admin", "--add", str(bad))
    failed(proc, 1, "is not UTF-8 text")
    assert proc.stdout == ""
    assert bad.read_bytes() == b'{"tokens": ["\xff"]}'


def test_token_new_interrupted_while_waiting_for_the_lock(tmp_path: Path) -> None:
    """Ctrl-C while another change held the folder's lock was a KeyboardInterrupt traceback."""
    import fcntl

    tokens = tmp_path / "tokens.json"
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    command = ["token", "new", "--role", "admin", "--add", str(tokens)]
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-m", "stations", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        try:
            wait_blocked(proc, "lock")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    finally:
        os.close(folder)
    assert proc.returncode == 130, (out, err)
    assert b"Traceback" not in err, err
    assert out.startswith(b"token: ")  # shown, and said not to be in the file
    assert f"the token shown was not added to {tokens}".encode() in err
    assert not tokens.exists()


def test_token_revoke_with_stdin_closed_or_not_utf8(tmp_path: Path) -> None:
    """``<&-`` was an AttributeError on sys.stdin (None); a line that is not UTF-8, in a strict
    UTF-8 locale, a UnicodeDecodeError traceback."""
    tokens = tmp_path / "tokens.json"
    for _ in range(2):
        assert clikit.run("token", "new", "--role", "admin", "--add", str(tokens)).returncode == 0
    before = tokens.read_bytes()
    one_error(raw("token", "revoke", str(tokens), close=(0,)), 2, "standard input", "closed")
    proc = subprocess.run(
        [sys.executable, "-m", "stations", "token", "revoke", str(tokens)],
        input=b"\xff\n",
        capture_output=True,
        env=_env(PYTHONIOENCODING="utf-8:strict"),
    )
    one_error(proc, 2, "not UTF-8")
    assert tokens.read_bytes() == before


def test_token_revoke_interrupted_while_reading_stdin(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    assert clikit.run("token", "new", "--role", "admin", "--add", str(tokens)).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "token", "revoke", str(tokens)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        wait_blocked(proc, "pipe_read")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert b"Traceback" not in err, err


# -- 6. backup -----------------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> str:
    import sqlite3

    path = tmp_path / "source.db"
    db = sqlite3.connect(path)
    with db:
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
    db.close()
    return f"sqlite:///{path}"


@pytest.mark.parametrize(
    "url", ["notaurl", "sqlite:///file://remote/x?uri=true"], ids=["no-url", "remote-uri"]
)
def test_backup_of_a_db_that_is_no_url_is_a_usage_error(tmp_path: Path, url: str) -> None:
    """Both were sqlalchemy's ArgumentError, a traceback."""
    proc = clikit.run("backup", "--db", url, str(tmp_path / "copy.db"))
    failed(proc, 2, "--db is not a database URL")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_backup_of_an_in_memory_database_says_so(tmp_path: Path, url: str) -> None:
    """It said "for PostgreSQL use pg_dump"."""
    line = failed(clikit.run("backup", "--db", url, str(tmp_path / "copy.db")), 2, "in-memory")
    assert "pg_dump" not in line


@pytest.mark.parametrize("output", ["full", "broken"])
def test_backup_whose_report_cannot_be_written(tmp_path: Path, database: str, output: str) -> None:
    """The copy was made, then its line failed: a traceback, exit 1."""
    dest = tmp_path / "copy.db"
    if output == "full":
        with open("/dev/full", "w") as full:
            proc = raw("backup", "--db", database, str(dest), stdout=full)
    else:
        pipe = broken_pipe()
        try:
            proc = raw("backup", "--db", database, str(dest), stdout=pipe)
        finally:
            os.close(pipe)
    one_error(proc, 7 if output == "full" else 141, "cannot write the output", "copy was made")
    assert dest.stat().st_size > 0


def test_backup_interrupted_removes_the_file_it_made(tmp_path: Path, database: str) -> None:
    """Ctrl-C during the copy was a KeyboardInterrupt traceback; the signal comes here just
    after DEST was made, before the copy into it began (db.backup does not remove it then)."""
    dest = tmp_path / "copy.db"
    script = (
        "import os, signal, sys\n"
        "from stations.store import db\n"
        "made = db._new_private_file\n"
        "def making(path):\n"
        "    made(path)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "db._new_private_file = making\n"
        "from stations.cli import main\n"
        "main()\n"
    )
    proc = raw("backup", "--db", database, str(dest), python=["-c", script])
    assert proc.returncode == 130, proc
    assert b"Traceback" not in proc.stderr, proc.stderr
    assert not dest.exists()


# -- 7. arguments that are not UTF-8 -------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [b"station", b"show", b"\xff"],
        [b"read", b"\xff"],
        [b"group", b"create", b"s", b"\xff"],
        [b"produce", b"s", b"1", b"--msg-id", b"\xff"],
    ],
    ids=["station-show", "read", "group-create", "msg-id"],
)
def test_arguments_that_are_not_utf8_are_usage_errors(srv: Server, argv: list[bytes]) -> None:
    """Each was a UnicodeEncodeError traceback (a lone surrogate in a URL or a body)."""
    one_error(raw(*argv, url=srv.url), 2, "argument", "is not UTF-8 text")


def test_produce_data_arguments_that_are_not_utf8(srv: Server, http: httpx.Client) -> None:
    """Sent as a lone surrogate, which the server refused; now as their bytes to a binary
    station, and a usage error on a JSON one (as stdin lines are)."""
    created = http.post(
        "/api/stations", json={"name": "bin-args", "contentType": "application/octet-stream"}
    )
    assert created.status_code == 201, created.text
    proc = raw("produce", "bin-args", b"\xff\xfe", "text", url=srv.url)
    assert proc.returncode == 0, proc
    messages = http.get("/api/stations/bin-args/messages").json()["messages"]
    assert messages[0]["dataBase64"] == base64.b64encode(b"\xff\xfe").decode()
    assert messages[1]["data"] == "text"

    assert http.post("/api/stations", json={"name": "json-args"}).status_code == 201
    one_error(raw("produce", "json-args", b"\xff", url=srv.url), 2, "argument 1 is not UTF-8")
    assert http.get("/api/stations/json-args").json()["stats"]["messages"] == 0


# -- 8. input and output in a strict or non-UTF-8 locale -----------------------------------------


def _fetched_offset(srv: Server, http: httpx.Client, station: str) -> None:
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    ok(cli(srv.url, "group", "create", station, "g"))
    ok(cli(srv.url, "produce", station, "1"))


@pytest.mark.parametrize("verb", ["ack", "nack"])
def test_stdin_that_is_not_utf8_in_a_strict_locale(
    srv: Server, http: httpx.Client, verb: str
) -> None:
    """A UnicodeDecodeError traceback; a file that is not UTF-8 was one line already."""
    station = f"strict-{verb}"
    _fetched_offset(srv, http, station)
    option = "--offsets-from" if verb == "ack" else "--leases-from"
    proc = subprocess.run(
        [sys.executable, "-m", "stations", "group", verb, station, "g", option, "-"],
        input=b"\xff\n",
        capture_output=True,
        env=_env(srv.url, PYTHONIOENCODING="utf-8:strict"),
    )
    one_error(proc, 2, f"{option} -", "can't decode")


def test_output_the_locale_cannot_encode_is_escaped(srv: Server, http: httpx.Client) -> None:
    """LC_ALL=en_US.ISO-8859-1 with a payload in Japanese: a UnicodeEncodeError traceback."""
    assert http.post("/api/stations", json={"name": "latin"}).status_code == 201
    ok(cli(srv.url, "produce", "latin", '"日本"'))
    for json_flag in ([], ["--json"]):
        proc = raw("read", "latin", *json_flag, url=srv.url, env={"PYTHONIOENCODING": "latin-1"})
        assert proc.returncode == 0 and proc.stderr == b"", proc
        assert b"\\u65e5\\u672c" in proc.stdout, proc.stdout
        if json_flag:  # still JSON, the text escaped in it
            assert json.loads(proc.stdout)["data"] == "日本"


# -- 10a. an empty --offsets-from / --leases-from is nothing to settle ---------------------------


@pytest.mark.parametrize("verb", ["ack", "nack"])
def test_empty_settlement_input_settles_nothing(
    srv: Server, http: httpx.Client, tmp_path: Path, verb: str
) -> None:
    """``group fetch --json | group ack --offsets-from -`` on an empty queue said "no offset
    in it", exit 2."""
    station = f"empty-{verb}"
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    ok(cli(srv.url, "group", "create", station, "g"))
    fetched = ok(cli(srv.url, "group", "fetch", station, "g", "-n", "10", "--json"))
    assert fetched == ""
    option = "--offsets-from" if verb == "ack" else "--leases-from"
    counted = "acked" if verb == "ack" else "nacked"
    said = ok(cli(srv.url, "group", verb, station, "g", option, "-", stdin=fetched))
    assert said.strip() == f"0 of 0 messages {counted}"
    answer = json.loads(
        ok(cli(srv.url, "group", verb, station, "g", option, "-", "--json", stdin=""))
    )
    assert answer == {counted: 0, "unknown": []}
    empty = tmp_path / "empty"
    empty.write_text("\n")
    said = ok(cli(srv.url, "group", verb, station, "g", option, str(empty)))
    assert said.strip() == f"0 of 0 messages {counted}"


# -- 10b. a --msg-id too many on stdin -----------------------------------------------------------


def test_a_msg_id_too_many_on_stdin_claims_no_rest(srv: Server, http: httpx.Client) -> None:
    """It stored the message, then said "the first 1 messages were stored ..., the rest were
    not" (exit 1): there was no rest."""
    assert http.post("/api/stations", json={"name": "surplus"}).status_code == 201
    proc = cli(srv.url, "produce", "surplus", "--msg-id", "q1", "--msg-id", "q2", stdin="1\n")
    stored = http.get("/api/stations/surplus").json()["stats"]["messages"]
    assert "the rest were not" not in proc.stderr
    if stored == 0:  # found before the request (stdin's end came with its line): usage
        failed(proc, 2, "2 --msg-id for 1 messages")
    else:  # stdin's end came after the request went out
        failed(proc, 1, "2 --msg-id for 1 messages", "all 1 messages were stored")


# -- 10c. stderr closed --------------------------------------------------------------------------


def test_errors_never_go_to_stdout(srv: Server) -> None:
    """With stderr closed, print(file=None) wrote the error line on stdout, into --json."""
    proc = raw("station", "show", "no-such-station", "--json", url=srv.url, close=(2,))
    assert proc.returncode == 3
    assert proc.stdout == b""


# -- 10d. a refusal whose field is not a string --------------------------------------------------


@pytest.fixture
def odd_server() -> Iterator[str]:
    """A server that answers every request 400 with a list for the error's field."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = json.dumps({"error": {"code": "x", "message": "bad", "field": ["a"]}})
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _answer  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_refusal_whose_field_is_not_a_string(odd_server: str) -> None:
    """A TypeError traceback in naming_options (an unhashable list looked up)."""
    failed(cli(odd_server, "station", "create", "s", "--window", "1m"), 1, "bad")


# -- 4. tail against a server that holds a long-poll longer than the SDK waits -------------------


@pytest.fixture(scope="module")
def slow_polls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory, "--long-poll-timeout-ms", "20000"):
        assert isinstance(server, Server)
        yield server


def test_tail_takes_a_long_poll_that_outlasts_the_sdk_for_no_data(slow_polls: Server) -> None:
    """The SDK waits 75 s for a long-poll; a server started with a longer
    --long-poll-timeout-ms had tail report an outage ("cannot reach ... no answer in time")
    every 75 s. Here the SDK's wait is made 1 s (the server holds 20 s)."""
    with httpx.Client(base_url=slow_polls.url, timeout=30) as http:
        assert http.post("/api/stations", json={"name": "slow"}).status_code == 201
        script = (
            "from stations.client.client import Station\n"
            "assert Station.read.__kwdefaults__ is not None\n"
            "Station.read.__kwdefaults__['read_timeout'] = 1.0\n"
            "from stations.cli import main\n"
            "main()\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", script, "tail", "slow", "--json", "-n", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(slow_polls.url),
        )
        try:
            time.sleep(4)  # a few of the SDK's waits
            assert proc.poll() is None, proc.communicate()
            put = http.post("/api/stations/slow/messages", json={"messages": [{"data": 7}]})
            assert put.status_code in (200, 201), put.text
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert err == b"", err
    assert json.loads(out)["data"] == 7


# -- 5. produce prints each request's rows as they are stored ------------------------------------


class Lines:
    """The lines of a process's output as they come (a buffered reader's readline may hold
    the next line, which select would not see)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""

    def next(self, seconds: float) -> bytes:
        deadline = time.monotonic() + seconds
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0))
            assert ready, f"no line printed in {seconds} s (so far: {self.pending!r})"
            chunk = os.read(self.fd, 65536)
            assert chunk, f"the output ended (so far: {self.pending!r})"
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["table", "json"])
def test_produce_prints_rows_while_stdin_is_open(srv: Server, output: list[str]) -> None:
    """``tail -f app.log | stations produce logs`` printed nothing until stdin ended, and kept
    every row in memory meanwhile."""
    station = f"streamed-{len(output)}"
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.post("/api/stations", json={"name": station}).status_code == 201
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "produce", station, *output],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(srv.url),
    )
    assert proc.stdin is not None and proc.stdout is not None
    lines = Lines(proc.stdout.fileno())
    try:
        proc.stdin.write(b"1\n")
        proc.stdin.flush()
        first = lines.next(30)
        if not output:
            assert first.split() == [b"OFFSET", b"ID", b"DUPLICATE"]
            first = lines.next(30)
            assert first.split() == [OFFSET0.encode(), b"-", b"no"]
        else:
            assert json.loads(first) == {"offset": OFFSET0, "id": None, "duplicate": False}
        proc.stdin.write(b"2\n")
        proc.stdin.flush()
        assert b"0000000000000001_0000000000000000" in lines.next(30)
        proc.stdin.close()
        assert proc.wait(30) == 0, proc.communicate()
    finally:
        proc.kill()
