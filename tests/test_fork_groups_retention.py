"""Consumer groups on a fork whose source's retention drops what the fork inherits (a review
of 2026-11-29). A fork loses what its source's retention drops (README), but the group paths
measured it by the fork's own head, which stays 0:

- a fetch handed out the dropped messages of a source row that retention cut through (the
  fork's reads answered 410 for them, and their acks "unknown");
- a DLS replay (and a redrive) of an entry whose message the source dropped put it back in
  the queue and deleted the entry, its only copy: the message never came again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory)


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def _ok(r: httpx.Response) -> Any:
    assert r.status_code in (200, 201), r.text
    return r.json()


def _fork(http: httpx.Client, source: str, fork: str) -> None:
    r = http.put(
        f"/v1/stream/{fork}",
        headers={"Stream-Forked-From": source, "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text


def _keep_one(http: httpx.Client, source: str) -> None:
    """Retention on the source down to its last message; returns once it has run."""
    _ok(http.patch(f"/api/stations/{source}", json={"retention": {"maxMessages": 1}}))
    deadline = time.monotonic() + 20
    while len(_ok(http.get(f"/api/stations/{source}/messages?offset=-1"))["messages"]) > 1:
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.1)


def test_a_forks_group_is_not_handed_what_its_sources_retention_dropped(
    http: httpx.Client,
) -> None:
    _ok(http.post("/api/stations", json={"name": "rowsrc"}))
    # One request: one row of four messages, which retention cuts through.
    _ok(
        http.post(
            "/api/stations/rowsrc/messages",
            json={"messages": [{"data": {"i": i}} for i in range(4)]},
        )
    )
    _fork(http, "rowsrc", "rowfork")
    _ok(http.put("/api/stations/rowfork/groups/g", json={}))
    _keep_one(http, "rowsrc")
    fetched = _ok(
        http.post("/api/stations/rowfork/groups/g/fetch", json={"max": 10, "consumer": "c"})
    )
    assert [m["data"] for m in fetched["messages"]] == [{"i": 3}]
    acked = _ok(
        http.post(
            "/api/stations/rowfork/groups/g/ack",
            json={"offsets": [m["offset"] for m in fetched["messages"]]},
        )
    )
    assert acked == {"acked": 1, "unknown": []}


def test_a_replay_keeps_an_entry_whose_message_the_source_dropped(http: httpx.Client) -> None:
    _ok(http.post("/api/stations", json={"name": "dlsrc"}))
    for i in range(4):  # a row each
        _ok(http.post("/api/stations/dlsrc/messages", json={"messages": [{"data": {"i": i}}]}))
    _fork(http, "dlsrc", "dlfork")
    _ok(http.put("/api/stations/dlfork/groups/g", json={}))
    fetched = _ok(
        http.post("/api/stations/dlfork/groups/g/fetch", json={"max": 2, "consumer": "c"})
    )
    offsets = [m["offset"] for m in fetched["messages"]]
    dead = _ok(
        http.post(
            "/api/stations/dlfork/groups/g/dead-letter", json={"offsets": offsets, "reason": "x"}
        )
    )
    assert dead["deadLettered"] == 2
    _keep_one(http, "dlsrc")
    replayed = _ok(http.post("/api/stations/dlfork/dls/replay", json={"all": True}))
    assert replayed["replayed"] == 0, replayed
    entries = _ok(http.get("/api/stations/dlfork/dls?limit=100"))["entries"]
    assert sorted(e["offset"] for e in entries) == sorted(offsets)
    assert [e["data"] for e in sorted(entries, key=lambda e: e["offset"])] == [{"i": 0}, {"i": 1}]
