"""``/metrics`` after known traffic: every per-station and per-group figure with its value, the
writer's histograms, the process collectors; series stay bounded however many stations or
random names arrive; the optional access log; and ``--log-level info`` stays quiet."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Server

JSON = {"Content-Type": "application/json"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: httpx.Client) -> Samples:
    answer = http.get("/metrics")
    assert answer.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def srv(db_url: str, tmp_path: Path) -> Iterator[Server]:
    """On SQLite and on PostgreSQL (the ``db_url`` fixture of tests/conftest.py)."""
    url = db_url
    args = ["--metrics-stations", "3", "--log-level", "info"]
    args += ["--access-log", str(tmp_path / "access.log")]
    server = Server(url, tmp_path, args).start()
    yield server
    server.kill()


@pytest.fixture
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def test_figures_after_known_traffic(srv: Server, http: httpx.Client, tmp_path: Path) -> None:
    for name in ("met-a", "met-b"):
        assert http.post("/api/stations", json={"name": name}).status_code == 201
    # met-a: 5 messages sent, "a" twice: 4 stored (ids a, b, c and one without), 1 duplicate.
    sent = [{"id": "a", "data": 10}, {"id": "b", "data": 20}, {"id": "a", "data": 10}]
    sent += [{"id": "c", "data": 30}, {"data": 40}]
    produced = http.post("/api/stations/met-a/messages", json={"messages": sent}).json()
    assert [r["duplicate"] for r in produced["results"]] == [False, False, True, False, False]
    # ... and "a" once more through the Durable Streams door: a second duplicate.
    again = http.post("/v1/stream/met-a", content=b"10", headers={**JSON, "Msg-Id": "a"})
    assert again.headers["Msg-Duplicate"] == "true"
    # met-b: an idempotent producer's retry is answered as a duplicate.
    producer = {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "0", **JSON}
    for _ in range(2):
        assert http.post("/v1/stream/met-b", content=b"[1]", headers=producer).is_success

    # A group on met-a: lease 2, nack 1, lease it again (a redelivery), dead-letter it.
    group = "/api/stations/met-a/groups/g"
    assert http.put(group, json={"maxMsgDeliveries": 5}).status_code == 201
    leased = http.post(group + "/fetch", json={"max": 2}).json()["messages"]
    assert len(leased) == 2
    first = leased[0]["offset"]
    assert http.post(group + "/nack", json={"offsets": [first]}).json()["nacked"] == 1
    again_leased = http.post(group + "/fetch", json={"max": 1}).json()["messages"]
    assert [(m["offset"], m["deliveryCount"]) for m in again_leased] == [(first, 2)]
    dead = http.post(group + "/dead-letter", json={"offsets": [first], "reason": "bad"})
    assert dead.json()["deadLettered"] == 1

    samples = scrape(http)
    stats = http.get("/api/stations/met-a").json()["stats"]
    assert (stats["messages"], stats["idsInWindow"]) == (4, 3)
    a = {"station": "met-a"}
    assert value(samples, "stations_station_messages", **a) == 4
    assert value(samples, "stations_station_bytes", **a) == 8 == stats["bytes"]
    assert value(samples, "stations_station_ids_in_window", **a) == 3
    assert value(samples, "stations_station_duplicates_total", **a) == 2
    assert value(samples, "stations_station_dls_depth", **a) == 1
    b = {"station": "met-b"}
    assert value(samples, "stations_station_messages", **b) == 1
    assert value(samples, "stations_station_producer_duplicates_total", **b) == 1
    assert value(samples, "stations_station_duplicates_total", **b) == 0
    g = {"station": "met-a", "group": "g"}
    # 4 messages: 2 were leased; one of them is now dead-lettered, one still in flight.
    assert value(samples, "stations_group_in_flight", **g) == 1
    assert value(samples, "stations_group_lag", **g) == 2
    assert value(samples, "stations_group_pending", **g) == 2
    assert value(samples, "stations_group_dls_depth", **g) == 1
    assert value(samples, "stations_group_redeliveries_total", **g) == 1
    assert value(samples, "stations_stations") == 2

    writes = value(samples, "stations_writer_batch_size_count")
    assert writes >= 1
    assert value(samples, "stations_writer_batch_size_sum") >= writes
    assert value(samples, "stations_writer_commit_seconds_count") == writes
    assert value(samples, "stations_writer_commit_seconds_sum") > 0
    assert 1 <= value(samples, "stations_writer_relaxed_commits_total") < writes  # the fetches
    # SQLite's WAL: the commits above left their pages in it (a checkpoint copies them once
    # thousands wait); PostgreSQL has no such series.
    wal = ("stations_wal_frames_waiting", ())
    if srv.db_url.startswith("sqlite"):
        wal_file = Path(srv.db_url.removeprefix("sqlite:///") + "-wal")
        # Each frame is a page (4 KB) plus its 24-byte header, after the file's 32-byte one.
        assert 1 <= samples[wal] <= (wal_file.stat().st_size - 32) // (4096 + 24)
        for by in ("thread", "writer"):
            assert value(samples, "stations_wal_checkpoints_total", by=by) == 0
    else:
        assert wal not in samples
    created = {"method": "POST", "route": "/api/stations", "status": "201"}
    assert value(samples, "stations_http_requests_total", **created) == 2
    assert value(samples, "process_resident_memory_bytes") > 0
    assert value(samples, "process_open_fds") > 0
    assert ("python_gc_collections_total", (("generation", "0"),)) in samples

    # The optional access log has a line per request.
    log = (tmp_path / "access.log").read_text()
    assert '"POST /api/stations HTTP/1.1" 201' in log
    assert '"GET /metrics HTTP/1.1" 200' in log

    # --log-level info stays quiet while idle: no scheduler line per job run, nothing at all
    # once started (the start-up lines name each schema migration run).
    before = srv.log()
    time.sleep(2.5)
    server_log = srv.log()
    assert "apscheduler" not in server_log and "Running job" not in server_log, server_log
    assert server_log == before, server_log[len(before) :]
    own = [line for line in server_log.splitlines() if "alembic" not in line]
    assert len(own) < 5, server_log

    # A request whose client left has its access line too (it had none: aiohttp writes a
    # line per answer it sends).
    with contextlib.suppress(httpx.TimeoutException):
        http.get("/v1/stream/met-a?offset=now&live=long-poll", timeout=0.5)
    line = '"GET /v1/stream/met-a?offset=now&live=long-poll HTTP/1.1" 499'
    deadline = time.monotonic() + 10  # until the server has seen the connection go
    while line not in (log := (tmp_path / "access.log").read_text()):
        assert time.monotonic() < deadline, log[-2000:]
        time.sleep(0.05)


def _random_traffic(http: httpx.Client, count: int) -> list[str]:
    """Random names on every kind of route, and methods nobody serves."""
    randoms = [uuid.uuid4().hex for _ in range(count)]
    for i, name in enumerate(randoms):
        http.get(f"/api/stations/{name}")
        http.post(f"/api/stations/{name}/messages", json={"messages": [{"data": 1}]})
        http.get(f"/api/stations/{name}/groups/{name}")
        http.get(f"/v1/stream/{name}")
        http.get(f"/{name}/{i}")
        http.request(f"X{name[:8].upper()}", "/api/stations")
    return randoms


def test_series_stay_bounded(srv: Server, http: httpx.Client) -> None:
    first = _random_traffic(http, 30)
    scrape(http)  # the scrape's own request is counted from the next one on
    once = scrape(http)
    second = _random_traffic(http, 60)
    twice = scrape(http)
    # Twice as many random names again: not one series more.
    assert set(twice) == set(once)
    text = repr(twice)
    assert not any(name in text for name in first + second)
    methods = {dict(k[1])["method"] for k in twice if k[0] == "stations_http_requests_total"}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}

    # More stations than --metrics-stations 3: per-station series for the first 3 by name.
    def station_series(samples: Samples) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {k for k in samples if k[0].startswith(("stations_station_", "stations_group_"))}

    names = [f"bound-{i:02d}" for i in range(12)]
    for name in names[:6]:
        assert http.post("/api/stations", json={"name": name}).status_code == 201
        assert http.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
    six = scrape(http)
    assert value(six, "stations_stations") == 6
    assert value(six, "stations_stations_reported") == 3
    reported = {dict(k[1])["station"] for k in station_series(six)}
    assert reported == set(names[:3])
    for name in names[6:]:
        assert http.post("/api/stations", json={"name": name}).status_code == 201
    twelve = scrape(http)
    assert value(twelve, "stations_stations") == 12
    assert station_series(twelve) == station_series(six)

    # A deleted station's series go with it (the next one by name takes its place).
    assert http.delete(f"/api/stations/{names[0]}").status_code == 204
    gone = scrape(http)
    assert ("stations_station_messages", (("station", names[0]),)) not in gone
    assert ("stations_station_messages", (("station", names[3]),)) in gone


def test_console_files_are_counted_by_the_status_they_answer(
    srv: Server, http: httpx.Client
) -> None:
    """A static file's status (304 to a conditional GET, 206 to a range) is only decided as
    it is sent: the count must not say 200 for them."""
    first = http.get("/ui/app.js")
    assert first.status_code == 200
    validator = {"If-None-Match": first.headers["ETag"]}
    assert http.get("/ui/app.js", headers=validator).status_code == 304
    assert http.get("/ui/app.js", headers={"Range": "bytes=0-9"}).status_code == 206
    counted = {
        dict(labels)["status"]: count
        for (name, labels), count in scrape(http).items()
        if name == "stations_http_requests_total"
        and dict(labels)["method"] == "GET"
        and dict(labels)["route"].startswith("/ui")
    }
    assert counted == {"200": 1, "304": 1, "206": 1}, counted


def _leave(srv: Server, path: str, wait_s: float) -> None:
    """GET ``path`` on a connection that reads next to nothing, then drop it (a reset)."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 200")
        time.sleep(wait_s)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_answers_their_clients_left_while_being_sent_are_499(
    srv: Server, http: httpx.Client, tmp_path: Path
) -> None:
    """An SSE whose client left, while it waited or as it was written, and a large catch-up
    page whose client left half way: logged and counted as 499 (they were 200, as if
    answered)."""
    assert http.put("/v1/stream/gone", headers={"Content-Type": "text/plain"}).status_code == 201
    for _ in range(6):  # 6 MiB: more than a page (4 MiB), more than the sockets hold
        appended = http.post(
            "/v1/stream/gone", content=b"x" * (1 << 20), headers={"Content-Type": "text/plain"}
        )
        assert appended.status_code == 204
    _leave(srv, "/v1/stream/gone?offset=-1", 1.0)
    _leave(srv, "/v1/stream/gone?offset=-1&live=sse", 1.0)
    _leave(srv, "/v1/stream/gone?offset=now&live=sse", 0.3)
    route = {"method": "GET", "route": "/v1/stream/{name}"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = scrape(http)
        if (
            samples.get(
                ("stations_http_requests_total", tuple(sorted({**route, "status": "499"}.items())))
            )
            == 3
        ):
            break
        time.sleep(0.1)
    assert value(samples, "stations_http_requests_total", status="499", **route) == 3
    assert (
        "stations_http_requests_total",
        tuple(sorted({**route, "status": "200"}.items())),
    ) not in samples
    log = (tmp_path / "access.log").read_text()
    for query in ("offset=-1", "offset=-1&live=sse", "offset=now&live=sse"):
        assert f'"GET /v1/stream/gone?{query} HTTP/1.1" 499' in log, log[-2000:]
    lines = [line for line in log.splitlines() if '"GET /v1/stream/gone?' in line]
    assert len(lines) == 3 and all('" 499 ' in line for line in lines), lines
