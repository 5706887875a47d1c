"""A command that reads stdin, started with stdin closed (``<&-``), is a usage error in one
line: ``produce`` and ``group nack --leases-from -`` ended in an ``AttributeError`` traceback
(Python's ``sys.stdin`` is None then)."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["produce", "s"], "no messages: give DATA arguments"),
        (["group", "nack", "s", "g", "--leases-from", "-"], "--leases-from -: stdin is closed"),
    ],
)
def test_a_closed_stdin_is_a_usage_error(srv: Server, args: list[str], said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    env["STATIONS_URL"] = srv.url
    command = " ".join([sys.executable, "-m", "stations", *(f"'{a}'" for a in args)])
    done = subprocess.run(
        ["bash", "-c", f"exec {command} <&-"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
