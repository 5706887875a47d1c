"""The stations' list (``GET /api/stations``) and the ``/metrics`` snapshot read their figures
with a fixed number of statements however many stations and groups there are (they ran a few
per station, then a few per group: seconds at thousands of stations), with the same values as
the per-station views, and the snapshot reports at most its limit of groups. Runs the service
in-process on both engines and counts the statements the database is sent."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, event

from stations.domain import catalog, figures, groups
from stations.domain.service import Service
from stations.store import streams as rows
from stations.store.clock import now_ms
from tests.harness import Server

T = TypeVar("T")


def counted(svc: Service, fn: Callable[[Connection], T]) -> tuple[int, T]:
    """``fn``'s result and how many statements it sent, on a read connection."""

    def run(conn: Connection) -> tuple[int, T]:
        sent: list[object] = []
        raw: Any = conn.connection.dbapi_connection
        if conn.dialect.name == "sqlite":
            # The driver's own trace: it sees statements run on the raw cursor as well.
            raw.set_trace_callback(sent.append)
        else:
            event.listen(conn, "before_cursor_execute", lambda *args: sent.append(args[2]))
        try:
            result = fn(conn)
        finally:
            if conn.dialect.name == "sqlite":
                raw.set_trace_callback(None)
        return len(sent), result

    return svc.run_sync(run)


async def add_stations(svc: Service, first: int, count: int) -> None:
    """Stations with ids in the window, two groups (one with a message leased, one waiting
    after a nack, one dead-lettered) and one without groups."""
    for i in range(first, first + count):
        name = f"fig-{i:03d}"
        await svc.create_station({"name": name})
        body = {"messages": [{"id": f"m{k}", "data": k} for k in range(5)]}
        await svc.produce(name, body)
        if i % 3 == 2:
            continue
        await svc.ensure_group(name, "g1", {})
        await svc.ensure_group(name, "g2", {})
        got = await svc.fetch(name, "g1", 3, 0, "c")
        seqs = [m.seq for m in got.messages]
        await svc.nack(name, "g1", seqs[:1], 60_000)
        await svc.dead_letter(name, "g1", seqs[1:2], "bad")


def run(db_url: str, scenario: Callable[[Service], Awaitable[None]]) -> None:
    async def main() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await scenario(svc)
        finally:
            await svc.close()

    asyncio.run(main())


