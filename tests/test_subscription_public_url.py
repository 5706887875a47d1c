"""``--public-url``: webhook callback and JWKS URLs are built on the URL clients reach the
server at, not on the scheme and host of the request that created the subscription (``http``
behind a TLS proxy, a loopback address when created on the server's own host: a receiver that
answers later through the callback never could). A review found it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx

from tests.harness import Server
from tests.test_subscriptions import LOOPBACK, Receiver

PUBLIC = "https://stations.example.com/broker"


async def test_callback_and_jwks_urls_use_the_public_url(make_server: Any, tmp_path: Any) -> None:
    server: Server = make_server(
        f"sqlite:///{tmp_path / 'p.db'}", LOOPBACK, "--public-url", PUBLIC + "/"
    )
    receiver = Receiver(answer={})
    await receiver.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.put(
                "/v1/stream/__ds/subscriptions/hook",
                json={"type": "webhook", "streams": ["a"], "webhook": {"url": receiver.url}},
            )
            assert r.status_code == 201, r.text
            jwks = r.json()["webhook"]["signing"]["jwks_url"]
            assert jwks == f"{PUBLIC}/v1/stream/__ds/jwks.json"
            await client.put("/v1/stream/a", json=[{"x": 1}])
            await receiver.wait(1)
            body = receiver.received[0][0]
            assert body["callback_url"] == f"{PUBLIC}/v1/stream/__ds/subscriptions/hook/callback"
    finally:
        await receiver.stop()


def test_a_public_url_that_is_not_http_is_refused() -> None:
    for bad in (
        "ftp://x",
        "stations.example.com",
        "https://",
        "https://h/?q=1",
        "https://h:99999/",
        "http://[::1",
    ):
        done = subprocess.run(
            [sys.executable, "-m", "stations", "serve", "--public-url", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (bad, done.stderr)
        assert "--public-url" in done.stderr and "is not an http(s) URL" in done.stderr
