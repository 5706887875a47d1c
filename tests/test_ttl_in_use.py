"""A ``Stream-TTL`` station stays while it is used through any API (the review of 2026-11-27).

Durable Streams renews a TTL stream's idle countdown on reads and appends. Only its own reads
and appends did: a consumer group working through the station (fetch and ack every second,
the TTL 3 s) saw it expire under its leases, the ack of the message it held answered 404 and
the unread messages deleted. Group fetches, acks, nacks and seeks, DLS replays, cursor commits
and the management API's message reads now renew it too; a station nobody uses still expires.
"""

from __future__ import annotations

import time

import httpx

from tests.harness import Server

TTL_S = 2


def _make(http: httpx.Client, name: str) -> None:
    created = http.put(
        f"/v1/stream/{name}",
        headers={"Content-Type": "application/json", "Stream-TTL": str(TTL_S)},
    )
    assert created.status_code == 201, created.text
    body = {"messages": [{"data": n} for n in range(40)]}
    assert http.post(f"/api/stations/{name}/messages", json=body).status_code == 200


def test_a_station_in_use_by_a_group_or_a_browser_does_not_expire(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for name in ("grouped", "browsed", "idle"):
            _make(http, name)
        group = http.put("/api/stations/grouped/groups/g", json={"maxAckTimeMs": 60_000})
        assert group.status_code in (200, 201), group.text
        started = time.monotonic()
        # Three TTLs, used every half second: by a group's fetch and ack, by the message browser.
        while time.monotonic() - started < 3 * TTL_S:
            fetched = http.post(
                "/api/stations/grouped/groups/g/fetch", json={"max": 1, "consumer": "c"}
            )
            assert fetched.status_code == 200, fetched.text
            (message,) = fetched.json()["messages"]
            acked = http.post(
                "/api/stations/grouped/groups/g/ack", json={"offsets": [message["offset"]]}
            )
            assert acked.status_code == 200, acked.text
            assert acked.json()["acked"] == 1, acked.text
            assert http.get("/api/stations/browsed/messages?limit=1").status_code == 200
            time.sleep(0.5)
        assert http.get("/api/stations/grouped").status_code == 200
        assert http.get("/api/stations/browsed").status_code == 200
        # Nobody used this one: it expired, as both do once left alone.
        assert http.get("/api/stations/idle").status_code == 404
        deadline = time.monotonic() + TTL_S + 5
        while http.get("/api/stations/grouped").status_code != 404:
            assert time.monotonic() < deadline, "a station nobody uses any more did not expire"
            time.sleep(0.2)


def test_a_transaction_that_acks_renews_the_station(server: Server) -> None:
    """The README's exactly-once pattern: fetch a batch, then one transaction per message that
    acks it and produces elsewhere. Only the plain ack renewed the countdown: the station
    expired a TTL after the fetch and the transactions that settled the rest answered 404."""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        _make(http, "settled")
        out = http.put("/v1/stream/out", headers={"Content-Type": "application/json"})
        assert out.status_code == 201, out.text
        group = http.put("/api/stations/settled/groups/g", json={"maxAckTimeMs": 60_000})
        assert group.status_code in (200, 201), group.text
        fetched = http.post(
            "/api/stations/settled/groups/g/fetch", json={"max": 6, "consumer": "c"}
        )
        assert fetched.status_code == 200, fetched.text
        leased = fetched.json()["messages"]
        assert len(leased) == 6
        # Six settlements 0.6 s apart: 3.6 s, past the 2 s TTL counted from the fetch.
        for n, message in enumerate(leased):
            time.sleep(0.6)
            done = http.post(
                "/api/transactions",
                json={
                    "ack": [{"station": "settled", "group": "g", "offset": message["offset"]}],
                    "produce": [{"station": "out", "data": n}],
                },
            )
            assert done.status_code == 200, (n, done.text)
        assert http.get("/api/stations/settled").status_code == 200
