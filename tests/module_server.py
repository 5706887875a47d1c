"""One ``stations serve`` per engine for a whole test module, for modules whose tests do not
need a server of their own (each test makes its own streams) and that would otherwise spend
most of their time starting servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import IN_CI, Server, drop_pg_database, new_pg_database, pg_available

ENGINES = ["sqlite", "postgresql"]


def module_server(
    engine: str, tmp_path_factory: pytest.TempPathFactory, *args: str
) -> Iterator[Server]:
    """Use from a module-scoped fixture parametrized over ``ENGINES``: ``yield from``."""
    # Two fixtures passed their ``request`` here, which is not "postgresql": their PostgreSQL
    # runs served SQLite, and nothing said so.
    if engine not in ENGINES:
        raise TypeError(f"module_server takes an engine name ({ENGINES}), not {engine!r}")
    workdir: Path = tmp_path_factory.mktemp(f"server-{engine}")
    if engine == "postgresql":
        if not pg_available():
            if IN_CI:
                pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 (required in CI)")
            pytest.skip("PostgreSQL is not reachable")
        url = new_pg_database()
    else:
        url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    server = Server(url, workdir, list(args)).start()
    try:
        yield server
    finally:
        server.kill()
        if engine == "postgresql":
            drop_pg_database(url)
