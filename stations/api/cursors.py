"""Reader cursors under ``/api/stations/{name}/cursors`` (``stations.domain.cursors``): a
reader that keeps its own position (a Spark streaming query) commits it here, and its lag shows
in the API, the console and ``/metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from stations.api import keys
from stations.api.auth import needs
from stations.api.stations import json_body, page_query, paged, query_once, station_name
from stations.domain import cursors, instants
from stations.domain.service import Service
from stations.errors import BadRequest


def _service(request: web.Request) -> Service:
    svc: Service = request.app[keys.SERVICE]
    return svc


def _cursor(request: web.Request) -> str:
    return cursors.validate_name(request.match_info["cursor"])


@needs("read")
async def list_cursors(request: web.Request) -> web.Response:
    """Every cursor (the whole list); with ``limit``, ``after``, ``prefix`` or ``contains`` a
    page of them by name."""
    page = page_query(request)
    if page is None:
        found = await _service(request).cursors(station_name(request))
        return web.json_response({"cursors": found})
    return paged("cursors", await _service(request).cursors(station_name(request), page), page)


@needs("read")
async def get_cursor(request: web.Request) -> web.Response:
    found = await _service(request).cursor(station_name(request), _cursor(request))
    return web.json_response(found)


@needs("consume")
async def put_cursor(request: web.Request) -> web.Response:
    body = await json_body(request)
    view = await _service(request).commit_cursor(station_name(request), _cursor(request), body)
    return web.json_response(view)


def _time_ms(raw: str | None) -> int:
    """``time``: milliseconds since the epoch, or a date-time with its zone."""
    if raw is None:
        raise BadRequest("time is required (milliseconds since the epoch or ISO 8601)", "time")
    if raw.isascii() and raw.isdigit() and len(raw) <= 15:  # not "²": int() refuses it
        ms = int(raw)
        # Times are answered as date-times too: years 1970 to 9999.
        if ms > instants.MAX_MS:
            raise BadRequest("time must lie between 1970 and 9999 (UTC)", "time")
        return ms
    return instants.parse(raw, "time").ms


@needs("read")
async def offset_at_time(request: web.Request) -> web.Response:
    """The offset of the first message stored at or after ``time``: readers start there to
    read by time (Spark pushes ``timestamp`` filters down through it)."""
    time_ms = _time_ms(query_once(request, "time"))
    found = await _service(request).offset_at(station_name(request), time_ms)
    return web.json_response(found)


@needs("admin")
async def delete_cursor(request: web.Request) -> web.Response:
    await _service(request).delete_cursor(station_name(request), _cursor(request))
    return web.Response(status=204)


# At most this many cursor series in /metrics, so many cursors cannot blow the series up.
MAX_LAG_SERIES = 1000


class CursorLag:
    """``stations_cursor_lag{station, cursor}``: messages after each cursor, refreshed from
    the database on each scrape (the stations' tails move without the cursors)."""

    def __init__(self, service: Service, registry: CollectorRegistry) -> None:
        self.service = service
        self.gauge = Gauge(
            "stations_cursor_lag",
            "Messages after a reader cursor's committed offset",
            ["station", "cursor"],
            registry=registry,
        )

    async def refresh(self) -> None:
        found = await self.service.cursor_lags(MAX_LAG_SERIES)
        self.gauge.clear()
        for station, name, lag in found:
            self.gauge.labels(station, name).set(lag)


def routes() -> list[web.RouteDef]:
    one = "/api/stations/{name:[^{}]+?}"
    cursor = one + "/cursors/{cursor:[^/{}]+}"
    return [
        web.get(one + "/cursors", list_cursors),
        web.get(one + "/offsets", offset_at_time),
        web.get(cursor, get_cursor),
        web.put(cursor, put_cursor),
        web.delete(cursor, delete_cursor),
    ]
