"""Operating ``stations serve`` and the ``stations`` command as an operator does: stopping the
service with SIGTERM or SIGINT while clients are busy, a data directory it cannot write, and the
CLI against a server that is down. (The package as a type-checked library: test_package.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import Server, free_port, wait_for_waiting_readers
from tests.packaging import clean_env
from tests.test_cli import assert_one_line_error, run_cli

BODY = b"x" * 1000
JSON = {"Content-Type": "application/json"}


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"


def _half_sent_append(server: Server, station: str) -> socket.socket:
    """A plain append (no message id: a retry would store it again) whose body is half sent."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = (
        f"POST /v1/stream/{station} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    sock.sendall(head.encode() + BODY[:500])
    time.sleep(0.3)  # the handler is reading the body
    return sock


def _answer(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def _long_poll(server: Server, station: str, outcome: list[object]) -> threading.Thread:
    def wait() -> None:
        try:
            r = httpx.get(
                f"{server.url}/v1/stream/{station}",
                params={"offset": "now", "live": "long-poll"},
                timeout=60,
            )
            outcome.append(r.status_code)
        except httpx.TransportError as exc:  # closed: the client reads again elsewhere
            outcome.append(type(exc).__name__)
        outcome.append(time.monotonic())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(0.3)
    return thread


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_answers_the_write_in_progress(tmp_path: Path, sig: signal.Signals) -> None:
    """aiohttp's own signal handling cancelled every handler at once: a write in progress was
    cut off unanswered (sometimes after it was stored). Now it is finished and answered, and
    a waiting long-poll (30 s here) does not hold the shutdown."""
    server = Server(_sqlite(tmp_path), tmp_path, ["--long-poll-timeout-ms", "30000"]).start()
    assert server.proc is not None
    try:
        assert (
            httpx.put(
                f"{server.url}/v1/stream/drain", headers={"Content-Type": "text/plain"}
            ).status_code
            == 201
        )
        polled: list[object] = []
        poller = _long_poll(server, "drain", polled)
        sock = _half_sent_append(server, "drain")
        signalled = time.monotonic()
        server.proc.send_signal(sig)
        time.sleep(0.5)
        sock.sendall(BODY[500:])
        answer = _answer(sock)
        assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.1 204 No Content"), (
            answer[:300],
            server.log(),
        )
        assert server.proc.wait(10) == 0, server.log()
        poller.join(10)
        assert polled and float(polled[-1]) - signalled < 5, polled  # type: ignore[arg-type]
    finally:
        server.kill()
    assert f"stations: {sig.name}: stopping" in server.log()
    assert "Traceback" not in server.log(), server.log()
    server.start()
    try:
        stored = httpx.get(f"{server.url}/v1/stream/drain", params={"offset": "-1"})
        assert stored.content == BODY  # acknowledged, so it is there, once
    finally:
        server.kill()


def test_a_stuck_write_is_cut_at_the_drain_timeout_and_a_second_signal_stops_at_once(
    tmp_path: Path,
) -> None:
    server = Server(_sqlite(tmp_path / "a"), tmp_path, ["--drain-timeout-s", "1"])
    (tmp_path / "a").mkdir()
    server.start()
    assert server.proc is not None
    try:
        httpx.put(f"{server.url}/v1/stream/s", headers={"Content-Type": "text/plain"})
        sock = _half_sent_append(server, "s")  # never completed
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(10) == 0, server.log()
        assert 0.9 < time.monotonic() - started < 5
        sock.close()
        assert "1 requests were still in progress after --drain-timeout-s 1" in server.log()
    finally:
        server.kill()

    (tmp_path / "b").mkdir()
    server = Server(_sqlite(tmp_path / "b"), tmp_path, ["--drain-timeout-s", "60"]).start()
    assert server.proc is not None
    try:
        httpx.put(f"{server.url}/v1/stream/s", headers={"Content-Type": "text/plain"})
        sock = _half_sent_append(server, "s")
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert server.proc.poll() is None  # draining: the write may still complete
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(5) == -signal.SIGTERM
        sock.close()
    finally:
        server.kill()


