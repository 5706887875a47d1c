"""Every number has an upper bound, and one station's bad state never stops another's upkeep
(issue 11), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server

MAX_AGE_MS = 100 * 365 * 86_400_000
MAX_COUNT = 2**53 - 1


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory)


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("field", "body", "bound"),
    [
        ("retention.maxAgeMs", {"retention": {"maxAgeMs": 10**30}}, MAX_AGE_MS),
        ("retention.maxMessages", {"retention": {"maxMessages": 10**30}}, MAX_COUNT),
        ("retention.maxBytes", {"retention": {"maxBytes": 10**30}}, MAX_COUNT),
        ("dls.retentionMs", {"dls": {"retentionMs": 10**30}}, MAX_AGE_MS),
        ("idempotencyWindowMs", {"idempotencyWindowMs": 10**30}, 86_400_000),
        (
            "consumerDefaults.maxAckTimeMs",
            {"consumerDefaults": {"maxAckTimeMs": 10**30}},
            43_200_000,
        ),
        (
            "consumerDefaults.maxMsgDeliveries",
            {"consumerDefaults": {"maxMsgDeliveries": 10**30}},
            1000,
        ),
    ],
)
def test_every_station_number_has_an_upper_bound(
    http: httpx.Client, field: str, body: dict[str, Any], bound: int
) -> None:
    name = uniq("bound")
    response = http.post("/api/stations", json={"name": name, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert str(bound) in error["message"]
    assert http.get(f"/api/stations/{name}").status_code == 404
    # The same through PATCH, and the bound itself is accepted.
    assert http.post("/api/stations", json={"name": name}).status_code == 201
    response = http.patch(f"/api/stations/{name}", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    section, _, key = field.rpartition(".")
    at_bound: dict[str, Any] = {section: {key: bound}} if section else {key: bound}
    response = http.patch(f"/api/stations/{name}", json=at_bound)
    assert response.status_code == 200, response.text


def _set_config(srv: Server, name: str, config: dict[str, Any]) -> None:
    """Write a station's settings behind the server's back, as a version without the bounds
    could have stored them."""
    text = json.dumps(config)
    # upkeep_at 0: its retention and DLS expiry are due at once, as a stored rule would be.
    update = "UPDATE streams SET config = {0}, upkeep_at = 0 WHERE name = {0}"
    if srv.db_url.startswith("sqlite"):
        with sqlite3.connect(srv.db_url.split("///", 1)[1], timeout=30) as conn:
            conn.execute(update.format("?"), (text, name))
        return
    import psycopg

    with psycopg.connect(srv.db_url, autocommit=True) as conn:
        conn.execute(update.format("%s"), (text, name))


def _ids_of(srv: Server, name: str) -> int:
    # Ids live in msg_ids (PostgreSQL) or in one id_blocks row per commit (SQLite).
    query = (
        "SELECT (SELECT count(*) FROM msg_ids m WHERE m.stream_id = s.id)"
        " + (SELECT coalesce(sum(b.ids), 0) FROM id_blocks b WHERE b.stream_id = s.id)"
        " FROM streams s WHERE s.name = "
    )
    if srv.db_url.startswith("sqlite"):
        with sqlite3.connect(srv.db_url.split("///", 1)[1], timeout=30) as conn:
            return int(conn.execute(query + "?", (name,)).fetchone()[0])
    import psycopg

    with psycopg.connect(srv.db_url, autocommit=True) as conn:
        row = conn.execute(query + "%s", (name,)).fetchone()
        assert row is not None
        return int(row[0])


def test_a_failing_station_does_not_stop_the_others_upkeep(srv: Server, http: httpx.Client) -> None:
    # A station whose stored settings make its retention, DLS expiry and id sweep fail.
    bad = uniq("upkeep-bad")
    created = http.post("/api/stations", json={"name": bad}).json()
    config = {
        k: created[k] for k in ("name", "contentType", "retention", "dls", "consumerDefaults")
    }
    config["idempotencyWindowMs"] = 10**30
    config["retention"]["maxAgeMs"] = 10**30
    config["dls"]["retentionMs"] = 10**30
    _set_config(srv, bad, config)

    good = uniq("upkeep-good")
    settings = {
        "name": good,
        "idempotencyWindowMs": 100,
        "retention": {"maxMessages": 1},
        "dls": {"retentionMs": 100},
    }
    assert http.post("/api/stations", json=settings).status_code == 201
    group = {"maxMsgDeliveries": 1}
    assert http.put(f"/api/stations/{good}/groups/g", json=group).status_code == 201
    msgs = {"messages": [{"id": f"m{i}", "data": i} for i in range(3)]}
    assert http.post(f"/api/stations/{good}/messages", json=msgs).status_code == 200
    fetched = http.post(f"/api/stations/{good}/groups/g/fetch", json={"max": 1}).json()
    offsets = [m["offset"] for m in fetched["messages"]]
    response = http.post(f"/api/stations/{good}/groups/g/nack", json={"offsets": offsets})
    assert response.json()["nacked"] == 1

    deadline = time.monotonic() + 15
    while True:
        kept = http.get(f"/api/stations/{good}").json()["stats"]["messages"]
        entries = http.get(f"/api/stations/{good}/dls").json()["entries"]
        ids = _ids_of(srv, good)
        if (kept, len(entries), ids) == (1, 0, 0):
            break
        assert time.monotonic() < deadline, (
            f"upkeep stalled: {kept} messages kept (want 1), {len(entries)} DLS entries "
            f"(want 0), {ids} ids (want 0)"
        )
        time.sleep(0.2)
    # The bad station is named in the log, once per job, not every second.
    time.sleep(1.5)
    log = (srv.workdir / f"server-{srv.port}.log").read_text(errors="replace")
    assert bad in log
    assert log.count(f"retention failed for station {bad}") == 1


def test_shrinking_the_window_forgets_older_ids_for_good(http: httpx.Client) -> None:
    """CONTRACT.md §4: a shrink forgets the ids older than the new window; growing the window
    again does not bring them back, whether or not the id sweep ran in between."""
    name = uniq("shrink")
    assert http.post("/api/stations", json={"name": name}).status_code == 201
    path = f"/api/stations/{name}/messages"
    first = http.post(path, json={"messages": [{"id": "x", "data": 1}]}).json()
    assert first["results"][0]["duplicate"] is False
    assert http.post(path, json={"messages": [{"id": "x", "data": 1}]}).json()["results"][0][
        "duplicate"
    ]
    time.sleep(0.3)  # x is now older than 100 ms
    shrink = http.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 100})
    grow = http.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 120_000})
    assert (shrink.status_code, grow.status_code) == (200, 200)
    assert grow.json()["stats"]["idsInWindow"] == 0
    again = http.post(path, json={"messages": [{"id": "x", "data": 2}]}).json()
    assert again["results"][0]["duplicate"] is False  # forgotten: stored anew
    assert http.get(f"/api/stations/{name}").json()["stats"]["messages"] == 2
