"""Fixtures: live ``stations serve`` processes on both engines.

Storage tests take the ``server`` fixture and run once on SQLite and once on PostgreSQL. In CI
(``CI=true``) a missing PostgreSQL is a failure, not a skip.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import (
    IN_CI,
    SHORT_LIVED_JVM,
    Server,
    drop_pg_database,
    new_pg_database,
    pg_available,
)

ENGINES = ["sqlite", "postgresql"]
# spark-submit (PySpark's own driver, `stations pipeline`'s) puts these on the driver JVM's
# command line; subprocesses inherit them (see SHORT_LIVED_JVM).
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)


def _one_tls_context_for_httpx() -> None:
    """httpx builds a TLS context and loads certifi's CA bundle into it for every client it
    makes (7% of the Python CPU py-spy sampled over five minutes of the suite), though the
    tests speak plain HTTP on loopback. The tests' clients share one, made as httpx makes it."""
    import httpx._transports.default as transport

    made = transport.create_ssl_context  # type: ignore[attr-defined]
    transport.create_ssl_context = functools.cache(made)  # type: ignore[attr-defined]


_one_tls_context_for_httpx()


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
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off: a leak that lasts until it runs shows as one."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


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


# The files that take longest, longest first (scripts/test.sh's `--durations` list says which).
# Under pytest-xdist each worker takes a whole file at a time in collection order, so these go
# first: the single two-and-a-half-minute Spark cluster test then runs beside a hundred short
# files instead of after them, with the other worker idle. The conformance suite comes once
# the Spark files are under way rather than beside the cluster's four JVMs from the start: its
# webhook test holds a 1 s subscription lease, which a box that loaded let expire once.
FIRST = (
    "test_spark_cluster.py",
    "test_spark.py",
    "test_package.py",
    "test_openapi_fuzz.py",
    "test_quickstart.py",
    "test_conformance.py",
    "test_limits.py",
    "test_subscriptions.py",
    "test_multiprocess_edges.py",
    "test_operate.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    # A stable sort: the other files keep their order.
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))
