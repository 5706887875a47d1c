"""Scoped tokens and what reaches past a station's name: subscription patterns, subscriptions
that exist, and consumer-group limits that make the lease timer forward into the DLS target.
Each case was found by a review and failed on the code before its fix."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server

ADMIN, TEAM, VERSIONS, SHOP, SHOP_CONSUMER = (
    "admin-token-1",
    "team-admin-1",
    "versions-admin-1",
    "shop-admin-1",
    "shop-consumer-1",
)
SUBS = "/v1/stream/__ds/subscriptions"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("scopes")
    tokens = [
        {"token": ADMIN, "role": "admin"},
        {"token": TEAM, "role": "admin", "stations": ["team/*"]},
        {"token": VERSIONS, "role": "admin", "stations": ["orders-v?"]},
        {"token": SHOP, "role": "admin", "stations": ["shop"]},
        {"token": SHOP_CONSUMER, "role": "consumer", "stations": ["shop"]},
    ]
    (work / "tokens.json").write_text(json.dumps({"tokens": tokens}))
    srv = Server(f"sqlite:///{work / 'db.sqlite'}", work, ["--tokens", str(work / "tokens.json")])
    srv.start()
    admin = _client(srv, ADMIN)
    for name in ("team", "team/wake", "orders-v1", "orders-v10-secret", "audit"):
        assert admin.post("/api/stations", json={"name": name}).status_code == 201
    shop = {"name": "shop", "dls": {"forwardTo": "audit"}}
    assert admin.post("/api/stations", json=shop).status_code == 201
    yield srv
    srv.kill()


def _client(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15
    )


def test_a_pattern_must_not_match_streams_outside_the_tokens_scope(server: Server) -> None:
    team, versions = _client(server, TEAM), _client(server, VERSIONS)
    # ``team/**`` matches ``team`` itself, which ``team/*`` does not cover.
    wide = {"type": "pull-wake", "pattern": "team/**", "wake_stream": "team/wake"}
    answer = team.put(f"{SUBS}/wide", json=wide)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["field"] == "pattern"
    # A ``?`` of the token's pattern is one character, not the glob's ``*``.
    hook = {"type": "webhook", "pattern": "orders-v*", "webhook": {"url": "https://x.test/h"}}
    assert versions.put(f"{SUBS}/versions", json=hook).status_code == 403
    # Within the scope, a pattern is fine.
    narrow = {"type": "pull-wake", "pattern": "team/*", "wake_stream": "team/wake"}
    assert team.put(f"{SUBS}/narrow", json=narrow).status_code == 201


def test_an_existing_subscription_outside_the_scope_is_not_shown(server: Server) -> None:
    admin, shop = _client(server, ADMIN), _client(server, SHOP)
    spec = {"type": "webhook", "streams": ["shop"], "webhook": {"url": "https://x.test/s"}}
    assert admin.put(f"{SUBS}/both", json=spec).status_code == 201
    assert admin.post(f"{SUBS}/both/streams", json={"streams": ["audit"]}).status_code == 204
    # The same spec sent again used to answer 200 with every linked stream, audit's too.
    again = shop.put(f"{SUBS}/both", json=spec)
    assert again.status_code == 404, again.text
    assert "audit" not in again.text
    # Out of scope and absent answer alike: the id tells nothing.
    for sub_id in ("both", "never-created"):
        answer = shop.get(f"{SUBS}/{sub_id}")
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == f"subscription {sub_id} not found"
    # Nor does a different definition under that id: it answered 409 "exists with a
    # different configuration" where GET says there is none.
    other = {"type": "webhook", "streams": ["shop"], "webhook": {"url": "https://x.test/o"}}
    answer = shop.put(f"{SUBS}/both", json=other)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"] == "subscription both not found"
    assert admin.get(f"{SUBS}/both").json()["webhook"]["url"] == "https://x.test/s"


def test_group_limits_need_the_scope_of_the_dls_forward_target(server: Server) -> None:
    """Lowering maxMsgDeliveries makes the lease timer dead-letter a leased message, and so
    forward it into ``audit``: the consumer's token must cover ``audit`` for that, as for a
    nack."""
    admin, consumer = _client(server, ADMIN), _client(server, SHOP_CONSUMER)
    assert admin.put("/api/stations/shop/groups/g", json={}).status_code == 201
    answer = consumer.put("/api/stations/shop/groups/g", json={"maxMsgDeliveries": 1})
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["field"] == "dls.forwardTo"
    (view,) = admin.get("/api/stations/shop/groups").json()["groups"]
    assert view["maxMsgDeliveries"] != 1


def test_names_covered_by_a_literal_prefix_pattern() -> None:
    from stations.api.auth import covers_pattern

    assert covers_pattern(["team/*"], "team/x/**")
    assert covers_pattern(["team/*"], "team/a*")
    assert covers_pattern(["*"], "**")
    assert not covers_pattern(["team/*"], "team/**")
    assert not covers_pattern(["team/*"], "tea*")
    assert not covers_pattern(["team"], "team/*")
    assert covers_pattern(["team"], "team")
    # ``team/**`` is ``team`` and what lies under ``team/``: that scope, written in two.
    assert covers_pattern(["team", "team/*"], "team/**")
    assert covers_pattern(["team", "team/*"], "team/**/**")
    assert covers_pattern(["team/*"], "team/**/x")  # it never matches ``team`` itself
    assert not covers_pattern(["team", "team/*"], "team*")
    assert covers_pattern(["team*"], "team/**")


def test_a_webhooks_address_is_shown_to_admin_tokens_only(server: Server) -> None:
    """A webhook's URL may be its secret (a chat service's incoming-webhook address posts to a
    channel for whoever holds it); a consumer token that may read the subscription saw it."""
    admin, consumer = _client(server, ADMIN), _client(server, SHOP_CONSUMER)
    url = "https://hooks.example.test/services/T000/B000/not-for-consumers"
    spec = {"type": "webhook", "streams": ["shop"], "webhook": {"url": url}}
    assert admin.put(f"{SUBS}/hook-secret", json=spec).status_code == 201
    seen = consumer.get(f"{SUBS}/hook-secret")
    assert seen.status_code == 200, seen.text
    assert "not-for-consumers" not in seen.text
    assert seen.json()["webhook"]["signing"]["alg"] == "ed25519"
    assert admin.get(f"{SUBS}/hook-secret").json()["webhook"]["url"] == url
