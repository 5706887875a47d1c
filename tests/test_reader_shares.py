"""One token cannot keep the others from reading (the reviews of 2026-11-27).

Waiting readers (long-poll, SSE, group fetches) share ``--max-waiting-readers`` slots. A token
that kept its readers re-polling won every slot its own answers freed, and another token's
reads, even of a station with data waiting, were all refused 503. With tokens, each token now
holds at most ``--max-waiting-readers-per-token`` slots (half by default)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.harness import Server

HOG, OTHER, ADMIN = "hog-secret-0001", "other-secret-0001", "admin-secret-0001"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def srv(make_server, tmp_path: Path) -> Server:  # type: ignore[no-untyped-def]
    tokens = [
        {"token": ADMIN, "role": "admin"},
        {"token": HOG, "role": "consumer", "stations": ["a"]},
        {"token": OTHER, "role": "consumer", "stations": ["b"]},
    ]
    (tmp_path / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    server: Server = make_server(
        f"sqlite:///{tmp_path}/shares.db",
        "--tokens",
        str(tmp_path / "tokens.json"),
        "--max-waiting-readers",
        "6",
        "--long-poll-timeout-ms",
        "4000",
    )
    return server


def waiting(admin: httpx.Client) -> float:
    for line in admin.get("/metrics").text.splitlines():
        if line.startswith("stations_waiting_readers "):
            return float(line.split()[1])
    raise AssertionError("no stations_waiting_readers in /metrics")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_one_token_holds_at_most_its_share_of_the_waiting_readers(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=30, headers=bearer(ADMIN)) as admin:
        for name in ("a", "b"):
            assert admin.put(f"/v1/stream/{name}", headers=JSON).status_code == 201
        assert admin.post("/v1/stream/b", headers=JSON, content=b"[1]").status_code == 204
    tail = {"offset": "now", "live": "long-poll"}
    started = threading.Barrier(4)
    answers: list[int] = []

    def wait_on_a() -> None:
        with httpx.Client(base_url=srv.url, timeout=30, headers=bearer(HOG)) as hog:
            started.wait()
            answers.append(hog.get("/v1/stream/a", params=tail).status_code)

    waiters = [threading.Thread(target=wait_on_a) for _ in range(3)]
    for t in waiters:
        t.start()
    started.wait()
    try:
        with httpx.Client(base_url=srv.url, timeout=30, headers=bearer(ADMIN)) as admin:
            deadline = time.monotonic() + 10
            while waiting(admin) < 3:  # the three wait: half of the six slots
                assert time.monotonic() < deadline, "the hog's readers did not wait"
                time.sleep(0.05)
        with httpx.Client(base_url=srv.url, timeout=30, headers=bearer(HOG)) as hog:
            r = hog.get("/v1/stream/a", params=tail)
            assert r.status_code == 503, r.text
            assert "its share" in r.json()["error"]["message"]
            assert int(r.headers["Retry-After"]) >= 1
        with httpx.Client(base_url=srv.url, timeout=30, headers=bearer(OTHER)) as other:
            r = other.get("/v1/stream/b", params={"offset": "-1", "live": "long-poll"})
            assert r.status_code == 200, r.text
            assert r.json() == [1]
    finally:
        for t in waiters:
            t.join()
    assert answers == [204, 204, 204]
