"""Subscriptions, fixes from a fifth review: webhook endpoints that hang no longer starve the
others' deliveries, a superseded webhook attempt's late done applies where the later attempt
announced the same, and re-creating a pull-wake's wake stream announces the wakes its deletion
ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
from aiohttp import web

from stations.api.webhooks import WebhookSender
from stations.domain import lifecycle
from stations.domain.service import Service
from stations.domain.subscriptions import links, spec, wakes
from stations.domain.subscriptions.engine import SubscriptionEngine
from stations.store import db
from stations.store import subscriptions as store
from tests.harness import free_port
from tests.test_subscriptions import LOOPBACK, ZERO, Receiver, append, wait_for

HUNG = 40  # endpoints that never answer, more than the 32 slots
SLOTS = 32


class Hung:
    """Webhook endpoints on ``count`` loopback ports of one aiohttp server: each accepts the
    POST and never answers (until the test ends); counts the POSTs open at once."""

    def __init__(self, count: int) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.open = 0
        self.most_open = 0
        self.reached: dict[int, asyncio.Event] = {}
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}/hook"

    def at(self, count: int) -> asyncio.Event:
        """Set once ``count`` POSTs are open at the same time."""
        event = self.reached.setdefault(count, asyncio.Event())
        if self.open >= count:
            event.set()
        return event

    async def _hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        for count, event in self.reached.items():
            if self.open >= count:
                event.set()
        try:
            await self._release.wait()
        finally:  # the client went away: the handler is cancelled
            self.open -= 1
        return web.json_response({"done": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        # A client that gives up (a cut POST) cancels its handler, so ``open`` counts only
        # POSTs the server still has a connection for.
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        for port in self.ports:
            await web.TCPSite(self._runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def hung() -> AsyncIterator[Hung]:
    endpoints = Hung(HUNG)
    await endpoints.start()
    yield endpoints
    await endpoints.stop()


async def test_hung_endpoints_do_not_starve_a_healthy_one(
    db_url: str, make_server: Any, hung: Hung
) -> None:
    """40 webhook endpoints (each its own port) accept the POST and never answer; their POSTs
    held all 32 slots until the 10 s timeout, and a healthy endpoint's wake waited behind
    them. Now a POST unanswered for 2 s marks its endpoint slow and may be cut for a new
    endpoint (as the healthy one is: nothing is known of it yet) or for one known to answer:
    it is delivered within seconds, and never are more than 32 POSTs open at once. (Many more
    new hung endpoints: tests/test_subscriptions_outbound.py.)"""
    healthy = Receiver()
    await healthy.start()
    server = make_server(db_url, LOOPBACK)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            subs = [(f"h{i}", hung.url(i)) for i in range(HUNG)] + [("ok", healthy.url)]
            for name, url in subs:
                assert (await client.put(f"/v1/stream/{name}", json=[])).status_code == 201
                r = await client.put(
                    f"/v1/stream/__ds/subscriptions/{name}",
                    json={"type": "webhook", "streams": [name], "webhook": {"url": url}},
                )
                assert r.status_code == 201, r.text
            for name, _ in subs[:HUNG]:
                await append(client, name, [{"n": 1}])
            # Every slot is held by a hung endpoint before the healthy one has anything.
            await asyncio.wait_for(hung.at(SLOTS).wait(), 10)
            await append(client, "ok", [{"n": 1}])
            start = time.monotonic()
            await healthy.wait(1, timeout=9)
            waited = time.monotonic() - start
            assert waited < 6, f"the healthy endpoint waited {waited:.1f} s behind hung ones"
            assert healthy.received[0][0]["subscription_id"] == "ok"
            assert hung.most_open <= SLOTS, f"{hung.most_open} POSTs open at once"

            async def acked() -> bool:
                r = await client.get("/v1/stream/__ds/subscriptions/ok")
                return bool(r.json()["streams"][0]["acked_offset"] != ZERO)

            await wait_for(acked, 10, "the healthy endpoint's done to be recorded")
    finally:
        await healthy.stop()


async def _events(client: httpx.AsyncClient, path: str) -> list[Any]:
    r = await client.get(f"/v1/stream/{path}", params={"offset": "-1"})
    if r.status_code != 200:
        return []
    events: list[Any] = r.json()
    return events


async def test_a_wake_stream_created_again_announces_the_pending_wake(
    db_url: str, make_server: Any
) -> None:
    """Deleting the wake stream ends the wake its event announced (nobody had claimed it);
    creating the stream again announced nothing until the next append to a followed stream.
    Now its creation announces the pending wake at once."""
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
        assert (await client.delete("/v1/stream/wk")).status_code == 204
        assert (await client.put("/v1/stream/wk", json=[])).status_code == 201
        again = await wait_for(woken, 10, "a wake event on the wake stream created again")
        assert again[0]["subscription_id"] == "s1" and again[0]["stream"] == "a"
        assert again[0]["generation"] > first[0]["generation"]
        r = await client.post("/v1/stream/__ds/subscriptions/s1/claim", json={"worker": "w"})
        assert r.status_code == 200, r.text
        assert r.json()["generation"] == again[0]["generation"]
        assert r.json()["streams"][0]["acked_offset"] == ZERO  # nothing of a was skipped


@contextlib.asynccontextmanager
async def _engine(db_url: str) -> AsyncIterator[tuple[Service, Any, Receiver]]:
    """The service, a receiver that answers done, and an engine that POSTs to it for real but
    arms no timers: the test plays the attempts itself, in the order it needs."""
    receiver = Receiver()
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if links.purge_stream not in lifecycle.purge_hooks:  # as the HTTP layer's setup does
        lifecycle.purge_hooks.append(links.purge_stream)
    svc = Service(db_url)
    await svc.start()
    sender = WebhookSender(allow_loopback=True)
    engine = SubscriptionEngine(svc, sender.send)
    engine.ctx = wakes.Context(await svc.write(wakes.load_signer), svc.ids)
    engine._stopped = True
    await receiver.start()
    try:
        await svc.create_station({"name": "a"})
        definition = spec.parse_spec(
            {"type": "webhook", "streams": ["a"], "webhook": {"url": receiver.url}}
        )
        await svc.write(links.create_or_confirm, "s1", definition, "http://127.0.0.1:1")
        yield svc, engine, receiver
    finally:
        await receiver.stop()
        await sender.close()
        await svc.close()


def _guard_passed(batch: Any) -> None:  # what 20 s without an outcome amounts to
    store.update_subscription(batch.conn, "s1", {"next_attempt_at": 0})


def _tails(delivery: Any) -> list[str]:
    return [s["tail_offset"] for s in json.loads(delivery.body)["streams"]]


async def test_a_late_done_applies_when_the_later_attempt_announced_the_same(
    db_url: str,
) -> None:
    """Attempt 1's outcome comes after its guard, once attempt 2 has claimed the wake with the
    very same tails: its ``{"done": true}`` was dropped, and the messages were sent again (a
    duplicate). It confirms exactly what attempt 2 announced, so it now acks and ends the
    wake; attempt 2's own answer then finds the wake ended."""
    async with _engine(db_url) as (svc, engine, receiver):
        ctx = engine.ctx
        await svc.produce("a", {"messages": [{"data": 1}]})
        await svc.write(wakes.on_append, ctx, {"a": ["s1"]})
        first = (await svc.write(wakes.due, ctx, "s1")).value
        await svc.write(_guard_passed)
        second = (await svc.write(wakes.due, ctx, "s1")).value
        assert (second.attempt, second.wake_id) == (2, first.wake_id)
        assert _tails(first) == _tails(second)

        await engine._deliver(first)  # a real POST; the receiver answers done, late
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked == 1, "attempt 1's done, covering attempt 2, was dropped"
        assert row["wake_id"] is None and row["next_attempt_at"] is None

        await engine._deliver(second)  # its answer counts for nothing now
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked == 1 and row["wake_id"] is None
        assert len(receiver.received) == 2


