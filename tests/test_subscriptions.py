"""Durable Streams subscriptions beyond the conformance suite: webhook delivery that outlives a
webhook outage and a server restart, signatures checked by an independent verifier, SSRF
refusals, pull-wake leases and tokens, and a thousand subscriptions woken by one append."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.harness import Server, free_port

LOOPBACK = "--webhooks-allow-loopback"
ZERO = "0000000000000000_0000000000000000"


def b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def verify(jwks: dict[str, Any], header: str, raw: bytes) -> None:
    """Check ``Webhook-Signature`` with the ``cryptography`` package alone: raises
    InvalidSignature (or KeyError for an unknown kid) when it does not hold."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    key = next(k for k in jwks["keys"] if k["kid"] == fields["kid"])
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519"
    public = Ed25519PublicKey.from_public_bytes(b64url(key["x"]))
    public.verify(b64url(fields["ed25519"]), fields["t"].encode() + b"." + raw)


class Receiver:
    """A webhook endpoint on loopback that records what it gets and answers ``{"done": true}``
    (or ``{}``); it can be started and stopped on the same port to play an outage."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.answer = {"done": True} if answer is None else answer
        self.received: list[tuple[dict[str, Any], bytes, str]] = []
        self.arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def _hook(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.received.append((json.loads(raw), raw, request.headers["Webhook-Signature"]))
        self.arrived.set()
        return web.json_response(self.answer)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            self.arrived.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(self.received)} of {count} webhook requests arrived"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    yield r
    await r.stop()


async def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> Any:
    """Wait for an async predicate, checking every 50 ms (tests only; the server never polls)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def append(client: httpx.AsyncClient, path: str, value: Any) -> str:
    r = await client.post(f"/v1/stream/{path}", json=value)
    assert r.status_code in (200, 204), r.text
    return r.headers["Stream-Next-Offset"]


async def test_webhook_outage_and_restart_lose_nothing(
    db_url: str, make_server: Any, receiver: Receiver
) -> None:
    """The webhook is down while messages arrive and the server is killed (-9) in between;
    once it is back, the wakes it gets cover every message, in order, none skipped, each
    signed verifiably."""
    server: Server = make_server(db_url, LOOPBACK)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.put("/v1/stream/orders/eu", json=[])).status_code == 201
        r = await client.put(
            "/v1/stream/__ds/subscriptions/billing",
            json={"type": "webhook", "pattern": "orders/*", "webhook": {"url": receiver.url}},
        )
        assert r.status_code == 201, r.text
        for i in range(5):
            await append(client, "orders/eu", {"n": i})

        async def failed() -> bool:
            body = (await client.get("/v1/stream/__ds/subscriptions/billing")).json()
            return bool(body["status"] == "failed")

        await wait_for(failed, what="a failed delivery attempt")

    server.restart()  # kill -9, then start again on the same database
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for i in range(5, 10):
            await append(client, "orders/eu", {"n": i})
        # a stream that first appears after the restart is delivered from its start
        await client.put("/v1/stream/orders/us", json=[{"n": "us-0"}])
        jwks = (await client.get("/v1/stream/__ds/jwks.json")).json()
        await receiver.start()

        async def caught_up() -> bool:
            body = (await client.get("/v1/stream/__ds/subscriptions/billing")).json()
            acked = {s["path"]: s["acked_offset"] for s in body["streams"]}
            return (
                acked.get("orders/eu", ZERO) > ZERO
                and acked.get("orders/eu") == await tail(client, "orders/eu")
                and acked.get("orders/us") == await tail(client, "orders/us")
            )

        await wait_for(caught_up, timeout=90, what="the cursor to catch up")
        assert (await client.get("/v1/stream/__ds/subscriptions/billing")).json()[
            "status"
        ] == "active"

        # Every wake was signed; the wakes' [acked, tail) ranges chain without a gap.
        ranges: dict[str, list[tuple[str, str]]] = {}
        generations = []
        for body, raw, signature in receiver.received:
            verify(jwks, signature, raw)
            generations.append(body["generation"])
            for s in body["streams"]:
                if s["has_pending"]:
                    ranges.setdefault(s["path"], []).append((s["acked_offset"], s["tail_offset"]))
        assert generations == sorted(generations)
        for path, spans in ranges.items():
            spans = sorted(set(spans))
            assert spans[0][0] == ZERO, (path, spans)
            for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
                assert start == end, f"{path}: a gap or overlap between wakes: {spans}"
            assert spans[-1][1] == await tail(client, path)
        everything = (await client.get("/v1/stream/orders/eu?offset=-1")).json()
        assert [m["n"] for m in everything] == list(range(10))


