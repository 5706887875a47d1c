"""The management CLI after a review (faults 1, 3 and 5 of the package review): binary payloads
survive ``read``/``tail``/``dls ls``, ``station edit`` can remove a limit, and ``tail`` says on
stderr when it has lost its server and when it is back (or gives up with exit 6)."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests import clikit
from tests.clikit import ok
from tests.harness import Server

PAYLOAD = b"\x00\xff\xfebinary\n"  # not UTF-8: the API gives it as dataBase64
ENCODED = base64.b64encode(PAYLOAD).decode()  # "AP/+YmluYXJ5Cg=="

MakeServer = Callable[..., Server]


@pytest.fixture
def srv(tmp_path: Path, make_server: MakeServer) -> Server:
    return make_server(
        f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}", "--long-poll-timeout-ms", "1000"
    )


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def _env(srv: Server) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    environment.update(STATIONS_URL=srv.url, PYTHONIOENCODING="utf-8")
    return environment


def cli(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return clikit.run(*args, env=_env(srv))


def _binary_station(http: httpx.Client, name: str) -> None:
    created = http.post(
        "/api/stations", json={"name": name, "contentType": "application/octet-stream"}
    )
    assert created.status_code == 201, created.text
    for body in (PAYLOAD, b"plain text"):
        sent = http.post(
            f"/v1/stream/{name}",
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert sent.is_success, sent.text
    stored = http.get(f"/api/stations/{name}/messages").json()["messages"]
    assert stored[0]["dataBase64"] == ENCODED and stored[0]["data"] is None


# -- 1. binary payloads -----------------------------------------------------------------------


def test_read_and_tail_keep_binary_payloads(srv: Server, http: httpx.Client) -> None:
    """``read --json`` gave the bytes that are not UTF-8 as U+FFFD, unmarked and lost."""
    _binary_station(http, "bin")
    for command in (["read", "bin"], ["tail", "bin", "--from", "-1", "-n", "2"]):
        lines = [json.loads(line) for line in ok(cli(srv, *command, "--json")).splitlines()]
        assert len(lines) == 2
        first, second = lines
        # As the API gives it: data null, dataBase64 the bytes; text stays text.
        assert first["data"] is None and first["dataBase64"] == ENCODED
        assert base64.b64decode(first["dataBase64"]) == PAYLOAD
        assert second["data"] == "plain text" and "dataBase64" not in second

    text = ok(cli(srv, "read", "bin"))
    assert "\ufffd" not in text
    first, second = text.splitlines()
    assert first.endswith(f"  [binary, base64] {ENCODED}"), first
    assert second.endswith("  plain text"), second


def test_dls_ls_keeps_binary_payloads(srv: Server, http: httpx.Client) -> None:
    _binary_station(http, "bin-dls")
    assert http.put("/api/stations/bin-dls/groups/g1", json={}).status_code == 201
    leased = http.post("/api/stations/bin-dls/groups/g1/fetch", json={"max": 1}).json()
    offsets = [m["offset"] for m in leased["messages"]]
    dead = http.post(
        "/api/stations/bin-dls/groups/g1/dead-letter", json={"offsets": offsets, "reason": "bad"}
    )
    assert dead.json()["deadLettered"] == 1

    (entry,) = json.loads(ok(cli(srv, "dls", "ls", "bin-dls", "--json")))
    assert entry["data"] is None and entry["dataBase64"] == ENCODED

    text = ok(cli(srv, "dls", "ls", "bin-dls"))
    assert "\ufffd" not in text
    assert text.splitlines()[1].endswith(f"  [binary, base64] {ENCODED}"), text


# -- 3. removing a limit ------------------------------------------------------------------------


def test_station_edit_removes_limits_with_none(srv: Server, http: httpx.Client) -> None:
    """Once set, a limit could not be set back to "no limit": ``--max-age none`` was a usage
    error and ``--dls-forward-to ''`` a refusal."""
    ok(cli(srv, "station", "create", "target"))
    ok(
        cli(
            srv,
            "station",
            "create",
            "limited",
            "--max-age",
            "7d",
            "--max-messages",
            "10",
            "--max-bytes",
            "1000",
            "--dls-forward-to",
            "target",
            "--dls-retention",
            "1d",
        )
    )
    view = json.loads(
        ok(
            cli(
                srv,
                "station",
                "edit",
                "limited",
                "--max-age",
                "none",
                "--max-messages",
                "none",
                "--max-bytes",
                "none",
                "--dls-forward-to",
                "none",
                "--dls-retention",
                "none",
                "--json",
            )
        )
    )
    assert view["retention"] == {"maxAgeMs": None, "maxMessages": None, "maxBytes": None}
    assert view["dls"]["forwardTo"] is None and view["dls"]["retentionMs"] is None
    stored = http.get("/api/stations/limited").json()
    assert stored["retention"] == view["retention"] and stored["dls"] == view["dls"]

    # Only what is named changes; '' also clears the forward target (no station has that name).
    ok(cli(srv, "station", "edit", "limited", "--max-bytes", "500", "--dls-forward-to", "target"))
    ok(cli(srv, "station", "edit", "limited", "--dls-forward-to", ""))
    stored = http.get("/api/stations/limited").json()
    assert stored["retention"]["maxBytes"] == 500 and stored["dls"]["forwardTo"] is None

    bad = cli(srv, "station", "edit", "limited", "--max-age", "never")
    assert bad.returncode == 2 and "none" in bad.stderr, bad.stderr
    assert "none" in ok(cli(srv, "station", "edit", "--help"))


# -- 5. tail through an outage ------------------------------------------------------------------


class _Lines:
    """A pipe's lines as they come, without blocking the test for ever."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def next(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line in {timeout} s") from None

    def rest(self) -> list[str]:
        out: list[str] = []
        while not self.lines.empty():
            out.append(self.lines.get())
        return out


