"""api/openapi.yaml describes the API as built: every route the application serves (but the
console's pages) is in the document with its methods, and the document parses."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from stations.api import make_app
from stations.domain.service import Service

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
