"""``PATCH /api/stations/{name}?createdAt=...``: change only the station created then. Without
it, a client that loaded a station's settings (the console's Settings tab) saved them onto
another station created under the name since, elsewhere. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.harness import Server

JSON = {"Content-Type": "application/json"}
NAME = "shop/orders"
PATH = "/api/stations/shop%2Forders"


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=JSON, timeout=15) as client:
        yield client


def _create(client: httpx.Client) -> str:
    answer = client.post("/api/stations", json={"name": NAME})
    assert answer.status_code == 201, answer.text
    created: str = answer.json()["createdAt"]
    return created


def _patch(client: httpx.Client, body: object, created_at: str | None) -> httpx.Response:
    query = "" if created_at is None else "?createdAt=" + quote(created_at, safe="")
    return client.patch(PATH + query, json=body)


def _created_again(client: httpx.Client, old: str) -> str:
    assert client.delete(PATH).status_code == 204
    new = _create(client)
    while new == old:  # createdAt is to the millisecond: the same one would match
        time.sleep(0.002)
        assert client.delete(PATH).status_code == 204
        new = _create(client)
    return new


def test_settings_meant_for_the_old_station_do_not_change_the_new_one(
    http: httpx.Client,
) -> None:
    old = _create(http)
    new = _created_again(http, old)
    refused = _patch(http, {"idempotencyWindowMs": 5_000}, old)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("conflict", "createdAt"), error
    assert "nothing was changed" in error["message"], error
    view = http.get(PATH).json()
    assert view["createdAt"] == new
    assert view["idempotencyWindowMs"] == 120_000  # the default, unchanged

    changed = _patch(http, {"idempotencyWindowMs": 5_000}, new)
    assert changed.status_code == 200, changed.text
    assert changed.json()["idempotencyWindowMs"] == 5_000
    # the same instant in another offset spelling is the same station
    plus = new.replace("Z", "+00:00") if new.endswith("Z") else new
    assert _patch(http, {"idempotencyWindowMs": 6_000}, plus).status_code == 200
    # without it, as before: whichever station has the name
    assert _patch(http, {"idempotencyWindowMs": 7_000}, None).status_code == 200
    assert http.get(PATH).json()["idempotencyWindowMs"] == 7_000


@pytest.mark.parametrize(
    "bad",
    [
        "yesterday",
        "2026-11-28T10:00:00",
        "2026-11-28T10:00:00.0001Z",
        "2026-11-28T10:00:00.0000001Z",  # digits past the sixth: dropped, not refused, before
    ],
)
def test_a_malformed_created_at_is_a_400_naming_it(http: httpx.Client, bad: str) -> None:
    _create(http)
    answer = _patch(http, {"idempotencyWindowMs": 5_000}, bad)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == "createdAt"
    assert http.get(PATH).json()["idempotencyWindowMs"] == 120_000


def test_the_sdk_sends_the_created_at_of_a_station_info(server: Server) -> None:
    """``patch_station`` / ``delete`` take ``created_at`` (a ``StationInfo``'s, a datetime with
    its offset, or the view's string) and raise ``Conflict`` naming createdAt."""
    import asyncio

    from stations.client import Client
    from stations.client.errors import Conflict

    async def main() -> None:
        async with Client(server.url) as client:
            old = await client.create_station(NAME)
            assert old.created_at is not None and old.created_at.tzinfo is not None
            await client.delete_station(NAME)
            new = await client.create_station(NAME)
            while new.created_at == old.created_at:
                await client.delete_station(NAME)
                new = await client.create_station(NAME)
            with pytest.raises(Conflict) as refused:
                await client.patch_station(
                    NAME, idempotency_window_ms=5_000, created_at=old.created_at
                )
            assert refused.value.field == "createdAt"
            with pytest.raises(Conflict):
                await client.station(NAME).delete(created_at=old.created_at)
            changed = await client.patch_station(
                NAME, idempotency_window_ms=5_000, created_at=new.created_at
            )
            assert changed.idempotency_window_ms == 5_000
            await client.station(NAME).delete(created_at=new.created_at)
            assert NAME not in {s.name for s in await client.list_stations()}

    asyncio.run(main())
