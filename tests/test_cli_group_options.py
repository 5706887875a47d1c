"""``stations group create`` names the option a refused value came from: a --from past the
station's tail said "startFrom is beyond the station's tail", a field the user never typed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import module_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.post("/api/stations", json={"name": "go"}).status_code == 201
        yield server


def test_a_from_past_the_tail_is_said_of_from(srv: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    past = "0000000000000099_0000000000000000"
    done = subprocess.run(
        [sys.executable, "-m", "stations", "group", "create", "go", "g", "--from", past],
        env={**env, "STATIONS_URL": srv.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"stations: error: --from {past}: "), line
    assert "startFrom" not in line, line