@pytest.fixture
def silent_database() -> Iterator[str]:
    """A PostgreSQL URL whose port accepts connections and never answers (a host gone silent
    behind a middlebox): libpq's defaults waited for ever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"postgresql://postgres@127.0.0.1:{listener.getsockname()[1]}/test"
    listener.close()
    for sock in accepted:
        sock.close()


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_a_start_the_database_does_not_answer(
    tmp_path: Path, silent_database: str, sig: signal.Signals
) -> None:
    """It went on waiting, and the signal did nothing."""
    port = free_port()
    command = [sys.executable, "-m", "stations", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--db", silent_database],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        # Connecting: it has bound its port (a fixed 2 s was not always past its imports on a
        # loaded CI box, and the signal then interrupted an import).
        deadline = time.monotonic() + 60
        while _port_free(port):
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=5)
        assert proc.returncode == 1, (out, err)
        assert b"stopping before the database answered" in out, (out, err)
        assert b"Traceback" not in err
    finally:
        proc.kill()
        proc.communicate()


def test_a_start_the_database_does_not_answer_gives_up(
    tmp_path: Path, silent_database: str
) -> None:
    started = time.monotonic()
    proc = run_cli(["serve", "--port", str(free_port()), "--db", silent_database], tmp_path)
    assert_one_line_error(proc, "cannot reach the database")
    assert proc.returncode == 1
    assert time.monotonic() - started < 25


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_bad_drain_timeout(tmp_path: Path, value: str) -> None:
    assert_one_line_error(run_cli(["serve", "--drain-timeout-s", value], tmp_path), "--drain")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:notaport/db",
        "postgresql://u@[::1:5432/db",
        "sqlite://localhost:x/tmp/s.db",
    ],
)
def test_a_db_url_whose_port_is_no_number_is_a_bad_command_line(tmp_path: Path, url: str) -> None:
    """SQLAlchemy says ValueError for these, not ArgumentError: a traceback and exit 1."""
    proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
    assert_one_line_error(proc, "--db is not a database URL")
    assert proc.returncode == 2


def test_a_file_that_is_no_database_is_one_line(tmp_path: Path) -> None:
    """SQLAlchemy's "(Background on this error at: ...)" made it two, against the rule; and
    it was "cannot start: DatabaseError: file is not a database", with a ``.lock`` file left
    beside it."""
    path = tmp_path / "not-a-db"
    path.write_bytes(b"garbage " * 200)
    proc = run_cli(["serve", "--port", str(free_port()), "--db", f"sqlite:///{path}"], tmp_path)
    assert_one_line_error(proc, str(path), "is not an SQLite database")
    assert proc.returncode == 1
    assert [p.name for p in tmp_path.iterdir()] == ["not-a-db"]
    assert path.read_bytes() == b"garbage " * 200


def test_a_data_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    """It said "cannot lock the database file: Not a directory" without saying which: the
    default is relative to wherever the service was started."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    url = f"sqlite:///{blocker / 'data' / 'stations.db'}"
    proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
    assert_one_line_error(proc, "--db", str(blocker), "Not a directory")


