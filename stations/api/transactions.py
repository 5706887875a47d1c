"""``POST /api/transactions``: settle leased deliveries and produce messages across stations,
atomically (see ``stations.domain.transactions``).

The route is top-level, not under ``/api/stations/{name}``, because one transaction spans
stations and groups: no single station owns it. The auth middleware lets any valid token
through to here; this handler checks each item, as CONTRACT.md §5 asks of every station one
request touches: the consumer role on every station it settles, the producer role on every
station it produces to.
"""

from __future__ import annotations

from aiohttp import web

from stations.api.auth import ALLOWED, TOKEN, needs, reach
from stations.api.limits import LIMITS
from stations.api.stations import json_body, service
from stations.domain import transactions
from stations.domain.offsets import encode
from stations.errors import Forbidden
from stations.tokens import Token


async def _authorize(request: web.Request, req: transactions.TxRequest) -> None:
    token: Token | None = request.get(TOKEN)
    if token is None:
        return
    for kind, needed in (("settle", "consume"), ("produce", "produce")):
        for station, field in req.stations(kind).items():
            if needed not in ALLOWED[token.role]:
                raise Forbidden(f"role {token.role} may not {needed} here", field)
            if not token.covers(station):
                raise Forbidden(f"this token does not cover station {station}", field)


# Any valid token may ask; each item is checked by ``_authorize``.
@needs("read")
async def transact(request: web.Request) -> web.Response:
    cap = request.app[LIMITS].max_append_messages
    req = transactions.parse(await json_body(request), cap)
    await _authorize(request, req)
    # A nack or dead-letter may put a message into the DLS, which copies it to the station's
    # dls.forwardTo: the token must cover that station too (CONTRACT.md §5), which the
    # transaction checks under the station's lock.
    result = await service(request).transact(req, reach(request))
    return web.json_response(
        {
            "acked": result.acked,
            "nacked": result.nacked,
            "deadLettered": result.dead_lettered,
            "produced": [
                {
                    "station": station,
                    "offset": None if offset is None else encode(offset),
                    "duplicate": duplicate,
                }
                for station, offset, duplicate in result.produced
            ],
        }
    )


def routes() -> list[web.RouteDef]:
    return [web.post("/api/transactions", transact)]
