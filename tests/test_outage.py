"""A database outage answers JSON 503 with Retry-After, and the health probes tell (issue 11).

The outage is real and confined to this test's own PostgreSQL database: its connections are
terminated and new ones refused (``ALLOW_CONNECTIONS false``), then it is given back. The
shared PostgreSQL server itself is never stopped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from stations.store.writer import OUTCOME_WAIT_S
from tests.harness import PG_ADMIN_URL, Server
from tests.pgcut import CommitCutter

JSON = {"Content-Type": "application/json"}


@contextmanager
def outage(db_url: str) -> Iterator[None]:
    import psycopg

    name = db_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def eventually(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    assert int(response.headers["Retry-After"]) >= 1
    if response.request.method != "HEAD":
        assert response.json()["error"]["code"] == "unavailable"


def test_database_outage_is_a_json_503_and_health_reports_it(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    srv = make_server(pg_url, "--long-poll-timeout-ms", "500")
    with httpx.Client(base_url=srv.url, timeout=15) as http:
        assert http.post("/api/stations", json={"name": "o1"}).status_code == 201
        assert http.post("/v1/stream/o1", headers=JSON, content=b"[1]").status_code == 204
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").json() == {"status": "ok"}

        with outage(pg_url):
            # Writes, reads and the management API: all JSON 503 with Retry-After.
            assert_unavailable(http.post("/v1/stream/o1", headers=JSON, content=b"[2]"))
            assert_unavailable(http.get("/v1/stream/o1", params={"offset": "-1"}))
            assert_unavailable(http.get("/api/stations/o1"))
            assert_unavailable(http.post("/api/stations", json={"name": "o2"}))
            assert_unavailable(
                http.post("/api/stations/o1/messages", json={"messages": [{"data": 3}]})
            )
            for probe in ("/healthz", "/readyz"):
                response = http.get(probe)
                assert response.status_code == 503, response.text
                assert response.json()["database"] == "unreachable"
            live = http.get("/livez")
            assert (live.status_code, live.json()) == (200, {"status": "ok"})
            # The scrape still answers (it was a 503: the series an outage alert is made of
            # were lost exactly then), without the figures read from the database.
            scrape = http.get("/metrics")
            assert scrape.status_code == 200, scrape.text[:300]
            assert "stations_database_up 0.0" in scrape.text
            assert 'status="503"' in scrape.text
            assert "stations_station_messages{" not in scrape.text
            time.sleep(3)  # the scheduler's jobs fail a few times each meanwhile

        # The database is back: so is the service, with what was acknowledged before.
        eventually(lambda: http.get("/healthz").status_code == 200, "healthz stayed 503")
        eventually(
            lambda: http.post("/v1/stream/o1", headers=JSON, content=b"[4]").status_code == 204,
            "appends did not recover",
        )
        assert http.get("/v1/stream/o1", params={"offset": "-1"}).json() == [1, 4]
        eventually(lambda: "stations_database_up 1.0" in http.get("/metrics").text, "metrics")
    log = (srv.workdir / f"server-{srv.port}.log").read_text(errors="replace")
    assert "Error handling request" not in log, log[-3000:]
    # Logged once each (the requests' failures, the writer's, each job's), not a traceback
    # per job run and a line per request: 800 KB in a 20 s outage.
    assert log.count("Traceback") == 0, log[-3000:]
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) <= 10, "\n".join(errors)
    assert "works again" in log


def test_the_first_write_after_postgresql_ended_the_connections_succeeds(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """A PostgreSQL restart (or failover, or an idle timeout) ends the server's connections:
    the pool checks its connections before use, but the writer keeps one of its own, and the
    first write after answered 503 for a database that was there. A transaction whose
    connection was lost before its COMMIT was sent runs again on a new one."""
    import psycopg

    srv = make_server(pg_url)
    name = pg_url.rsplit("/", 1)[1]
    with httpx.Client(base_url=srv.url, timeout=15) as http:
        assert http.put("/v1/stream/t1", headers=JSON).status_code == 201
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
        assert ended is not None and ended[0] >= 1
        answers = [http.post("/v1/stream/t1", headers=JSON, content=b"[%d]" % k) for k in (1, 2)]
        assert [r.status_code for r in answers] == [204, 204], [r.text for r in answers]
        assert http.get("/v1/stream/t1", params={"offset": "-1"}).json() == [1, 2]
    log = (srv.workdir / f"server-{srv.port}.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_a_commit_whose_answer_was_lost_is_answered_by_what_happened(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """The connection is lost while PostgreSQL commits (the COMMIT reached it, its answer did
    not reach the server): the server asks PostgreSQL on a new connection whether the
    transaction committed and answers accordingly. It answered 503 ("nothing decided, retry"),
    and a transaction or an append without ids, sent again, was stored twice."""
    cutter = CommitCutter()
    try:
        srv = make_server(cutter.url(pg_url))
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            for name in ("cut-tx", "cut-ds"):
                assert http.post("/api/stations", json={"name": name}).status_code == 201
            cutter.arm("cut-tx")
            r = http.post("/api/transactions", json={"produce": [{"station": "cut-tx", "data": 1}]})
            assert r.status_code == 200, r.text
            assert r.json()["produced"][0]["offset"]
            cutter.arm("cut-ds")
            r = http.post("/v1/stream/cut-ds", headers=JSON, content=b"[1, 2]")
            assert r.status_code == 204, r.text
            assert cutter.cuts == 2
            for name, stored in (("cut-tx", [1]), ("cut-ds", [1, 2])):
                assert http.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == stored
            r = http.post("/v1/stream/cut-ds", headers=JSON, content=b"[3]")  # it works on
            assert r.status_code == 204, r.text
            assert http.get("/v1/stream/cut-ds", params={"offset": "-1"}).json() == [1, 2, 3]
    finally:
        cutter.close()


def test_a_commit_that_never_reached_postgresql_runs_again(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """The connection is lost as the COMMIT is sent, before PostgreSQL reads it: the old
    server process waits on in its open transaction (``txid_status`` says in progress), locks
    held. The writer ends that process, learns the transaction aborted and runs it again: a
    200 at once. It waited the whole 10 s for a 500 ``outcome_unknown``, every other write
    behind it."""
    cutter = CommitCutter()
    try:
        srv = make_server(cutter.url(pg_url))
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            assert http.post("/api/stations", json={"name": "held"}).status_code == 201
            cutter.arm("held", forward=False)
            started = time.monotonic()
            r = http.post("/api/stations/held/messages", json={"messages": [{"data": 1}]})
            assert r.status_code == 200, r.text
            assert time.monotonic() - started < 5
            assert cutter.cuts == 1
            assert http.get("/v1/stream/held", params={"offset": "-1"}).json() == [1]
    finally:
        cutter.close()


def test_a_commit_whose_outcome_cannot_be_learned_is_not_a_503(
    pg_url: str, make_server: Callable[..., Server]
) -> None:
    """Lost during its COMMIT, and the database unreachable for longer than the writer asks:
    the answer is 500 ``outcome_unknown`` (it may have been carried out), never the 503 that
    tells clients nothing was decided; the SDK does not send such a transaction again."""
    from stations.client import Client
    from stations.client.errors import ServerError, may_have_acted

    cutter = CommitCutter()
    try:
        srv = make_server(cutter.url(pg_url))

        async def sdk() -> None:
            async with Client(srv.url) as client:
                await client.create_station("dark")
                await client.station("dark").produce(0)  # the server is connected
                cutter.arm("dark", then_refuse_s=OUTCOME_WAIT_S + 3)
                with pytest.raises(ServerError) as raised:
                    async with client.transaction() as tx:
                        tx.produce("dark", 1)
                assert (raised.value.status, raised.value.code) == (500, "outcome_unknown")
                assert may_have_acted(raised.value)  # so the SDK did not send it again

        asyncio.run(sdk())
        assert cutter.cuts == 1
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            eventually(
                lambda: http.get("/v1/stream/dark", params={"offset": "-1"}).status_code == 200,
                "the server reads again",
            )
            assert http.get("/v1/stream/dark", params={"offset": "-1"}).json() == [0, 1]
    finally:
        cutter.close()
