"""The management CLI (``stations station|produce|read|tail|group|dls``) against a live server:
each command's table and ``--json`` output, and the documented exit codes (0 ok, 1 refused,
2 usage, 3 not found, 4 conflict, 5 auth, 6 server error or unreachable)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stations import __version__
from tests import clikit
from tests.clikit import as_json, failed, ok
from tests.harness import Server, free_port

ADMIN = "admin-secret-0123456789"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir: Path = tmp_path_factory.mktemp("cli")
    tokens = workdir / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}]}))
    url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    server = Server(url, workdir, ["--tokens", str(tokens)]).start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def http(srv: Server) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=10) as client:
        yield client


def cli(
    srv: Server | None, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if srv is None:
        return clikit.run(*args, stdin=stdin, env=env)
    return clikit.run(*args, url=srv.url, token=ADMIN, stdin=stdin, env=env)


def json_lines(proc: subprocess.CompletedProcess[str]) -> list[Any]:
    return [json.loads(line) for line in ok(proc).splitlines()]


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_version() -> None:
    assert ok(cli(None, "--version")).strip() == f"stations {__version__}"


def test_every_option_has_help() -> None:
    """``serve``, every management command and the ``pipeline`` jobs."""
    import argparse

    from stations import cli as cli_module
    from stations import commands
    from stations.spark import pipeline

    parser = cli_module._Parser(prog="stations")
    sub = parser.add_subparsers(dest="command")
    cli_module.serve_parser(sub)
    commands.add_parsers(sub)
    pipeline.add_parser(sub)

    def walk(p: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}")
            elif not action.help:
                yield path, "/".join(action.option_strings) or action.dest

    assert list(walk(parser, "stations")) == []


def test_station_commands(srv: Server) -> None:
    assert ok(cli(srv, "station", "create", "cli-orders", "--window", "10m")).strip() == (
        "station cli-orders created"
    )
    again = as_json(cli(srv, "station", "create", "cli-orders", "--window", "10m", "--json"))
    assert again["created"] is False and again["idempotencyWindowMs"] == 600_000
    failed(
        cli(srv, "station", "create", "cli-orders", "--window", "5m"),
        4,
        "idempotencyWindowMs = 600000, not 300000",
    )
    failed(cli(srv, "station", "create", "bad name!"), 1, "name")
    failed(cli(srv, "station", "create", "x", "--window", "soon"), 2, "--window")

    rows = table(ok(cli(srv, "station", "ls")))
    assert rows[0] == ["NAME", "TYPE", "MESSAGES", "BYTES", "IDS", "GROUPS", "DLS", "WINDOW"]
    assert ["cli-orders", "application/json", "0", "0", "0", "0", "0", "10m"] in rows
    listed = as_json(cli(srv, "station", "ls", "--json"))
    assert "cli-orders" in [s["name"] for s in listed]

    shown = ok(cli(srv, "station", "show", "cli-orders"))
    assert "Idempotency window:" in shown and "10m" in shown
    edited = as_json(
        cli(
            srv, "station", "edit", "cli-orders", "--window", "1h", "--max-messages", "50", "--json"
        )
    )
    assert edited["idempotencyWindowMs"] == 3_600_000
    assert edited["retention"]["maxMessages"] == 50
    assert as_json(cli(srv, "station", "show", "cli-orders", "--json"))["retention"] == {
        "maxAgeMs": None,
        "maxMessages": 50,
        "maxBytes": None,
    }
    failed(cli(srv, "station", "edit", "cli-orders"), 2, "nothing to change")

    assert ok(cli(srv, "station", "delete", "cli-orders")).strip() == "station cli-orders deleted"
    failed(cli(srv, "station", "show", "cli-orders"), 3, "station cli-orders not found")
    failed(cli(srv, "station", "delete", "cli-orders", "--json"), 3)


def test_produce_from_arguments_and_stdin(srv: Server, http: httpx.Client) -> None:
    ok(cli(srv, "station", "create", "cli-produce"))
    rows = table(
        ok(
            cli(
                srv,
                "produce",
                "cli-produce",
                '{"n":1}',
                '{"n":2}',
                "--msg-id",
                "a",
                "--msg-id",
                "b",
            )
        )
    )
    assert rows == [
        ["OFFSET", "ID", "DUPLICATE"],
        ["0000000000000000_0000000000000000", "a", "no"],
        ["0000000000000001_0000000000000000", "b", "no"],
    ]
    again = json_lines(cli(srv, "produce", "cli-produce", '{"n":1}', "--msg-id", "a", "--json"))
    assert again == [{"offset": "0000000000000000_0000000000000000", "id": "a", "duplicate": True}]

    lines = "".join(json.dumps({"k": k, "v": i}) + "\n" for i, k in enumerate("xyxz"))
    results = json_lines(
        cli(
            srv, "produce", "cli-produce", "--id-field", "k", "-H", "src=cli", "--json", stdin=lines
        )
    )
    assert [(r["id"], r["duplicate"]) for r in results] == [
        ("x", False),
        ("y", False),
        ("x", True),
        ("z", False),
    ]
    stored = http.get("/api/stations/cli-produce/messages").json()["messages"]
    assert [m["data"] for m in stored] == [
        {"n": 1},
        {"n": 2},
        {"k": "x", "v": 0},
        {"k": "y", "v": 1},
        {"k": "z", "v": 3},
    ]
    assert stored[2]["headers"] == {"src": "cli"}

    failed(cli(srv, "produce", "cli-produce", "not json"), 2, "argument 1 is not JSON")
    failed(cli(srv, "produce", "cli-produce", "1", "2", "--msg-id", "a"), 2, "--msg-id")
    failed(cli(srv, "produce", "no-such-station", "1"), 3, "station no-such-station not found")

    ok(cli(srv, "station", "create", "cli-text", "--content-type", "text/plain"))
    ok(cli(srv, "produce", "cli-text", stdin="hello\nworld\n"))
    texts = json_lines(cli(srv, "read", "cli-text", "--json"))
    assert [m["data"] for m in texts] == ["hello", "world"]


def test_read_shows_control_characters_escaped(srv: Server, http: httpx.Client) -> None:
    """``read`` and ``tail`` printed a text station's payloads raw: whoever could produce to
    it sent escape sequences to the reader's terminal (clear the screen, retitle the window,
    write the clipboard) and, with a newline, forged lines of the output. ``--json`` stays
    exact."""
    ok(cli(srv, "station", "create", "cli-escapes", "--content-type", "text/plain"))
    payload = "before\x1b]0;PWNED\x07\x1b[2Jafter\nforged  line\u202eevil\x9b"
    answer = http.post(
        "/v1/stream/cli-escapes",
        content=payload.encode(),
        headers={"Content-Type": "text/plain"},
    )
    assert answer.status_code == 204, answer.text
    shown = ok(cli(srv, "read", "cli-escapes"))
    assert shown.count("\n") == 1 and "\x1b" not in shown and "\u202e" not in shown
    assert shown.split("  ", 2)[2].rstrip("\n") == (
        "before\\x1b]0;PWNED\\x07\\x1b[2Jafter\\nforged  line\\u202eevil\\x9b"
    )
    assert [m["data"] for m in json_lines(cli(srv, "read", "cli-escapes", "--json"))] == [payload]


def test_read_and_tail(srv: Server) -> None:
    ok(cli(srv, "station", "create", "cli-read"))
    ok(
        cli(
            srv,
            "produce",
            "cli-read",
            "1",
            "2",
            "3",
            "--msg-id",
            "a",
            "--msg-id",
            "b",
            "--msg-id",
            "c",
        )
    )
    everything = json_lines(cli(srv, "read", "cli-read", "--json"))
    assert [(m["id"], m["data"]) for m in everything] == [("a", 1), ("b", 2), ("c", 3)]
    rows = table(ok(cli(srv, "read", "cli-read", "-n", "2")))
    assert rows == [
        ["0000000000000000_0000000000000000", "a", "1"],
        ["0000000000000001_0000000000000000", "b", "2"],
    ]
    second = everything[1]["offset"]  # a message's offset reads from that message on
    from_second = json_lines(cli(srv, "read", "cli-read", "--from", second, "--json"))
    assert [m["data"] for m in from_second] == [2, 3]
    failed(cli(srv, "read", "no-such-station"), 3)

    # tail follows: it prints what arrives after it started, then stops at -n.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    env.update(STATIONS_URL=srv.url, STATIONS_TOKEN=ADMIN)
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stations",
            "tail",
            "cli-read",
            "-n",
            "2",
            "--json",
            "--from",
            "0000000000000003_0000000000000000",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ok(cli(srv, "produce", "cli-read", "4"))
        assert tail.stdout is not None
        first = json.loads(tail.stdout.readline())
        assert first["data"] == 4
        assert tail.poll() is None  # still following
        ok(cli(srv, "produce", "cli-read", "5"))
        out, err = tail.communicate(timeout=30)
        assert tail.returncode == 0, err
        assert [json.loads(line)["data"] for line in out.splitlines()] == [5]
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()


def _group_with_traffic(http: httpx.Client, station: str) -> None:
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    messages = [{"data": i} for i in range(5)]
    assert http.post(f"/api/stations/{station}/messages", json={"messages": messages}).is_success
    assert http.put(f"/api/stations/{station}/groups/g1", json={}).status_code == 201
    fetched = http.post(f"/api/stations/{station}/groups/g1/fetch", json={"max": 2}).json()
    assert len(fetched["messages"]) == 2


def test_group_commands(srv: Server, http: httpx.Client) -> None:
    _group_with_traffic(http, "cli-groups")
    rows = table(ok(cli(srv, "group", "ls", "cli-groups")))
    assert rows[0] == [
        "NAME",
        "PENDING",
        "IN-FLIGHT",
        "LAG",
        "DLS",
        "MAX-ACK",
        "MAX-DELIVERIES",
        "CURSOR",
    ]
    assert rows[1][:7] == ["g1", "3", "2", "3", "0", "30s", "2"]
    (listed,) = as_json(cli(srv, "group", "ls", "cli-groups", "--json"))
    assert (listed["name"], listed["pending"], listed["inFlight"], listed["lag"]) == ("g1", 3, 2, 3)
    shown = as_json(cli(srv, "group", "show", "cli-groups", "g1", "--json"))
    assert shown == listed
    assert "In flight:" in ok(cli(srv, "group", "show", "cli-groups", "g1"))
    failed(cli(srv, "group", "show", "cli-groups", "nope"), 3, "group nope not found")
    failed(cli(srv, "group", "ls", "no-such-station"), 3)
    failed(cli(srv, "group", "seek", "cli-groups", "g1"), 2, "--to")
    failed(cli(srv, "group", "seek", "cli-groups", "g1", "--time", "yesterday"), 2, "--time")
    failed(cli(srv, "group", "seek", "cli-groups", "g1", "--time", "\u00b2"), 2, "--time")
    failed(cli(srv, "group", "seek", "cli-groups", "g1", "--to", "bogus"), 1, "to")
    failed(cli(srv, "group", "seek", "cli-groups", "nope", "--to", "now"), 3)

    seeked = as_json(cli(srv, "group", "seek", "cli-groups", "g1", "--to", "earliest", "--json"))
    assert seeked == {"cursor": "0000000000000000_0000000000000000", "revoked": 2, "dropped": 0}
    after = as_json(cli(srv, "group", "show", "cli-groups", "g1", "--json"))
    assert (after["lag"], after["inFlight"]) == (5, 0)
    now = ok(cli(srv, "group", "seek", "cli-groups", "g1", "--time", "2999-01-01T00:00:00Z"))
    assert now.strip() == (
        "group g1 on cli-groups now at 0000000000000005_0000000000000000 "
        "(0 leases revoked, 0 redeliveries dropped)"
    )
    assert as_json(cli(srv, "group", "show", "cli-groups", "g1", "--json"))["lag"] == 0

    assert "deleted" in ok(cli(srv, "group", "delete", "cli-groups", "g1"))
    failed(cli(srv, "group", "delete", "cli-groups", "g1"), 3)


def test_group_delete(srv: Server, http: httpx.Client) -> None:
    _group_with_traffic(http, "cli-groups-delete")
    assert as_json(cli(srv, "group", "delete", "cli-groups-delete", "g1", "--json")) == {
        "deleted": "g1",
        "station": "cli-groups-delete",
    }
    assert as_json(cli(srv, "group", "ls", "cli-groups-delete", "--json")) == []
    failed(cli(srv, "group", "delete", "cli-groups-delete", "g1"), 3, "group g1 not found")


def test_dls_commands(srv: Server, http: httpx.Client) -> None:
    _group_with_traffic(http, "cli-dls")
    leased = http.post("/api/stations/cli-dls/groups/g1/fetch", json={"max": 3}).json()["messages"]
    offsets = [m["offset"] for m in leased]
    dead = http.post(
        "/api/stations/cli-dls/groups/g1/dead-letter", json={"offsets": offsets, "reason": "bad"}
    )
    assert dead.json()["deadLettered"] == 3
    entries = as_json(cli(srv, "dls", "ls", "cli-dls", "--json"))
    assert [(e["data"], e["group"], e["error"]) for e in entries] == [
        (2, "g1", "bad"),
        (3, "g1", "bad"),
        (4, "g1", "bad"),
    ]
    first_two = cli(srv, "dls", "ls", "cli-dls", "-n", "2")
    assert first_two.returncode == 0, first_two.stderr
    assert first_two.stderr.startswith("stations: 2 shown, more after ID "), first_two.stderr
    rows = table(first_two.stdout)
    assert rows[0] == ["ID", "GROUP", "OFFSET", "DELIVERIES", "REASON", "ERROR", "DATA"]
    assert len(rows) == 3
    assert as_json(cli(srv, "dls", "replay", "cli-dls", entries[0]["id"], "--json")) == {
        "replayed": 1
    }
    assert ok(cli(srv, "dls", "drop", "cli-dls", "--all")).strip() == "2 dead letters dropped"
    assert as_json(cli(srv, "dls", "ls", "cli-dls", "--json")) == []
    failed(cli(srv, "dls", "replay", "cli-dls"), 2, "--all")
    failed(cli(srv, "dls", "ls", "no-such-station"), 3)
    failed(cli(srv, "dls", "ls", "cli-dls", "--group", "g9"), 3, "group g9 not found")
    # Replaying a misspelt group's dead letters said "0 dead letters replayed", exit 0.
    failed(cli(srv, "dls", "replay", "cli-dls", "--all", "--group", "g9"), 3, "group g9 not found")
    assert as_json(cli(srv, "dls", "ls", "cli-dls", "--group", "g1", "--json")) == []


def test_auth_and_connection_exit_codes(srv: Server) -> None:
    failed(cli(srv, "station", "ls", env={"STATIONS_TOKEN": ""}), 5)
    failed(cli(srv, "station", "ls", "--token", "wrong-token-0123456789"), 5)
    nobody = f"http://127.0.0.1:{free_port()}"
    failed(cli(None, "station", "ls", "--url", nobody), 6, f"cannot reach {nobody}")
    failed(cli(None, "station", "frobnicate"), 2, "frobnicate")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--url", "http://127.0.0.1:99999", "--url"),
        ("--url", "http://[::1", "--url"),
        ("--url", "notaurl", "--url"),
        ("--token", "abc\ndef", "--token"),  # read from a file with its line end
        ("--token", "h\u00e9llo", "--token"),
        ("--timeout", "-1", "--timeout"),
    ],
)
def test_bad_connection_options_are_usage_errors(option: str, value: str, fragment: str) -> None:
    """Each was a Python traceback (exit 1) or "cannot reach" (exit 6) before (review)."""
    failed(cli(None, "station", "ls", option, value), 2, fragment)


def test_produce_failing_midway_says_what_was_stored(srv: Server, http: httpx.Client) -> None:
    """Stdin goes out in batches: a bad line after some were stored printed only the error,
    with exit 2 ("the server never saw it"), and a run again stored those again (review)."""
    ok(cli(srv, "station", "create", "cli-partial"))
    lines = "".join(f'{{"n": {k}}}\n' for k in range(549)) + "oops\n" + '{"n": 550}\n'
    proc = cli(srv, "produce", "cli-partial", stdin=lines)
    stored = http.get("/api/stations/cli-partial").json()["stats"]["messages"]
    assert 0 < stored < 550
    line = failed(proc, 1, "line 550", f"the first {stored} messages were stored")
    assert f"through offset {stored - 1:016d}_" in line
    listed = table(proc.stdout)
    assert listed[0] == ["OFFSET", "ID", "DUPLICATE"] and len(listed) == stored + 1


def _environment(srv: Server) -> dict[str, str]:
    """This process's environment for a CLI run of its own, pointed at ``srv``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    environment.update(STATIONS_URL=srv.url, STATIONS_TOKEN=ADMIN, PYTHONFAULTHANDLER="1")
    return environment


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["table", "json"])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(
    srv: Server, http: httpx.Client, output: list[str]
) -> None:
    """``stations read s | head -1`` printed a BrokenPipeError traceback and exited 1 (a
    refusal, by the documented codes). Now it ends quietly with 141, as tools killed by
    SIGPIPE do in a shell."""
    ok(cli(srv, "station", "create", "cli-pipe"))
    body = {"messages": [{"data": i} for i in range(5000)]}
    assert http.post("/api/stations/cli-pipe/messages", json=body).status_code == 200
    environment = _environment(srv)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "read", "cli-pipe", *output],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does after its line
    assert proc.wait(60) == 141
    assert proc.stderr.read() == b""


