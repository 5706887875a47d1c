"""Multi-message rows: a plain JSON append of many messages is stored as one row, yet every
reader still sees single messages at their own offsets — catch-up from inside the row, the
management API, consumer groups, forks cut inside the row, retention and SSE."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory)


def off(position: int) -> str:
    return f"{position:016d}_{0:016d}"


def batch_stream(client: httpx.Client, n: int = 10) -> str:
    name = f"span-{uuid.uuid4().hex[:8]}"
    assert client.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
    body = json.dumps([{"i": i} for i in range(n)])
    response = client.post(f"/v1/stream/{name}", content=body, headers=JSON)
    assert response.status_code == 204
    assert response.headers["Stream-Next-Offset"] == off(n)
    return name


def test_catch_up_from_inside_a_row(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = batch_stream(client)
        for start in (0, 1, 4, 9):
            response = client.get(f"/v1/stream/{name}", params={"offset": off(start)})
            assert response.json() == [{"i": i} for i in range(start, 10)]
            assert response.headers["Stream-Next-Offset"] == off(10)
        tail = client.get(f"/v1/stream/{name}", params={"offset": off(10)})
        assert tail.json() == [] and tail.headers["Stream-Up-To-Date"] == "true"


def test_management_api_sees_single_messages(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = batch_stream(client)
        page = client.get(f"/api/stations/{name}/messages", params={"offset": off(3), "limit": 4})
        body = page.json()
        assert [m["data"] for m in body["messages"]] == [{"i": i} for i in range(3, 7)]
        assert [m["offset"] for m in body["messages"]] == [off(p) for p in range(3, 7)]
        assert body["nextOffset"] == off(7) and body["upToDate"] is False
        assert client.get(f"/api/stations/{name}").json()["stats"]["messages"] == 10


def test_group_fetches_messages_out_of_one_row(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = batch_stream(client)
        assert client.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
        got = []
        for _ in range(4):
            batch = client.post(
                f"/api/stations/{name}/groups/g/fetch", json={"max": 3, "consumer": "c"}
            ).json()["messages"]
            got += batch
            if batch:
                acked = client.post(
                    f"/api/stations/{name}/groups/g/ack",
                    json={"offsets": [m["offset"] for m in batch]},
                ).json()
                assert acked["acked"] == len(batch)
        assert [m["data"]["i"] for m in got] == list(range(10))
        assert [m["offset"] for m in got] == [off(p) for p in range(10)]


def test_fork_cut_inside_a_row(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = batch_stream(client)
        fork = f"{name}-fork"
        created = client.put(
            f"/v1/stream/{fork}",
            headers={
                **JSON,
                "Stream-Forked-From": f"/v1/stream/{name}",
                "Stream-Fork-Offset": off(4),
            },
        )
        assert created.status_code == 201
        assert (
            client.post(f"/v1/stream/{fork}", content='[{"f":1},{"f":2}]', headers=JSON).status_code
            == 204
        )
        whole = client.get(f"/v1/stream/{fork}", params={"offset": "-1"}).json()
        assert whole == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}, {"f": 1}, {"f": 2}]
        inside = client.get(f"/v1/stream/{fork}", params={"offset": off(2)}).json()
        assert inside == [{"i": 2}, {"i": 3}, {"f": 1}, {"f": 2}]


def test_retention_cuts_through_a_row(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = f"span-ret-{uuid.uuid4().hex[:8]}"
        assert (
            client.post(
                "/api/stations", json={"name": name, "retention": {"maxMessages": 3}}
            ).status_code
            == 201
        )
        body = json.dumps([{"i": i} for i in range(10)])
        assert client.post(f"/v1/stream/{name}", content=body, headers=JSON).status_code == 204
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if client.get(f"/api/stations/{name}").json()["stats"]["messages"] == 3:
                break
            time.sleep(0.2)
        assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == [
            {"i": 7},
            {"i": 8},
            {"i": 9},
        ]
        assert client.get(f"/v1/stream/{name}", params={"offset": off(2)}).status_code == 410
        # The counts are those of the messages kept, though their row also holds dropped ones.
        stats = client.get(f"/api/stations/{name}").json()["stats"]
        assert stats["bytes"] == len(b'{"i":7}{"i":8}{"i":9}')


def test_sse_from_inside_a_row(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        name = batch_stream(client, 6)
        assert (
            client.post(f"/v1/stream/{name}", headers={"Stream-Closed": "true"}).status_code == 204
        )
        text = client.get(f"/v1/stream/{name}", params={"offset": off(2), "live": "sse"}).text
        data = [line[5:] for line in text.splitlines() if line.startswith("data:")]
        assert json.loads(data[0]) == [{"i": i} for i in range(2, 6)]
        assert json.loads(data[-1])["streamClosed"] is True


def _rows_of(srv: Server, name: str) -> list[tuple[int, int]]:
    """(seq, span) of every messages row of a station, read from the database itself."""
    from sqlalchemy import text

    from stations.store import db

    engine = db.make_engine(srv.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT m.seq, m.span FROM messages m JOIN streams s ON s.id = m.stream_id "
                    "WHERE s.name = :name ORDER BY m.seq"
                ),
                {"name": name},
            ).all()
    finally:
        engine.dispose()
    return [(seq, span) for seq, span in rows]


def test_produce_with_ids_is_one_row_of_single_messages(srv: Server) -> None:
    """The stored messages of a produce with ids share one row on a JSON station, yet each
    keeps its own id and headers for every reader: browse (also from inside the row), a
    consumer group, and a retry, which still finds each id."""
    with httpx.Client(base_url=srv.url) as client:
        name = f"span-ids-{uuid.uuid4().hex[:8]}"
        assert client.post("/api/stations", json={"name": name}).status_code == 201
        long_id = "L" * 256
        items = [
            {"id": "a", "data": {"n": 0}},
            {"id": long_id, "data": {"n": 1}, "headers": {"k": "v\nw"}},
            {"data": {"n": 2}},
            {"id": "a", "data": {"n": 99}},  # a repeat inside the request: not stored
            {"id": "c", "data": "line\nbreak", "headers": {}},
        ]
        for k in range(20):  # many long ids in one row too
            items.append({"id": f"{k:03d}" + "x" * 253, "data": k})
        r = client.post(f"/api/stations/{name}/messages", json={"messages": items})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["duplicate"] for x in results[:5]] == [False, False, False, True, False]
        assert results[3]["offset"] == off(0)
        assert _rows_of(srv, name) == [(24, 24)]

        expected = [
            ("a", {}, {"n": 0}),
            (long_id, {"k": "v\nw"}, {"n": 1}),
            (None, {}, {"n": 2}),
            ("c", {}, "line\nbreak"),
        ] + [(f"{k:03d}" + "x" * 253, {}, k) for k in range(20)]
        page = client.get(f"/api/stations/{name}/messages", params={"limit": 100}).json()
        got = [(m["id"], m["headers"], m["data"]) for m in page["messages"]]
        assert got == expected
        inside = client.get(
            f"/api/stations/{name}/messages", params={"offset": off(1), "limit": 2}
        ).json()
        assert [(m["id"], m["offset"]) for m in inside["messages"]] == [
            (long_id, off(1)),
            (None, off(2)),
        ]

        assert client.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
        fetched = client.post(
            f"/api/stations/{name}/groups/g/fetch", json={"max": 3, "consumer": "c"}
        ).json()["messages"]
        assert [(m["id"], m["headers"]) for m in fetched] == [
            ("a", {}),
            (long_id, {"k": "v\nw"}),
            (None, {}),
        ]

        again = client.post(f"/api/stations/{name}/messages", json={"messages": items})
        assert [(x["offset"], x["duplicate"]) for x in again.json()["results"]] == [
            (off(0), True),
            (off(1), True),
            (off(24), False),  # no id: stored again
            (off(0), True),
            (off(3), True),
        ] + [(off(4 + k), True) for k in range(20)]
