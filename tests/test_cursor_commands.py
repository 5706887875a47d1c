"""Reader cursors through the SDK (``Station.cursors``, ``cursor_page``, ``cursor``,
``commit_cursor``, ``delete_cursor``, on the async and the blocking face) and the CLI
(``stations cursor ls|show|set|delete``), against one live server with tokens: an admin token,
and a consumer token that reaches ``mine-*`` only."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stations.client import (
    Client,
    CursorInfo,
    CursorNotFound,
    CursorPage,
    Forbidden,
    StationNotFound,
)
from stations.client.sync import SyncClient
from tests import clikit
from tests.clikit import as_json, failed, ok
from tests.harness import Server, admin_and_scoped_tokens

ADMIN = "cursor-commands-admin-1"
SCOPED = "cursor-commands-scoped-1"  # a consumer of mine-* only
OFFSET0 = "0000000000000000_0000000000000000"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir: Path = tmp_path_factory.mktemp("cursor-commands")
    tokens = admin_and_scoped_tokens(workdir, ADMIN, SCOPED, "mine-*")
    url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    server = Server(url, workdir, ["--tokens", str(tokens)]).start()
    yield server
    server.kill()


async def _station(server: Server, prefix: str, messages: int = 5) -> tuple[str, list[str]]:
    """A new station holding ``messages`` messages: its name and their offsets."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    async with Client(server.url, ADMIN) as client:
        await client.create_station(name)
        produced = await client.station(name).produce_many(list(range(messages)))
    return name, [p.offset for p in produced]


