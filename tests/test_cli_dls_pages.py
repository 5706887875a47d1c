"""``stations dls ls`` showed its first page (100 by default) as if it were the whole store: it
now says on stderr that more are left out and how to go on (``--after ID``, a new option)."""

from __future__ import annotations

import json
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
            assert http.post("/api/stations", json={"name": "dl"}).status_code == 201
            base = "/api/stations/dl"
            http.post(f"{base}/messages", json={"messages": [{"data": n} for n in range(5)]})
            assert http.put(f"{base}/groups/g", json={}).status_code == 201
            got = http.post(f"{base}/groups/g/fetch", json={"max": 5, "consumer": "c"}).json()
            offsets = [m["offset"] for m in got["messages"]]
            dead = http.post(f"{base}/groups/g/dead-letter", json={"offsets": offsets})
            assert dead.json()["deadLettered"] == 5, dead.text
        yield server


def _cli(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    return subprocess.run(
        [sys.executable, "-m", "stations", "dls", "ls", "dl", "--url", srv.url, "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_page_says_more_are_left_out_and_the_next_goes_on_after_it(srv: Server) -> None:

    first = _cli(srv, "-n", "2")
    assert first.returncode == 0, first.stderr
    ids = [e["id"] for e in json.loads(first.stdout)]
    assert len(ids) == 2
    assert (
        first.stderr
        == f"stations: 2 shown, more after ID {ids[-1]} (--after {ids[-1]}, or a larger --limit)\n"
    )

    rest = _cli(srv, "--after", str(ids[-1]))
    assert rest.returncode == 0, rest.stderr
    assert len(json.loads(rest.stdout)) == 3
    assert rest.stderr == ""  # the last page: nothing left out

    whole = _cli(srv)
    assert len(json.loads(whole.stdout)) == 5 and whole.stderr == ""

    bad = _cli(srv, "--after", "x")
    assert bad.returncode == 2 and "--after takes a dead letter's ID" in bad.stderr, bad.stderr
