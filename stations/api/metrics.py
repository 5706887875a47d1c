"""``GET /metrics``: Prometheus text, from prometheus_client with a registry per application."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "stations_http_requests",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "stations_http_request_seconds",
            "HTTP request latency (long-polls and SSE included)",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
        )


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def metrics_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    metrics: Metrics = request.app["metrics"]
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        route = _route(request)
        metrics.requests.labels(request.method, route, str(status)).inc()
        metrics.latency.labels(request.method, route).observe(time.perf_counter() - started)


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app["metrics"].registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
