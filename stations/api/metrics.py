"""``GET /metrics``: Prometheus text, from prometheus_client with a registry per application.

- HTTP requests and latency by method, route template and status (never a raw path or an
  unknown method, so random URLs cannot add series);
- per station and per group, read from the service at scrape time by a custom collector:
  messages, bytes, ids in the window, DLS depth, pending, in flight, lag, and the counters the
  service keeps (duplicates answered, redeliveries). Series exist only for stations that exist,
  and for at most ``max_stations`` of them (by name), and group series only for the first
  ``figures.MAX_GROUPS`` groups of those stations, so their number is bounded;
- the group-commit writer's batch sizes and commit latency;
- the standard process, platform and GC collectors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from stations.api.limits import CLOSE_REASONS
from stations.domain.figures import MAX_GROUPS, Snapshot
from stations.domain.service import Service
from stations.errors import Unavailable

DEFAULT_MAX_STATIONS = 500
DATABASE_S = 3.0  # the longest a scrape waits for the figures read from the database
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class StationsCollector(Collector):
    """Turns the service's latest snapshot into metric families (``collect`` cannot await,
    so the handler takes the snapshot just before it renders)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.snapshot: Snapshot | None = None

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        tally = self.service.tally

        def station_gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["station"])

        def group_gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["station", "group"])

        total = GaugeMetricFamily("stations_stations", "Live stations")
        total.add_metric([], len(snap.live))
        shown = GaugeMetricFamily(
            "stations_stations_reported", "Stations with per-station series (--metrics-stations)"
        )
        shown.add_metric([], len(snap.stations))
        all_groups = GaugeMetricFamily("stations_groups", "Consumer groups of live stations")
        all_groups.add_metric([], snap.groups)
        shown_groups = GaugeMetricFamily(
            "stations_groups_reported",
            f"Groups with per-group series (of the reported stations, at most {MAX_GROUPS})",
        )
        shown_groups.add_metric([], snap.groups_reported)
        messages = station_gauge("stations_station_messages", "Messages stored in the station")
        size = station_gauge("stations_station_bytes", "Payload bytes stored in the station")
        ids = station_gauge(
            "stations_station_ids_in_window", "Message ids in the idempotency window"
        )
        depth = station_gauge("stations_station_dls_depth", "Entries in the dead-letter store")
        dups = CounterMetricFamily(
            "stations_station_duplicates",
            "Messages answered as duplicates of an id in the window (not stored), this process",
            labels=["station"],
        )
        pdups = CounterMetricFamily(
            "stations_station_producer_duplicates",
            "Idempotent-producer requests answered as duplicates, this process",
            labels=["station"],
        )
        pending = group_gauge("stations_group_pending", "Messages the group has yet to deliver")
        in_flight = group_gauge("stations_group_in_flight", "Messages leased and not yet settled")
        lag = group_gauge("stations_group_lag", "Messages after the group's cursor")
        group_dls = group_gauge("stations_group_dls_depth", "The group's dead-letter entries")
        redelivered = CounterMetricFamily(
            "stations_group_redeliveries",
            "Deliveries of a message after its first, this process",
            labels=["station", "group"],
        )
        for st in snap.stations:
            label = [st.name]
            messages.add_metric(label, st.messages)
            size.add_metric(label, st.bytes)
            ids.add_metric(label, st.ids_in_window)
            depth.add_metric(label, st.dead_lettered)
            dups.add_metric(label, tally.duplicates.get(st.name, 0))
            pdups.add_metric(label, tally.producer_duplicates.get(st.name, 0))
            for g in st.groups:
                labels = [st.name, g.name]
                pending.add_metric(labels, g.pending)
                in_flight.add_metric(labels, g.in_flight)
                lag.add_metric(labels, g.lag)
                group_dls.add_metric(labels, g.dead_lettered)
                redelivered.add_metric(labels, tally.redeliveries.get((st.name, g.name), 0))
        yield from (total, shown, all_groups, shown_groups)
        yield from (messages, size, ids, depth, dups, pdups)
        yield from (pending, in_flight, lag, group_dls, redelivered)


class Metrics:
    def __init__(self, service: Service, max_stations: int = DEFAULT_MAX_STATIONS) -> None:
        self.service = service
        self.max_stations = max_stations
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
        self.batch_size = Histogram(
            "stations_writer_batch_size",
            "Write requests sharing one transaction (group commit)",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )
        self.commit_seconds = Histogram(
            "stations_writer_commit_seconds",
            "Time to run and commit one writer transaction",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
        )
        self.database_up = Gauge(
            "stations_database_up",
            "1 when this scrape read the stations' figures from the database, 0 when it could "
            "not (an outage: the station and group series are left out, the rest is served)",
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "stations_connections_closed",
            "Connections the server closed or refused by itself, by reason (before or around "
            "any request's handler, so in no request's count)",
            ["reason"],
            registry=self.registry,
        )
        for reason in CLOSE_REASONS:  # each series from the start, at 0
            self.connections_closed.labels(reason)
        service.tally.batch_observers.append(self._batch)
        self.stations = StationsCollector(service)
        self.registry.register(self.stations)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._lock = asyncio.Lock()
        self._request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def closed(self, reason: str) -> None:
        self.connections_closed.labels(reason).inc()

    def observe(self, request: web.Request, status: int, seconds: float) -> None:
        # prometheus_client's ``labels()`` costs more than the count itself (5 of 8 us a
        # request): each label set's series are looked up once. Bounded like the series are
        # (methods, route templates, statuses).
        method, route = _method(request), _route(request)
        key = (method, route, status)
        series = self._request_series.get(key)
        if series is None:
            series = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._request_series[key] = series
        series[0].inc()
        series[1].observe(seconds)

    def _batch(self, ops: int, seconds: float) -> None:
        self.batch_size.observe(ops)
        self.commit_seconds.observe(seconds)

    async def render(self, refreshes: Iterable[Callable[[], Awaitable[None]]] = ()) -> bytes:
        """The scrape. During a database outage it still answers, with what this process
        knows (HTTP series, the 503s among them, the writer, the process): a refused scrape
        lost exactly the series an outage alert is made of."""
        async with self._lock:  # one snapshot per render, scrapes one after another
            try:
                # Within a scraper's patience (Prometheus gives up after 10 s by default): a
                # database host gone silent holds a read until the connect timeout (10 s).
                async with asyncio.timeout(DATABASE_S):
                    for refresh in refreshes:  # other gauges read from the database
                        await refresh()
                    self.stations.snapshot = await self.service.figures(self.max_stations)
                self.database_up.set(1)
            except (Unavailable, TimeoutError):
                self.stations.snapshot = None
                self.database_up.set(0)
            return generate_latest(self.registry)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _method(request: web.Request) -> str:
    return request.method if request.method in METHODS else "other"


async def metrics_handler(request: web.Request) -> web.Response:
    refreshes = request.app[METRICS_REFRESH]
    body = await request.app[METRICS].render(refreshes)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


# Its object in the application (see stations.api.keys).
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
METRICS_REFRESH: web.AppKey[tuple[Callable[[], Awaitable[None]], ...]] = web.AppKey(
    "metrics_refresh"
)
