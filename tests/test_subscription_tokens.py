"""Wake tokens a client forges are refused as TOKEN_INVALID on the open wake routes, whatever
the token library makes of them (a JWT header whose ``crit`` was not a list raised TypeError:
an unauthenticated 500, inside a writer batch other clients' appends shared)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from tests.harness import Server
from tests.test_subscriptions import LOOPBACK


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


@pytest.mark.parametrize("crit", [5, None, 1.5, True, [1], [[1]], "x"])
async def test_a_forged_token_header_is_token_invalid(
    make_server: Any, tmp_path: Any, crit: Any
) -> None:
    server: Server = make_server(f"sqlite:///{tmp_path / 'p.db'}", LOOPBACK)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        for path in ("wk", "a"):
            assert (await c.put(f"/v1/stream/{path}", json=[])).status_code in (200, 201)
        pull = {"type": "pull-wake", "streams": ["a"], "wake_stream": "wk"}
        assert (await c.put("/v1/stream/__ds/subscriptions/pw", json=pull)).status_code in (
            200,
            201,
        )
        # Never called: the append that would wake it is not made.
        hook = {"type": "webhook", "streams": ["a"], "webhook": {"url": "http://127.0.0.1:9/h"}}
        r = await c.put("/v1/stream/__ds/subscriptions/wh", json=hook)
        assert r.status_code in (200, 201), r.text
        token = _b64({"alg": "Ed25519", "crit": crit}) + ".e30.AAAA"
        for route, sub in (("callback", "wh"), ("ack", "pw"), ("release", "pw")):
            r = await c.post(
                f"/v1/stream/__ds/subscriptions/{sub}/{route}",
                headers={"Authorization": f"Bearer {token}"},
                json={"wake_id": "w", "generation": 1},
            )
            assert r.status_code == 401, (route, r.status_code, r.text)
            assert r.json()["error"]["code"] == "TOKEN_INVALID"
