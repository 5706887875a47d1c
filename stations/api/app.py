"""The aiohttp application: routes, the edge middleware and the service's life cycle."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stations.api import (
    cursors,
    groups,
    keys,
    params,
    stations,
    streams,
    subscriptions,
    transactions,
)
from stations.api.auth import TOKENS, may_see_internals, needs
from stations.api.drain import DRAIN, Drain, close_when_draining
from stations.api.edge import count_file, edge_middleware
from stations.api.errors import RETRY_AFTER_S
from stations.api.headers import CORS, CorsPolicy, on_prepare
from stations.api.limits import (
    LIMITS,
    READERS,
    SLOW_CLIENTS,
    Limits,
    ReaderSlots,
    SlowClients,
    with_expect_continue,
)
from stations.api.metrics import (
    DEFAULT_MAX_STATIONS,
    METRICS,
    METRICS_REFRESH,
    Metrics,
    metrics_handler,
)
from stations.domain.service import Service
from stations.tokens import Token

MAX_BODY = 64 * 1024 * 1024
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


@needs("open")
async def livez(_request: web.Request) -> web.Response:
    """The process is up and its event loop answers."""
    return web.json_response({"status": "ok"})


@needs("open")
async def readyz(request: web.Request) -> web.Response:
    """The database answers and takes writes: 200, else 503 saying why (``/healthz`` is the
    same check)."""
    problem = await request.app[keys.SERVICE].ping()
    if problem is None:
        return web.json_response({"status": "ok"})
    state, why = problem
    body = {"status": "unavailable", "database": state}
    if may_see_internals(request):  # the probes are open: the driver's words are not
        body["error"] = why
    return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})


@needs("open")
async def to_console(_request: web.Request) -> web.Response:
    # Relative (from / and from /ui alike): behind a proxy that mounts the server under a path
    # prefix, "/ui/" left the prefix.
    raise web.HTTPFound("ui/")


@needs("open")
async def console_index(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


OPENAPI = Path(__file__).with_name("openapi.yaml")
_SERVERS = re.compile(r"^servers:\n  - url: .*\n    description: .*$", re.MULTILINE)


# Without --public-url the document names its server relative to itself: "..", from
# /api/openapi.yaml, is the server's root whatever its port, and behind a proxy's path prefix
# too (the file itself names the default address, which a server on another port is not).
_RELATIVE = (
    "..",
    "this server: relative to this document (start it with --public-url to name one)",
)


@functools.lru_cache(maxsize=4)
def _openapi_at(url: str, description: str) -> tuple[bytes, str]:
    """The document with ``url`` as its one server, and its entity tag."""
    text, found = _SERVERS.subn(
        f"servers:\n  - url: {json.dumps(url)}\n    description: {json.dumps(description)}",
        OPENAPI.read_text(encoding="utf-8"),
        1,
    )
    if not found:
        raise RuntimeError("openapi.yaml has no 'servers:' list of one url to replace")
    body = text.encode()
    return body, hashlib.sha256(body).hexdigest()[:20]


@needs("read")
async def openapi(request: web.Request) -> web.StreamResponse:
    public_url = request.app[keys.PUBLIC_URL]
    if public_url is None:
        body, tag = _openapi_at(*_RELATIVE)
    else:
        body, tag = _openapi_at(public_url, "this server (--public-url)")
    # A tool that asks again revalidates it (304) rather than reading ~75 KB each time.
    if any(asked.value in (tag, "*") for asked in request.if_none_match or ()):
        return web.Response(status=304, headers={"ETag": f'"{tag}"', "Cache-Control": "no-cache"})
    # mimetypes knows no .yaml before Python 3.13: it went as application/octet-stream.
    response = web.Response(body=body, content_type="application/yaml", charset="utf-8")
    response.etag = tag
    response.headers["Cache-Control"] = "no-cache"
    return response


class _ReadCollector:
    """Read transactions, waiting readers, the read-memory budget and SQLite's WAL, read at
    scrape time."""

    def __init__(self, service: Service, readers: ReaderSlots) -> None:
        self.service, self.readers = service, readers

    def collect(self) -> list[Metric]:
        reads = CounterMetricFamily(
            "stations_read_transactions", "database read transactions run by this process"
        )
        reads.add_metric([], self.service.read_transactions)
        relaxed = CounterMetricFamily(
            "stations_writer_relaxed_commits",
            "commits of fetches alone, which do not wait for the disk (a power cut may cost a "
            "redelivery of what they leased)",
        )
        relaxed.add_metric([], self.service.relaxed_commits)
        waiting = GaugeMetricFamily("stations_waiting_readers", "long-poll and SSE readers")
        waiting.add_metric([], self.readers.used)
        held = GaugeMetricFamily(
            "stations_read_budget_used_bytes", "bytes of read pages held in memory"
        )
        held.add_metric([], self.service.budget.used)
        failing = GaugeMetricFamily(
            "stations_writes_failing",
            "1 while the writer's transactions fail (a full disk, a lost database) and none has "
            "written since, else 0",
        )
        failing.add_metric([], int(self.service.writes_failing))
        deaf = GaugeMetricFamily(
            "stations_notifications_failing",
            "1 while this process cannot LISTEN for other processes' commits (PostgreSQL; "
            "their appends then reach its waiting readers and fetches only at their timeouts), "
            "else 0",
        )
        deaf.add_metric([], int(self.service.notifications_failing))
        families: list[Metric] = [reads, relaxed, waiting, held, failing, deaf]
        wal = self.service.wal()
        if wal is not None:  # an SQLite file whose WAL this process checkpoints
            frames = GaugeMetricFamily(
                "stations_wal_frames_waiting",
                "pages in SQLite's WAL not yet copied into the database file",
            )
            frames.add_metric([], wal.frames_waiting)
            runs = CounterMetricFamily(
                "stations_wal_checkpoints",
                "WAL checkpoints, by the checkpoint thread or by the writer between two of "
                "its transactions",
                labels=["by"],
            )
            runs.add_metric(["thread"], wal.passes)
            runs.add_metric(["writer"], wal.tail_copies)
            families += [frames, runs]
        return families


def make_app(
    service: Service,
    *,
    long_poll_timeout_ms: int = 30_000,
    sse_lifetime_ms: int = 60_000,
    tokens: list[Token] | None = None,
    metrics_stations: int = DEFAULT_MAX_STATIONS,
    webhooks_allow_loopback: bool = False,
    public_url: str | None = None,
    limits: Limits | None = None,
    cors: CorsPolicy | None = None,
) -> web.Application:
    app = web.Application(
        middlewares=[edge_middleware],
        client_max_size=MAX_BODY,
    )
    limits = limits or Limits()
    app[keys.SERVICE] = service
    app[TOKENS] = tokens
    app[METRICS] = Metrics(service, metrics_stations)
    app[LIMITS] = limits
    app[CORS] = cors or CorsPolicy(any_origin=bool(tokens))
    app[READERS] = ReaderSlots(limits.max_waiting_readers, limits.max_waiting_readers_per_token)
    app[SLOW_CLIENTS] = SlowClients(app[METRICS].closed)
    service.budget.on_starved = app[SLOW_CLIENTS].close_paused
    app[DRAIN] = Drain(app[READERS], service.end_all_waits)
    app[METRICS].registry.register(_ReadCollector(service, app[READERS]))
    lag = cursors.CursorLag(service, app[METRICS].registry)
    app[METRICS_REFRESH] = (lag.refresh,)
    app[keys.LONG_POLL_TIMEOUT_S] = long_poll_timeout_ms / 1000
    app[keys.SSE_LIFETIME_S] = sse_lifetime_ms / 1000
    app[keys.PUBLIC_URL] = public_url
    app.router.add_get("/healthz", readyz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", needs("read", every_station=True)(metrics_handler))
    app.router.add_get("/api/openapi.yaml", openapi)
    app.router.add_get("/", to_console)
    app.router.add_get("/ui", to_console)
    if WEB_DIR.is_dir():
        app.router.add_get("/ui/", console_index)
        app.router.add_static("/ui/", WEB_DIR, follow_symlinks=False)
    # Before the stream routes: /v1/stream/__ds/... is never a stream (PROTOCOL.md §6).
    subscriptions.setup(app, allow_loopback=webhooks_allow_loopback)
    for api in (streams, groups, transactions, cursors, stations):
        app.router.add_routes(with_expect_continue(api.routes()))
    # The query parameters each route takes, read from openapi.yaml now rather than by the
    # first request with a query (tens of ms on the event loop).
    params.table()
    app.on_response_prepare.append(on_prepare)
    app.on_response_prepare.append(count_file)
    app.on_response_prepare.append(close_when_draining)  # the client's next request: port closed

    async def start(_app: web.Application) -> None:
        await service.start()

    async def stop(_app: web.Application) -> None:
        await service.close()

    app.on_startup.append(start)
    subscriptions.attach(app)  # starts after the service, stops (on shutdown) before it
    app.on_cleanup.append(stop)
    return app
