"""``stations serve`` on the command line: every refusal is one ``stations: error: ...`` line on
stderr and a non-zero exit, never a Python traceback; a running server answers ``/healthz``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import clikit
from tests.harness import Server, free_port


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return clikit.run(*args, cwd=cwd, env=env, timeout=timeout)


assert_one_line_error = clikit.one_line_error


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["serve", "--bogus"], "--bogus"),
        (["serve", "--port", "abc"], "--port"),
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--port", "0"], "--port"),
        (["serve", "--durability", "sometimes"], "--durability"),
        (["serve", "--log-level", "loud"], "--log-level"),
        (["serve", "--long-poll-timeout-ms", "0"], "--long-poll-timeout-ms"),
        (["serve", "--long-poll-timeout-ms", "soon"], "--long-poll-timeout-ms"),
        (["serve", "--sse-lifetime-ms", "-1"], "--sse-lifetime-ms"),
        (["serve", "--db"], "--db"),
        (["serve", "--recent-ids", "1"], "--recent-ids"),
        (["serve", "--recent-ids", "many"], "--recent-ids"),
        (["serve", "--id-cache-size", "0"], "--id-cache-size"),
        (["serve", "--metrics-stations", "-1"], "--metrics-stations"),
        (["serve", "--access-log", "/nonexistent/dir/access.log"], "--access-log"),
        # Every number has an upper bound (issue 11).
        (["serve", "--long-poll-timeout-ms", "3600001"], "--long-poll-timeout-ms"),
        (["serve", "--sse-lifetime-ms", "86400001"], "--sse-lifetime-ms"),
        (["serve", "--id-cache-size", "10000001"], "--id-cache-size"),
        (["serve", "--recent-ids", "100000001"], "--recent-ids"),
        (["serve", "--metrics-stations", "100001"], "--metrics-stations"),
        (["launch"], "launch"),
        ([], "command"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_options(tmp_path: Path, args: list[str], fragment: str) -> None:
    assert_one_line_error(run_cli(args, tmp_path), fragment)
    assert not (tmp_path / "stations-data").exists()  # refused before touching anything


def test_bad_option_from_the_environment(tmp_path: Path) -> None:
    proc = run_cli(["serve"], tmp_path, env={"STATIONS_PORT": "eighty"})
    assert_one_line_error(proc, "--port")


def test_unreachable_database(tmp_path: Path) -> None:
    started = time.monotonic()
    db = "postgresql://postgres@127.0.0.1:1/x"
    proc = run_cli(["serve", "--db", db, "--port", str(free_port())], tmp_path)
    assert_one_line_error(proc, "database")
    assert time.monotonic() - started < 30


def test_database_url_that_is_not_one(tmp_path: Path) -> None:
    proc = run_cli(["serve", "--db", "not a url", "--port", str(free_port())], tmp_path)
    assert_one_line_error(proc, "--db")
    proc = run_cli(["serve", "--db", "nosuchdb://x/y", "--port", str(free_port())], tmp_path)
    assert_one_line_error(proc)


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli(["serve", "--port", str(port), "--db", sqlite_url(tmp_path)], tmp_path)
    assert_one_line_error(proc, str(port), "in use")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_non_loopback_host_needs_tokens(tmp_path: Path, host: str) -> None:
    proc = run_cli(["serve", "--host", host, "--port", str(free_port())], tmp_path)
    assert_one_line_error(proc, host, "--tokens")
    assert not (tmp_path / "stations-data").exists()


def test_missing_tokens_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-tokens.json"
    proc = run_cli(["serve", "--tokens", str(missing), "--port", str(free_port())], tmp_path)
    assert_one_line_error(proc)


def test_healthz(server: Server) -> None:
    r = httpx.get(server.url + "/healthz", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"status": "ok"}


def test_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        command = [sys.executable, "-m", "stations", "serve", "--port", str(port)]
        command += ["--db", sqlite_url(tmp_path)]
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            base = f"http://127.0.0.1:{port}/v1/stream/s"
            assert httpx.put(base, headers={"Content-Type": "text/plain"}).status_code == 201
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "Task was destroyed" not in text, text


def test_a_second_server_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    """Each process keeps recent message ids in its own RAM: two on one SQLite file stored a
    retried id twice (found by a review). The second is refused; after the first is killed
    (-9: its lock goes with it) a new one starts."""
    url = sqlite_url(tmp_path)
    first = Server(url, tmp_path).start()
    try:
        proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
        assert_one_line_error(proc, "stations.db", "another process", f"pid {first.proc.pid}")
        alias = tmp_path / "alias.db"
        alias.symlink_to(tmp_path / "stations-data" / "stations.db")  # the file, another name
        proc = run_cli(
            ["serve", "--port", str(free_port()), "--db", f"sqlite:///{alias}"], tmp_path
        )
        assert_one_line_error(proc, "another process")
    finally:
        first.kill()
    again = Server(url, tmp_path).start()
    again.kill()


def test_a_sqlite_file_with_another_hard_link_is_refused(tmp_path: Path) -> None:
    """The lock is named after the path: a second server started on a hard link of the file
    took a lock of its own and served the same file beside the first, each with its own WAL,
    and stored a retried Msg-Id again (found by a review). A file with other hard links is
    refused, running or not; a symbolic link still meets the first server's lock."""
    url = sqlite_url(tmp_path)
    first = Server(url, tmp_path).start()
    first.stop()
    data = tmp_path / "stations-data" / "stations.db"
    link = tmp_path / "hard.db"
    os.link(data, link)
    for db in (url, f"sqlite:///{link}"):
        proc = run_cli(["serve", "--port", str(free_port()), "--db", db], tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert_one_line_error(proc, "1 other hard link(s)", "symbolic links")
    link.unlink()
    again = Server(url, tmp_path).start()
    again.kill()


@pytest.mark.parametrize(
    ("db", "fragment"),
    [
        ("mysql://u@127.0.0.1/db", "SQLite or PostgreSQL"),
        ("foo://bar", "SQLite or PostgreSQL"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///file:mem?mode=memory&uri=true", "in-memory"),
    ],
)
def test_a_database_stations_cannot_store_on_is_a_usage_error(
    tmp_path: Path, db: str, fragment: str
) -> None:
    """``--db`` was "any SQLAlchemy URL" and another database said "cannot open the database:
    No module named 'MySQLdb'" (installing it would not help: the store speaks SQLite and
    PostgreSQL), an in-memory SQLite "Invalid argument(s) 'max_overflow' sent to
    create_engine()"."""
    proc = run_cli(["serve", "--port", str(free_port()), "--db", db], tmp_path)
    assert_one_line_error(proc, "--db", fragment)
    assert proc.returncode == 2
    assert not (tmp_path / "stations-data").exists()


def _start_line(server: Server) -> str:
    deadline = time.monotonic() + 10  # printed right after the port opens
    while not (lines := [x for x in server.log().splitlines() if "serving" in x]):
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    return lines[0]


def test_the_start_line_says_where_the_data_goes(tmp_path: Path) -> None:
    """It said "(sqlite)": an operator could not tell which file a relative --db (the default
    is one) had opened, from wherever the service was started."""
    server = Server("sqlite:///stations-data/stations.db", tmp_path).start()
    try:
        line = _start_line(server)
    finally:
        server.kill()
    assert line == (
        f"stations: serving http://127.0.0.1:{server.port} "
        f"(sqlite: {tmp_path / 'stations-data' / 'stations.db'})"
    )


def test_the_start_line_names_the_postgresql_database_without_its_password(
    pg_url: str, tmp_path: Path
) -> None:
    from sqlalchemy.engine import make_url

    parsed = make_url(pg_url)
    url = parsed.set(password="sekrit-pw").render_as_string(hide_password=False)
    server = Server(url, tmp_path).start()
    try:
        line = _start_line(server)
    finally:
        server.kill()
    where = f"{parsed.username}@{parsed.host}:{parsed.port or 5432}/{parsed.database}"
    assert line == f"stations: serving http://127.0.0.1:{server.port} (postgresql: {where})"


def test_the_start_line_brackets_an_ipv6_address(tmp_path: Path) -> None:
    """It said "serving http://::1:PORT", which is no URL (a copy of it into a browser or
    curl fails)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "serve", "--host", "::1", "--port", str(port)]
        + ["--db", sqlite_url(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert line.startswith(f"stations: serving http://[::1]:{port} "), line