async def tail(client: httpx.AsyncClient, path: str) -> str:
    return (await client.head(f"/v1/stream/{path}")).headers["Stream-Next-Offset"]


async def test_signature_verifies_independently(make_server: Any, tmp_path: Any) -> None:
    """The ``cryptography`` package alone verifies a delivery with the JWKS key; a changed
    body, timestamp or key does not verify; no shared secret is handed out."""
    server: Server = make_server(f"sqlite:///{tmp_path / 's.db'}", LOOPBACK)
    receiver = Receiver(answer={})
    await receiver.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.put(
                "/v1/stream/__ds/subscriptions/sig",
                json={
                    "type": "webhook",
                    "streams": ["sig/a"],
                    "webhook": {"url": receiver.url},
                    "lease_ttl_ms": 1000,
                },
            )
            created = r.json()
            assert "webhook_secret" not in created and "secret" not in json.dumps(created)
            jwks_response = await client.get(created["webhook"]["signing"]["jwks_url"])
            assert jwks_response.headers["Content-Type"].startswith("application/jwk-set+json")
            jwks = jwks_response.json()
            assert all("d" not in key for key in jwks["keys"])  # public halves only
            await client.put("/v1/stream/sig/a", json=[{"x": 1}])
            await receiver.wait(1)
            body, raw, signature = receiver.received[0]
            verify(jwks, signature, raw)
            assert body["subscription_id"] == "sig"
            with pytest.raises(InvalidSignature):
                verify(jwks, signature, raw.replace(b'"sig"', b'"gis"'))
            fields = dict(part.split("=", 1) for part in signature.split(","))
            forged_t = signature.replace(f"t={fields['t']}", f"t={int(fields['t']) + 1}")
            with pytest.raises(InvalidSignature):
                verify(jwks, forged_t, raw)
            # the callback token is not a key for anything else: a changed one is refused
            bad = body["callback_token"][:-4] + (
                "AAAA" if not body["callback_token"].endswith("AAAA") else "BBBB"
            )
            r = await client.post(
                body["callback_url"],
                headers={"Authorization": f"Bearer {bad}"},
                json={"wake_id": body["wake_id"], "generation": body["generation"], "done": True},
            )
            assert r.status_code == 401 and r.json()["error"]["code"] == "TOKEN_INVALID"
            # The receiver answered without "done" and never called back: when the lease runs
            # out the same work is woken again, in a new generation, and the old token is fenced.
            await receiver.wait(2)
            again_body = receiver.received[1][0]
            assert again_body["generation"] == body["generation"] + 1
            assert again_body["streams"] == body["streams"]  # nothing was acked
            r = await client.post(
                body["callback_url"],
                headers={"Authorization": f"Bearer {body['callback_token']}"},
                json={"wake_id": body["wake_id"], "generation": body["generation"], "done": True},
            )
            assert r.status_code == 409 and r.json()["error"]["code"] == "FENCED"
            # the key survives a restart: same kid in the JWKS
            server.restart()
            again = (await client.get(f"{server.url}/v1/stream/__ds/jwks.json")).json()
            assert [k["kid"] for k in again["keys"]] == [k["kid"] for k in jwks["keys"]]
    finally:
        await receiver.stop()


