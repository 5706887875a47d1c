"""api/openapi.yaml describes the API as built: every route the application serves (but the
console's pages) is in the document with its methods, and the document parses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator

from stations.api import make_app
from stations.domain.service import Service
from tests.harness import Server
from tests.module_server import module_server

SPEC = Path(__file__).parent.parent / "stations" / "api" / "openapi.yaml"
NOT_API = {"/", "/ui", "/ui/"}


def _served() -> dict[str, set[str]]:
    app = make_app(Service("sqlite:///:memory:"))
    routes: dict[str, set[str]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or info.get("prefix")
        if path is None or path in NOT_API or path.startswith("/ui"):
            continue
        path = re.sub(r"\{(\w+)(:[^}]*(\{[^}]*\})?[^}]*)?\}", r"{\1}", path)
        path = path.replace("{name}", "{path}") if path.startswith("/v1/stream/") else path
        if route.method != "HEAD" or path.startswith("/v1/"):
            routes.setdefault(path, set()).add(route.method.lower())
    return routes


def test_every_route_is_documented() -> None:
    spec = yaml.safe_load(SPEC.read_text())
    documented = {path: set(ops) - {"parameters"} for path, ops in spec["paths"].items()}
    for path, methods in _served().items():
        assert path in documented, f"{path} is served but not in api/openapi.yaml"
        if path.startswith("/v1/stream/"):
            continue  # the Durable Streams protocol is documented by reference, POST in full
        assert methods <= documented[path], f"{path}: {methods - documented[path]} undocumented"


def test_schemas_resolve() -> None:
    spec = yaml.safe_load(SPEC.read_text())
    text = SPEC.read_text()
    for ref in set(re.findall(r'\$ref: "#/([^"]+)"', text)):
        node = spec
        for part in ref.split("/"):
            assert part in node, f"dangling $ref #{ref}"
            node = node[part]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_server("sqlite", tmp_path_factory)


def _request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    body = spec["paths"][path]["post"]["requestBody"]
    while "$ref" in body:
        node: Any = spec
        for part in body["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        body = node
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    return schema


REPLAY = "/api/stations/{name}/dls/replay"
DROP = "/api/stations/{name}/dls/drop"


@pytest.mark.parametrize(
    ("path", "body", "accepted"),
    [
        (REPLAY, {"ids": ["1"]}, True),
        (REPLAY, {"ids": ["1"], "delayMs": 5}, True),
        (REPLAY, {"ids": ["1"], "group": "g"}, True),
        (REPLAY, {"ids": ["1"], "group": "g", "delayMs": 5}, True),
        (REPLAY, {"all": True}, True),
        (REPLAY, {"all": True, "group": "g", "delayMs": 5}, True),
        (REPLAY, {"ids": ["1"], "extra": 1}, False),
        (REPLAY, {"ids": ["1"], "group": "g", "extra": 1}, False),
        (REPLAY, {"all": True, "extra": 1}, False),
        (REPLAY, {"all": True, "ids": ["1"]}, False),
        (REPLAY, {"all": False}, False),
        (REPLAY, {}, False),
        # Integer ids, a null group and "all": false beside ids: the server takes them.
        (REPLAY, {"ids": [1, "2"], "group": None, "all": False}, True),
        (REPLAY, {"all": True, "group": None}, True),
        (REPLAY, {"ids": [-1]}, False),
        (REPLAY, {"ids": ["1x"]}, False),
        (DROP, {"ids": [1], "all": False}, True),
        (DROP, {"ids": ["1"]}, True),
        (DROP, {"all": True}, True),
        (DROP, {"ids": ["1"], "group": "g"}, False),
        (DROP, {"all": True, "group": "g"}, False),
        (DROP, {"ids": ["1"], "delayMs": 5}, False),
        (DROP, {"ids": ["1"], "extra": 1}, False),
        (DROP, {"all": True, "ids": ["1"]}, False),
    ],
)
def test_dls_selection_schema_takes_what_the_server_takes(
    srv: Server, path: str, body: dict[str, Any], accepted: bool
) -> None:
    """The DLS replay and drop bodies: the schema let unknown fields through (the server
    refuses them), matched ids with a group in two ``oneOf`` branches at once (so refused a
    body the server takes), and let drop take ``group`` and ``delayMs`` (replay only); it
    refused integer ids, a null group and ``"all": false`` beside ids, which the server takes."""
    spec = yaml.safe_load(SPEC.read_text())
    # Its "#/components/..." references resolve against the schema's own root.
    schema = {**_request_schema(spec, path), "components": spec["components"]}
    assert Draft202012Validator(schema).is_valid(body) is accepted, schema
    with httpx.Client(base_url=srv.url, timeout=10) as http:
        assert http.post("/api/stations", json={"name": "oas-dls"}).status_code in (200, 201)
        assert http.put("/api/stations/oas-dls/groups/g", json={}).status_code in (200, 201)
        answer = http.post(path.replace("{name}", "oas-dls"), json=body)
    assert answer.status_code == (200 if accepted else 400), answer.text
