"""The aiohttp application: routes, middlewares and the service's life cycle."""

from __future__ import annotations

from aiohttp import web

from api import groups, stations, streams
from api.errors import error_middleware
from api.headers import headers_middleware, on_prepare
from stations.service import Service

MAX_BODY = 64 * 1024 * 1024


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(
    service: Service,
    *,
    long_poll_timeout_ms: int = 30_000,
    sse_lifetime_ms: int = 60_000,
) -> web.Application:
    app = web.Application(
        middlewares=[headers_middleware, error_middleware], client_max_size=MAX_BODY
    )
    app["service"] = service
    app["long_poll_timeout_s"] = long_poll_timeout_ms / 1000
    app["sse_lifetime_s"] = sse_lifetime_ms / 1000
    app.router.add_get("/healthz", healthz)
    app.router.add_routes(streams.routes())
    app.router.add_routes(groups.routes())
    app.router.add_routes(stations.routes())
    app.on_response_prepare.append(on_prepare)

    async def start(_app: web.Application) -> None:
        await service.start()

    async def stop(_app: web.Application) -> None:
        await service.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