async def test_a_late_done_never_acks_a_stream_created_again_with_the_same_tail(
    db_url: str,
) -> None:
    """Equal tails are not enough: stream a is deleted and created again between the two
    claims and reaches the same tail, so attempt 2 announces the same offsets of other
    messages. Attempt 1's late done confirmed the old ones only and must ack nothing."""
    async with _engine(db_url) as (svc, engine, receiver):
        ctx = engine.ctx
        await svc.produce("a", {"messages": [{"data": "old"}]})
        await svc.write(wakes.on_append, ctx, {"a": ["s1"]})
        first = (await svc.write(wakes.due, ctx, "s1")).value
        await svc.delete("a")
        await svc.create_station({"name": "a"})
        await svc.produce("a", {"messages": [{"data": "new"}]})
        await svc.write(_guard_passed)
        second = (await svc.write(wakes.due, ctx, "s1")).value
        assert second.attempt == 2 and _tails(first) == _tails(second)

        await engine._deliver(first)
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked == 0, "acked the new stream's message on the old one's done"
        assert row["wake_id"] == first.wake_id

        await engine._deliver(second)  # attempt 2's done decides
        row, followed = await svc.read_db(links.read_view, "s1")
        assert followed[0].acked == 1 and row["wake_id"] is None


async def test_a_stream_deleted_while_a_claim_commits_leaves_no_tail_in_its_snapshot(
    pg_url: str,
) -> None:
    """PostgreSQL, two transactions at once: a claim (another process's) has locked the
    subscription and written a snapshot holding stream a's tail, not committed yet, while a
    deletes. The delete's purge read the snapshots without a lock: it missed the claim's and
    left a's tail in it, which a later done would ack on a stream created again under the
    name. Now the purge waits for the claim and takes a's tail out."""
    async with _engine(pg_url) as (svc, engine, _receiver):
        await svc.produce("a", {"messages": [{"data": 1}]})
        await svc.write(wakes.on_append, engine.ctx, {"a": ["s1"]})
        other = sqlalchemy.create_engine(db.normalize_url(pg_url))
        try:
            claim = other.connect()
            claim.begin()
            assert store.get(claim, "s1", lock=True) is not None
            tails = store.tails(claim, ["a"])
            assert tails == {"a": 1}
            store.update_subscription(claim, "s1", {"snapshot": json.dumps(tails)})
            delete = asyncio.ensure_future(svc.delete("a"))
            await asyncio.sleep(0.5)  # it reaches the purge (and waits there, now)
            claim.commit()
            claim.close()
            await asyncio.wait_for(delete, 20)
        finally:
            other.dispose()
        row, _ = await svc.read_db(links.read_view, "s1")
        assert "a" not in json.loads(row["snapshot"]), row["snapshot"]