def test_output_that_cannot_be_written_is_one_line_and_its_own_code(
    srv: Server, http: httpx.Client
) -> None:
    """``stations read s > /dev/full`` (a full disk) printed a traceback and exited 1, a
    refusal by the documented codes."""
    ok(cli(srv, "station", "create", "cli-full"))
    body = {"messages": [{"data": i} for i in range(3000)]}
    assert http.post("/api/stations/cli-full/messages", json=body).status_code == 200
    environment = _environment(srv)
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "stations", "read", "cli-full"],
            env=environment,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.splitlines() == [
        "stations: error: cannot write the output: No space left on device"
    ]


def _interrupt_signals_as_in_a_terminal() -> None:
    # A command run from a terminal's foreground gets Ctrl-C's SIGINT and SIGQUIT at their
    # defaults. A process started with them ignored keeps them ignored (so does Python, which
    # then installs no KeyboardInterrupt), and a suite started as a shell's background job
    # has them ignored: three such runs started produce so (SigIgn held SIGINT and SIGQUIT)
    # whenever the test worker had not installed a handler of its own, and it never heard
    # the test's SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _producer(srv: Server, station: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "stations", "produce", station],
        env=_environment(srv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_interrupt_signals_as_in_a_terminal,
    )


def _wait_or_say_why(proc: subprocess.Popen[bytes], seconds: float) -> int:
    """``proc.wait(seconds)``; past it, a failure that shows the process's signal masks and
    every thread's stack (it runs with PYTHONFAULTHANDLER, so SIGABRT prints them)."""
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        masks = [
            line
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
        ]
        proc.send_signal(signal.SIGABRT)
        proc.wait(10)
        assert proc.stderr is not None
        said = proc.stderr.read().decode(errors="replace")
        raise AssertionError(f"still running {seconds} s later; {masks}\n{said}") from None


