"""``stations station edit|delete --created-at TIME``: only the station created then, as the
API's ``?createdAt=`` does; a station deleted and created again since is exit 4 (conflict),
unchanged."""

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


def _created(srv: Server) -> str:
    made = _cli(srv, "station", "create", "ca", "--json")
    assert made.returncode == 0, made.stderr
    created: str = json.loads(made.stdout)["createdAt"]
    return created


def test_edit_and_delete_name_the_station_they_mean(srv: Server) -> None:
    old = _created(srv)
    assert _cli(srv, "station", "delete", "ca").returncode == 0
    new = _created(srv)
    while new == old:
        assert _cli(srv, "station", "delete", "ca").returncode == 0
        new = _created(srv)
    edit = _cli(srv, "station", "edit", "ca", "--window", "5s", "--created-at", old)
    assert edit.returncode == 4, edit.stderr
    assert edit.stderr.startswith("stations: error: --created-at: "), edit.stderr
    delete = _cli(srv, "station", "delete", "ca", "--created-at", old)
    assert delete.returncode == 4, delete.stderr
    shown = json.loads(_cli(srv, "station", "show", "ca", "--json").stdout)
    assert shown["createdAt"] == new and shown["idempotencyWindowMs"] == 120_000
    assert _cli(srv, "station", "edit", "ca", "--window", "5s", "--created-at", new).returncode == 0
    assert _cli(srv, "station", "delete", "ca", "--created-at", new).returncode == 0
