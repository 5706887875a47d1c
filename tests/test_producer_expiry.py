"""Idle producer sessions are forgotten after the producer expiry (``--producer-expiry-ms``).

A producer id per Spark query partition or per short-lived process left a row for good: the
sessions table only grew. A session whose producer wrote nothing for the expiry goes (7 days by
default, as the reference server's); the producer is then a new one, so a late retry of seq 1
or later is refused as a gap and only its epoch's seq 0 can be stored again. The sweep deletes
what is due by an index on the time a session was last written, in chunks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from stations.domain import producers
from stations.domain.idwindow import IdWindow
from stations.domain.lifecycle import CreateRequest, create
from stations.domain.log import AppendRequest, SequenceGap, append
from stations.domain.producers import Producer
from stations.domain.station import parse_config
from stations.store import db
from stations.store import streams as stored
from stations.store.schema import producers as sessions
from tests.test_upkeep import store  # noqa: F401  (fixture)
from tests.test_upkeep import write as upkeep_write

T0 = 1_000_000_000  # the test's clock, in ms


def write(engine: Engine, now: int, op: Any) -> Any:
    return upkeep_write(engine, now, op)[0]


def produce(pid: str, epoch: int, seq: int) -> Any:
    req = AppendRequest("s", "application/json", [b'{"p":"%s","s":%d}' % (pid.encode(), seq)])
    req.producer = Producer(pid, epoch, seq)
    return lambda batch: append(batch, IdWindow(), req)


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(sessions)).scalar_one())


def test_idle_sessions_expire_and_their_producer_starts_anew(store: Engine) -> None:  # noqa: F811
    req = CreateRequest("s", "application/json", parse_config({"name": "s"}))
    write(store, T0, lambda batch: create(batch, IdWindow(), req))
    write(store, T0, produce("old", 3, 0))
    write(store, T0 + 1000, produce("live", 0, 0))
    # Idle for 1 s at T0 + 1500: "old" (last written at T0), not "live" (at T0 + 1000).
    assert write(store, T0 + 1500, lambda b: producers.expire_idle(b, 1000)) == 1
    assert count(store) == 1
    # Forgotten: its next seq is a gap (a late retry is refused, not stored again) ...
    with pytest.raises(SequenceGap) as gap:
        write(store, T0 + 1600, produce("old", 3, 1))
    assert gap.value.extra["expected"] == 0
    # ... and it starts anew at seq 0 of any epoch, an older one too (no fence is left).
    write(store, T0 + 1600, produce("old", 1, 0))
    # The one still within the expiry goes on where it was.
    write(store, T0 + 1600, produce("live", 0, 1))
    assert count(store) == 2
    assert write(store, T0 + 1600, lambda b: producers.expire_idle(b, 1000)) == 0


def test_the_sweep_deletes_a_chunk_at_a_time(store: Engine) -> None:  # noqa: F811
    req = CreateRequest("s", "application/json", parse_config({"name": "s"}))
    write(store, T0, lambda batch: create(batch, IdWindow(), req))
    for k in range(5):
        write(store, T0 + k, produce(f"p{k}", 0, 0))
    assert write(store, T0 + 100, lambda b: stored.expire_sessions(b.conn, T0 + 3, 2)) == 2
    assert write(store, T0 + 100, lambda b: stored.expire_sessions(b.conn, T0 + 3, 2)) == 1
    assert write(store, T0 + 100, lambda b: stored.expire_sessions(b.conn, T0 + 3, 2)) == 0
    assert count(store) == 2  # p3 and p4, written at T0 + 3 and + 4


def _append(client: httpx.Client, epoch: int, seq: int) -> httpx.Response:
    return client.post(
        "/v1/stream/s",
        content=b'{"seq":%d}' % seq,
        headers={
            "Content-Type": "application/json",
            "Producer-Id": "p",
            "Producer-Epoch": str(epoch),
            "Producer-Seq": str(seq),
        },
    )


def test_the_server_forgets_an_idle_producer(db_url: str, make_server: Any) -> None:
    server = make_server(db_url, "--producer-expiry-ms", "1000")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert (
            client.put("/v1/stream/s", headers={"Content-Type": "application/json"}).status_code
            == 201
        )
        assert _append(client, 0, 0).status_code == 200
        assert _append(client, 0, 1).status_code == 200
        # A retry of seq 1 is a duplicate while the session lives (a duplicate does not
        # refresh it) and a gap once it is gone; the scheduler sweeps every 0.25 s here.
        deadline = time.monotonic() + 15
        statuses = []
        while time.monotonic() < deadline:
            statuses.append(_append(client, 0, 1).status_code)
            if statuses[-1] != 204:
                break
            time.sleep(0.2)
        assert statuses[0] == 204
        assert statuses[-1] == 409, statuses
        # The producer starts anew at seq 0 of an epoch; the stream holds each message once.
        assert _append(client, 1, 0).status_code == 200
        body = client.get("/v1/stream/s", params={"offset": "-1"}).json()
        assert body == [{"seq": 0}, {"seq": 1}, {"seq": 0}]


@pytest.mark.parametrize("value", ["-1", "3153600000001", "soon"])
def test_a_bad_expiry_is_a_usage_error(value: str, tmp_path: Any) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stations",
            "serve",
            "--producer-expiry-ms",
            value,
            "--db",
            f"sqlite:///{tmp_path}/x.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--producer-expiry-ms" in out.stderr and "unrecognized" not in out.stderr


def test_the_sweep_reads_only_what_is_due_on_postgresql(pg_url: str) -> None:
    """With 20,000 live sessions and the statistics the scheduler keeps (autovacuum is off
    here), the sweep's plan reads the time index, not the table."""
    engine = db.make_engine(pg_url, writer=True)
    try:
        db.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(
                sessions.insert(),
                [
                    {
                        "stream_id": 1,
                        "producer_id": f"p{k}",
                        "epoch": 0,
                        "last_seq": 0,
                        "updated_at": T0 + k,
                    }
                    for k in range(20_000)
                ],
            )
        deadline = time.monotonic() + 10
        grown: list[str] = []
        while "producers" not in grown and time.monotonic() < deadline:
            time.sleep(0.2)  # PostgreSQL publishes its table counters about once a second
            grown = db.analyze_grown(engine)
        assert "producers" in grown
        statement = stored.expiry_statement(T0 - 1, producers.EXPIRE_CHUNK, shared=True)
        with engine.connect() as conn:
            sql = str(statement.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql))
        assert "ix_producers_updated_at" in plan, plan
        assert "Seq Scan on producers" not in plan, plan
    finally:
        engine.dispose()


