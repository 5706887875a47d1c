"""Helpers for the consumer-group and DLS tests: a thin async client for the management API,
a module-wide server per engine with a clean log, and timing helpers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES
from tests.module_server import module_server as shared_server

__all__ = ["ENGINES"]

# Lease expiry is promised within 100 ms of the deadline; other engineers share this machine,
# so the hard bound is looser and 100 ms is only reported.
EXPIRY_SLACK_S = 1.5

# Server log lines that mean something went wrong even though no test saw it.
TROUBLE = (
    "Error handling request",  # aiohttp: an unhandled exception, answered 500
    "write batch failed",
    "lease expiry failed",
    "retention failed",
    "measuring the database's clock failed",
    "skipped: maximum number of running instances",  # APScheduler dropped a timer job
)


def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The shared module server (tests/module_server.py), whose log must stay clean."""
    servers = shared_server(request.param, tmp_path_factory, "--long-poll-timeout-ms", "1000")
    server = next(servers)
    try:
        yield server
        assert_clean_log(server)
    finally:
        servers.close()  # the shared server's own clean-up: kill it, drop its database


def assert_clean_log(server: Server) -> None:
    """No request failed inside the server (a 500), no upkeep failed, no timer job was lost."""
    path = server.workdir / f"server-{server.port}.log"
    text = path.read_text(errors="replace")
    bad = [line for line in text.splitlines() if any(m in line for m in TROUBLE)]
    assert not bad, f"the server logged trouble: {bad[:5]}\n{text[-3000:]}"


def uniq(prefix: str = "st") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ms(iso: str) -> float:
    """An ISO timestamp from the API as epoch seconds."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def field_of(response: httpx.Response) -> Any:
    return response.json()["error"]["field"]


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 5.0, interval: float = 0.05
) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last: {value!r})")
        await asyncio.sleep(interval)


class Api:
    """The management API of one server, with assertions on the happy paths."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    @staticmethod
    def path(station: str, *rest: str) -> str:
        return "/".join(["/api/stations", station.replace("/", "%2F"), *rest])

    async def station(self, name: str | None = None, **config: Any) -> str:
        name = name or uniq()
        r = await self.c.post("/api/stations", json={"name": name, **config})
        assert r.status_code == 201, r.text
        return name

    async def view(self, station: str) -> dict[str, Any]:
        r = await self.c.get(self.path(station))
        assert r.status_code == 200, r.text
        return r.json()

    async def produce(
        self, station: str, datas: list[Any], ids: list[str] | None = None
    ) -> list[str]:
        items: list[dict[str, Any]] = []
        for i, data in enumerate(datas):
            item: dict[str, Any] = {"data": data, "headers": {"n": str(i)}}
            if ids is not None:
                item["id"] = ids[i]
            items.append(item)
        r = await self.c.post(self.path(station, "messages"), json={"messages": items})
        assert r.status_code == 200, r.text
        return [x["offset"] for x in r.json()["results"]]

    async def put_group(self, station: str, group: str, status: int = 201, **body: Any) -> Any:
        r = await self.c.put(self.path(station, "groups", group), json=body)
        assert r.status_code == status, r.text
        return r.json()

    async def groups(self, station: str) -> dict[str, dict[str, Any]]:
        r = await self.c.get(self.path(station, "groups"))
        assert r.status_code == 200, r.text
        return {g["name"]: g for g in r.json()["groups"]}

    async def fetch(
        self,
        station: str,
        group: str,
        max: int = 10,
        wait_ms: int = 0,
        consumer: str = "c1",
    ) -> list[dict[str, Any]]:
        r = await self.c.post(
            self.path(station, "groups", group, "fetch"),
            json={"max": max, "waitMs": wait_ms, "consumer": consumer},
            timeout=wait_ms / 1000 + 30,
        )
        assert r.status_code == 200, r.text
        return r.json()["messages"]

    async def settle(self, station: str, group: str, verb: str, offsets: list[str], **extra: Any):  # type: ignore[no-untyped-def]
        r = await self.c.post(
            self.path(station, "groups", group, verb), json={"offsets": offsets, **extra}
        )
        assert r.status_code == 200, r.text
        return r.json()

    async def ack(self, station: str, group: str, offsets: list[str]) -> dict[str, Any]:
        return await self.settle(station, group, "ack", offsets)

    async def nack(
        self, station: str, group: str, offsets: list[str], delay_ms: int = 0
    ) -> dict[str, Any]:
        return await self.settle(station, group, "nack", offsets, delayMs=delay_ms)

    async def dead_letter(
        self, station: str, group: str, offsets: list[str], reason: str | None = None
    ) -> dict[str, Any]:
        extra = {} if reason is None else {"reason": reason}
        return await self.settle(station, group, "dead-letter", offsets, **extra)

    async def dls(self, station: str, **params: Any) -> dict[str, Any]:
        r = await self.c.get(self.path(station, "dls"), params=params)
        assert r.status_code == 200, r.text
        return r.json()

    async def dls_entries(self, station: str, group: str | None = None) -> list[dict[str, Any]]:
        params = {"limit": 1000} | ({"group": group} if group else {})
        return (await self.dls(station, **params))["entries"]

    async def replay(self, station: str, body: dict[str, Any]) -> int:
        r = await self.c.post(self.path(station, "dls", "replay"), json=body)
        assert r.status_code == 200, r.text
        return r.json()["replayed"]

    async def drop(self, station: str, body: dict[str, Any]) -> int:
        r = await self.c.post(self.path(station, "dls", "drop"), json=body)
        assert r.status_code == 200, r.text
        return r.json()["dropped"]

    async def browse(self, station: str) -> list[dict[str, Any]]:
        r = await self.c.get(self.path(station, "messages"), params={"offset": "-1", "limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["messages"]


def client(server: Server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, timeout=30)


# The fixtures ``shared`` and ``api`` of the test modules that import these two: pytest registers
# an imported fixture as the importing module's own, so module scope still gives each of those
# modules its own server per engine. Named apart from the fixtures, so that a test's ``api`` or
# ``shared`` parameter does not shadow the imported name (ruff F811).
@pytest.fixture(name="shared", scope="module", params=ENGINES)
def shared_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request, tmp_path_factory)


@pytest.fixture(name="api")
async def api_fixture(shared: Server) -> AsyncIterator[Api]:
    async with client(shared) as c:
        yield Api(c)