def _tail(srv: Server, *args: str) -> tuple[subprocess.Popen[str], _Lines, _Lines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "tail", *args],
        env=_env(srv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    assert proc.stdout is not None and proc.stderr is not None
    return proc, _Lines(proc.stdout), _Lines(proc.stderr)


def _following(out: _Lines) -> None:
    """Wait until tail follows: it printed the station's one message and is waiting for more."""
    assert json.loads(out.next(timeout=30))["data"] == 0


def test_tail_says_when_it_lost_the_server_and_when_it_is_back(
    srv: Server, http: httpx.Client
) -> None:
    """``tail`` retried for ever and said nothing: it looked like a quiet station."""
    assert http.post("/api/stations", json={"name": "t"}).status_code == 201
    assert http.post("/api/stations/t/messages", json={"messages": [{"data": 0}]}).is_success
    proc, out, err = _tail(srv, "t", "--json", "--from", "-1", "-n", "2")
    try:
        _following(out)
        srv.kill()
        lost = err.next(timeout=15)
        assert lost.startswith("stations: ") and "reconnecting" in lost, lost
        assert srv.url in lost
        time.sleep(4)  # several attempts: still one line
        assert err.rest() == []
        assert proc.poll() is None
        srv.start()
        back = err.next(timeout=20)
        assert back.startswith("stations: ") and "reconnected" in back, back
        with httpx.Client(base_url=srv.url, timeout=10) as again:
            sent = again.post("/api/stations/t/messages", json={"messages": [{"data": 7}]})
            assert sent.is_success, sent.text
        assert json.loads(out.next(timeout=20))["data"] == 7
        assert proc.wait(30) == 0
        assert err.rest() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tail_gives_up_after_the_time_it_is_given(srv: Server, http: httpx.Client) -> None:
    assert http.post("/api/stations", json={"name": "t2"}).status_code == 201
    assert http.post("/api/stations/t2/messages", json={"messages": [{"data": 0}]}).is_success
    proc, out, err = _tail(srv, "t2", "--json", "--from", "-1", "--give-up-after", "2s")
    try:
        _following(out)
        srv.kill()
        lost = err.next(timeout=15)
        assert "reconnecting" in lost and "2s" in lost, lost
        assert proc.wait(30) == 6
        time.sleep(0.2)  # the reader thread's last line
        rest: list[Any] = err.rest()
        assert len(rest) == 1 and rest[0].startswith("stations: error: cannot reach"), rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