def test_serve_exits_1_when_it_cannot_start_and_2_on_a_bad_command_line(tmp_path: Path) -> None:
    """Both were 2: a supervisor could not tell a start to retry (the port or the database
    not there yet) from a command line that will never work."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = str(taken.getsockname()[1])
        proc = run_cli(["serve", "--port", port, "--db", _sqlite(tmp_path)], tmp_path)
        assert_one_line_error(proc, "already in use")
        assert proc.returncode == 1
    finally:
        taken.close()
    nobody = f"postgresql+psycopg://127.0.0.1:{free_port()}/test"
    proc = run_cli(["serve", "--port", str(free_port()), "--db", nobody], tmp_path)
    assert_one_line_error(proc, "cannot reach the database")
    assert proc.returncode == 1
    proc = run_cli(["serve", "--port", "70000"], tmp_path)
    assert_one_line_error(proc, "--port")
    assert proc.returncode == 2


@pytest.mark.parametrize("how", ["--db", "STATIONS_DB_URL"])
def test_an_empty_database_url_is_refused(tmp_path: Path, how: str) -> None:
    """An empty ``--db`` or ``$STATIONS_DB_URL`` served a fresh SQLite file in the working
    directory: a PostgreSQL deployment whose variable came out empty acknowledged writes into
    a database nobody would look in."""
    args = ["serve", "--port", str(free_port())]
    if how == "--db":
        proc = run_cli([*args, "--db", " "], tmp_path, timeout=20)
    else:
        proc = run_cli(args, tmp_path, env={"STATIONS_DB_URL": ""}, timeout=20)
    assert_one_line_error(proc, "--db (or $STATIONS_DB_URL) is empty")
    assert proc.returncode == 2
    assert not (tmp_path / "stations-data").exists()


def test_waiting_readers_must_leave_connections_for_the_rest(tmp_path: Path) -> None:
    """A cap of waiting readers at or above the connection cap was taken: long-polls could hold
    every connection, against the promise that producers and /healthz always find one."""
    args = ["serve", "--port", str(free_port()), "--max-connections", "50"]
    proc = run_cli([*args, "--max-waiting-readers", "50"], tmp_path)
    assert_one_line_error(proc, "--max-waiting-readers", "--max-connections (50)")
    assert proc.returncode == 2


def test_the_cli_says_why_a_server_cannot_be_reached(tmp_path: Path) -> None:
    """It said "(Connect call failed ('127.0.0.1', 4437))", the address twice and no reason."""
    nobody = f"http://127.0.0.1:{free_port()}"
    proc = run_cli(["station", "ls", "--url", nobody], tmp_path)
    assert proc.returncode == 6
    line = assert_one_line_error(proc)
    assert line == f"stations: error: cannot reach {nobody} (Connection refused)"
    # A password in the URL is not echoed (it was, whole, in every error).
    secret = nobody.replace("http://", "http://ops:hunter2-secret@")
    proc = run_cli(["station", "ls", "--url", secret], tmp_path)
    line = assert_one_line_error(proc)
    assert "hunter2-secret" not in proc.stdout + proc.stderr
    shown = nobody.replace("http://", "http://ops:***@")
    assert line == f"stations: error: cannot reach {shown} (Connection refused)"
    proc = run_cli(
        ["station", "ls", "--url", "http://ops:hunter2-secret@127.0.0.1:99999"], tmp_path
    )
    line = assert_one_line_error(proc, "is not a valid URL", "http://ops:***@127.0.0.1:99999")
    assert "hunter2-secret" not in proc.stdout + proc.stderr
    # A URL too broken to parse is shown without its password too (CI caught a traceback).
    proc = run_cli(["station", "ls", "--url", "http://ops:hunter2-secret@[::1"], tmp_path)
    assert_one_line_error(proc, "is not a valid URL", "http://ops:***@[::1")
    assert proc.returncode == 2 and "hunter2-secret" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("status", [404, 502])
def test_the_cli_says_when_the_url_is_no_stations_server(tmp_path: Path, status: int) -> None:
    """A web server's 404 page was "not found" (exit 3) with the whole page as its message,
    and a proxy's 502 page was printed whole too."""
    import http.server

    page = b"<html><head><title>Error</title></head><body>" + b"x" * 2000 + b"</body></html>"

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}"
        proc = run_cli(["station", "show", "orders", "--url", url], tmp_path)
        assert proc.returncode == 6, (proc.returncode, proc.stderr)
        line = assert_one_line_error(proc, f"HTTP {status} with an HTML page")
        assert "<html" not in line and len(line) < 300
    finally:
        web.shutdown()


def _schema(url: str) -> None:
    """A database at this version's newest schema, as a first ``stations serve`` leaves it."""
    from stations.store import db

    engine = db.make_engine(url, writer=True)
    try:
        db.upgrade(engine)
    finally:
        engine.dispose()


def _revision(url: str, set_to: str | None = None) -> str:
    from sqlalchemy import text

    from stations.store import db

    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            if set_to is not None:
                conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": set_to})
            return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar())
    finally:
        engine.dispose()


def test_a_database_from_a_newer_version_is_refused_untouched(db_url: str, tmp_path: Path) -> None:
    """A schema revision this version does not know (a newer Stations wrote it, or another
    application's Alembic) was "cannot open the database: Can't locate revision identified by
    '9999'" with exit 2, the code of a bad command line: a supervisor gave up for good, where
    installing the newer version and restarting is the cure."""
    _schema(db_url)
    _revision(db_url, set_to="9999")
    proc = run_cli(["serve", "--port", str(free_port()), "--db", db_url], tmp_path)
    assert_one_line_error(proc, "revision 9999", "newer version of Stations")
    assert proc.returncode == 1
    assert _revision(db_url) == "9999"


def test_another_applications_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    """``--db`` naming another application's SQLite file (tables, no Stations schema) had
    Stations' tables added to it by the migrations."""
    import sqlite3

    path = tmp_path / "invoices.db"
    with contextlib.closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        other.commit()
    proc = run_cli(["serve", "--port", str(free_port()), "--db", f"sqlite:///{path}"], tmp_path)
    assert_one_line_error(proc, "invoices", "another application's database")
    assert proc.returncode == 1
    with contextlib.closing(sqlite3.connect(path)) as other:
        tables = other.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        mode = other.execute("PRAGMA journal_mode").fetchone()
    assert tables == [("invoices",)]
    assert mode == ("delete",)  # not switched to WAL
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("invoices")) == [
        "invoices.db"
    ]  # no lock file, WAL or shared memory file left beside it


