"""The query parameters each management route takes, as ``openapi.yaml`` documents them.

A name a route does not take is a 400 naming it: a typo (``?limt=10``, ``?ofset=5``) answered
as if the parameter were absent reads the wrong page, or from the start, without a word. The
document is the one list: a parameter the server reads but the document leaves out is refused
too, so the two cannot drift apart (``tests/test_query_params.py`` sends each route a name it
does not take).

Only ``/api/`` routes: the Durable Streams routes follow that protocol, whose clients may add
parameters of their own (cache busters) that its servers ignore.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from stations.errors import BadRequest

SPEC = Path(__file__).with_name("openapi.yaml")
_METHODS = ("get", "put", "post", "patch", "delete")


@functools.cache
def table() -> dict[tuple[str, str], frozenset[str]]:
    """``(METHOD, path template)`` → the query parameters the operation documents."""
    with SPEC.open("rb") as f:
        spec: dict[str, Any] = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    shared: dict[str, Any] = spec.get("components", {}).get("parameters", {})

    def queries(params: list[dict[str, Any]]) -> set[str]:
        names = set()
        for p in params:
            ref = p.get("$ref")
            if ref is not None:
                p = shared[ref.rsplit("/", 1)[1]]
            if p.get("in") == "query":
                names.add(p["name"])
        return names

    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, item in spec["paths"].items():
        if not path.startswith("/api/"):
            continue
        common = queries(item.get("parameters", []))
        for method in _METHODS:
            op = item.get(method)
            if op is not None:
                out[method.upper(), path] = frozenset(common | queries(op.get("parameters", [])))
    return out


def refused_query(request: web.Request) -> None:
    """Raise a 400 naming the first query parameter the matched route does not take."""
    if not request.query_string:
        return
    resource = request.match_info.route.resource
    if resource is None:  # no route matched: the 404 or 405 says so
        return
    method = "GET" if request.method == "HEAD" else request.method
    taken = table().get((method, resource.canonical))
    if taken is None:  # not a documented /api/ operation
        return
    for name in request.query:
        if name not in taken:
            takes = f"takes: {', '.join(sorted(taken))}" if taken else "takes none"
            raise BadRequest(f"unknown query parameter {name!r} (this route {takes})", name)
