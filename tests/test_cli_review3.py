"""The management CLI, as a second review found it, against one live server:

- ``--`` ends the options of every command (a station named ``-b``): with options allowed after
  positional arguments, CPython's intermixed parse dropped the ``--``;
- ``station edit|delete --created-at TIME``: only the station created then (exit 4 for one
  deleted and created again since);
- a command that reads stdin, started with stdin closed (``<&-``), is a usage error in one line
  (it was an ``AttributeError`` traceback);
- ``group create`` names the option a refused value came from (``--from``), not the JSON field;
- ``dls ls`` says on stderr when entries were left out and takes ``--after ID``;
- ``read`` that falls behind retention mid-read says so instead of blaming ``--from``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests import clikit
from tests.harness import Server
from tests.module_server import module_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def _env(srv: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    env["STATIONS_URL"] = srv.url
    return env


def cli(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return clikit.run(*args, env=_env(srv))


# -- -- ends the options -----------------------------------------------------------------------


def test_a_station_named_with_a_dash_can_be_named_after_double_dash(srv: Server) -> None:
    made = cli(srv, "station", "create", "--", "-b")
    assert made.returncode == 0, made.stderr
    shown = cli(srv, "station", "show", "--json", "--", "-b")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == "-b"
    # options before the positional, data after --, one starting with a dash
    produced = cli(srv, "produce", "--json", "--msg-id", "m1", "--", "-b", '"-x"')
    assert produced.returncode == 0, produced.stderr
    read = cli(srv, "read", "--json", "--", "-b")
    assert read.returncode == 0, read.stderr
    assert [json.loads(line)["data"] for line in read.stdout.splitlines()] == ["-x"]
    # without --, -b is an option (unknown): a usage error
    assert cli(srv, "station", "show", "-b", "--json").returncode == 2


# -- station edit|delete --created-at ------------------------------------------------------------


def _created(srv: Server, name: str) -> str:
    made = cli(srv, "station", "create", name, "--json")
    assert made.returncode == 0, made.stderr
    created: str = json.loads(made.stdout)["createdAt"]
    return created


def test_edit_and_delete_name_the_station_they_mean(srv: Server) -> None:
    old = _created(srv, "ca")
    assert cli(srv, "station", "delete", "ca").returncode == 0
    new = _created(srv, "ca")
    while new == old:  # createdAt is to the millisecond
        assert cli(srv, "station", "delete", "ca").returncode == 0
        new = _created(srv, "ca")
    edit = cli(srv, "station", "edit", "ca", "--window", "5s", "--created-at", old)
    assert edit.returncode == 4, edit.stderr
    assert edit.stderr.startswith("stations: error: --created-at: "), edit.stderr
    delete = cli(srv, "station", "delete", "ca", "--created-at", old)
    assert delete.returncode == 4, delete.stderr
    shown = json.loads(cli(srv, "station", "show", "ca", "--json").stdout)
    assert shown["createdAt"] == new and shown["idempotencyWindowMs"] == 120_000
    assert cli(srv, "station", "edit", "ca", "--window", "5s", "--created-at", new).returncode == 0
    assert cli(srv, "station", "delete", "ca", "--created-at", new).returncode == 0


# -- a closed stdin ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["produce", "s"], "no messages: give DATA arguments"),
        (["group", "nack", "s", "g", "--leases-from", "-"], "--leases-from -: stdin is closed"),
    ],
)
def test_a_closed_stdin_is_a_usage_error(srv: Server, args: list[str], said: str) -> None:
    command = shlex.join([sys.executable, "-m", "stations", *args])
    done = subprocess.run(
        ["bash", "-c", f"exec {command} <&-"],
        env=_env(srv),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr


# -- group create names --from -------------------------------------------------------------------


def test_a_from_past_the_tail_is_said_of_from(srv: Server, http: httpx.Client) -> None:
    assert http.post("/api/stations", json={"name": "go"}).status_code == 201
    past = "0000000000000099_0000000000000000"
    done = cli(srv, "group", "create", "go", "g", "--from", past)
    assert done.returncode != 0, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"stations: error: --from {past}: "), line
    assert "startFrom" not in line, line


# -- dls ls pages --------------------------------------------------------------------------------


def test_a_dls_page_says_more_are_left_out_and_the_next_goes_on(
    srv: Server, http: httpx.Client
) -> None:
    assert http.post("/api/stations", json={"name": "dl"}).status_code == 201
    base = "/api/stations/dl"
    http.post(f"{base}/messages", json={"messages": [{"data": n} for n in range(5)]})
    assert http.put(f"{base}/groups/g", json={}).status_code == 201
    got = http.post(f"{base}/groups/g/fetch", json={"max": 5, "consumer": "c"}).json()
    offsets = [m["offset"] for m in got["messages"]]
    dead = http.post(f"{base}/groups/g/dead-letter", json={"offsets": offsets})
    assert dead.json()["deadLettered"] == 5, dead.text

    def dls_ls(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(srv, "dls", "ls", "dl", "--json", *args)

    first = dls_ls("-n", "2")
    assert first.returncode == 0, first.stderr
    ids = [e["id"] for e in json.loads(first.stdout)]
    assert len(ids) == 2
    last = ids[-1]
    assert first.stderr == (
        f"stations: 2 shown, more after ID {last} (--after {last}, or a larger --limit)\n"
    )
    rest = dls_ls("--after", str(last))
    assert rest.returncode == 0, rest.stderr
    assert len(json.loads(rest.stdout)) == 3
    assert rest.stderr == ""  # the last page: nothing left out
    whole = dls_ls()
    assert len(json.loads(whole.stdout)) == 5 and whole.stderr == ""
    bad = dls_ls("--after", "x")
    assert bad.returncode == 2 and "--after takes a dead letter's ID" in bad.stderr, bad.stderr


# -- read behind retention -----------------------------------------------------------------------


def _produce(http: httpx.Client, first: int, count: int) -> None:
    for start in range(first, first + count, 200):
        body = {"messages": [{"data": f"{n:06d}" + "x" * 1000} for n in range(start, start + 200)]}
        assert http.post("/api/stations/rr/messages", json=body).status_code == 200


def test_a_read_that_falls_behind_retention_says_so_not_that_from_was_wrong(
    srv: Server, http: httpx.Client
) -> None:
    made = http.post("/api/stations", json={"name": "rr", "retention": {"maxMessages": 600}})
    assert made.status_code == 201, made.text
    _produce(http, 0, 600)
    reader = subprocess.Popen(
        [sys.executable, "-m", "stations", "read", "rr"],
        env=_env(srv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert reader.stdout is not None and reader.stderr is not None
        # Its first page (500 messages, ~500 kB) is being written: the pipe is full and the read
        # stops there until this end reads it.
        assert reader.stdout.read(1000)
        _produce(http, 600, 1200)  # retention drops offsets 0 to 1199, page 2 included
        deadline = time.monotonic() + 30
        while True:
            page = http.get(
                "/api/stations/rr/messages", params={"offset": "-1", "limit": "1"}
            ).json()
            if page["messages"][0]["data"].startswith("001200"):
                break
            assert time.monotonic() < deadline, page["messages"][0]["data"][:6]
            time.sleep(0.1)
        reader.stdout.read()
        err = reader.stderr.read().decode()
        assert reader.wait(30) == 3, err
    finally:
        reader.kill()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--from" not in lines[0], lines[0]
    assert "the read reached offset" in lines[0] and "after retention dropped it" in lines[0]
