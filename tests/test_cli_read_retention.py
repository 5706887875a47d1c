"""``stations read`` that falls behind retention mid-read says so: it blamed ``--from``
("--from -1: offset is before the earliest retained message") for an offset it had reached
itself, which retention dropped while the read's reader was slow."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import module_server

BASE = "/api/stations/rr"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


def _produce(http: httpx.Client, first: int, count: int) -> None:
    for start in range(first, first + count, 200):
        body = {"messages": [{"data": f"{n:06d}" + "x" * 1000} for n in range(start, start + 200)]}
        assert http.post(f"{BASE}/messages", json=body).status_code == 200


def test_a_read_that_falls_behind_retention_says_so_not_that_from_was_wrong(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        made = http.post("/api/stations", json={"name": "rr", "retention": {"maxMessages": 600}})
        assert made.status_code == 201, made.text
        _produce(http, 0, 600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
        reader = subprocess.Popen(
            [sys.executable, "-m", "stations", "read", "rr", "--url", srv.url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert reader.stdout is not None and reader.stderr is not None
            # Its first page (500 messages, ~500 kB) is being written: the pipe is full and the
            # read stops there until this end reads it.
            assert reader.stdout.read(1000)
            _produce(http, 600, 1200)  # retention drops offsets 0 to 1199, page 2 included
            deadline = time.monotonic() + 30
            while True:
                page = http.get(f"{BASE}/messages", params={"offset": "-1", "limit": "1"}).json()
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
