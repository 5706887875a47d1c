"""An ack may name leases, as nack, dead-letter and extend do (a review of 2026-11-29).

Consumer A holds a message; the group seeks back and B is delivered it again (same offset,
delivery count 1). A's late ack by offset settled B's delivery: B's nack then found nothing
and the redelivery the seek asked for was lost. By lease, A's ack settles only A's delivery,
which the seek revoked: it is ``unknown``, and B's delivery stays B's."""

from __future__ import annotations

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


def _ok(r: httpx.Response) -> Any:
    assert r.status_code in (200, 201), r.text
    return r.json()


def _lease(message: dict[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in ("offset", "deliveryCount", "ackDeadline")}


def test_a_revoked_leases_ack_by_lease_leaves_the_new_delivery(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        base = "/api/stations/acks/groups/g"
        _ok(http.post("/api/stations", json={"name": "acks"}))
        _ok(http.post("/api/stations/acks/messages", json={"messages": [{"data": 1}]}))
        _ok(http.put(base, json={"maxAckTimeMs": 60_000}))
        (a,) = _ok(http.post(f"{base}/fetch", json={"max": 1, "consumer": "A"}))["messages"]
        assert _ok(http.post(f"{base}/seek", json={"to": "earliest"}))["revoked"] == 1
        (b,) = _ok(http.post(f"{base}/fetch", json={"max": 1, "consumer": "B"}))["messages"]
        assert (b["offset"], b["deliveryCount"]) == (a["offset"], 1)
        late = _ok(http.post(f"{base}/ack", json={"leases": [_lease(a)]}))
        assert late == {"acked": 0, "unknown": [a["offset"]]}
        # B's delivery is still B's to settle: its nack gives the message back.
        assert _ok(http.post(f"{base}/nack", json={"leases": [_lease(b)]}))["nacked"] == 1
        (c,) = _ok(http.post(f"{base}/fetch", json={"max": 1, "consumer": "C"}))["messages"]
        assert c["offset"] == a["offset"] and c["deliveryCount"] == 2
        assert _ok(http.post(f"{base}/ack", json={"leases": [_lease(c)]}))["acked"] == 1
        bad = http.post(f"{base}/ack", json={"leases": [_lease(c)], "offsets": [c["offset"]]})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "offsets"