def test_a_folder_as_db_is_refused_untouched(tmp_path: Path) -> None:
    """``--db`` naming a folder said "cannot reach the database: unable to open database
    file" (words of a network outage) and left a ``.lock`` file beside it."""
    folder = tmp_path / "data"
    folder.mkdir()
    proc = run_cli(["serve", "--port", str(free_port()), "--db", f"sqlite:///{folder}"], tmp_path)
    assert_one_line_error(proc, str(folder), "is a folder")
    assert proc.returncode == 1
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert list(folder.iterdir()) == []


def test_a_named_pipe_as_db_is_refused_at_once(tmp_path: Path) -> None:
    """The check of a file's first bytes opened a named pipe and waited for a writer for
    ever, before the signal handlers were set: no word, and SIGTERM killed it (143)."""
    import os

    pipe = tmp_path / "pipe.db"
    os.mkfifo(pipe)
    proc = run_cli(["serve", "--port", str(free_port()), "--db", f"sqlite:///{pipe}"], tmp_path)
    assert_one_line_error(proc, str(pipe), "is not a regular file")
    assert proc.returncode == 1


def test_backup_to_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    """DEST in a folder that does not exist was told "no database at <the database>", of a
    database that was there."""
    database = tmp_path / "stations.db"
    server = Server(f"sqlite:///{database}", tmp_path).start()
    server.kill()
    dest = tmp_path / "missing" / "copy.db"
    proc = run_cli(["backup", str(dest), "--db", f"sqlite:///{database}"], tmp_path)
    assert_one_line_error(proc, f"cannot create {dest}: no folder {dest.parent}")
    assert proc.returncode == 1
    gone = run_cli(
        ["backup", str(tmp_path / "c.db"), "--db", f"sqlite:///{tmp_path / 'x.db'}"], tmp_path
    )
    assert_one_line_error(gone, f"no database at {tmp_path / 'x.db'}")