def test_the_sweep_reads_only_what_is_due_on_sqlite(tmp_path: Any) -> None:
    """SQLite planned the row value ``IN`` on the primary key's first column: every session
    of a station was read to delete the few that were due (73 ms a sweep with a million live
    ones, found by a review). It picks them by rowid through the time index."""
    engine = db.make_engine(f"sqlite:///{tmp_path / 's.db'}", writer=True)
    try:
        db.upgrade(engine)
        statement = stored.expiry_statement(T0, producers.EXPIRE_CHUNK, shared=False)
        with engine.connect() as conn:
            sql = str(statement.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        assert "ix_producers_updated_at" in plan, plan
        assert "sqlite_autoindex_producers" not in plan, plan
    finally:
        engine.dispose()


def test_a_session_written_while_the_sweep_waits_for_it_stays(pg_url: str) -> None:
    """The sweep picked a due session, then waited for its row lock while another process's
    append wrote it again; PostgreSQL re-checked only the outer condition (the key) and
    deleted the session that append had just written: a retry of it a moment later was
    stored twice (two servers on one database, found by a review)."""
    import threading

    from tests.harness import waiting_for_locks

    engine = db.make_engine(pg_url, writer=True)
    try:
        db.upgrade(engine)
        row = {"stream_id": 1, "producer_id": "p", "epoch": 0, "last_seq": 0}
        with engine.begin() as conn:
            conn.execute(sessions.insert(), [{**row, "updated_at": T0}])
        swept: list[int] = []
        other = db.make_engine(pg_url)  # another process's connection (the writer's pool is one)
        with other.connect() as appending:
            appending.begin()
            appending.execute(
                sessions.update().values(last_seq=1, updated_at=T0 + 10_000)
            )  # the append's upsert, not committed yet: it holds the row
            pid = appending.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

            def sweep() -> None:
                with engine.begin() as conn:
                    swept.append(stored.expire_sessions(conn, T0 + 5_000, 100))

            sweeper = threading.Thread(target=sweep)
            sweeper.start()
            deadline = time.monotonic() + 10
            while not waiting_for_locks(pg_url, pid):
                assert time.monotonic() < deadline, "the sweep did not wait for the row"
                time.sleep(0.02)
            appending.commit()
            sweeper.join(10)
        other.dispose()
        assert swept == [0]
        with engine.connect() as conn:
            assert conn.execute(select(sessions.c.last_seq)).scalars().all() == [1]
    finally:
        engine.dispose()


def _forgotten(client: httpx.Client, stream: str) -> bool:
    """Whether the server has swept a probe producer written after the SDK's (and so the
    SDK's too): its retry is a duplicate while it is remembered, a gap once it is not."""
    headers = {"Content-Type": "application/json", "Producer-Id": "probe"}
    headers |= {"Producer-Epoch": "0", "Producer-Seq": "0"}
    url = f"/v1/stream/{stream}"
    deadline = time.monotonic() + 15
    assert client.post(url, content=b'"probe"', headers=headers).status_code == 200
    headers["Producer-Seq"] = "1"
    assert client.post(url, content=b'"probe"', headers=headers).status_code == 200
    while time.monotonic() < deadline:
        status = client.post(url, content=b'"probe"', headers=headers).status_code
        if status == 409:
            return True
        assert status == 204
        time.sleep(0.1)
    return False


async def test_the_sdk_producer_goes_on_in_a_new_epoch_once_forgotten(
    db_url: str, make_server: Any
) -> None:
    """An SDK producer idle past the expiry sent its next batch at seq 2, got 409 (expected 0)
    and retried it until it gave up: a producer kept open for a week stopped working."""
    import asyncio

    from stations.client import Client, RetryPolicy

    server = make_server(db_url, "--producer-expiry-ms", "300")
    async with Client(server.url, retry=RetryPolicy(give_up_after=3)) as client:
        await client.create_station("s", content_type="application/json")
        producer = client.station("s").producer("sdk", epoch=5)
        for k in range(2):
            producer.append({"k": k})
            await producer.flush()  # seq 0, then seq 1
        with httpx.Client(base_url=server.url, timeout=10) as raw:
            assert await asyncio.to_thread(_forgotten, raw, "s")
        producer.append({"k": 2})
        producer.append({"k": 3})
        await producer.flush()
        await producer.close({"k": "last"})
    with httpx.Client(base_url=server.url, timeout=10) as raw:
        items = raw.get("/v1/stream/s", params={"offset": "-1"}).json()
    assert [i for i in items if i != "probe"] == [
        {"k": 0},
        {"k": 1},
        {"k": 2},
        {"k": 3},
        {"k": "last"},
    ]


async def test_a_forgotten_sdk_producer_whose_answer_was_lost_goes_on(
    db_url: str, make_server: Any
) -> None:
    """The first batch after the server forgot the producer reached it (409, expected 0) but
    its answer was lost: the batch was taken for perhaps stored and sent again and again into
    the same 409 until the producer gave up (found by a review). A 409 expecting seq 0 says
    the lost attempt stored nothing: the producer goes on in a new epoch."""
    import asyncio

    from stations.client import Client, RetryPolicy
    from tests.test_sdk import FaultProxy

    server = make_server(db_url, "--producer-expiry-ms", "300")
    async with FaultProxy(server.url) as proxy:
        async with Client(proxy.url, retry=RetryPolicy(give_up_after=3)) as client:
            await client.create_station("s", content_type="application/json")
            producer = client.station("s").producer("sdk")
            for k in range(2):
                producer.append({"k": k})
                await producer.flush()
            with httpx.Client(base_url=server.url, timeout=10) as raw:
                assert await asyncio.to_thread(_forgotten, raw, "s")
            proxy.drop_after = {proxy.posts + 1}  # answered 409 by the server, then cut
            producer.append({"k": 2})
            await producer.flush()
            await producer.close()
        assert proxy.dropped == 1
    with httpx.Client(base_url=server.url, timeout=10) as raw:
        items = raw.get("/v1/stream/s", params={"offset": "-1"}).json()
    assert [i for i in items if i != "probe"] == [{"k": 0}, {"k": 1}, {"k": 2}]


async def test_the_sdk_close_goes_on_in_a_new_epoch_once_forgotten(
    db_url: str, make_server: Any
) -> None:
    import asyncio

    from stations.client import Client, RetryPolicy

    server = make_server(db_url, "--producer-expiry-ms", "300")
    async with Client(server.url, retry=RetryPolicy(give_up_after=3)) as client:
        await client.create_station("s", content_type="application/json")
        producer = client.station("s").producer("sdk")
        producer.append({"k": 0})
        await producer.flush()
        with httpx.Client(base_url=server.url, timeout=10) as raw:
            assert await asyncio.to_thread(_forgotten, raw, "s")
        await producer.close({"k": "last"})
    with httpx.Client(base_url=server.url, timeout=10) as raw:
        items = raw.get("/v1/stream/s", params={"offset": "-1"}).json()
        closed = raw.head("/v1/stream/s").headers.get("Stream-Closed")
    assert [i for i in items if i != "probe"] == [{"k": 0}, {"k": "last"}]
    assert closed == "true"
