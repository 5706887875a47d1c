"""A path no route serves (a base URL with a proxy's prefix, a typo) is a 404 of its own,
``no_route``: it was ``not_found``, the code of a missing station, so the CLI said "Not Found"
with the exit code of a missing station (3), the SDK raised ``StationNotFound``, and the
console would take it for a station deleted elsewhere."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from stations.client import Client
from stations.client.errors import NotFound, StationsError
from tests.harness import Server
from tests.module_server import module_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


def test_a_path_no_route_serves_has_its_own_code(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=10) as http:
        for method, path in (("GET", "/prefix/api/stations"), ("POST", "/v2/stream/x")):
            answer = http.request(method, path)
            assert answer.status_code == 404, answer.text
            error = answer.json()["error"]
            assert error["code"] == "no_route", error
            assert error["message"] == f"nothing is served at {path} (is the URL right?)"
        # a station that is not there is still not_found
        missing = http.get("/api/stations/nope")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_the_sdk_does_not_take_it_for_a_missing_station(srv: Server) -> None:
    async def main() -> None:
        async with Client(srv.url + "/prefix") as client:
            with pytest.raises(StationsError) as raised:
                await client.get_station("orders")
        assert not isinstance(raised.value, NotFound), type(raised.value)
        assert raised.value.status == 404 and raised.value.code == "no_route"
        assert "nothing is served at /prefix/api/stations/orders" in str(raised.value)

    asyncio.run(main())


def test_the_cli_says_what_the_server_said_with_the_exit_code_of_a_refusal(srv: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    done = subprocess.run(
        [sys.executable, "-m", "stations", "station", "show", "orders", "--url", srv.url + "/x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "nothing is served at /x/api/stations/orders" in done.stderr, done.stderr