def test_figures_take_the_same_statements_for_3_or_30_stations(db_url: str) -> None:
    async def scenario(svc: Service) -> None:
        sent: dict[int, tuple[int, int]] = {}
        for first, count in ((0, 3), (3, 27)):
            await add_stations(svc, first, count)
            now = now_ms()
            listed, views = counted(svc, lambda c: catalog.views(c, now))  # noqa: B023
            scraped, snap = counted(svc, lambda c: figures.snapshot(c, now, 500))  # noqa: B023
            sent[first + count] = (listed, scraped)
            assert len(views) == len(snap.stations) == first + count
            for view, station in zip(views, snap.stations, strict=True):
                grouped = int(view["name"][4:]) % 3 != 2
                stats = view["stats"]
                assert (stats["messages"], stats["bytes"], stats["idsInWindow"]) == (5, 5, 5)
                assert (stats["groups"], stats["deadLettered"]) == ((2, 1) if grouped else (0, 0))
                assert (station.name, station.messages, station.ids_in_window) == (
                    view["name"],
                    5,
                    5,
                )
                assert station.dead_lettered == stats["deadLettered"]
                # The same figures as the station's own group views.
                each = svc.run_sync(lambda c: groups.views(c, view["name"], now))  # noqa: B023
                assert [
                    (g.name, g.pending, g.in_flight, g.lag, g.dead_lettered) for g in station.groups
                ] == [
                    (g["name"], g["pending"], g["inFlight"], g["lag"], g["deadLettered"])
                    for g in each
                ]
                if grouped:  # cursor 3 of 5: lag 2, one waiting again, one leased, one dead
                    assert [
                        (g.pending, g.in_flight, g.lag, g.dead_lettered) for g in station.groups
                    ] == [
                        (3, 1, 2, 1),
                        (5, 0, 5, 0),
                    ]
            assert (snap.groups, snap.groups_reported) == (2 * 2 * (first + count) // 3,) * 2
        assert sent[30] == sent[3], sent
        assert max(sent[30]) <= 12, sent

    run(db_url, scenario)


def test_group_series_are_bounded(db_url: str) -> None:
    async def scenario(svc: Service) -> None:
        await add_stations(svc, 0, 6)  # groups on fig-000, 001, 003, 004
        now = now_ms()
        snap = svc.run_sync(lambda c: figures.snapshot(c, now, 4, group_limit=3))
        assert [s.name for s in snap.stations] == ["fig-000", "fig-001", "fig-002", "fig-003"]
        # The first 3 groups by station and group name, of the reported stations only.
        assert [[g.name for g in s.groups] for s in snap.stations] == [["g1", "g2"], ["g1"], [], []]
        assert (snap.groups, snap.groups_reported) == (8, 3)
        snap = svc.run_sync(lambda c: figures.snapshot(c, now, 4))
        assert [len(s.groups) for s in snap.stations] == [2, 2, 0, 2]
        assert (snap.groups, snap.groups_reported) == (8, 6)
        snap = svc.run_sync(lambda c: figures.snapshot(c, now, 0))
        assert (snap.stations, snap.groups, snap.groups_reported) == ([], 8, 0)

    run(db_url, scenario)


def test_station_counts_for_more_stations_than_a_statement_takes_parameters(
    db_url: str,
) -> None:
    """The list passes every live station's id to the groups and DLS counts: with more than
    65535 stations PostgreSQL's driver refused the statement (a 500 for the whole list)."""

    async def scenario(svc: Service) -> None:
        await add_stations(svc, 0, 3)
        now = now_ms()
        views = svc.run_sync(lambda c: catalog.views(c, now))
        real = svc.run_sync(lambda c: [s.id for s in rows.every(c)])
        many = real + list(range(10**7, 10**7 + 70_000))  # as many stations, but idle
        counts: dict[int, dict[str, int]] = {}
        for provider in catalog.stats_providers:
            for sid, values in svc.run_sync(lambda c: provider(c, many)).items():  # noqa: B023
                counts.setdefault(sid, {}).update(values)
        assert counts == {
            sid: {"groups": 2, "deadLettered": 1}
            for sid, view in zip(real, views, strict=True)
            if view["stats"]["groups"]
        }

    run(db_url, scenario)


def test_a_config_number_beyond_64_bits_is_still_listed(tmp_path: Path) -> None:
    """The list is encoded by orjson, which takes no integer beyond 64 bits: a config an older
    version stored with one is still listed (by the standard library's encoder)."""
    path = tmp_path / "stations.db"
    server = Server(f"sqlite:///{path}", tmp_path).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            created = http.post("/api/stations", json={"name": "big"}).json()
            config = {k: created[k] for k in ("name", "contentType", "retention", "dls")}
            config["retention"]["maxAgeMs"] = 10**30
            with sqlite3.connect(path, timeout=30) as conn:
                conn.execute(
                    "UPDATE streams SET config = ? WHERE name = 'big'", (json.dumps(config),)
                )
            listed = http.get("/api/stations")
            assert listed.status_code == 200, listed.text
            assert listed.headers["Content-Type"] == "application/json; charset=utf-8"
            (station,) = listed.json()["stations"]
            assert station["retention"]["maxAgeMs"] == 10**30
    finally:
        server.kill()


def test_metrics_report_groups_and_how_many_have_series(db_url: str, tmp_path: Path) -> None:
    server = Server(db_url, tmp_path, ["--metrics-stations", "2"]).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for name in ("mg-a", "mg-b", "mg-c"):
                assert http.post("/api/stations", json={"name": name}).status_code == 201
                for group in ("g1", "g2", "g3"):
                    path = f"/api/stations/{name}/groups/{group}"
                    assert http.put(path, json={}).status_code == 201
            text = http.get("/metrics").text
    finally:
        server.kill()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("stations_groups", ())] == 9
    assert samples[("stations_groups_reported", ())] == 6  # of the 2 stations with series
    lags = {dict(k[1])["station"] for k in samples if k[0] == "stations_group_lag"}
    assert lags == {"mg-a", "mg-b"}


def test_a_page_counts_the_ids_of_its_own_stations_only(db_url: str) -> None:
    """A page of the list counts the ids in the window of its stations, not of every station
    (at 10,000 stations that was 2-6 ms a page, for figures it then dropped)."""

    async def scenario(svc: Service) -> None:
        await add_stations(svc, 0, 6)
        now = now_ms()
        page = catalog.Page(limit=1, after="fig-003")

        def listed(conn: Connection) -> tuple[list[dict[str, Any]], list[set[Any]]]:
            sent: list[set[Any]] = []

            def seen(_c: Any, _cur: Any, sql: str, params: Any, *_rest: Any) -> None:
                if any(t in sql for t in ("msg_ids", "id_blocks", "id_runs")):
                    values = params.values() if isinstance(params, dict) else params
                    flat: set[Any] = set()
                    for v in values:
                        flat |= set(v) if isinstance(v, (list, tuple)) else {v}
                    sent.append(flat)

            event.listen(conn, "before_cursor_execute", seen)
            try:
                return catalog.views(conn, now, page=page), sent
            finally:
                event.remove(conn, "before_cursor_execute", seen)

        views, sent = svc.run_sync(listed)
        assert [v["name"] for v in views] == ["fig-004", "fig-005"]  # one more: a next page
        assert [v["stats"]["idsInWindow"] for v in views] == [5, 5]
        ids = svc.run_sync(lambda c: {s.name: s.id for s in rows.every(c)})
        shown = {ids["fig-004"], ids["fig-005"]}
        others = {i for name, i in ids.items() if i not in shown}
        assert sent, "no statement counted the ids in the window"
        for values in sent:
            assert shown <= values and not values & others, (values, shown, others)

    run(db_url, scenario)
