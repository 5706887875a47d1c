"""Paged lists of a station's consumer groups and reader cursors
(``GET /api/stations/{name}/groups?limit=&after=&prefix=&contains=&order=`` and the same on
``/cursors``, an extension of the contract): the console downloaded every group of a station
every two seconds to show a hundred (855 KB at 5,000 groups), and the Overview read them all to
chart six. Without those parameters each list is the contract's, whole. Over HTTP on both
engines, through the SDK and the CLI; the statements a page sends are counted in-process."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, event

from stations.client import Client, GroupPage
from stations.client.sync import SyncClient
from stations.domain import cursors as domain_cursors
from stations.domain import groups as domain_groups
from stations.domain.pages import Page
from stations.domain.service import Service
from stations.store import cursors as cursor_rows
from stations.store import groups as group_rows
from stations.store import streams as stream_rows
from stations.store.clock import now_ms
from stations.store.streams import load
from tests import clikit
from tests.clikit import ok
from tests.harness import Server, admin_and_scoped_tokens
from tests.module_server import ENGINES, module_server

OFFSET0 = "0000000000000000_0000000000000000"
WIDE = 250  # groups of the wide station
CURSORS = 130  # cursors of the wide station
SCOPED = "group-pages-scoped-1"
ADMIN = "group-pages-admin-1"


def _group_name(k: int) -> str:
    return f"g{k:03d}" + ("-EU" if k % 10 == 0 else "")


GROUPS = [_group_name(k) for k in range(WIDE)]
CURSOR_NAMES = [f"c{k:03d}" for k in range(CURSORS)]


async def _put_all(base: str, paths: list[tuple[str, dict[str, Any]]]) -> None:
    """PUT every (path, body), 25 at a time."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        slots = asyncio.Semaphore(25)

        async def put(path: str, body: dict[str, Any]) -> None:
            async with slots:
                r = await client.put(path, json=body)
                assert r.status_code in (200, 201), r.text

        await asyncio.gather(*(put(path, body) for path, body in paths))


