"""``--`` ends the options of every command, so a station whose name starts with ``-`` can be
named: with options allowed after positional arguments (b41340e), CPython's intermixed parse
dropped the ``--`` and ``stations station show -- -a`` was refused as an unknown option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness import Server
from tests.module_server import module_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


def _cli(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    env["STATIONS_URL"] = srv.url
    return subprocess.run(
        [sys.executable, "-m", "stations", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_station_named_with_a_dash_can_be_named_after_double_dash(srv: Server) -> None:
    made = _cli(srv, "station", "create", "--", "-b")
    assert made.returncode == 0, made.stderr
    shown = _cli(srv, "station", "show", "--json", "--", "-b")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == "-b"
    # options before and after the positional, data after --, one starting with a dash
    produced = _cli(srv, "produce", "--json", "--msg-id", "m1", "--", "-b", '"-x"')
    assert produced.returncode == 0, produced.stderr
    read = _cli(srv, "read", "--json", "--", "-b")
    assert read.returncode == 0, read.stderr
    assert [json.loads(line)["data"] for line in read.stdout.splitlines()] == ["-x"]
    # and an option after the station still works
    again = _cli(srv, "station", "show", "-b", "--json")
    assert again.returncode == 2, again.stderr  # -b is taken for an option without --
