"""Errors of the management API speak of stations, and a 409 on create names the setting that
differs from the existing station's, with both values."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import module_server


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client


@pytest.mark.parametrize(
    ("changed", "field", "fragment"),
    [
        ({"idempotencyWindowMs": 600000}, "idempotencyWindowMs", "= 120000, not 600000"),
        ({"retention": {"maxMessages": 10}}, "retention.maxMessages", "= null, not 10"),
        ({"contentType": "text/plain"}, "contentType", '= "application/json", not "text/plain"'),
        (
            {"consumerDefaults": {"maxMsgDeliveries": 5}},
            "consumerDefaults.maxMsgDeliveries",
            "= 2, not 5",
        ),
    ],
)
def test_conflict_names_the_setting(
    http: httpx.Client, changed: dict[str, object], field: str, fragment: str
) -> None:
    name = f"conflict-{field.replace('.', '-')}"
    assert http.post("/api/stations", json={"name": name}).status_code == 201
    answer = http.post("/api/stations", json={"name": name, **changed})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["field"] == field
    assert error["message"] == f"station {name} already exists with {field} {fragment}"


def test_station_api_errors_say_station(http: httpx.Client) -> None:
    for method, path in [
        ("GET", "/api/stations/nope"),
        ("DELETE", "/api/stations/nope"),
        ("GET", "/api/stations/nope/messages"),
        ("GET", "/api/stations/nope/groups"),
    ]:
        answer = http.request(method, path)
        assert answer.status_code == 404, (method, path)
        message = answer.json()["error"]["message"]
        assert message == "station nope not found", (method, path, message)
    produced = http.post("/api/stations/nope/messages", json={"messages": [{"data": 1}]})
    assert produced.json()["error"]["message"] == "station nope not found"
    # The Durable Streams door keeps its own word.
    assert http.delete("/v1/stream/nope").json()["error"]["message"] == "stream nope not found"