def _api(server: Server, path: str) -> Any:
    """The JSON the API answers a GET of ``path`` with (an admin token)."""
    answer = httpx.get(server.url + path, headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def cli(server: Server, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    return clikit.run("cursor", *args, url=server.url, token=token)


# -- the SDK -----------------------------------------------------------------------------------


async def test_the_sdk_commits_lists_pages_shows_and_deletes_cursors(server: Server) -> None:
    # A station name with "/" and a cursor name with ":" and "@": each one path segment.
    name, offsets = await _station(server, "team/cursors")
    async with Client(server.url, ADMIN) as client:
        station = client.station(name)
        assert await station.cursors() == []
        first = await station.commit_cursor("spark:q@1", offsets[1])
        assert isinstance(first, CursorInfo)
        # An offset is where the reader goes on: the message there and after it are lag.
        assert (first.name, first.offset, first.lag) == ("spark:q@1", offsets[1], 4)
        assert first.updated_at is not None and first.updated_at.tzinfo is not None
        await station.commit_cursor("a-start", "-1")  # nothing read yet: every message is lag
        await station.commit_cursor("b-tail", offsets[-1])
        await station.commit_cursor("b-mid", offsets[2])

        whole = await station.cursors()
        assert [(c.name, c.lag) for c in whole] == [
            ("a-start", 5),
            ("b-mid", 3),
            ("b-tail", 1),
            ("spark:q@1", 4),
        ]
        assert await station.cursor("spark:q@1") == whole[-1]

        page = await station.cursor_page(2)
        assert isinstance(page, CursorPage)
        assert [c.name for c in page.cursors] == ["a-start", "b-mid"] and page.next == "b-mid"
        page = await station.cursor_page(2, page.next)
        assert [c.name for c in page.cursors] == ["b-tail", "spark:q@1"]
        assert page.next is None
        page = await station.cursor_page(10, prefix="b-")
        assert [c.name for c in page.cursors] == ["b-mid", "b-tail"] and page.next is None
        page = await station.cursor_page(10, contains="Q@")
        assert [c.name for c in page.cursors] == ["spark:q@1"]

        # A cursor may move back (a query restarted from an older checkpoint).
        back = await station.commit_cursor("b-tail", offsets[0])
        assert (back.offset, back.lag) == (offsets[0], 5)
        assert (await station.cursor("b-tail")).offset == offsets[0]

        await station.delete_cursor("spark:q@1")
        assert [c.name for c in await station.cursors()] == ["a-start", "b-mid", "b-tail"]


async def test_a_missing_cursor_is_not_found(server: Server) -> None:
    name, _ = await _station(server, "missing", messages=0)
    async with Client(server.url, ADMIN) as client:
        station = client.station(name)
        with pytest.raises(CursorNotFound) as caught:
            await station.cursor("nobody")
        assert caught.value.status == 404 and "cursor nobody not found" in str(caught.value)
        assert caught.value.field == "cursor"
        with pytest.raises(CursorNotFound, match="cursor nobody not found"):
            await station.delete_cursor("nobody")
        # A missing station is said of the station, whichever cursor call asked.
        for call in ("cursor", "delete_cursor"):
            with pytest.raises(StationNotFound):
                await getattr(client.station(f"{name}-no-such"), call)("nobody")
        with pytest.raises(StationNotFound):
            await client.station(f"{name}-no-such").cursors()
        with pytest.raises(StationNotFound):
            await client.station(f"{name}-no-such").commit_cursor("c", "-1")


def test_the_blocking_face_has_the_cursor_methods(server: Server) -> None:
    with SyncClient(server.url, ADMIN) as client:
        name = f"sync-{uuid.uuid4().hex[:6]}"
        client.create_station(name)
        station = client.station(name)
        offsets = [p.offset for p in station.produce_many(["a", "b", "c"])]
        committed = station.commit_cursor("reader", offsets[0])
        assert isinstance(committed, CursorInfo) and committed.lag == 3
        station.commit_cursor("other", "-1")
        assert [c.name for c in station.cursors()] == ["other", "reader"]
        page = station.cursor_page(1, prefix="r")
        assert isinstance(page, CursorPage)
        assert [c.name for c in page.cursors] == ["reader"] and page.next is None
        assert station.cursor("reader") == committed
        station.delete_cursor("reader")
        with pytest.raises(CursorNotFound):
            station.cursor("reader")


# -- the CLI -----------------------------------------------------------------------------------


async def test_the_cli_lists_cursors_as_a_table_json_or_a_page(server: Server) -> None:
    name, offsets = await _station(server, "cli-ls")
    async with Client(server.url, ADMIN) as client:
        station = client.station(name)
        for k in range(5):
            await station.commit_cursor(f"c{k}", offsets[k])
    rows = [line.split() for line in ok(cli(server, "ls", name)).strip().splitlines()]
    assert rows[0] == ["NAME", "OFFSET", "LAG", "UPDATED"]
    assert [row[:3] for row in rows[1:]] == [[f"c{k}", offsets[k], str(5 - k)] for k in range(5)]
    assert all(row[3].endswith("Z") for row in rows[1:])

    listed = as_json(cli(server, "ls", name, "--json"))
    assert [(c["name"], c["offset"], c["lag"]) for c in listed] == [
        (f"c{k}", offsets[k], 5 - k) for k in range(5)
    ]
    assert set(listed[0]) == {"name", "offset", "lag", "updatedAt"}
    # --json gives each cursor as the API does.
    assert listed == _api(server, f"/api/stations/{name}/cursors")["cursors"]

    proc = cli(server, "ls", name, "-n", "2")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.strip().splitlines()[1:]] == ["c0", "c1"]
    assert proc.stderr == "stations: 2 shown, more after c1 (--after c1, or a larger --limit)\n"
    proc = cli(server, "ls", name, "--after", "c1", "--limit", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [c["name"] for c in json.loads(proc.stdout)] == ["c2", "c3"]
    assert proc.stderr == "stations: 2 shown, more after c3 (--after c3, or a larger --limit)\n"
    # Exactly --limit left: all shown, and no word of more.
    proc = cli(server, "ls", name, "--after", "c2", "--limit", "2", "--json")
    assert [c["name"] for c in json.loads(proc.stdout)] == ["c3", "c4"]
    assert (proc.returncode, proc.stderr) == (0, "")
    listed = as_json(cli(server, "ls", name, "--after", "c3", "--limit", "2", "--json"))
    assert [c["name"] for c in listed] == ["c4"]
    listed = as_json(cli(server, "list", name, "--prefix", "c4", "--json"))
    assert [c["name"] for c in listed] == ["c4"]
    listed = as_json(cli(server, "ls", name, "--contains", "C3", "--json"))
    assert [c["name"] for c in listed] == ["c3"]
    failed(cli(server, "ls", name, "-n", "0"), 2, "--limit must be at least 1")
    failed(cli(server, "ls", f"{name}-no-such"), 3, "not found")


async def test_the_cli_sets_shows_and_deletes_a_cursor(server: Server) -> None:
    name, offsets = await _station(server, "cli-set")
    said = ok(cli(server, "set", name, "query-1", offsets[2]))
    assert said == f"cursor query-1 on {name} at {offsets[2]} (lag 3)\n"
    shown = as_json(cli(server, "set", name, "query-2", "-1", "--json"))
    assert (shown["name"], shown["lag"]) == ("query-2", 5)

    fields = dict(
        line.split(":", 1) for line in ok(cli(server, "show", name, "query-1")).splitlines()
    )
    assert {k: v.strip() for k, v in fields.items() if k != "Updated"} == {
        "Name": "query-1",
        "Station": name,
        "Offset": offsets[2],
        "Lag": "3",
    }
    shown = as_json(cli(server, "show", name, "query-1", "--json"))
    assert (shown["name"], shown["offset"], shown["lag"]) == ("query-1", offsets[2], 3)
    assert shown == _api(server, f"/api/stations/{name}/cursors/query-1")

    failed(cli(server, "set", name, "query-1", "latest"), 2, "OFFSET 'latest' is not an offset")
    beyond = "0000000000000099_0000000000000000"
    failed(cli(server, "set", name, "query-1", beyond), 1, f"OFFSET {beyond}: it is beyond")
    failed(cli(server, "set", name, "bad/name", "-1"), 1, "a cursor name is 1 to 256 letters")
    failed(cli(server, "show", name, ""), 2, "the cursor name is empty")

    assert ok(cli(server, "delete", name, "query-1")) == f"cursor query-1 on {name} deleted\n"
    assert as_json(cli(server, "delete", name, "query-2", "--json")) == {
        "deleted": "query-2",
        "station": name,
    }
    failed(cli(server, "show", name, "query-1"), 3, "cursor query-1 not found")
    failed(cli(server, "delete", name, "query-1"), 3, "cursor query-1 not found")
    assert as_json(cli(server, "ls", name, "--json")) == []


# -- scoped tokens -----------------------------------------------------------------------------


async def test_a_token_without_the_station_is_refused(server: Server) -> None:
    mine, offsets = await _station(server, "mine", messages=2)
    other, _ = await _station(server, "other", messages=2)
    async with Client(server.url, ADMIN) as client:
        await client.station(other).commit_cursor("theirs", "-1")
    async with Client(server.url, SCOPED) as client:
        # Its own stations: a consumer may read and commit cursors, not delete them.
        committed = await client.station(mine).commit_cursor("mine-q", offsets[0])
        assert committed.lag == 2
        assert [c.name for c in await client.station(mine).cursors()] == ["mine-q"]
        with pytest.raises(Forbidden):
            await client.station(mine).delete_cursor("mine-q")
        station = client.station(other)
        with pytest.raises(Forbidden):
            await station.cursors()
        with pytest.raises(Forbidden):
            await station.cursor_page(10)
        with pytest.raises(Forbidden):
            await station.cursor("theirs")
        with pytest.raises(Forbidden):
            await station.commit_cursor("theirs", "-1")
    assert [c["name"] for c in as_json(cli(server, "ls", mine, "--json", token=SCOPED))] == [
        "mine-q"
    ]
    failed(cli(server, "ls", other, token=SCOPED), 5)
    failed(cli(server, "show", other, "theirs", token=SCOPED), 5)
    failed(cli(server, "set", other, "theirs", "-1", token=SCOPED), 5)
    failed(cli(server, "delete", mine, "mine-q", token=SCOPED), 5)
    # Nothing was changed by the refused requests.
    async with Client(server.url, ADMIN) as client:
        theirs = await client.station(other).cursor("theirs")
        assert (theirs.offset, theirs.lag) == (OFFSET0, 2)
        assert [c.name for c in await client.station(mine).cursors()] == ["mine-q"]
