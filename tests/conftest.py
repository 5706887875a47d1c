"""Fixtures: live ``stations serve`` processes on both engines.

Storage tests take the ``server`` fixture and run once on SQLite and once on PostgreSQL. In CI
(``CI=true``) a missing PostgreSQL is a failure, not a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import IN_CI, Server, drop_pg_database, new_pg_database, pg_available

ENGINES = ["sqlite", "postgresql"]


def _require_pg() -> None:
    if not pg_available():
        if IN_CI:
            pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 (required in CI)")
        pytest.skip("PostgreSQL is not reachable")


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql":
        _require_pg()
    return request.param


@pytest.fixture
def db_url(engine: str, tmp_path: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"
        return
    url = new_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def pg_url() -> Iterator[str]:
    _require_pg()
    url = new_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    servers: list[Server] = []

    def make(db_url: str, *args: str) -> Server:
        server = Server(db_url, tmp_path, list(args)).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()


@pytest.fixture
def server(db_url: str, make_server) -> Server:  # type: ignore[no-untyped-def]
    return make_server(db_url, "--long-poll-timeout-ms", "1000")