def _stored(http: httpx.Client, station: str, want: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        count = int(http.get(f"/api/stations/{station}").json()["stats"]["messages"])
        if count >= want or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_produce_sends_stdin_lines_as_they_come(srv: Server, http: httpx.Client) -> None:
    """Nothing was sent until 500 lines had come or stdin ended: ``tail -f app.log |
    stations produce logs`` stored nothing for as long as that took."""
    ok(cli(srv, "station", "create", "cli-live"))
    proc = _producer(srv, "cli-live")
    assert proc.stdin is not None
    try:
        proc.stdin.write(b'{"n": 1}\n')
        proc.stdin.flush()
        assert _stored(http, "cli-live", 1, 10) == 1  # while stdin is still open
        proc.stdin.write(b'{"n": 2}\n{"n": 3}\n')
        proc.stdin.flush()
        assert _stored(http, "cli-live", 3, 10) == 3
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    stored = json_lines(cli(srv, "read", "cli-live", "--json"))
    assert [m["data"] for m in stored] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_one_ctrl_c_ends_produce_and_says_what_was_stored(srv: Server, http: httpx.Client) -> None:
    """The first Ctrl-C was not heard (stdin was read on the event loop, and the read went on),
    and the second ended it silently: the lines already read were dropped and nothing said
    what had been stored, which a run again without ids would store twice."""
    ok(cli(srv, "station", "create", "cli-sigint"))
    proc = _producer(srv, "cli-sigint")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(b"".join(b'{"n": %d}\n' % n for n in range(600)))
        proc.stdin.flush()
        assert _stored(http, "cli-sigint", 600, 15) == 600
        proc.send_signal(signal.SIGINT)  # once, stdin still open
        assert _wait_or_say_why(proc, 15) == 130
    finally:
        proc.kill()
    err = proc.stderr.read().decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "stations: interrupted: the first 600 messages were stored (through offset "
        "0000000000000599_"
    ), err
    assert len(table(proc.stdout.read().decode())) == 601  # the header and every message


