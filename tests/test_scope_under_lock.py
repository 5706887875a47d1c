"""A scoped token's dead letters reach only the stations its scope names, even when an admin
points ``dls.forwardTo`` elsewhere between a request's arrival and its write (CONTRACT.md §5).

The request's check and its write were two steps: the API read the station's config, then the
writer's transaction wrote. On PostgreSQL the test holds the station's row lock, so the
request's transaction waits on it, and changes ``forwardTo`` meanwhile, as an admin's PATCH in
another process does. The check must be the write's own, made on the row it has locked."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.harness import Server, waiting_for_locks

ADMIN, SCOPED = "admin-secret", "shop-consumer-secret"
OUT = "b-out"  # outside the scoped token's a* stations


def _client(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _while_forward_changes(url: str, station: str, send: Callable[[], httpx.Response]) -> Any:
    """``send()`` while ``station``'s row is locked; once its transaction waits for the lock,
    point the station's dead letters at OUT and let it go on. The answer."""
    answer: list[httpx.Response | BaseException] = []

    def run() -> None:
        try:
            answer.append(send())
        except BaseException as exc:  # the test's thread hears it
            answer.append(exc)

    with psycopg.connect(url) as conn:
        (config,) = conn.execute(
            "SELECT config FROM streams WHERE name = %s FOR UPDATE", (station,)
        ).fetchone() or (None,)
        assert config is not None, station
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not waiting_for_locks(url, conn.info.backend_pid):
            assert not answer, f"answered without waiting for the station's lock: {answer}"
            assert time.monotonic() < deadline, "the request never waited for the lock"
            time.sleep(0.02)
        settings = json.loads(config)
        settings["dls"]["forwardTo"] = OUT
        conn.execute(
            "UPDATE streams SET config = %s WHERE name = %s", (json.dumps(settings), station)
        )
        conn.commit()
    thread.join(30)
    (got,) = answer
    if isinstance(got, BaseException):
        raise got
    return got


def _leased_station(admin: httpx.Client, name: str) -> list[str]:
    """A station with group g (one delivery each) whose one message is leased: the offsets."""
    assert admin.post("/api/stations", json={"name": name}).status_code == 201
    group = f"/api/stations/{name}/groups/g"
    assert admin.put(group, json={"maxMsgDeliveries": 1}).status_code == 201
    body = {"messages": [{"id": "m1", "data": {"n": 1}}]}
    assert admin.post(f"/api/stations/{name}/messages", json=body).status_code == 200
    got = admin.post(f"{group}/fetch", json={"max": 1}).json()["messages"]
    assert len(got) == 1
    return [got[0]["offset"]]


def test_dead_letters_do_not_pass_a_forward_target_changed_meanwhile(
    pg_url: str, tmp_path: Path
) -> None:
    tokens = [
        {"token": ADMIN, "role": "admin"},
        {"token": SCOPED, "role": "consumer", "stations": ["a*"]},
    ]
    (tmp_path / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    server = Server(pg_url, tmp_path, ["--tokens", str(tmp_path / "tokens.json")]).start()
    try:
        with _client(server, ADMIN) as admin, _client(server, SCOPED) as scoped:
            assert admin.post("/api/stations", json={"name": OUT}).status_code == 201

            def group(name: str) -> str:
                return f"/api/stations/{name}/groups/g"

            def tx(verb: str, name: str, offsets: list[str]) -> dict[str, Any]:
                return {verb: [{"station": name, "group": "g", "offset": offsets[0]}]}

            cases: dict[str, tuple[Callable[[str, list[str]], httpx.Response], str]] = {
                "nack": (
                    lambda n, o: scoped.post(f"{group(n)}/nack", json={"offsets": o}),
                    "dls.forwardTo",
                ),
                "dead-letter": (
                    lambda n, o: scoped.post(f"{group(n)}/dead-letter", json={"offsets": o}),
                    "dls.forwardTo",
                ),
                "fetch": (
                    lambda n, o: scoped.post(f"{group(n)}/fetch", json={"max": 1}),
                    "dls.forwardTo",
                ),
                "group": (
                    lambda n, o: scoped.put(group(n), json={"maxMsgDeliveries": 1}),
                    "dls.forwardTo",
                ),
                "transaction nack": (
                    lambda n, o: scoped.post("/api/transactions", json=tx("nack", n, o)),
                    "nack.0.station",
                ),
                "transaction dead letter": (
                    lambda n, o: scoped.post("/api/transactions", json=tx("deadLetter", n, o)),
                    "deadLetter.0.station",
                ),
            }
            for i, (what, (send, field)) in enumerate(cases.items()):
                name = f"a-{i}"
                offsets = _leased_station(admin, name)
                answer = _while_forward_changes(
                    pg_url, name, functools.partial(send, name, offsets)
                )
                assert answer.status_code == 403, (what, answer.text)
                error = answer.json()["error"]
                assert error["field"] == field, (what, error)
                assert OUT in error["message"], (what, error)
                stats = admin.get(f"/api/stations/{OUT}").json()["stats"]
                assert stats["messages"] == 0, (what, stats)
                # Nothing was settled: the lease stands for a token that may forward there.
                left = admin.post(f"{group(name)}/ack", json={"offsets": offsets}).json()
                assert left == {"acked": 1, "unknown": []}, (what, left)
    finally:
        server.kill()