REFUSED = [
    "http://10.0.0.1/hook",
    "https://10.1.2.3/hook",
    "https://172.16.5.4/hook",
    "https://192.168.1.10/hook",
    "https://169.254.169.254/latest/meta-data",  # cloud metadata, link-local
    "https://100.64.0.1/hook",  # carrier-grade NAT
    "https://0.0.0.0/hook",
    "https://[fe80::1]/hook",  # IPv6 link-local
    "https://[fc00::1]/hook",  # IPv6 unique local
    "https://[fec0::1]/hook",  # IPv6 site-local (deprecated, still local; Python calls it global)
    "https://[::ffff:10.0.0.1]/hook",  # IPv6-mapped private
    "https://[::ffff:169.254.169.254]/hook",  # IPv6-mapped link-local
    "https://[::ffff:192.168.0.1]/hook",
    "https://[64:ff9b::a00:1]/hook",  # NAT64 form of 10.0.0.1
    "ftp://example.com/hook",
    "http://93.184.215.14/hook",  # public, but plain http
]
LOOPBACK_URLS = [
    "http://127.0.0.1:9/hook",
    "http://127.0.0.2:9/hook",
    "http://localhost:9/hook",
    "http://[::1]:9/hook",
    "http://[::ffff:127.0.0.1]:9/hook",  # IPv6-mapped loopback
]


