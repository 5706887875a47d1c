"""A 403 says what would be allowed: the role(s) a request needs, and the station a token does
not cover. They said "role consumer may not admin here" and "this token does not cover that
station", which left a user of the CLI or a pipeline guessing which token or station was
meant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server

ADMIN = "admin-secret-0123456789"
CONSUMER = "consumer-secret-0123456789"
PRODUCER = "producer-secret-0123456789"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir: Path = tmp_path_factory.mktemp("auth-messages")
    tokens = workdir / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": ADMIN, "role": "admin"},
                    {"token": CONSUMER, "role": "consumer", "stations": ["orders"]},
                    {"token": PRODUCER, "role": "producer"},
                ]
            }
        )
    )
    server = Server(f"sqlite:///{workdir / 's.db'}", workdir, ["--tokens", str(tokens)]).start()
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for name in ("orders", "billing"):
            made = http.post(
                "/api/stations", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert made.status_code == 201, made.text
    yield server
    server.kill()


def _as(srv: Server, token: str, method: str, path: str, body: object = None) -> httpx.Response:
    with httpx.Client(base_url=srv.url, timeout=10) as http:
        return http.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize(
    ("token", "method", "path", "body", "message"),
    [
        (
            CONSUMER,
            "PATCH",
            "/api/stations/orders",
            {"idempotencyWindowMs": 5000},
            "role consumer may not do this: it needs a token of role admin",
        ),
        (
            PRODUCER,
            "POST",
            "/api/stations/orders/groups/g/fetch",
            {"max": 1},
            "role producer may not do this: it needs a token of role admin or consumer",
        ),
        (
            CONSUMER,
            "GET",
            "/api/stations/billing",
            None,
            "this token does not cover station 'billing'",
        ),
    ],
)
def test_a_refusal_says_what_would_be_allowed(
    srv: Server, token: str, method: str, path: str, body: object, message: str
) -> None:
    answer = _as(srv, token, method, path, body)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["message"] == message
