"""Subscriptions, fixes from a review: a webhook attempt's late outcome applies to its own
attempt only (it acked a later attempt's tails, whose POST had failed: messages lost), a
pull-wake whose wake stream is deleted and created again wakes again, an explicitly linked
stream deleted and created again stays in its subscription, and the open wake routes refuse a
bad token before they tell whether the subscription exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from stations.domain.service import Service
from stations.domain.subscriptions import links, spec, wakes
from stations.domain.subscriptions.engine import SubscriptionEngine
from stations.store import subscriptions as store
from tests.test_subscriptions import ZERO, append, wait_for


def _tails(delivery: Any) -> list[str]:
    return [s["tail_offset"] for s in json.loads(delivery.body)["streams"]]


async def test_a_late_outcome_applies_to_its_own_attempt_only(db_url: str, tmp_path: Path) -> None:
    """Attempt 1 announces tail 1; its outcome is not recorded within the attempt guard, so
    attempt 2 claims the same wake and announces tail 3. Attempt 1's late ``{"done": true}``
    must not ack up to 3 (attempt 2's POST failed: nobody was told of messages 2-3); the wake
    stays open and retried, and the attempt that succeeds acks what it announced."""
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    svc = Service(db_url)
    await svc.start()
    answers: list[tuple[bool, bool]] = []

    async def send(url: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
        return answers.pop(0)

    engine = SubscriptionEngine(svc, send)
    engine.ctx = wakes.Context(await svc.write(wakes.load_signer), svc.ids)
    engine._stopped = True  # no timers: this test plays the attempts itself
    ctx = engine.ctx
    try:
        await svc.create_station({"name": "a"})
        definition = spec.parse_spec(
            {"type": "webhook", "streams": ["a"], "webhook": {"url": "https://h.example/x"}}
        )
        await svc.write(links.create_or_confirm, "s1", definition, "http://127.0.0.1:1")
        await svc.produce("a", {"messages": [{"data": 1}]})
        await svc.write(wakes.on_append, ctx, {"a": ["s1"]})
        first = (await svc.write(wakes.due, ctx, "s1")).value
        await svc.produce("a", {"messages": [{"data": 2}, {"data": 3}]})

        def guard_passed(batch: Any) -> None:  # what 20 s without an outcome amounts to
            store.update_subscription(batch.conn, "s1", {"next_attempt_at": 0})

        await svc.write(guard_passed)
        second = (await svc.write(wakes.due, ctx, "s1")).value
        assert second.wake_id == first.wake_id  # the same wake, claimed again
        assert _tails(first) != _tails(second)

        answers[:] = [(True, True), (False, False)]
        await engine._deliver(first)  # attempt 1's receiver confirms, late
        await engine._deliver(second)  # attempt 2's POST failed
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked <= 1, (
            f"acked up to {followed[0].acked}: beyond what the confirmed attempt announced"
        )
        assert row["wake_id"] == first.wake_id, "the wake ended: nothing would deliver 2-3"
        assert row["next_attempt_at"] is not None, "no retry is scheduled"

        await svc.write(guard_passed)  # the retry is due
        third = (await svc.write(wakes.due, ctx, "s1")).value
        assert _tails(third) == _tails(second)
        answers[:] = [(True, True)]
        await engine._deliver(third)
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked == 3 and row["wake_id"] is None
    finally:
        await svc.close()


async def _events(client: httpx.AsyncClient, path: str) -> list[Any]:
    r = await client.get(f"/v1/stream/{path}", params={"offset": "-1"})
    assert r.status_code == 200, r.text
    events: list[Any] = r.json()
    return events


async def test_a_wake_stream_deleted_and_created_again_hears_the_next_wake(
    db_url: str, make_server: Any
) -> None:
    """The wake event of an open, unclaimed wake went with its wake stream: the wake stayed
    open for ever and no later append wrote an event. Deleting the wake stream ends such a
    wake, so the next append announces one on the stream created again."""
    server = make_server(db_url)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for path in ("wk", "a"):
            assert (await client.put(f"/v1/stream/{path}", json=[])).status_code == 201
        r = await client.put(
            "/v1/stream/__ds/subscriptions/s1",
            json={"type": "pull-wake", "streams": ["a"], "wake_stream": "wk"},
        )
        assert r.status_code == 201, r.text
        await append(client, "a", [{"n": 1}])

        async def woken() -> list[Any]:
            return await _events(client, "wk")

        first = await wait_for(woken, 10, "the first wake event")
        assert first[0]["subscription_id"] == "s1"
        assert (await client.delete("/v1/stream/wk")).status_code == 204
        assert (await client.put("/v1/stream/wk", json=[])).status_code == 201
        await append(client, "a", [{"n": 2}])
        again = await wait_for(woken, 10, "a wake event on the wake stream created again")
        assert again[0]["generation"] > first[0]["generation"]
        r = await client.post("/v1/stream/__ds/subscriptions/s1/claim", json={"worker": "w"})
        assert r.status_code == 200, r.text
        assert r.json()["generation"] == again[0]["generation"]
        assert r.json()["streams"][0]["acked_offset"] == ZERO  # nothing of a was skipped


async def test_an_explicit_stream_deleted_and_created_again_stays_linked_from_its_start(
    db_url: str, make_server: Any
) -> None:
    """A stream named in ``streams`` that is deleted and created again stays in the
    subscription, its cursor back at the start (as a stream a pattern links again): it left
    the subscription without a word, which then never woke for it again."""
    server = make_server(db_url)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for path in ("wk", "b"):
            assert (await client.put(f"/v1/stream/{path}", json=[])).status_code == 201
        await append(client, "b", [{"n": 0}])  # linked at its tail: position 1
        r = await client.put(
            "/v1/stream/__ds/subscriptions/s2",
            json={"type": "pull-wake", "streams": ["b"], "wake_stream": "wk"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["streams"][0]["acked_offset"] != ZERO
        assert (await client.delete("/v1/stream/b")).status_code == 204
        view = (await client.get("/v1/stream/__ds/subscriptions/s2")).json()
        assert view["streams"] == [{"path": "b", "link_type": "explicit", "acked_offset": ZERO}]
        assert (await client.put("/v1/stream/b", json=[])).status_code == 201
        await append(client, "b", [{"n": 1}])

        async def woken() -> list[Any]:
            return await _events(client, "wk")

        events = await wait_for(woken, 10, "a wake event for the stream created again")
        assert events[0]["subscription_id"] == "s2" and events[0]["stream"] == "b"
        r = await client.post("/v1/stream/__ds/subscriptions/s2/claim", json={"worker": "w"})
        assert r.status_code == 200, r.text
        (stream,) = r.json()["streams"]
        assert stream["path"] == "b" and stream["acked_offset"] == ZERO and stream["has_pending"]


async def test_the_open_wake_routes_refuse_a_bad_token_before_telling_what_exists(
    db_url: str, make_server: Any
) -> None:
    """Callback, ack and release need no service token, only the wake's own: a request whose
    token is not one the server signed for that id learned whether the id existed (404 or
    not) and its type (400 "this is a pull-wake subscription") before being refused."""
    server = make_server(db_url)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for path in ("wk", "a"):
            assert (await client.put(f"/v1/stream/{path}", json=[])).status_code == 201
        r = await client.put(
            "/v1/stream/__ds/subscriptions/payroll",
            json={"type": "pull-wake", "streams": ["a"], "wake_stream": "wk"},
        )
        assert r.status_code == 201, r.text
        await append(client, "a", [{"n": 1}])
        r = await client.post("/v1/stream/__ds/subscriptions/payroll/claim", json={"worker": "w"})
        assert r.status_code == 200, r.text
        payroll_token = r.json()["token"]  # a real token, for payroll only
        body = {"wake_id": r.json()["wake_id"], "generation": r.json()["generation"]}
        answers = {}
        for sub_id in ("payroll", "no-such-sub"):
            for action in ("callback", "ack", "release"):
                for token in ("garbage", "e30.e30.e30"):
                    r = await client.post(
                        f"/v1/stream/__ds/subscriptions/{sub_id}/{action}",
                        json=body,
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    answers[(sub_id, action, token)] = (r.status_code, r.json()["error"]["code"])
            # payroll's own token names another subscription; no token at all for payroll
            mine = sub_id == "payroll"
            r = await client.post(
                f"/v1/stream/__ds/subscriptions/{sub_id}/ack",
                json=body,
                headers={} if mine else {"Authorization": f"Bearer {payroll_token}"},
            )
            answers[(sub_id, "ack", "other")] = (r.status_code, r.json()["error"]["code"])
        assert set(answers.values()) == {(401, "TOKEN_INVALID")}, answers
        # The right token still works, and settles the wake.
        r = await client.post(
            "/v1/stream/__ds/subscriptions/payroll/ack",
            json={**body, "done": True},
            headers={"Authorization": f"Bearer {payroll_token}"},
        )
        assert r.status_code == 200, r.text