async def test_ssrf_refusals(make_server: Any, tmp_path: Any) -> None:
    strict: Server = make_server(f"sqlite:///{tmp_path / 'strict.db'}")
    dev: Server = make_server(f"sqlite:///{tmp_path / 'dev.db'}", LOOPBACK)
    async with httpx.AsyncClient(timeout=30) as client:
        for n, url in enumerate(REFUSED + LOOPBACK_URLS):
            r = await client.put(
                f"{strict.url}/v1/stream/__ds/subscriptions/s{n}",
                json={"type": "webhook", "streams": ["a"], "webhook": {"url": url}},
            )
            assert r.status_code == 400, (url, r.text)
            assert r.json()["error"]["code"] == "WEBHOOK_URL_REJECTED", url
            assert r.json()["error"]["field"] == "webhook.url"
        for n, url in enumerate(REFUSED):
            r = await client.put(
                f"{dev.url}/v1/stream/__ds/subscriptions/s{n}",
                json={"type": "webhook", "streams": ["a"], "webhook": {"url": url}},
            )
            assert r.status_code == 400, (url, r.text)
            assert r.json()["error"]["code"] == "WEBHOOK_URL_REJECTED", url
        # A host name is judged by what it resolves to: this machine's own name resolves to
        # a loopback or private address, so it is refused like the address itself.
        host = socket.gethostname()
        addresses = {ipaddress.ip_address(a[4][0]) for a in socket.getaddrinfo(host, 443)}
        assert addresses and not any(a.is_global for a in addresses), addresses
        r = await client.put(
            f"{strict.url}/v1/stream/__ds/subscriptions/byname",
            json={"type": "webhook", "streams": ["a"], "webhook": {"url": f"https://{host}/hook"}},
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "WEBHOOK_URL_REJECTED"
        assert "resolves to a refused address" in r.json()["error"]["message"]
        for n, url in enumerate(LOOPBACK_URLS):
            r = await client.put(
                f"{dev.url}/v1/stream/__ds/subscriptions/l{n}",
                json={"type": "webhook", "streams": ["a"], "webhook": {"url": url}},
            )
            assert r.status_code == 201, (url, r.text)


async def test_pull_wake_lease_expiry_and_tokens(make_server: Any, tmp_path: Any) -> None:
    server: Server = make_server(f"sqlite:///{tmp_path / 'p.db'}")
    base = "/v1/stream/__ds/subscriptions/pool"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await client.put("/v1/stream/wake/pool", json=[])
        r = await client.put(
            base,
            json={
                "type": "pull-wake",
                "streams": ["jobs"],
                "wake_stream": "wake/pool",
                "lease_ttl_ms": 3000,
            },
        )
        assert r.status_code == 201, r.text
        for lease in (999, 600_001, "30000"):
            r = await client.put(
                "/v1/stream/__ds/subscriptions/bad",
                json={
                    "type": "pull-wake",
                    "streams": ["jobs"],
                    "wake_stream": "wake/pool",
                    "lease_ttl_ms": lease,
                },
            )
            assert r.status_code == 400 and r.json()["error"]["field"] == "lease_ttl_ms"
        own = await client.put(
            "/v1/stream/__ds/subscriptions/loop",
            json={"type": "pull-wake", "streams": ["wake/pool"], "wake_stream": "wake/pool"},
        )
        assert own.status_code == 400 and own.json()["error"]["field"] == "streams"
        r = await client.post(f"{base}/streams", json={"streams": ["wake/pool"]})
        assert r.status_code == 400 and r.json()["error"]["field"] == "streams"
        # Paths no stream can have: accepted (201), then never woken (found by a review).
        for odd in ("wk-x/./y", "shop w!", "x" * 600, "a//b", "shop-1/../secret"):
            for field, body in (
                ("wake_stream", {"type": "pull-wake", "pattern": "wk/*", "wake_stream": odd}),
                ("streams", {"type": "pull-wake", "streams": [odd], "wake_stream": "wake/w"}),
            ):
                r = await client.put("/v1/stream/__ds/subscriptions/odd", json=body)
                assert r.status_code == 400, (odd, r.text)
                assert r.json()["error"]["field"] == field, (odd, r.text)
            r = await client.post(f"{base}/streams", json={"streams": [odd]})
            assert r.status_code == 400 and r.json()["error"]["field"] == "streams", r.text
        default = await client.put(
            "/v1/stream/__ds/subscriptions/dflt",
            json={"type": "pull-wake", "streams": ["x"], "wake_stream": "wake/other"},
        )
        assert default.json()["lease_ttl_ms"] == 30_000
        r = await client.post(f"{base}/claim", json={"worker": "w1"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "NO_PENDING_WORK"

        await client.put("/v1/stream/jobs", json=[{"job": 1}])
        events = (await client.get("/v1/stream/wake/pool?offset=-1&live=long-poll")).json()
        assert [e["subscription_id"] for e in events] == ["pool"]
        first = (await client.post(f"{base}/claim", json={"worker": "w1"})).json()
        busy = await client.post(f"{base}/claim", json={"worker": "w2"})
        assert busy.status_code == 409
        assert busy.json()["error"]["current_holder"] == "w1"
        assert busy.json()["error"]["generation"] == first["generation"]
        # acks need the claim's token: none, or a made-up one, is refused
        ack = {"wake_id": first["wake_id"], "generation": first["generation"], "done": False}
        assert (await client.post(f"{base}/ack", json=ack)).status_code == 401
        r = await client.post(f"{base}/ack", json=ack, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        # a generation that is no integer is refused, not compared (true == 1 passed the fence)
        auth = {"Authorization": f"Bearer {first['token']}"}
        for odd in (True, 1.0, str(first["generation"])):
            r = await client.post(f"{base}/ack", json={**ack, "generation": odd}, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["field"] == "generation", r.text
        # a heartbeat keeps the lease; then it runs out and another worker claims a new wake
        assert (await client.post(f"{base}/ack", json=ack, headers=auth)).json() == {
            "ok": True,
            "next_wake": False,
        }

        async def claimed_by_w2() -> Any:
            r = await client.post(f"{base}/claim", json={"worker": "w2"})
            return r.json() if r.status_code == 200 else None

        second = await wait_for(claimed_by_w2, timeout=10, what="the lease to expire")
        assert second["generation"] > first["generation"]
        # the first worker's token is fenced now, for ack and release alike
        late = {**ack, "done": True}
        r = await client.post(f"{base}/ack", json=late, headers=auth)
        assert r.status_code == 409 and r.json()["error"]["code"] == "FENCED"
        r = await client.post(f"{base}/release", json=ack, headers=auth)
        assert r.status_code == 409 and r.json()["error"]["code"] == "FENCED"
        # an ack past the tail is refused and moves nothing
        auth2 = {"Authorization": f"Bearer {second['token']}"}
        wake2 = {"wake_id": second["wake_id"], "generation": second["generation"]}
        r = await client.post(
            f"{base}/ack",
            json={
                **wake2,
                "acks": [{"stream": "jobs", "offset": "0000000000000009_0000000000000000"}],
            },
            headers=auth2,
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "INVALID_OFFSET"
        # a release with pending work writes another wake event for a later claim
        assert (await client.post(f"{base}/release", json=wake2, headers=auth2)).status_code == 204
        events = (await client.get("/v1/stream/wake/pool?offset=-1")).json()
        assert len(events) >= 2 and events[-1]["generation"] > second["generation"]
        # deleting ends it: the claim is gone
        assert (await client.delete(base)).status_code == 204
        assert (await client.post(f"{base}/claim", json={"worker": "w3"})).status_code == 404


async def test_subscriptions_obey_token_roles(make_server: Any, tmp_path: Any) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": "admin-secret", "role": "admin"},
                    {"token": "eu-admin-secret", "role": "admin", "stations": ["eu/*"]},
                    {"token": "consumer-secret", "role": "consumer"},
                    {"token": "producer-secret", "role": "producer"},
                ]
            }
        )
    )
    server: Server = make_server(f"sqlite:///{tmp_path / 't.db'}", "--tokens", str(tokens))
    spec = {"type": "pull-wake", "streams": ["eu/a"], "wake_stream": "eu/wake"}
    base = "/v1/stream/__ds/subscriptions/roles"

    def bearer(secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"}

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.put(base, json=spec)).status_code == 401
        assert (
            await client.put(base, json=spec, headers=bearer("consumer-secret"))
        ).status_code == 403
        r = await client.put(
            base, json={**spec, "streams": ["us/a"]}, headers=bearer("eu-admin-secret")
        )
        assert r.status_code == 403
        assert (
            await client.put(base, json=spec, headers=bearer("eu-admin-secret"))
        ).status_code == 201
        assert (await client.get(base, headers=bearer("producer-secret"))).status_code == 200
        assert (await client.get("/v1/stream/__ds/jwks.json")).status_code == 200  # public
        await client.put("/v1/stream/eu/wake", json=[], headers=bearer("admin-secret"))
        await client.put("/v1/stream/eu/a", json=[{"x": 1}], headers=bearer("admin-secret"))
        assert (
            await client.post(
                f"{base}/claim", json={"worker": "w"}, headers=bearer("producer-secret")
            )
        ).status_code == 403
        claimed = await client.post(
            f"{base}/claim", json={"worker": "w"}, headers=bearer("consumer-secret")
        )
        assert claimed.status_code == 200, claimed.text
        c = claimed.json()
        # the ack is authorized by the claim's own token, not a service token
        r = await client.post(
            f"{base}/ack",
            json={"wake_id": c["wake_id"], "generation": c["generation"], "done": True},
            headers=bearer(c["token"]),
        )
        assert r.status_code == 200, r.text
        assert (await client.delete(base, headers=bearer("consumer-secret"))).status_code == 403


async def test_thousand_subscriptions_wake_on_one_append(make_server: Any, db_url: str) -> None:
    """1,000 pull-wake subscriptions on one station: one append wakes each of them exactly
    once (one wake event each), a second append while they are all awake adds none, and each
    can still be claimed. The engine is woken by the append's commit, not by a poll."""
    count = 1000
    server: Server = make_server(db_url, "--long-poll-timeout-ms", "1000")
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        await client.put("/v1/stream/fleet/wake", json=[])
        await client.put("/v1/stream/fleet/orders", json=[])
        sem = asyncio.Semaphore(16)

        async def create(i: int) -> None:
            async with sem:
                r = await client.put(
                    f"/v1/stream/__ds/subscriptions/fleet-{i}",
                    json={
                        "type": "pull-wake",
                        "streams": ["fleet/orders"],
                        "wake_stream": "fleet/wake",
                    },
                )
                assert r.status_code == 201, r.text

        await asyncio.gather(*(create(i) for i in range(count)))
        await append(client, "fleet/orders", {"order": 1})
        events: list[dict[str, Any]] = []
        offset = "-1"
        deadline = time.monotonic() + 60
        while len(events) < count:
            assert time.monotonic() < deadline, f"{len(events)} of {count} wake events"
            r = await client.get(f"/v1/stream/fleet/wake?offset={offset}&live=long-poll")
            if r.status_code == 200:
                events += r.json()
            offset = r.headers["Stream-Next-Offset"]
        assert sorted(e["subscription_id"] for e in events) == sorted(
            f"fleet-{i}" for i in range(count)
        )
        assert {e["stream"] for e in events} == {"fleet/orders"}
        # all are awake (wake in flight): more data makes no second wake for any of them
        await append(client, "fleet/orders", {"order": 2})
        r = await client.get(f"/v1/stream/fleet/wake?offset={offset}&live=long-poll")
        assert r.status_code == 204 or r.json() == []
        claimed = await client.post(
            "/v1/stream/__ds/subscriptions/fleet-7/claim", json={"worker": "w"}
        )
        assert claimed.status_code == 200
        assert claimed.json()["streams"][0]["tail_offset"] == await tail(client, "fleet/orders")


async def test_two_processes_share_subscriptions(
    pg_url: str, make_server: Any, receiver: Receiver
) -> None:
    """Two ``stations serve`` on one PostgreSQL database: a subscription made on one wakes on
    appends made on the other (LISTEN/NOTIFY), each wake is delivered by one process only,
    and the wakes chain over every message."""
    a: Server = make_server(pg_url, LOOPBACK)
    b: Server = make_server(pg_url, LOOPBACK)
    await receiver.start()
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
        httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
    ):
        r = await ca.put(
            "/v1/stream/__ds/subscriptions/shared",
            json={"type": "webhook", "pattern": "multi/*", "webhook": {"url": receiver.url}},
        )
        assert r.status_code == 201
        await cb.put("/v1/stream/multi/x", json=[])
        for i in range(20):
            await append(ca if i % 2 else cb, "multi/x", {"n": i})

        async def caught_up() -> bool:
            body = (await cb.get("/v1/stream/__ds/subscriptions/shared")).json()
            acked = [s["acked_offset"] for s in body["streams"] if s["path"] == "multi/x"]
            return acked == [await tail(ca, "multi/x")]

        await wait_for(caught_up, what="the cursor to catch up")
        generations = [body["generation"] for body, _, _ in receiver.received]
        assert len(generations) == len(set(generations)), generations  # one delivery per wake
        spans = sorted(
            (s["acked_offset"], s["tail_offset"])
            for body, _, _ in receiver.received
            for s in body["streams"]
            if s["has_pending"]
        )
        assert spans[0][0] == ZERO
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start == end, spans


# -- wakes that were lost or repeated (a review, 2026-11-27) ------------------------------------


async def _events(client: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/stream/{path}", params={"offset": "-1"})
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()
    return events


@contextlib.asynccontextmanager
async def webhook(handler: Any) -> AsyncIterator[str]:
    """A webhook endpoint on loopback that answers with ``handler``; yields its URL."""
    port = free_port()
    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


async def _pull_wake(client: httpx.AsyncClient, url: str, streams: list[str]) -> None:
    """A pull-wake subscription at ``url`` over new ``streams``, waking stream ``wk``."""
    for path in ("wk", *streams):
        assert (await client.put(f"/v1/stream/{path}", json=[])).status_code == 201
    spec = {"type": "pull-wake", "streams": streams, "wake_stream": "wk"}
    assert (await client.put(url, json=spec)).status_code == 201


async def test_a_pull_wake_whose_work_went_away_ends_when_claimed(
    make_server: Any, tmp_path: Any
) -> None:
    """The pending stream of a wake leaves the subscription before anyone claims it: the claim
    answers NO_PENDING_WORK, and the wake stayed open, so an append to another stream of the
    subscription announced nothing (a worker driven by events never heard of it)."""
    server: Server = make_server(f"sqlite:///{tmp_path / 'w.db'}")
    base = "/v1/stream/__ds/subscriptions/gone"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await _pull_wake(client, base, ["a", "b"])
        await append(client, "a", {"n": 1})
        first = await wait_for(lambda: _events(client, "wk"), what="the first wake event")
        assert [e["generation"] for e in first] == [1]
        assert (await client.delete(f"{base}/streams/a")).status_code == 204
        claim = await client.post(f"{base}/claim", json={"worker": "w1"})
        assert claim.status_code == 409 and claim.json()["error"]["code"] == "NO_PENDING_WORK"
        await append(client, "b", {"n": 2})

        async def second() -> bool:
            return len(await _events(client, "wk")) == 2

        await wait_for(second, timeout=5, what="a wake event for the append to b")


async def test_a_wake_waits_for_its_wake_stream(make_server: Any, tmp_path: Any) -> None:
    """Appends before the wake stream exists: the wake was started without its event and never
    announced again, however many appends followed once the stream was there."""
    server: Server = make_server(f"sqlite:///{tmp_path / 'w2.db'}")
    base = "/v1/stream/__ds/subscriptions/later"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.put("/v1/stream/a", json=[])).status_code == 201
        spec = {"type": "pull-wake", "streams": ["a"], "wake_stream": "wk2"}
        assert (await client.put(base, json=spec)).status_code == 201
        await append(client, "a", {"n": 1})
        assert (await client.put("/v1/stream/wk2", json=[])).status_code == 201
        await append(client, "a", {"n": 2})
        events = await wait_for(lambda: _events(client, "wk2"), timeout=5, what="a wake event")
        assert [e["subscription_id"] for e in events] == ["later"]


async def test_a_heartbeat_stops_the_retries_of_its_delivery(
    make_server: Any, tmp_path: Any
) -> None:
    """The receiver calls back (a heartbeat: it holds the wake) and then fails the POST itself
    (past its own timeout, say): the same generation was POSTed again about every second."""
    deliveries: list[tuple[int, str]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.json()
        deliveries.append((body["generation"], body["wake_id"]))
        async with httpx.AsyncClient(timeout=10) as callback:
            r = await callback.post(
                body["callback_url"],
                headers={"Authorization": f"Bearer {body['callback_token']}"},
                json={"generation": body["generation"], "wake_id": body["wake_id"]},
            )
            assert r.status_code == 200, r.text
        return web.json_response({"error": "busy"}, status=500)

    async with webhook(hook) as url:
        server: Server = make_server(f"sqlite:///{tmp_path / 'w3.db'}", LOOPBACK)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            assert (await client.put("/v1/stream/a", json=[])).status_code == 201
            spec = {
                "type": "webhook",
                "streams": ["a"],
                "webhook": {"url": url},
                "lease_ttl_ms": 10_000,
            }
            r = await client.put("/v1/stream/__ds/subscriptions/beat", json=spec)
            assert r.status_code == 201, r.text
            await append(client, "a", {"n": 1})
            await asyncio.sleep(3.5)
        assert len(deliveries) == 1, deliveries  # its lease (10 s) decides, not the retries


async def test_a_stream_deleted_during_a_delivery_is_not_acked_past_its_new_tail(
    make_server: Any, tmp_path: Any
) -> None:
    """A webhook answers done while the stream it was told of was deleted and created again:
    the wake's snapshot acked the new stream up to the old one's tail (5, of 2 messages), and
    the new stream's messages were never delivered."""
    deliveries: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        deliveries.append(await request.json())
        if len(deliveries) == 1:
            await asyncio.sleep(1.5)  # the test deletes and recreates the stream meanwhile
        return web.json_response({"done": True})

    async with webhook(hook) as url:
        server: Server = make_server(f"sqlite:///{tmp_path / 'w4.db'}", LOOPBACK)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            spec = {
                "type": "webhook",
                "pattern": "ev/*",
                "webhook": {"url": url},
            }
            r = await client.put("/v1/stream/__ds/subscriptions/again", json=spec)
            assert r.status_code == 201, r.text
            assert (await client.put("/v1/stream/ev/x", json=[1, 2, 3, 4, 5])).status_code == 201

            async def first() -> bool:
                return len(deliveries) == 1

            await wait_for(first, timeout=10, what="the first delivery")
            assert (await client.delete("/v1/stream/ev/x")).status_code == 204
            assert (await client.put("/v1/stream/ev/x", json=[{"new": 1}])).status_code == 201
            await append(client, "ev/x", {"new": 2})

            async def told_of_the_new_stream() -> bool:
                return any(
                    s["path"] == "ev/x" and s["has_pending"]
                    for d in deliveries[1:]
                    for s in d["streams"]
                )

            await wait_for(told_of_the_new_stream, timeout=10, what="a delivery of the new ev/x")


async def test_two_processes_creating_one_subscription_at_once(
    pg_url: str, make_server: Any
) -> None:
    """Two processes each took a new subscription id for free (its row was not there to lock)
    and both inserted it: one answered 500 (a unique-key violation), about one PUT in seven."""
    servers: list[Server] = [make_server(pg_url), make_server(pg_url)]
    async with httpx.AsyncClient(timeout=30) as client:
        statuses: list[int] = []
        for i in range(40):
            spec = {"type": "pull-wake", "streams": [f"s{i}"], "wake_stream": "wk"}
            answers = await asyncio.gather(
                *(
                    client.put(f"{s.url}/v1/stream/__ds/subscriptions/r{i}", json=spec)
                    for s in servers * 2
                )
            )
            codes = sorted(r.status_code for r in answers)
            statuses += codes
            assert codes == [200, 200, 200, 201], (i, [r.text[:200] for r in answers])
    assert len(statuses) == 160


MALFORMED_HOSTS = [
    "https://[v1.x]/hook",  # an IPvFuture literal: no resolver answers it, retried forever
    "https://[example.com]/hook",  # brackets hold IPv6 literals only
    "https://exa_mple..com/hook",  # an empty label
    "https://-example.com/hook",  # a label starts with a hyphen
    "https://example-.com/hook",
    "https://exa$mple.com/hook",
    "https://10.1/hook",  # all-numeric: not a DNS name, and not an IPv4 literal either
    "https://1.2.3.256/hook",
    "https://" + "a" * 64 + ".com/hook",  # a label over 63 octets
    "https://" + ".".join(["abcdefghi"] * 26) + "/hook",  # a name over 253 octets
]


def test_webhook_urls_whose_host_no_resolver_answers_are_refused() -> None:
    from stations.domain.subscriptions.errors import UrlRejected
    from stations.domain.subscriptions.urls import check_webhook_url

    for url in MALFORMED_HOSTS:
        with pytest.raises(UrlRejected) as refused:
            check_webhook_url(url, allow_loopback=False)
        assert refused.value.field == "webhook.url", url
    for url in (
        "https://example.com/hook",
        "https://xn--bcher-kva.example/x",
        "https://bücher.example/x",
        "https://hooks_1.example.com./x",
        "https://93.184.215.14/hook",
        "https://[2606:2800:220:1::]/hook",
    ):
        assert check_webhook_url(url, allow_loopback=False)[0], url


async def test_a_restart_after_a_crash_before_the_wake_started_delivers_it(
    make_server: Any, tmp_path: Any
) -> None:
    """kill -9 after an append committed and before the transaction that starts its webhook
    wake: the restart's sweep starts it. It armed the same subscription's timer twice, and
    the second ``_arm`` asked uvloop's Handle (given for a moment already due) for ``when()``,
    which it has not: the server refused to start, with the exit code of a bad command line."""
    import sqlite3

    receiver = Receiver(answer={})  # no done: the data stays pending
    await receiver.start()
    db = tmp_path / "crash.db"
    server: Server = make_server(f"sqlite:///{db}", LOOPBACK)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.put("/v1/stream/w/a", json=[])).status_code == 201
        spec = {"type": "webhook", "pattern": "w/*", "webhook": {"url": receiver.url}}
        r = await client.put("/v1/stream/__ds/subscriptions/s1", json=spec)
        assert r.status_code == 201, r.text
        await append(client, "w/a", {"x": 1})
        await receiver.wait(1)
    server.kill()
    # What the crash leaves: the append committed, no wake started for it.
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE ds_subscriptions SET wake_id = NULL, next_attempt_at = NULL, attempts = 0"
        )
    server.start()
    try:
        await receiver.wait(2)
        assert receiver.received[1][0]["subscription_id"] == "s1"
    finally:
        await receiver.stop()


async def test_removing_a_stream_decodes_its_path_once(make_server: Any, tmp_path: Any) -> None:
    """``.../streams/a%2541`` names the stream ``a%41``; it was decoded a second time, into
    ``aA``, and that other stream left the subscription."""
    server: Server = make_server(f"sqlite:///{tmp_path / 'd.db'}")
    base = "/v1/stream/__ds/subscriptions/decode"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await _pull_wake(client, base, ["aA", "b"])
        await client.delete(f"{base}/streams/a%2541")
        view = (await client.get(base)).json()
        assert sorted(s["path"] for s in view["streams"]) == ["aA", "b"]
