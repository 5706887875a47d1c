"""Consumer groups and retention (the review of 2026-11-27): settling a lease whose message
retention dropped answers ``unknown`` (ack, nack and dead-letter said it was done, the dead
letter writing no entry, and the group's figures kept it); a fork's group sees its source's
retention (seek and ``startFrom`` took offsets it had dropped, and lag counted them)."""

from __future__ import annotations

import time

import httpx

from tests.harness import Server

ZERO = "0" * 16


def _offset(n: int) -> str:
    return f"{n:016d}_{ZERO}"


def _dropped(http: httpx.Client, station: str, offset: str) -> None:
    """Wait until retention dropped the message at ``offset`` (a read of it is 410)."""
    deadline = time.monotonic() + 10
    while http.get(f"/v1/stream/{station}", params={"offset": offset}).status_code != 410:
        assert time.monotonic() < deadline, "retention did not drop the message"
        time.sleep(0.1)


def test_settling_messages_retention_dropped_answers_unknown(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        station = "/api/stations/kept"
        assert http.post("/api/stations", json={"name": "kept"}).status_code == 201
        group = http.put(f"{station}/groups/g", json={"maxMsgDeliveries": 1})
        assert group.status_code == 201
        body = {"messages": [{"data": n} for n in range(3)]}
        assert http.post(f"{station}/messages", json=body).status_code == 200
        fetched = http.post(f"{station}/groups/g/fetch", json={"max": 3, "consumer": "c"})
        offsets = [m["offset"] for m in fetched.json()["messages"]]
        assert len(offsets) == 3
        # Retention keeps 3: three more messages push the leased ones out.
        patched = http.patch(station, json={"retention": {"maxMessages": 3}})
        assert patched.status_code == 200, patched.text
        assert http.post(f"{station}/messages", json=body).status_code == 200
        _dropped(http, "kept", offsets[2])

        acked = http.post(f"{station}/groups/g/ack", json={"offsets": [offsets[0]]}).json()
        assert acked == {"acked": 0, "unknown": [offsets[0]]}, acked
        nacked = http.post(f"{station}/groups/g/nack", json={"offsets": [offsets[1]]}).json()
        assert nacked == {"nacked": 0, "unknown": [offsets[1]]}, nacked
        dead = http.post(f"{station}/groups/g/dead-letter", json={"offsets": [offsets[2]]})
        assert dead.json() == {"deadLettered": 0, "unknown": [offsets[2]]}, dead.text
        assert http.get(f"{station}/dls").json()["entries"] == []
        (view,) = http.get(f"{station}/groups").json()["groups"]
        assert (view["inFlight"], view["pending"], view["lag"]) == (0, 3, 3), view


def test_a_forks_group_does_not_start_or_seek_where_its_source_dropped(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        source = {"name": "src", "retention": {"maxMessages": 100}}
        assert http.post("/api/stations", json=source).status_code == 201
        body = {"messages": [{"data": n} for n in range(5)]}
        assert http.post("/api/stations/src/messages", json=body).status_code == 200
        fork = http.put(
            "/v1/stream/fork",
            headers={"Stream-Forked-From": "src", "Content-Type": "application/json"},
        )
        assert fork.status_code == 201, fork.text
        assert http.post("/v1/stream/fork", json={"own": 1}).status_code in (200, 204)
        assert http.put("/api/stations/fork/groups/g", json={}).status_code == 201
        # The source keeps its last message only (beyond the fork's offset): the five the fork
        # inherits are gone for it too, its own is left.
        patched = http.patch("/api/stations/src", json={"retention": {"maxMessages": 1}})
        assert patched.status_code == 200, patched.text
        assert http.post("/api/stations/src/messages", json=body).status_code == 200
        _dropped(http, "fork", _offset(4))

        (view,) = http.get("/api/stations/fork/groups").json()["groups"]
        assert (view["pending"], view["lag"]) == (1, 1), view
        # /metrics says the same (it said 6, the fork's own head only).
        scraped = http.get("/metrics").text
        lag = [
            line
            for line in scraped.splitlines()
            if line.startswith("stations_group_lag{") and 'station="fork"' in line
        ]
        assert len(lag) == 1 and lag[0].endswith(" 1.0"), lag
        seek = http.post("/api/stations/fork/groups/g/seek", json={"to": _offset(1)})
        assert seek.status_code == 400 and seek.json()["error"]["field"] == "to", seek.text
        late = http.put("/api/stations/fork/groups/h", json={"startFrom": _offset(2)})
        assert late.status_code == 400, late.text
        assert late.json()["error"]["field"] == "startFrom"
        earliest = http.post("/api/stations/fork/groups/g/seek", json={"to": "earliest"})
        assert earliest.status_code == 200, earliest.text
        fetched = http.post(
            "/api/stations/fork/groups/g/fetch", json={"max": 10, "consumer": "c"}
        ).json()["messages"]
        assert [m["data"] for m in fetched] == [{"own": 1}], fetched
        # A standing group PUT again as it was made (the SDK does on every start) is still
        # "200 same", whatever retention dropped since (it was 400).
        made = http.put("/api/stations/fork/groups/k", json={"startFrom": _offset(5)})
        assert made.status_code == 201, made.text
        body = {"messages": [{"data": n} for n in range(5)]}
        assert http.post("/api/stations/src/messages", json=body).status_code == 200
        assert http.post("/api/stations/fork/messages", json=body).status_code == 200
        patched = http.patch("/api/stations/fork", json={"retention": {"maxMessages": 1}})
        assert patched.status_code == 200, patched.text
        assert http.post("/api/stations/fork/messages", json=body).status_code == 200
        _dropped(http, "fork", _offset(5))
        again = http.put("/api/stations/fork/groups/k", json={"startFrom": _offset(5)})
        assert again.status_code == 200, again.text


def test_a_transaction_settling_a_message_retention_dropped_is_refused(server: Server) -> None:
    """The transaction's lease check passed a lease whose message retention had dropped, and
    the settlement then answered it unknown: an assertion, a 500, and the writer logged the
    database failing (found by the review of 2026-11-27 late; the SDK's nack() and
    dead_letter() go this way). It is a 409 naming the lease; an ack of it still settles."""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        station = "/api/stations/txkept"
        assert http.post("/api/stations", json={"name": "txkept"}).status_code == 201
        assert http.put(f"{station}/groups/g", json={}).status_code == 201
        body = {"messages": [{"data": n} for n in range(3)]}
        assert http.post(f"{station}/messages", json=body).status_code == 200
        fetched = http.post(f"{station}/groups/g/fetch", json={"max": 3, "consumer": "c"})
        leases = fetched.json()["messages"]
        assert http.patch(station, json={"retention": {"maxMessages": 3}}).status_code == 200
        assert http.post(f"{station}/messages", json=body).status_code == 200
        _dropped(http, "txkept", leases[2]["offset"])

        def lease(m: dict[str, object]) -> dict[str, object]:
            return {"station": "txkept", "group": "g", "offset": m["offset"]} | {
                "deliveryCount": m["deliveryCount"]
            }

        for verb in ("nack", "deadLetter"):
            r = http.post("/api/transactions", json={"consumer": "c", verb: [lease(leases[0])]})
            assert r.status_code == 409, r.text
            assert r.json()["error"]["field"] == f"{verb}.0.offset"
            assert "retention" in r.json()["error"]["message"]
        r = http.post("/api/transactions", json={"consumer": "c", "ack": [lease(leases[1])]})
        assert r.status_code == 200 and r.json()["acked"] == 1, r.text
        assert http.get("/readyz").status_code == 200


def test_a_groups_figures_leave_out_what_retention_dropped(server: Server) -> None:
    """Leased and waiting deliveries of messages retention dropped are not in flight nor
    pending: nothing is left to deliver (they counted until a fetch forgot them)."""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        station = "/api/stations/figs"
        assert http.post("/api/stations", json={"name": "figs"}).status_code == 201
        assert http.put(f"{station}/groups/g", json={"maxMsgDeliveries": 5}).status_code == 201
        body = {"messages": [{"data": n} for n in range(4)]}
        assert http.post(f"{station}/messages", json=body).status_code == 200
        fetched = http.post(f"{station}/groups/g/fetch", json={"max": 4, "consumer": "c"})
        offsets = [m["offset"] for m in fetched.json()["messages"]]
        assert len(offsets) == 4
        # One waits after a nack, two stay leased (one of them cut out of its lease range),
        # one is acked.
        nack = {"offsets": [offsets[0]], "delayMs": 3_600_000}
        assert http.post(f"{station}/groups/g/nack", json=nack).json()["nacked"] == 1
        assert (
            http.post(f"{station}/groups/g/ack", json={"offsets": [offsets[2]]}).status_code == 200
        )
        (view,) = http.get(f"{station}/groups").json()["groups"]
        assert (view["inFlight"], view["pending"], view["lag"]) == (2, 1, 0), view
        # Retention keeps 3: three more messages push all four out.
        patched = http.patch(station, json={"retention": {"maxMessages": 3}})
        assert patched.status_code == 200, patched.text
        body = {"messages": [{"data": n} for n in range(4, 7)]}
        assert http.post(f"{station}/messages", json=body).status_code == 200
        _dropped(http, "figs", offsets[3])
        (view,) = http.get(f"{station}/groups").json()["groups"]
        assert (view["inFlight"], view["pending"], view["lag"]) == (0, 3, 3), view