def test_a_stdin_that_fails_to_read_is_no_end_of_input(srv: Server, http: httpx.Client) -> None:
    """A read of stdin that failed (EIO, or EAGAIN on a non-blocking pipe) ended the input as
    if it were its end: what came before was stored, the rest never read, and the command
    exited 0 after a traceback."""
    ok(cli(srv, "station", "create", "cli-eagain"))
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # the read after the lines written fails with EAGAIN
    os.write(write_end, b'{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "stations", "produce", "cli-eagain"],
            env=_environment(srv),
            stdin=read_end,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    stored = _stored(http, "cli-eagain", 3, 5)
    line = failed(proc, 1 if stored else 2, "reading stdin failed")
    if stored:
        assert f"the first {stored} messages were stored" in line


def test_the_token_can_come_from_a_file(srv: Server, tmp_path: Path) -> None:
    """The token could be given only on the command line, which every local user sees (ps),
    or in the environment."""
    secret = tmp_path / "token"
    secret.write_text(ADMIN + "\n")
    listed = cli(None, "station", "ls", "--url", srv.url, "--token-file", str(secret), "--json")
    assert isinstance(json.loads(ok(listed)), list)
    # The file wins over $STATIONS_TOKEN; --token and --token-file together are refused.
    wrong = {"STATIONS_TOKEN": "not-the-token-0123"}
    args = ("station", "ls", "--url", srv.url, "--token-file", str(secret))
    ok(cli(None, *args, env=wrong))
    failed(cli(None, *args, "--token", ADMIN), 2, "not allowed with argument")
    missing = str(tmp_path / "nothing")
    failed(
        cli(None, "station", "ls", "--url", srv.url, "--token-file", missing),
        2,
        f"--token-file {missing}: No such file or directory",
    )


def test_list_is_ls(srv: Server, http: httpx.Client) -> None:
    """``stations --help`` says "station: list, show, ..." and ``nats`` takes both words, but
    ``stations station list`` was "invalid choice: 'list'"."""
    ok(cli(srv, "station", "create", "cli-list"))
    assert as_json(cli(srv, "station", "list", "--json")) == as_json(
        cli(srv, "station", "ls", "--json")
    )
    assert as_json(cli(srv, "group", "list", "cli-list", "--json")) == []
    assert as_json(cli(srv, "dls", "list", "cli-list", "--json")) == []


@pytest.mark.parametrize("limit", ["0", "-1"])
@pytest.mark.parametrize("command", ["read", "tail"])
def test_a_limit_below_one_is_a_usage_error(srv: Server, command: str, limit: str) -> None:
    """``read -n 0`` (or ``-n -1``) printed nothing and exited 0 without asking the server,
    so ``stations read no-such-station -n 0`` said the station was there."""
    failed(cli(srv, command, "no-such-station", "-n", limit), 2, "-n/--limit")


def test_produce_fits_a_server_that_takes_fewer_messages_per_request(
    tmp_path: Path,
) -> None:
    """Stdin went out in batches of 500: a server started with ``--max-append-messages 50``
    refused each one (400 naming ``messages``), so a long stdin run stored nothing. A batch
    refused for its size is now sent again in smaller ones (a refusal stores nothing), and
    ``--batch N`` sets the size from the start."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}]}))
    url = f"sqlite:///{tmp_path / 'stations.db'}"
    small = Server(url, tmp_path, ["--tokens", str(tokens), "--max-append-messages", "50"])
    small.start()
    try:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=small.url, headers=headers, timeout=10) as http:
            ok(cli(small, "station", "create", "cli-small"))
            lines = "".join(f'{{"n": {n}}}\n' for n in range(1000))
            results = json_lines(cli(small, "produce", "cli-small", "--json", stdin=lines))
            assert len(results) == 1000
            offsets = [r["offset"] for r in results]
            assert offsets == sorted(offsets) and len(set(offsets)) == 1000
            assert not any(r["duplicate"] for r in results)
            page = http.get("/api/stations/cli-small/messages", params={"limit": "1000"}).json()
            assert [m["data"] for m in page["messages"]] == [{"n": n} for n in range(1000)]
            assert [m["offset"] for m in page["messages"]] == offsets

            ok(cli(small, "station", "create", "cli-small-text", "--content-type", "text/plain"))
            texts = "".join(f"line {n}\n" for n in range(120))
            listed = table(ok(cli(small, "produce", "cli-small-text", "--batch", "7", stdin=texts)))
            assert listed[0] == ["OFFSET", "ID", "DUPLICATE"] and len(listed) == 121
            page = http.get("/api/stations/cli-small-text/messages", params={"limit": "1000"})
            assert [m["data"] for m in page.json()["messages"]] == [f"line {n}" for n in range(120)]

            for bad in ("0", "-3", "x"):
                failed(cli(small, "produce", "cli-small", "--batch", bad, "1"), 2, "--batch")
            assert http.get("/api/stations/cli-small").json()["stats"]["messages"] == 1000
    finally:
        small.kill()


def test_produce_halves_a_request_over_the_servers_body_limit(
    srv: Server, http: httpx.Client
) -> None:
    """200 lines of 600 KB went out as one request of 120 MB, which the server refuses (413,
    over its 64 MiB per request): the command failed and stored nothing. A request refused
    for its size is now sent again in halves (a refusal stores nothing)."""
    ok(cli(srv, "station", "create", "cli-big"))
    pad = "x" * 600_000
    lines = "".join(f'{{"i": {i}, "pad": "{pad}"}}\n' for i in range(200))
    results = json_lines(cli(srv, "produce", "cli-big", "--json", stdin=lines))
    offsets = [r["offset"] for r in results]
    assert len(offsets) == 200 and offsets == sorted(set(offsets))
    assert not any(r["duplicate"] for r in results)
    assert http.get("/api/stations/cli-big").json()["stats"]["messages"] == 200
    for k in (0, 199):
        page = http.get(
            "/api/stations/cli-big/messages", params={"offset": offsets[k], "limit": "1"}
        ).json()
        assert page["messages"][0]["data"]["i"] == k


def test_produce_sends_stdin_lines_that_are_not_utf8_as_bytes(
    srv: Server, http: httpx.Client
) -> None:
    """In a strict UTF-8 locale a line that is not UTF-8 was a traceback (in a lenient one, a
    lone surrogate the server refused): a binary station stores its bytes, a JSON station's
    refusal is a usage error."""
    ok(cli(srv, "station", "create", "cli-bytes", "--content-type", "application/octet-stream"))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    environment.update(STATIONS_URL=srv.url, STATIONS_TOKEN=ADMIN, PYTHONIOENCODING="utf-8")

    def produce(station: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "stations", "produce", station],
            input=b"ab\xffcd\nplain\n",
            env=environment,
            capture_output=True,
            timeout=60,
        )

    done = produce("cli-bytes")
    assert done.returncode == 0, done.stderr
    assert http.get("/v1/stream/cli-bytes", params={"offset": "-1"}).content == b"ab\xffcdplain"
    ok(cli(srv, "station", "create", "cli-bytes-json"))
    refused = produce("cli-bytes-json")
    assert refused.returncode == 2, refused.stderr
    assert b"line 1 is not UTF-8" in refused.stderr and b"Traceback" not in refused.stderr


def test_a_url_that_is_not_a_stations_server_is_one_clear_error(tmp_path: Path) -> None:
    """A 200 that is not JSON (a proxy's page, a login form) was a JSONDecodeError traceback."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            body = b"<html>please log in</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        stderr = failed(cli(None, "station", "ls", "--url", url), 6, "not JSON")
        assert "Stations server" in stderr
    finally:
        server.shutdown()
        server.server_close()


def test_stdin_read_on_after_the_command_ended_prints_nothing() -> None:
    """produce ended on an error (line 1 not UTF-8 on a JSON station) while its stdin thread
    still read: waking the closed event loop raised in the thread, and its traceback followed
    the command's own error (seen once in a loaded CI run)."""
    import asyncio
    import threading

    from stations.commands.produce import _StdinLines

    read, write = os.pipe()

    async def start() -> _StdinLines:
        return _StdinLines(read, 1)

    loop = asyncio.new_event_loop()
    lines = loop.run_until_complete(start())
    loop.close()  # the command is over
    raised: list[BaseException | None] = []
    before = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)
    try:
        os.write(write, b"one\ntwo\n")
        os.close(write)
        lines.thread.join(10)
    finally:
        threading.excepthook = before
        os.close(read)
    assert not lines.thread.is_alive()
    assert raised == []
