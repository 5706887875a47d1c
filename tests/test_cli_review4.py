"""The management CLI, as a fourth review found it, against one live server:

- ``group edit`` looked the group up and then PUT: a group deleted in between was made again
  by the edit. ``group create`` looked it up and then PUT its limits: a group another client
  made in between had its limits changed, and the command said "already exists with these
  limits". The API has no create-only or conditional PUT; the races are placed here by a relay
  between the CLI and the server that acts just before it forwards the CLI's PUT;
- ``group ack`` (by offset: the API's ack has no lease form) and ``group extend`` (by offset
  or by lease) beside ``group nack`` and ``group dead-letter``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import clikit
from tests.clikit import failed, ok
from tests.harness import Server, free_port
from tests.module_server import module_server

OFFSET0 = "0000000000000000_0000000000000000"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        yield server


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return clikit.run(*args, url=url, stdin=stdin, env={"PYTHONIOENCODING": "utf-8"})


def _groups(http: httpx.Client, station: str) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in http.get(f"/api/stations/{station}/groups").json()["groups"]}


# -- a relay that acts between the CLI's requests ------------------------------------------------


class Relay:
    """An HTTP relay to the server on a port of its own; ``before(method, path)`` runs before
    each request is forwarded, so a test can change the server's state between two requests of
    one command."""

    def __init__(self, target: str) -> None:
        self.before: Callable[[str, str], None] = lambda method, path: None
        self.seen: list[tuple[str, str]] = []
        relay = self
        upstream = httpx.Client(base_url=target, timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                relay.seen.append((self.command, self.path))
                relay.before(self.command, self.path)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("content-type", "accept", "if-match", "if-none-match")
                }
                answer = upstream.request(self.command, self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for key in ("Content-Type", "Location"):
                    if key in answer.headers:
                        self.send_header(key, answer.headers[key])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._upstream = upstream
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()


@pytest.fixture
def relay(srv: Server) -> Iterator[Relay]:
    made = Relay(srv.url)
    yield made
    made.close()


def _once(action: Callable[[], None], method: str, suffix: str) -> Callable[[str, str], None]:
    """A ``Relay.before`` that runs ``action`` before the first ``method`` to a path ending in
    ``suffix``."""
    done: list[bool] = []

    def before(seen_method: str, path: str) -> None:
        if not done and seen_method == method and path.split("?")[0].endswith(suffix):
            done.append(True)
            action()

    return before


# -- group edit never creates --------------------------------------------------------------------


def test_edit_does_not_make_again_a_group_deleted_meanwhile(
    srv: Server, http: httpx.Client, relay: Relay
) -> None:
    assert http.post("/api/stations", json={"name": "race-edit"}).status_code == 201
    put = http.put("/api/stations/race-edit/groups/g", json={"maxMsgDeliveries": 3})
    assert put.status_code == 201

    def delete() -> None:
        assert http.delete("/api/stations/race-edit/groups/g").status_code == 204

    relay.before = _once(delete, "PUT", "/groups/g")
    done = cli(relay.url, "group", "edit", "race-edit", "g", "--max-deliveries", "7")
    assert ("PUT", "/api/stations/race-edit/groups/g") in relay.seen  # the race was placed
    failed(done, 3, "group g not found on station race-edit")
    assert _groups(http, "race-edit") == {}


# -- group create never changes a group it did not make ------------------------------------------


def test_create_does_not_change_the_limits_of_a_group_made_meanwhile(
    srv: Server, http: httpx.Client, relay: Relay
) -> None:
    assert http.post("/api/stations", json={"name": "race-create"}).status_code == 201
    http.post("/api/stations/race-create/messages", json={"messages": [{"data": 1}]})

    def other_creates() -> None:
        put = http.put("/api/stations/race-create/groups/g", json={"maxMsgDeliveries": 3})
        assert put.status_code == 201

    relay.before = _once(other_creates, "PUT", "/groups/g")
    done = cli(relay.url, "group", "create", "race-create", "g", "--max-deliveries", "7")
    assert ("PUT", "/api/stations/race-create/groups/g") in relay.seen
    failed(done, 4, "group g exists on race-create with --max-deliveries 3", "group edit")
    assert _groups(http, "race-create")["g"]["maxMsgDeliveries"] == 3
    # Made meanwhile with the limits asked (none): no error, and --from is said not to apply.
    relay.before = _once(lambda: _put(http, "race-create", "h"), "PUT", "/groups/h")
    said = ok(cli(relay.url, "group", "create", "race-create", "h", "--from", "latest"))
    assert "already exists" in said and "--from places a new group only" in said
    assert _groups(http, "race-create")["h"]["cursor"] == OFFSET0  # the other's: earliest


def _put(http: httpx.Client, station: str, group: str) -> None:
    assert http.put(f"/api/stations/{station}/groups/{group}", json={}).status_code == 201


def test_create_with_limits_makes_the_group_with_them(http: httpx.Client, srv: Server) -> None:
    assert http.post("/api/stations", json={"name": "limits-create"}).status_code == 201
    made = json.loads(
        ok(
            cli(
                srv.url,
                "group",
                "create",
                "limits-create",
                "g",
                "--max-deliveries",
                "9",
                "--max-ack-time",
                "2m",
                "--json",
            )
        )
    )
    assert (made["created"], made["maxMsgDeliveries"], made["maxAckTimeMs"]) == (True, 9, 120_000)
    shown = _groups(http, "limits-create")["g"]
    assert (shown["maxMsgDeliveries"], shown["maxAckTimeMs"]) == (9, 120_000)
    again = json.loads(ok(cli(srv.url, "group", "create", "limits-create", "g", "--json")))
    assert (again["created"], again["maxMsgDeliveries"]) == (False, 9)


# -- group ack -----------------------------------------------------------------------------------


def _fetched(srv: Server, station: str, count: int, *extra: str) -> list[str]:
    """``count`` lines of ``group fetch --json`` from group g."""
    lines = ok(cli(srv.url, "group", "fetch", station, "g", "-n", str(count), "--json", *extra))
    assert len(lines.splitlines()) == count
    return lines.splitlines()


def _station_with_group(http: httpx.Client, station: str, count: int, **group: Any) -> None:
    assert http.post("/api/stations", json={"name": station}).status_code == 201
    body = {"messages": [{"data": i} for i in range(count)]}
    assert http.post(f"/api/stations/{station}/messages", json=body).is_success
    assert http.put(f"/api/stations/{station}/groups/g", json=group).status_code == 201


def test_group_ack_by_offset_and_from_fetch_lines(
    srv: Server, http: httpx.Client, tmp_path: Path
) -> None:
    _station_with_group(http, "ack", 5)
    lines = _fetched(srv, "ack", 4)
    offsets = [json.loads(line)["offset"] for line in lines]
    # group fetch --json | group ack --offsets-from -
    piped = ok(cli(srv.url, "group", "ack", "ack", "g", "--offsets-from", "-", "--json",
                   stdin="\n".join(lines[:2]) + "\n"))  # fmt: skip
    assert json.loads(piped) == {"acked": 2, "unknown": []}
    said = ok(cli(srv.url, "group", "ack", "ack", "g", offsets[2]))
    assert said.splitlines() == ["1 of 1 messages acked"]
    # Settled already: listed as unknown, exit 0 (as nack and dead-letter do).
    again = ok(cli(srv.url, "group", "ack", "ack", "g", offsets[2], offsets[0]))
    assert again.splitlines()[0] == "0 of 2 messages acked"
    assert [line.split()[1] for line in again.splitlines()[1:]] == [offsets[2], offsets[0]]
    # A file of plain offsets (blank lines skipped), with OFFSETs beside it.
    listed = tmp_path / "offsets.txt"
    listed.write_text(f"\n{offsets[3]}\n\n")
    both = json.loads(
        ok(
            cli(
                srv.url,
                "group",
                "ack",
                "ack",
                "g",
                offsets[1],
                "--offsets-from",
                str(listed),
                "--json",
            )
        )  # fmt: skip
    )
    assert both == {"acked": 1, "unknown": [offsets[1]]}
    group = _groups(http, "ack")["g"]
    assert (group["inFlight"], group["pending"]) == (0, 1)


def test_group_ack_refusals(srv: Server, http: httpx.Client) -> None:
    _station_with_group(http, "ack-refuse", 1)
    (line,) = _fetched(srv, "ack-refuse", 1)
    base = ("group", "ack", "ack-refuse", "g")
    failed(cli(srv.url, *base), 2, "OFFSET", "--offsets-from")
    failed(cli(srv.url, *base, "12"), 2, "OFFSET '12'")
    # The API's ack names messages by offset only: a lease would read as "that delivery only".
    failed(cli(srv.url, *base, "--lease", line), 2, "--offsets-from", "by offset")
    failed(cli(srv.url, *base, "--leases-from", "-", stdin=line), 2, "--offsets-from")
    failed(cli(srv.url, *base, "--offsets-from", "/no/such/file"), 2, "--offsets-from")
    # Empty input is nothing to ack, not a mistake (review 5): see test_cli_review5.
    assert (
        ok(cli(srv.url, *base, "--offsets-from", "-", stdin="\n")).strip()
        == "0 of 0 messages acked"
    )
    failed(cli(srv.url, *base, "--offsets-from", "-", stdin="{nope\n"), 2, "line 1")
    failed(cli(srv.url, *base, "--offsets-from", "-", stdin='{"id": 1}\n'), 2, "line 1")
    failed(cli(srv.url, "group", "ack", "ack-refuse", "nope", OFFSET0), 3, "group nope")
    failed(cli(srv.url, "group", "ack", "ack-none", "g", OFFSET0), 3, "ack-none")
    assert _groups(http, "ack-refuse")["g"]["inFlight"] == 1  # nothing was acked


def test_group_ack_sends_more_offsets_than_one_request_takes(
    srv: Server, http: httpx.Client, relay: Relay, tmp_path: Path
) -> None:
    """The API takes 10000 offsets a request: more go in several, as nack's do."""
    _station_with_group(http, "ack-many", 1)
    (line,) = _fetched(srv, "ack-many", 1)
    listed = tmp_path / "offsets.txt"
    others = [f"{n:016d}_0000000000000000" for n in range(1000, 11_000)]
    listed.write_text("\n".join([line, *others]) + "\n")
    answer = json.loads(
        ok(cli(relay.url, "group", "ack", "ack-many", "g", "--offsets-from", str(listed), "--json"))
    )
    assert answer == {"acked": 1, "unknown": others}
    assert [p for m, p in relay.seen if m == "POST"] == ["/api/stations/ack-many/groups/g/ack"] * 2


