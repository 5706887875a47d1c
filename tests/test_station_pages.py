"""Paged station lists (``GET /api/stations?limit=&after=&prefix=&contains=``, an extension of
the contract): a console at 10,000 stations downloaded them all every two seconds to show a
hundred rows. Without those parameters the list is the contract's, whole."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server, admin_and_scoped_tokens
from tests.module_server import ENGINES, module_server

ADMIN = "pages-admin-1"
SCOPED = "pages-scoped-1"


@pytest.fixture(scope="module", params=ENGINES)
def http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    for server in module_server(request.param, tmp_path_factory):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client


def _names(http: httpx.Client, prefix: str, **params: object) -> tuple[list[str], object]:
    r = http.get("/api/stations", params={"prefix": prefix, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return [s["name"] for s in body["stations"]], body["next"]


def test_pages_walk_the_list_by_name(http: httpx.Client) -> None:
    run = f"pg{uuid.uuid4().hex[:6]}-"
    names = sorted(f"{run}{k:03d}{'-x' if k % 3 == 0 else ''}" for k in range(25))
    for name in reversed(names):
        assert http.post("/api/stations", json={"name": name}).status_code == 201
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        params = {"limit": 10} | ({"after": after} if after is not None else {})
        page, after = _names(http, run, **params)
        seen += page
        pages += 1
        if after is None:
            break
        assert page[-1] == after and len(page) == 10
    assert (seen, pages) == (names, 3)
    # A page holds full station views, with their stats.
    r = http.get("/api/stations", params={"prefix": run, "limit": 1})
    [view] = r.json()["stations"]
    assert view["name"] == names[0] and "stats" in view and view["stats"]["messages"] == 0
    # contains filters too; the whole list (no parameters) has no "next" and every station.
    assert _names(http, run, contains="-x") == ([n for n in names if n.endswith("-x")], None)
    whole = http.get("/api/stations").json()
    assert "next" not in whole
    assert set(names) <= {s["name"] for s in whole["stations"]}
    assert _names(http, run, after=names[-1]) == ([], None)
    # contains ignores ASCII case (a console's search box); prefix is exact; a % or _ in
    # either is a character, not a pattern.
    assert _names(http, run, contains="-X") == ([n for n in names if n.endswith("-x")], None)
    assert _names(http, run.upper()) == ([], None)
    assert _names(http, run, contains="%") == ([], None)
    assert _names(http, run, contains="0_1") == ([], None)


def test_pages_order_by_code_point_on_both_engines(http: httpx.Client) -> None:
    """One order for pages and ``after`` on both engines, whatever a PostgreSQL database's
    collation: by code point (Z before _ before a, ~ last)."""
    run = f"cp{uuid.uuid4().hex[:6]}-"
    names = [f"{run}{tail}" for tail in ("a", "Z", "b", "_", "~", "B1", "-")]
    for name in names:
        assert http.post("/api/stations", json={"name": name}).status_code == 201
    expected = sorted(names)
    assert _names(http, run, limit=100) == (expected, None)
    first, after = _names(http, run, limit=4)
    rest, last = _names(http, run, limit=4, after=after)
    assert (first + rest, last) == (expected, None)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": ["1", "2"]}, "limit"),
        ({"after": ["a", "b"]}, "after"),
        ({"prefix": ["a", "b"]}, "prefix"),
    ],
)
def test_bad_page_parameters_name_their_field(
    http: httpx.Client, params: dict[str, object], field: str
) -> None:
    r = http.get("/api/stations", params=params)  # type: ignore[arg-type]
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == field


def test_a_scoped_token_pages_through_its_own_stations_only(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir: Path = tmp_path_factory.mktemp("pages-auth")
    tokens = admin_and_scoped_tokens(workdir, ADMIN, SCOPED, "mine-*")
    server = Server(f"sqlite:///{workdir / 's.db'}", workdir, ["--tokens", str(tokens)]).start()
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        scoped = {"Authorization": f"Bearer {SCOPED}"}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for name in ("a-other", "mine-1", "mine-2", "n-other", "mine-3", "z-other"):
                r = http.post("/api/stations", json={"name": name}, headers=admin)
                assert r.status_code == 201
            r = http.get("/api/stations", params={"limit": 2}, headers=scoped)
            body = r.json()
            assert [s["name"] for s in body["stations"]] == ["mine-1", "mine-2"]
            assert body["next"] == "mine-2"
            r = http.get("/api/stations", params={"limit": 2, "after": "mine-2"}, headers=scoped)
            assert r.json() == {"stations": r.json()["stations"], "next": None}
            assert [s["name"] for s in r.json()["stations"]] == ["mine-3"]
            r = http.get("/api/stations", params={"contains": "other"}, headers=scoped)
            assert r.json()["stations"] == []
    finally:
        server.kill()
