"""Several ``stations serve`` processes on one PostgreSQL database: state one process keeps in
RAM that another process changes behind its back (a review of the edges).

- Msg-Id caches: an id that expired and was stored again through the other process must not
  come back with its old offset when the window later grows.
- LISTEN/NOTIFY: a LISTEN connection that goes silent (the network drops it without a reset,
  as a NAT or a failover does) must be noticed, or readers at that process never again see
  the other process's appends (they keep answering from their last look at the tail).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

JSON = {"Content-Type": "application/json"}


def offset(position: int) -> str:
    return f"{position:016d}_{0:016d}"


def new_station(client: httpx.Client, **config: Any) -> str:
    name = f"mpe-{uuid.uuid4().hex[:10]}"
    r = client.post("/api/stations", json={"name": name, **config})
    assert r.status_code == 201, r.text
    return name


def produce(client: httpx.Client, name: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post(f"/api/stations/{name}/messages", json={"messages": list(items)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


# -- Msg-Id caches ----------------------------------------------------------------------------


def test_id_stored_again_at_the_other_process_keeps_its_new_offset_when_the_window_grows(
    pg_url: str, make_server: Any
) -> None:
    """A stores id x (offset 0, in A's cache); its 300 ms window passes; B stores x again
    (offset 1). The window then grows: x is a duplicate of offset 1 at both processes. Before,
    A's cache still held x -> 0, which the grown window made look live again: A answered
    duplicate of offset 0, a message that is no longer the one stored under x."""
    a, b = make_server(pg_url), make_server(pg_url)
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url) as cb:
        name = new_station(ca, idempotencyWindowMs=300)
        assert produce(ca, name, {"id": "x", "data": 0})[0] == {
            "offset": offset(0),
            "duplicate": False,
        }
        time.sleep(0.45)  # past the window
        assert produce(cb, name, {"id": "x", "data": 1})[0] == {
            "offset": offset(1),
            "duplicate": False,
        }
        r = cb.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 60_000})
        assert r.status_code == 200, r.text
        for client in (cb, ca):
            assert produce(client, name, {"id": "x", "data": 2})[0] == {
                "offset": offset(1),
                "duplicate": True,
            }
            r = client.post(f"/v1/stream/{name}", headers={**JSON, "Msg-Id": "x"}, content=b"3")
            assert r.status_code in (200, 204), r.text
            assert (r.headers["Msg-Offset"], r.headers["Msg-Duplicate"]) == (offset(1), "true")
        messages = ca.get(f"/api/stations/{name}/messages", params={"offset": "-1"}).json()
        assert [(m["offset"], m["id"]) for m in messages["messages"]] == [
            (offset(0), "x"),
            (offset(1), "x"),
        ]