# -- group extend --------------------------------------------------------------------------------


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_group_extend_keeps_leases_past_the_ack_time(srv: Server, http: httpx.Client) -> None:
    # 4 s: the fetch's leases must outlive starting the CLI on a loaded box (1 s did not; 2.5 s
    # came near it beside three test workers).
    _station_with_group(http, "ext", 3, maxAckTimeMs=4000)
    lines = _fetched(srv, "ext", 2, "--consumer", "w1")
    offsets = [json.loads(line)["offset"] for line in lines]
    before = datetime.now(UTC)
    answer = json.loads(
        ok(
            cli(
                srv.url,
                "group",
                "extend",
                "ext",
                "g",
                "--leases-from",
                "-",
                "--lease-time",
                "1m",
                "--json",
                stdin="\n".join(lines),
            )
        )  # fmt: skip
    )
    assert (answer["extended"], answer["unknown"]) == (2, [])
    assert _at(answer["leaseUntil"]) > before + timedelta(seconds=50)
    time.sleep(4.3)  # past the group's max ack time: unextended, both would be out again
    third = http.post("/api/stations/ext/groups/g/fetch", json={"max": 5}).json()["messages"]
    assert [m["offset"] for m in third] != offsets and len(third) == 1
    # --consumer: only leases that consumer holds.
    other = ok(cli(srv.url, "group", "extend", "ext", "g", offsets[0], "--consumer", "w2"))
    assert other.splitlines()[0] == "0 of 1 leases extended"
    assert other.splitlines()[1].startswith(f"unknown: {offsets[0]} ")
    mine = ok(cli(srv.url, "group", "extend", "ext", "g", offsets[0], "--consumer", "w1"))
    assert mine.startswith("1 of 1 leases extended, until "), mine
    # A lease that expired is not extended (its message may be on its way to someone else).
    time.sleep(4.3)
    expired = json.dumps(third[0])
    stale = json.loads(
        ok(cli(srv.url, "group", "extend", "ext", "g", "--lease", expired, "--json"))
    )
    assert stale == {"extended": 0, "leaseUntil": None, "unknown": [third[0]["offset"]]}
    assert ok(cli(srv.url, "group", "ack", "ext", "g", *offsets)).startswith("2 of 2 ")