def _read_only(url: str) -> str:
    """The same database through a connection that may not write: SQLite opened read-only (as
    a file the service's user cannot write is), PostgreSQL in read-only transactions (as a hot
    standby or a role with default_transaction_read_only)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"sqlite:///file:{parsed.database}?mode=ro&uri=true"
    options = {"options": "-c default_transaction_read_only=on"}
    return parsed.update_query_dict(options).render_as_string(hide_password=False)


def test_a_database_it_cannot_write_is_refused_at_start(db_url: str, tmp_path: Path) -> None:
    """A read-only database was served: /healthz and /readyz said ok, and every write (the
    scheduler's too) failed with 503 "the database is unavailable, retry later"."""
    _schema(db_url)
    proc = run_cli(["serve", "--port", str(free_port()), "--db", _read_only(db_url)], tmp_path)
    assert_one_line_error(proc, "cannot write to the database")
    assert proc.returncode == 1


def test_a_database_it_cannot_write_that_needs_its_schema_says_so(
    db_url: str, tmp_path: Path
) -> None:
    """The same, before the schema is made (an empty file or database): the failed migration
    was "cannot reach the database", the words of an outage."""
    if db_url.startswith("sqlite"):
        path = Path(db_url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()  # an empty SQLite file: no tables yet
    proc = run_cli(["serve", "--port", str(free_port()), "--db", _read_only(db_url)], tmp_path)
    assert_one_line_error(proc, "cannot write to the database (is it read-only?)")
    assert proc.returncode == 1


def test_a_postgresql_url_with_connection_options_wakes_other_processes(
    pg_url: str, tmp_path: Path
) -> None:
    """The LISTEN connection's DSN was the URL rendered again, a space as ``+``, which libpq
    does not decode: with ``options=-c ...`` in --db every LISTEN failed ("unrecognized
    configuration parameter"), so a long-poll at one process slept out its timeout while
    another appended."""
    from sqlalchemy.engine import make_url

    url = (
        make_url(pg_url)
        .update_query_dict({"options": "-c statement_timeout=600000"})
        .render_as_string(hide_password=False)
    )
    args = ["--long-poll-timeout-ms", "20000"]
    waiter, appender = Server(url, tmp_path, args).start(), Server(url, tmp_path, args).start()
    try:
        put = httpx.put(f"{waiter.url}/v1/stream/w", headers={"Content-Type": "text/plain"})
        assert put.status_code == 201
        answer: list[float] = []

        def poll() -> None:
            r = httpx.get(
                f"{waiter.url}/v1/stream/w",
                params={"offset": "now", "live": "long-poll"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            answer.append(time.monotonic())

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(0.5)  # parked at the tail
        appended = time.monotonic()
        r = httpx.post(
            f"{appender.url}/v1/stream/w", content=b"x", headers={"Content-Type": "text/plain"}
        )
        assert r.status_code == 204, r.text
        thread.join(30)
        assert answer and answer[0] - appended < 2, "the long-poll slept out its timeout"
        assert "LISTEN connection lost" not in waiter.log()
    finally:
        waiter.kill()
        appender.kill()


def test_a_data_directory_serve_makes_is_private(tmp_path: Path) -> None:
    """Messages are the users' data: a directory made with the umask's 755 let every local
    account read the database, its WAL and the lock file (PostgreSQL insists on 0700)."""
    data = tmp_path / "made" / "here"
    server = Server(f"sqlite:///{data / 'stations.db'}", tmp_path).start()
    try:
        assert httpx.put(f"{server.url}/v1/stream/s", content=b"secret").status_code == 201
    finally:
        server.stop()
    assert oct(data.stat().st_mode & 0o777) == oct(0o700)
    # Every directory it made, not only the last (os.makedirs gave the others the umask's).
    assert oct(data.parent.stat().st_mode & 0o777) == oct(0o700)


def test_database_files_serve_makes_are_private_in_a_directory_that_exists(
    tmp_path: Path,
) -> None:
    """A data directory that already existed (``/var/lib/stations``, 0755) kept its mode, and
    the database, its WAL, shared memory and lock were made with the umask's 0644: every local
    account could read the messages and the webhook signing key stored in the database."""
    data = tmp_path / "existing"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    server = Server(f"sqlite:///{data / 'stations.db'}", tmp_path).start()
    try:
        assert httpx.put(f"{server.url}/v1/stream/s", content=b"secret").status_code == 201
        made = {p.name: oct(p.stat().st_mode & 0o777) for p in data.iterdir()}
    finally:
        server.stop()
    assert set(made) >= {"stations.db", "stations.db-wal", "stations.db-shm", "stations.db.lock"}
    assert made == dict.fromkeys(made, oct(0o600))
    assert oct(data.stat().st_mode & 0o777) == oct(0o755)  # the owner's directory as it was


def test_the_access_log_can_be_rotated(tmp_path: Path) -> None:
    """logrotate moves the file and sends SIGHUP: the lines went on into the moved file, and
    SIGHUP ended the server at once, without a drain."""
    access = tmp_path / "access.log"
    server = Server(_sqlite(tmp_path), tmp_path, ["--access-log", str(access)]).start()
    assert server.proc is not None
    try:
        assert httpx.get(f"{server.url}/livez", timeout=10).status_code == 200
        access.rename(tmp_path / "access.log.1")
        server.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert server.proc.poll() is None, server.log()
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        deadline = time.monotonic() + 10
        while not (access.exists() and "/healthz" in access.read_text()):
            assert time.monotonic() < deadline, "no line in the new file"
            time.sleep(0.1)
        assert "/healthz" not in (tmp_path / "access.log.1").read_text()
    finally:
        server.kill()


def test_sighup_reads_the_tokens_file_again(tmp_path: Path) -> None:
    """A token was added or revoked only by restarting every process (a revoked one kept
    working on any process not restarted). SIGHUP reads the file again; a file that does not
    load keeps the tokens in use and says why."""
    tokens = tmp_path / "tokens.json"

    def write(*entries: tuple[str, str]) -> None:
        listed = [{"token": secret, "role": role} for secret, role in entries]
        tokens.write_text(json.dumps({"tokens": listed}))

    def status(secret: str) -> int:
        headers = {"Authorization": f"Bearer {secret}"}
        return httpx.get(f"{server.url}/api/stations", headers=headers, timeout=10).status_code

    def hangup(line: str) -> None:
        assert server.proc is not None
        before = server.log().count(line)
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while server.log().count(line) == before:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)

    write(("old-secret-1", "admin"))
    flags = ["--tokens", str(tokens), "--log-level", "info"]
    server = Server(_sqlite(tmp_path), tmp_path, flags).start()
    try:
        assert status("old-secret-1") == 200 and status("new-secret-1") == 401
        write(("new-secret-1", "consumer"))
        hangup("SIGHUP: 1 token(s) read from")
        assert status("old-secret-1") == 401  # revoked
        assert status("new-secret-1") == 200  # added (a consumer may list stations)
        no_access = httpx.post(
            f"{server.url}/api/stations",
            json={"name": "x"},
            headers={"Authorization": "Bearer new-secret-1"},
            timeout=10,
        )
        assert no_access.status_code == 403  # with the role the file gives it
        tokens.write_text('{"tokens": [')  # half written: the tokens in use stay
        hangup("the tokens in use are kept")
        assert status("new-secret-1") == 200 and status("old-secret-1") == 401
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.kill()


def test_revoking_a_token_ends_its_waiting_requests(tmp_path: Path) -> None:
    """A revoked token's long-poll and SSE ran to their timeouts, and its group fetch (waitMs
    up to 300 s) went on waiting and then leased the next message to a client that could no
    longer ack it (found by a review). SIGHUP ends the waits of tokens no longer in the file
    as they were: 401 where nothing was sent yet, an SSE ends whole; other tokens' waits
    go on."""
    tokens = tmp_path / "tokens.json"
    keep = {"token": "keep-secret-1", "role": "admin"}
    gone = {"token": "gone-secret-1", "role": "consumer", "stations": ["s"]}
    tokens.write_text(json.dumps({"tokens": [keep, gone]}))
    flags = ["--tokens", str(tokens), "--log-level", "info"]
    server = Server(_sqlite(tmp_path), tmp_path, flags).start()
    assert server.proc is not None
    admin = {"Authorization": "Bearer keep-secret-1"}
    revoked = {"Authorization": "Bearer gone-secret-1"}
    try:
        http = httpx.Client(base_url=server.url, timeout=90)
        assert http.put("/v1/stream/s", headers={**admin, **JSON}).status_code == 201
        assert http.put("/api/stations/s/groups/g", json={}, headers=admin).status_code == 201
        tail = http.head("/v1/stream/s", headers=admin).headers["Stream-Next-Offset"]
        read = f"/v1/stream/s?offset={tail}&live="
        outcomes: dict[str, tuple[int, float, str]] = {}

        def wait(name: str, method: str, path: str, headers: dict[str, str], **kw: Any) -> None:
            with httpx.Client(base_url=server.url, timeout=90) as own:
                with own.stream(method, path, headers=headers, **kw) as r:
                    body = r.read().decode()
                outcomes[name] = (r.status_code, time.monotonic(), body)

        fetch = {"max": 1, "waitMs": 120_000}
        waits = [
            ("long-poll", "GET", read + "long-poll", revoked, {}),
            ("sse", "GET", read + "sse", revoked, {}),
            ("fetch", "POST", "/api/stations/s/groups/g/fetch", revoked, {"json": fetch}),
            ("kept", "GET", read + "long-poll", admin, {}),
        ]
        threads = [threading.Thread(target=wait, args=w[:4], kwargs=w[4]) for w in waits]
        for thread in threads:
            thread.start()
        wait_for_waiting_readers(server.url, 4, "keep-secret-1")
        assert not outcomes, outcomes
        tokens.write_text(json.dumps({"tokens": [keep]}))
        hung_up = time.monotonic()
        server.proc.send_signal(signal.SIGHUP)
        deadline = hung_up + 10
        while len(outcomes) < 3:
            assert time.monotonic() < deadline, (outcomes, server.log())
            time.sleep(0.05)
        assert "3 waiting request(s) of revoked tokens ended" in server.log()
        for name in ("long-poll", "fetch"):
            status, _, body = outcomes[name]
            assert status == 401 and "revoked" in body, (name, outcomes[name])
        assert outcomes["sse"][0] == 200  # its events were under way: it ends whole
        assert all(outcomes[n][1] - hung_up < 5 for n in ("long-poll", "sse", "fetch"))
        assert "kept" not in outcomes  # another token's wait goes on
        produced = http.post("/v1/stream/s", json={"n": 1}, headers=admin)
        assert produced.status_code in (200, 204)
        threads[3].join(30)
        assert outcomes["kept"][0] == 200 and '"n"' in outcomes["kept"][2]
        # The revoked fetch leased nothing: the message's first delivery is now.
        got = http.post("/api/stations/s/groups/g/fetch", json={"max": 1}, headers=admin)
        assert [m["deliveryCount"] for m in got.json()["messages"]] == [1], got.text
        assert http.get("/api/stations", headers=revoked).status_code == 401
        for thread in threads:
            thread.join(10)
    finally:
        server.kill()


def test_a_fatal_signal_leaves_a_word(tmp_path: Path) -> None:
    """SQLite's shared-memory file failing to grow on a full disk raises SIGBUS: the server
    was gone without a line, no traceback and no message (found by a review)."""
    server = Server(_sqlite(tmp_path), tmp_path, []).start()
    assert server.proc is not None
    try:
        server.proc.send_signal(signal.SIGBUS)
        server.proc.wait(30)
        # The whole log: server.log() is its last 4000 characters, and the dump of every
        # thread's stack after the line may be longer (a thread deep in SQLAlchemy's compiler).
        said = (tmp_path / f"server-{server.port}.log").read_text(errors="replace")
        assert "Fatal Python error: Bus error" in said, server.log()
    finally:
        server.kill()


def test_a_reader_of_stdout_that_went_away_does_not_stop_the_drain(tmp_path: Path) -> None:
    """``stations serve | head -1``, or a log shipper that died: the next line on stdout (the
    one SIGTERM prints) raised BrokenPipeError, the request in progress was cut unanswered
    and the server exited 1 with a traceback instead of draining."""
    port = free_port()
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "stations", "serve", "--port", str(port)]
    command += ["--db", _sqlite(tmp_path)]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    try:
        with os.fdopen(read_end) as out:
            assert "serving" in out.readline()  # ... and then nobody reads stdout any more
        url = f"http://127.0.0.1:{port}"
        assert (
            httpx.put(
                f"{url}/v1/stream/t", headers={"Content-Type": "application/json"}
            ).status_code
            == 201
        )
        body = b'[{"n": 1}]'
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v1/stream/t HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(body)
                + body[:3]
            )
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            sock.sendall(body[3:])  # the request in progress completes during the drain
            sock.settimeout(10)
            assert sock.recv(200).startswith(b"HTTP/1.1 204"), "the append was not answered"
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_shutdown_answers_waiting_reads_as_at_their_timeout(tmp_path: Path) -> None:
    """SIGTERM cut a waiting long-poll and a waiting group fetch off unanswered: a planned
    restart was an error to their clients (the CLI's ``group fetch --wait`` said "cannot
    reach"). They now answer at once as at their timeout: 204 up to date, an empty page."""
    server = Server(_sqlite(tmp_path), tmp_path).start()
    assert server.proc is not None
    try:
        assert httpx.put(f"{server.url}/v1/stream/s", content=b"hello").status_code == 201
        assert httpx.put(f"{server.url}/api/stations/s/groups/g", json={}).status_code == 201
        fetch = {"max": 1, "waitMs": 60_000}
        got = httpx.post(f"{server.url}/api/stations/s/groups/g/fetch", json=fetch).json()
        assert len(got["messages"]) == 1  # the group is at the tail now
        tail = httpx.head(f"{server.url}/v1/stream/s").headers["Stream-Next-Offset"]
        answers: dict[str, Any] = {}

        def ask(what: str, method: str, path: str, body: Any = None) -> None:
            try:
                answers[what] = httpx.request(method, server.url + path, json=body, timeout=60)
            except httpx.HTTPError as exc:
                answers[what] = exc

        threads = [
            threading.Thread(target=ask, args=a, daemon=True)
            for a in (
                ("poll", "GET", f"/v1/stream/s?offset={tail}&live=long-poll"),
                ("fetch", "POST", "/api/stations/s/groups/g/fetch", fetch),
            )
        ]
        for thread in threads:
            thread.start()
        wait_for_waiting_readers(server.url, 2)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(15)
        poll, fetched = answers["poll"], answers["fetch"]
        assert isinstance(poll, httpx.Response), poll
        assert poll.status_code == 204, poll.text
        assert poll.headers["Stream-Up-To-Date"] == "true"
        assert poll.headers["Stream-Next-Offset"] == tail
        assert isinstance(fetched, httpx.Response), fetched
        assert (fetched.status_code, fetched.json()) == (200, {"messages": []})
        assert server.proc.wait(10) == 0, server.log()
        assert time.monotonic() - started < 5  # not their 60 s
    finally:
        server.kill()


def test_a_stream_begun_during_the_drain_closes_its_connection(tmp_path: Path) -> None:
    """Responses a handler prepares itself (SSE, large reads) kept their connection alive
    during a drain: an SSE ends at once there (the waits are over), and a client asked again
    and again on one connection, thousands of answers a second until the drain's end."""
    server = Server(_sqlite(tmp_path), tmp_path).start()
    assert server.proc is not None
    port = int(server.url.rsplit(":", 1)[1])
    try:
        assert httpx.put(f"{server.url}/v1/stream/s", content=b"hello").status_code == 201
        with (
            socket.create_connection(("127.0.0.1", port)) as held,
            socket.create_connection(("127.0.0.1", port)) as kept,
        ):
            # A POST whose body has not all come holds the drain open.
            held.sendall(
                b"POST /v1/stream/s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: 10\r\n\r\nabc"
            )
            kept.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            kept.settimeout(10)
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the drain has begun
            kept.sendall(b"GET /v1/stream/s?offset=-1&live=sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = kept.recv(4096)
                assert chunk, answer
                answer += chunk
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert head.startswith(b"http/1.1 200"), head
            assert b"connection: close" in head, head
            while chunk:  # the response ends, and so does the connection
                chunk = kept.recv(4096)
            held.sendall(b"defghij")  # the POST completes: the drain ends
            held.settimeout(10)
            assert held.recv(200).startswith(b"HTTP/1.1 204")
        assert server.proc.wait(15) == 0, server.log()
    finally:
        server.kill()


def test_a_shutdown_ends_an_sse_response_whole(tmp_path: Path) -> None:
    """The drain ends an SSE response as a whole (its client reads again from the last
    event's offset), logged 200: a change for the 499 of clients that leave cut it off
    mid-response (curl: "transfer closed with outstanding read data") and logged a 499."""
    access = tmp_path / "access.log"
    server = Server(_sqlite(tmp_path), tmp_path, ["--access-log", str(access)]).start()
    assert server.proc is not None
    try:
        assert httpx.put(f"{server.url}/v1/stream/s", content=b"hello").status_code == 201
        events: list[str] = []
        ended: list[object] = []

        def read() -> None:
            try:
                with httpx.stream(
                    "GET", f"{server.url}/v1/stream/s?offset=-1&live=sse", timeout=30
                ) as answer:
                    for line in answer.iter_lines():
                        events.append(line)
                ended.append("whole")
            except httpx.HTTPError as exc:
                ended.append(type(exc).__name__)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not any(e.startswith("event: control") for e in events):
            assert time.monotonic() < deadline, events
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        reader.join(15)
        assert ended == ["whole"], ended
        assert server.proc.wait(10) == 0, server.log()
    finally:
        server.kill()
    lines = [line for line in access.read_text().splitlines() if "live=sse" in line]
    assert len(lines) == 1 and '" 200 ' in lines[0], lines


def test_backup_copies_a_running_servers_database_whole(tmp_path: Path) -> None:
    """The README said to back the database up before an upgrade and never said how; the
    obvious copy of a running server's file missed everything still in its WAL (all of it,
    until a checkpoint), and a server started on it served an empty database. ``stations
    backup`` copies it whole while the server writes on, and the copy serves every message
    and remembers every message id."""
    data = tmp_path / "data"
    server = Server(f"sqlite:///{data / 'stations.db'}", tmp_path).start()
    copy = tmp_path / "copy.db"
    try:
        assert httpx.post(f"{server.url}/api/stations", json={"name": "orders"}).is_success
        body = {"messages": [{"id": f"order-{n}", "data": {"n": n}} for n in range(500)]}
        assert httpx.post(f"{server.url}/api/stations/orders/messages", json=body).is_success
        proc = run_cli(["backup", str(copy), "--db", f"sqlite:///{data / 'stations.db'}"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"copied {data / 'stations.db'} to {copy} (")
        refused = run_cli(
            ["backup", str(copy), "--db", f"sqlite:///{data / 'stations.db'}"], tmp_path
        )
        assert_one_line_error(refused, f"{copy} exists: give a new file")
        assert refused.returncode == 2
    finally:
        server.kill()  # kill -9: the WAL is left as it was
    assert oct(copy.stat().st_mode & 0o777) == oct(0o600)
    restored = Server(f"sqlite:///{copy}", tmp_path).start()
    try:
        view = httpx.get(f"{restored.url}/api/stations/orders").json()
        assert view["stats"]["messages"] == 500 and view["stats"]["idsInWindow"] == 500
        again = {"messages": [{"id": "order-7", "data": {"n": 7}}]}
        answer = httpx.post(f"{restored.url}/api/stations/orders/messages", json=again).json()
        assert answer["results"][0]["duplicate"] is True
    finally:
        restored.stop()
    pg = run_cli(
        ["backup", str(tmp_path / "pg.db"), "--db", "postgresql://u@127.0.0.1/x"], tmp_path
    )
    assert_one_line_error(pg, "for PostgreSQL use pg_dump")
