"""The time stamped on what a transaction stores (the review of 2026-11-29): it was read once,
when the writer's transaction began, before it waited for a station's lock held by another
process (up to the lock timeout) and before the rest of its batch ran.

- A message id is remembered for ``idempotencyWindowMs`` from when its message was stored:
  stamped early, it ran out early, and a retry sent right after the answer was stored again.
- Store times must rise with positions on a station (retention by age and seeks by time
  rely on it): a transaction that waited for one station's lock stamped its produce to
  another with a time older than a message stored there meanwhile by another process."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from stations.domain import log
from stations.domain.log import AppendRequest
from stations.domain.service import Service
from stations.store.clock import now_ms
from stations.store.writer import Batch
from tests.harness import Server, waiting_for_locks


def _id_stored_at(db_url: str) -> int:
    """The store time of the one message id in the database."""
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            ((at,),) = conn.execute("SELECT stored_at FROM id_blocks").fetchall()
    else:
        with psycopg.connect(db_url) as pg:
            ((at,),) = pg.execute("SELECT stored_at FROM msg_ids").fetchall()
    return int(at)


def test_an_id_is_stamped_when_its_batch_writes_it(db_url: str) -> None:
    """The batch's other work after the id's append (here a pause standing for another
    request's large append) comes before the id is stored, so the id's time comes after it."""

    def append_then_more(batch: Batch, svc: Service) -> int:
        req = AppendRequest("s", "application/json", [b'{"n":1}'], msg_ids=["x"])
        log.append(batch, svc.ids, req)
        time.sleep(0.05)
        return now_ms()

    async def run() -> int:
        svc = Service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "s"})
            ops_ended: int = await svc.write(append_then_more, svc)
            return ops_ended
        finally:
            await svc.close()

    ops_ended = asyncio.run(run())
    assert _id_stored_at(db_url) >= ops_ended


def _while_locked(
    url: str,
    station: str,
    send: Callable[[], Any],
    hold_s: float,
    meanwhile: Callable[[], None] | None = None,
) -> Any:
    """``send()`` in a thread while ``station``'s row is locked, released ``hold_s`` (then
    ``meanwhile()``) after the request's transaction waits for it; ``send``'s result."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(send()), daemon=True)
    with psycopg.connect(url) as conn:
        conn.execute("SELECT 1 FROM streams WHERE name = %s FOR UPDATE", (station,))
        thread.start()
        deadline = time.monotonic() + 20
        while not waiting_for_locks(url, conn.info.backend_pid):
            assert not answer, f"answered without waiting for the lock: {answer}"
            assert time.monotonic() < deadline, "the request never waited for the lock"
            time.sleep(0.02)
        time.sleep(hold_s)
        if meanwhile is not None:
            meanwhile()
        conn.rollback()
    thread.join(30)
    (got,) = answer
    return got


def test_an_id_is_remembered_for_its_window_after_a_lock_wait(pg_url: str, tmp_path: Path) -> None:
    server = Server(pg_url, tmp_path).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            station = {"name": "s", "idempotencyWindowMs": 1500}
            assert http.post("/api/stations", json=station).status_code == 201

            def send() -> httpx.Response:
                return http.post(
                    "/v1/stream/s",
                    content=b'{"n":1}',
                    headers={"Content-Type": "application/json", "Msg-Id": "x"},
                )

            first = _while_locked(pg_url, "s", send, hold_s=2.0)
            assert first.status_code in (200, 204), first.text
            assert first.headers["Msg-Duplicate"] == "false"
            retry = send()  # at once: well inside the window of a message just stored
            assert retry.headers["Msg-Duplicate"] == "true", retry.headers
            assert retry.headers["Msg-Offset"] == first.headers["Msg-Offset"]
    finally:
        server.kill()


def test_store_times_rise_with_positions_across_processes(pg_url: str, tmp_path: Path) -> None:
    """Process one's transaction produces to stations a and b and waits for a's lock; process
    two stores a message on b meanwhile. The transaction's message on b comes after it, and
    so must its store time."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = Server(pg_url, tmp_path / "one").start()
    two = Server(pg_url, tmp_path / "two").start()
    try:
        with (
            httpx.Client(base_url=one.url, timeout=30) as http_one,
            httpx.Client(base_url=two.url, timeout=30) as http_two,
        ):
            for name in ("a", "b"):
                assert http_one.post("/api/stations", json={"name": name}).status_code == 201

            def transaction() -> httpx.Response:
                produce = [{"station": "a", "data": 1}, {"station": "b", "data": "late"}]
                return http_one.post("/api/transactions", json={"produce": produce})

            def store_on_b() -> None:
                body = {"messages": [{"data": "meanwhile"}]}
                stored = http_two.post("/api/stations/b/messages", json=body)
                assert stored.status_code == 200, stored.text

            done = _while_locked(pg_url, "a", transaction, hold_s=0.3, meanwhile=store_on_b)
            assert done.status_code == 200, done.text
        with psycopg.connect(pg_url) as pg:
            rows = pg.execute(
                "SELECT m.seq, m.stored_at FROM messages m JOIN streams s "
                "ON s.id = m.stream_id WHERE s.name = 'b' ORDER BY m.seq"
            ).fetchall()
        assert len(rows) == 2, rows
        assert rows[0][1] <= rows[1][1], rows
    finally:
        one.kill()
        two.kill()