def test_group_extend_refusals(srv: Server, http: httpx.Client) -> None:
    _station_with_group(http, "ext-refuse", 1)
    (line,) = _fetched(srv, "ext-refuse", 1)
    base = ("group", "extend", "ext-refuse", "g")
    failed(cli(srv.url, *base), 2, "OFFSET", "--lease")
    failed(cli(srv.url, *base, "--lease", line, OFFSET0), 2, "not both")
    failed(cli(srv.url, *base, "--lease", line, "--lease-time", "50ms"), 2, "--lease-time")
    failed(cli(srv.url, *base, "--lease", line, "--lease-time", "13h"), 2, "--lease-time")
    failed(cli(srv.url, *base, "--lease", line, "--consumer", ""), 2, "--consumer")
    failed(cli(srv.url, *base, "--lease", line, "--consumer", "c" * 257), 2, "--consumer")
    failed(cli(srv.url, "group", "extend", "ext-refuse", "nope", "--lease", line), 3, "nope")


def test_group_help_names_ack_and_extend(srv: Server) -> None:
    listed = ok(cli(srv.url, "group", "--help")).splitlines()
    verbs = [line.split()[0] for line in listed if line.startswith("    ") and line[4] != " "]
    assert verbs[verbs.index("fetch") + 1 : verbs.index("nack")] == ["ack", "extend"]
    assert "fetch, ack, extend, nack" in " ".join(ok(cli(srv.url, "--help")).split())
    for verb in ("ack", "extend"):
        helped = ok(cli(srv.url, "group", verb, "--help"))
        assert "exit codes:" in helped and "OFFSET" in helped