@pytest.fixture(scope="module", params=ENGINES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def wide(server: Server, http: httpx.Client) -> str:
    """A station with 250 groups and 130 reader cursors, made once per engine."""
    station = f"wide-{uuid.uuid4().hex[:6]}"
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    base = f"/api/stations/{station}"
    puts = [(f"{base}/groups/{name}", {}) for name in reversed(GROUPS)]
    puts += [(f"{base}/cursors/{name}", {"offset": OFFSET0}) for name in reversed(CURSOR_NAMES)]
    asyncio.run(_put_all(server.url, puts))
    return station


def _page(
    http: httpx.Client, station: str, what: str = "groups", **params: Any
) -> tuple[list[dict[str, Any]], str | None]:
    r = http.get(f"/api/stations/{station}/{what}", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {what, "next"}, body.keys()
    return body[what], body["next"]


def _walk(
    http: httpx.Client, station: str, what: str = "groups", **params: Any
) -> tuple[list[str], list[str | None]]:
    """Every page from the first, following ``next``: the names in order and each next."""
    seen: list[str] = []
    nexts: list[str | None] = []
    after = None
    while True:
        page, after = _page(http, station, what, **params, **({"after": after} if after else {}))
        seen += [view["name"] for view in page]
        nexts.append(after)
        if after is None:
            return seen, nexts
        assert page[-1]["name"] == after


# -- groups ------------------------------------------------------------------------------------


def test_pages_walk_every_group_by_name(http: httpx.Client, wide: str) -> None:
    seen, nexts = _walk(http, wide, limit=100)
    assert seen == GROUPS
    assert nexts == [GROUPS[99], GROUPS[199], None]
    # The default page is 100 groups; a page holds whole group views.
    page, after = _page(http, wide, prefix="g")
    assert [g["name"] for g in page] == GROUPS[:100] and after == GROUPS[99]
    assert set(page[0]) == {
        "name",
        "maxAckTimeMs",
        "maxMsgDeliveries",
        "pending",
        "inFlight",
        "deadLettered",
        "lag",
        "cursor",
    }
    # Without the parameters the list is the contract's: every group, no "next".
    whole = http.get(f"/api/stations/{wide}/groups").json()
    assert list(whole) == ["groups"]
    assert [g["name"] for g in whole["groups"]] == GROUPS
    assert _page(http, wide, after=GROUPS[-1]) == ([], None)


def test_prefix_and_contains_filter_the_pages(http: httpx.Client, wide: str) -> None:
    tens = [n for n in GROUPS if n.startswith("g1")]
    assert len(tens) == 100
    assert _walk(http, wide, prefix="g1", limit=40) == (tens, [tens[39], tens[79], None])
    # contains ignores case; prefix is exact; % and _ are characters, not patterns.
    eu = [n for n in GROUPS if n.endswith("-EU")]
    assert _walk(http, wide, contains="-eu") == (eu, [None])
    assert _walk(http, wide, prefix="g1", contains="eu") == ([n for n in eu if n[1] == "1"], [None])
    assert _walk(http, wide, prefix="G1") == ([], [None])
    assert _walk(http, wide, contains="%") == ([], [None])
    assert _walk(http, wide, contains="0_0") == ([], [None])
    # A prefix that is a whole name finds it first (as the CLI's group show looks one up).
    page, _ = _page(http, wide, prefix="g010", limit=1)
    assert [g["name"] for g in page] == ["g010-EU"]


def test_a_page_counts_the_same_figures_as_the_whole_list(http: httpx.Client) -> None:
    station = f"figs-{uuid.uuid4().hex[:6]}"
    base = f"/api/stations/{station}"
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    body = {"messages": [{"data": k} for k in range(10)]}
    assert http.post(f"{base}/messages", json=body).status_code == 200
    for name in ("a", "b", "c", "d", "e"):
        assert http.put(f"{base}/groups/{name}", json={}).status_code == 201
    leased = http.post(f"{base}/groups/a/fetch", json={"max": 3}).json()["messages"]
    assert len(leased) == 3  # a: 3 in flight, lag 7
    leased = http.post(f"{base}/groups/b/fetch", json={"max": 4}).json()["messages"]
    offsets = [m["offset"] for m in leased]
    nacked = http.post(f"{base}/groups/b/nack", json={"offsets": offsets[:2], "delayMs": 60_000})
    assert nacked.json()["nacked"] == 2  # b: 2 waiting, 2 in flight, lag 6
    assert http.post(f"{base}/groups/b/dead-letter", json={"offsets": offsets[2:3]}).is_success
    leased = http.post(f"{base}/groups/d/fetch", json={"max": 10}).json()["messages"]
    acked = http.post(f"{base}/groups/d/ack", json={"offsets": [m["offset"] for m in leased]})
    assert acked.json()["acked"] == 10  # d: caught up
    whole = {g["name"]: g for g in http.get(f"{base}/groups").json()["groups"]}
    assert (whole["b"]["pending"], whole["b"]["inFlight"], whole["b"]["deadLettered"]) == (8, 1, 1)
    for limit in (1, 2, 5):
        after = None
        while True:
            params: dict[str, Any] = {"limit": limit} | ({"after": after} if after else {})
            page, after = _page(http, station, **params)
            assert len(page) <= limit
            for view in page:
                assert view == whole[view["name"]], (limit, view)
            if after is None:
                break


def test_order_lag_answers_the_groups_furthest_behind(http: httpx.Client) -> None:
    station = f"lags-{uuid.uuid4().hex[:6]}"
    base = f"/api/stations/{station}"
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    body = {"messages": [{"data": k} for k in range(10)]}
    assert http.post(f"{base}/messages", json=body).status_code == 200
    taken = {"a": 0, "b": 4, "c": 10, "d": 0, "e": 7, "f": 10, "x-b": 2}
    for name, count in taken.items():
        assert http.put(f"{base}/groups/{name}", json={}).status_code == 201
        if count:
            fetched = http.post(f"{base}/groups/{name}/fetch", json={"max": count})
            assert len(fetched.json()["messages"]) == count
    ranked = ["a", "d", "x-b", "b", "e", "c", "f"]  # lag 10, 10, 8, 6, 3, 0, 0: ties by name
    page, after = _page(http, station, order="lag", limit=3)
    assert ([g["name"] for g in page], after) == (ranked[:3], None)
    assert [g["lag"] for g in page] == [10, 10, 8]
    page, after = _page(http, station, order="lag")
    assert ([g["name"] for g in page], after) == (ranked, None)
    # The figures of a lag page are those of the whole list.
    whole = {g["name"]: g for g in http.get(f"{base}/groups").json()["groups"]}
    assert all(view == whole[view["name"]] for view in page)
    # prefix and contains filter it too; order=name is the order of a plain page.
    page, _ = _page(http, station, order="lag", prefix="x-")
    assert [g["name"] for g in page] == ["x-b"]
    page, _ = _page(http, station, order="lag", contains="B", limit=1)
    assert [g["name"] for g in page] == ["x-b"]
    page, after = _page(http, station, order="name", limit=2)
    assert ([g["name"] for g in page], after) == (["a", "b"], "b")
    # Lags move between requests: a lag page has no next and takes no after.
    r = http.get(f"{base}/groups", params={"order": "lag", "after": "a"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "after", r.text


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "ten"},
        {"limit": ["1", "2"]},
        {"after": ["a", "b"]},
        {"prefix": ["a", "b"]},
        {"contains": "a\x00"},
    ],
)
@pytest.mark.parametrize("what", ["groups", "cursors"])
def test_bad_page_parameters_are_refused_as_the_stations_list_refuses_them(
    http: httpx.Client, wide: str, what: str, params: dict[str, Any]
) -> None:
    r = http.get(f"/api/stations/{wide}/{what}", params=params)
    assert r.status_code == 400, r.text
    stations = http.get("/api/stations", params=params)
    assert stations.status_code == 400, stations.text
    assert r.json()["error"] == stations.json()["error"], (r.json(), stations.json())
    assert r.json()["error"]["field"] == next(iter(params))


def test_order_takes_name_or_lag_on_groups_only(http: httpx.Client, wide: str) -> None:
    r = http.get(f"/api/stations/{wide}/groups", params={"order": "pending"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "order", r.text
    r = http.get(f"/api/stations/{wide}/cursors", params={"order": "lag"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "order", r.text
    r = http.get("/api/stations/no-such-station/groups", params={"limit": "5"})
    assert r.status_code == 404, r.text


# -- cursors -----------------------------------------------------------------------------------


def test_pages_walk_every_cursor_by_name(http: httpx.Client, wide: str) -> None:
    seen, nexts = _walk(http, wide, "cursors", limit=100)
    assert (seen, nexts) == (CURSOR_NAMES, [CURSOR_NAMES[99], None])
    page, _ = _page(http, wide, "cursors", limit=1)
    assert page == [{**page[0], "name": "c000", "offset": OFFSET0, "lag": 0}]
    assert _walk(http, wide, "cursors", prefix="c12")[0] == CURSOR_NAMES[120:]
    assert _walk(http, wide, "cursors", contains="C11")[0] == CURSOR_NAMES[110:120]
    whole = http.get(f"/api/stations/{wide}/cursors").json()
    assert list(whole) == ["cursors"]
    assert [c["name"] for c in whole["cursors"]] == CURSOR_NAMES


# -- the SDK and the CLI -----------------------------------------------------------------------


async def test_the_sdk_pages_groups(server: Server, wide: str) -> None:
    async with Client(server.url) as client:
        station = client.station(wide)
        page = await station.group_page(limit=100)
        assert isinstance(page, GroupPage)
        assert [g.name for g in page.groups] == GROUPS[:100] and page.next == GROUPS[99]
        seen: list[str] = []
        after = None
        while True:
            page = await station.group_page(100, after, prefix="g1")
            seen += [g.name for g in page.groups]
            if page.next is None:
                break
            after = page.next
        assert seen == [n for n in GROUPS if n.startswith("g1")]
        page = await station.group_page(5, contains="eu")
        assert [g.name for g in page.groups] == [n for n in GROUPS if n.endswith("-EU")][:5]
        lag = await station.group_page(3, order="lag")
        assert len(lag.groups) == 3 and lag.next is None
        assert len(await station.groups()) == WIDE  # the whole list, as before


def test_the_sync_sdk_pages_groups(server: Server, wide: str) -> None:
    with SyncClient(server.url) as client:
        page = client.station(wide).group_page(2, GROUPS[10])
        assert [g.name for g in page.groups] == GROUPS[11:13] and page.next == GROUPS[12]


def test_the_cli_lists_every_group_or_a_page(server: Server, wide: str) -> None:
    rows = ok(clikit.run("group", "ls", wide, url=server.url)).strip().splitlines()
    assert rows[0].split()[0] == "NAME"
    assert [row.split()[0] for row in rows[1:]] == GROUPS
    listed = json.loads(ok(clikit.run("group", "ls", wide, "--json", url=server.url)))
    assert [g["name"] for g in listed] == GROUPS
    proc = clikit.run("group", "ls", wide, "--prefix", "g1", "--limit", "30", url=server.url)
    tens = [n for n in GROUPS if n.startswith("g1")]
    assert proc.returncode == 0, proc.stderr
    assert [row.split()[0] for row in proc.stdout.strip().splitlines()[1:]] == tens[:30]
    # Said apart from the table: it is not every group.
    assert (
        proc.stderr
        == f"stations: 30 shown, more after {tens[29]} (--after {tens[29]}, or a larger --limit)\n"
    )
    proc = clikit.run(
        "group", "ls", wide, "--contains", "eu", "--after", "g200-EU", "--json", url=server.url
    )
    assert [g["name"] for g in json.loads(ok(proc))] == ["g210-EU", "g220-EU", "g230-EU", "g240-EU"]
    shown = json.loads(ok(clikit.run("group", "show", wide, "g010-EU", "--json", url=server.url)))
    assert shown["name"] == "g010-EU"
    proc = clikit.run("group", "show", wide, "g010", url=server.url)
    assert proc.returncode == 3 and "group g010 not found" in proc.stderr, proc.stderr


# -- scoped tokens -----------------------------------------------------------------------------


def test_a_scoped_token_pages_the_groups_and_cursors_of_its_stations(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir: Path = tmp_path_factory.mktemp("group-pages-auth")
    tokens = admin_and_scoped_tokens(workdir, ADMIN, SCOPED, "mine-*")
    server = Server(f"sqlite:///{workdir / 's.db'}", workdir, ["--tokens", str(tokens)]).start()
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        scoped = {"Authorization": f"Bearer {SCOPED}"}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for station in ("mine-1", "other"):
                assert http.post("/api/stations", json={"name": station}, headers=admin).is_success
                for name in ("g1", "g2", "g3"):
                    path = f"/api/stations/{station}/groups/{name}"
                    assert http.put(path, json={}, headers=admin).status_code == 201
                    path = f"/api/stations/{station}/cursors/c-{name}"
                    assert http.put(path, json={"offset": OFFSET0}, headers=admin).is_success
            r = http.get("/api/stations/mine-1/groups", params={"limit": 2}, headers=scoped)
            assert r.status_code == 200, r.text
            assert [g["name"] for g in r.json()["groups"]] == ["g1", "g2"]
            assert r.json()["next"] == "g2"
            params = {"limit": 2, "after": "g2"}
            r = http.get("/api/stations/mine-1/groups", params=params, headers=scoped)
            assert [g["name"] for g in r.json()["groups"]] == ["g3"] and r.json()["next"] is None
            r = http.get("/api/stations/mine-1/groups", params={"order": "lag"}, headers=scoped)
            assert r.status_code == 200, r.text
            r = http.get("/api/stations/mine-1/cursors", params={"prefix": "c-"}, headers=scoped)
            assert [c["name"] for c in r.json()["cursors"]] == ["c-g1", "c-g2", "c-g3"]
            for what in ("groups", "cursors"):
                r = http.get(f"/api/stations/other/{what}", params={"limit": 2}, headers=scoped)
                assert r.status_code == 403, r.text
                r = http.get(f"/api/stations/mine-1/{what}", params={"limit": 2})
                assert r.status_code == 401, r.text
    finally:
        server.kill()


# -- in-process: what a page sends to the database ---------------------------------------------


def _run(db_url: str, scenario: Any) -> None:
    async def main() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            await scenario(svc)
        finally:
            await svc.close()

    asyncio.run(main())


def test_a_page_counts_the_figures_of_its_own_groups_only(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figures (four counts per group) are counted in one statement for the page's groups,
    not for the station's other groups nor for the one read past the page to tell that a next
    page exists."""
    counted: list[list[int]] = []
    real = group_rows.queue_figures

    def spy(conn: Any, group_ids: list[int]) -> Any:
        counted.append(list(group_ids))
        return real(conn, group_ids)

    monkeypatch.setattr(group_rows, "queue_figures", spy)

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "counted"})
        for k in range(12):
            await svc.ensure_group("counted", f"g{k:02d}", {})
        ids = svc.run_sync(
            lambda c: {
                row["name"]: row["id"]
                for row in group_rows.of_stream(c, load(c, "counted").id)  # type: ignore[union-attr]
            }
        )
        counted.clear()  # a group's creation answers its view, figures too
        page = await svc.groups("counted", Page(limit=4, after="g03"))
        assert [v["name"] for v in page] == ["g04", "g05", "g06", "g07", "g08"]
        assert "lag" not in page[-1]  # the look past the page: its name only
        assert counted == [[ids[f"g{k:02d}"] for k in range(4, 8)]]
        counted.clear()
        page = await svc.groups("counted", Page(limit=2, order="lag"))
        assert len(page) == 2 and len(counted) == 1 and len(counted[0]) == 2

    _run(db_url, scenario)


def _plan(conn: Connection, read: Any) -> str:
    """The database's plan of the one statement ``read(conn)`` sends, with the planner kept
    from any way but an index read in order (PostgreSQL: a sort or a scan of the table would
    still be chosen, at a cost, if no index served the page)."""
    sent: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        sent.append((statement, parameters))  # SQLite's BEGIN too

    event.listen(conn, "before_cursor_execute", seen)
    try:
        read(conn)
    finally:
        event.remove(conn, "before_cursor_execute", seen)
    ((statement, parameters),) = [(sql, p) for sql, p in sent if sql.startswith("SELECT")]
    raw = conn.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    if conn.dialect.name == "postgresql":
        for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
            cursor.execute(f"SET LOCAL {setting} = off")
        cursor.execute("EXPLAIN " + statement, parameters)
        return "\n".join(row[0] for row in cursor.fetchall())
    cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
    return "\n".join(str(row[-1]) for row in cursor.fetchall())


def test_pages_read_through_a_stream_and_name_index(db_url: str) -> None:
    """A page of groups or cursors seeks the (stream_id, name) index to its ``after`` and
    prefix and reads it in order: no sort of the station's groups."""

    async def scenario(svc: Service) -> None:
        await svc.create_station({"name": "indexed"})
        for k in range(30):
            await svc.ensure_group("indexed", f"g{k:02d}", {})
            await svc.commit_cursor("indexed", f"c{k:02d}", {"offset": OFFSET0})

        def plans(conn: Connection) -> list[str]:
            sid = load(conn, "indexed").id  # type: ignore[union-attr]
            return [
                _plan(conn, lambda c: group_rows.page(c, sid, "g05", "g1", "", 5)),
                _plan(conn, lambda c: cursor_rows.page(c, sid, "c05", "c1", "", 5)),
            ]

        groups_plan, cursors_plan = svc.run_sync(plans)
        if "postgresql" in db_url:
            assert "ix_groups_stream_name_c" in groups_plan, groups_plan
            assert "ix_cursors_stream_name_c" in cursors_plan, cursors_plan
            for plan in (groups_plan, cursors_plan):
                assert "Sort" not in plan and "Seq Scan" not in plan, plan
        else:
            assert "ux_groups_stream_name" in groups_plan, groups_plan
            assert "sqlite_autoindex_cursors_1" in cursors_plan, cursors_plan  # its primary key
            for plan in (groups_plan, cursors_plan):
                assert "TEMP B-TREE" not in plan, plan
        # And the pages are the right ones.
        now = now_ms()
        views = svc.run_sync(
            lambda c: domain_groups.views(c, "indexed", now, Page(limit=3, prefix="g1"))
        )
        assert [v["name"] for v in views] == ["g10", "g11", "g12", "g13"]
        views = svc.run_sync(
            lambda c: domain_cursors.views(c, "indexed", now, Page(limit=3, after="c27"))
        )
        assert [v["name"] for v in views] == ["c28", "c29"]

    _run(db_url, scenario)


def test_a_page_of_stations_reads_through_a_name_index(db_url: str) -> None:
    """A page of the stations list seeks an index on the name to its ``after`` and prefix and
    reads it in order (PostgreSQL sorted every station: its unique index on the name is in
    the database's collation, the page in code point order)."""

    async def scenario(svc: Service) -> None:
        for k in range(30):
            await svc.create_station({"name": f"s{k:02d}"})
        plan = svc.run_sync(
            lambda conn: _plan(conn, lambda c: stream_rows.page(c, "s05", "s1", "", 5))
        )
        if "postgresql" in db_url:
            assert "ix_streams_name_c" in plan, plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
        else:
            assert "sqlite_autoindex_streams_1" in plan, plan  # its unique name
            assert "TEMP B-TREE" not in plan, plan

    _run(db_url, scenario)
