"""Several ``stations serve`` processes on one PostgreSQL database (CONTRACT.md §2, the issue's
"Several processes, one database").

Two live processes share a fresh database. Producers hammer both with overlapping message ids,
through both doors, concurrently: every id is stored exactly once, every answer for an id names
the same offset, and the stored offsets are contiguous (appends to one station are ordered by the
database). A reader long-polling or on SSE at one process wakes as soon as the other appends
(LISTEN/NOTIFY). Window changes, creation races, ``kill -9`` and retention hold across processes.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.harness import IN_CI, Server, drop_pg_database, new_pg_database, pg_available

JSON = {"Content-Type": "application/json"}
LONG_WINDOW = 60_000
LIVE_TIMEOUT_MS = 20_000  # far above what a prompt wake-up may take


def offset(position: int) -> str:
    return f"{position:016d}_{0:016d}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """Two processes on one fresh database, shared by the module (each case makes its own
    stations; a case that kills one starts it again)."""
    if not pg_available():
        if IN_CI:
            pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 (required in CI)")
        pytest.skip("PostgreSQL is not reachable")
    url = new_pg_database()
    workdir = tmp_path_factory.mktemp("multiprocess")
    args = ["--long-poll-timeout-ms", str(LIVE_TIMEOUT_MS), "--sse-lifetime-ms", "20000"]
    servers = [Server(url, workdir, args), Server(url, workdir, args)]
    try:
        for server in servers:
            server.start()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.kill()
        drop_pg_database(url)


@pytest.fixture
def clients(pair: tuple[Server, Server]) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    a, b = pair
    limits = httpx.Limits(max_connections=32)
    with (
        httpx.Client(base_url=a.url, timeout=30, limits=limits) as ca,
        httpx.Client(base_url=b.url, timeout=30, limits=limits) as cb,
    ):
        yield ca, cb


def new_station(client: httpx.Client, **config: Any) -> str:
    name = f"mp-{uuid.uuid4().hex[:10]}"
    r = client.post("/api/stations", json={"name": name, **config})
    assert r.status_code == 201, r.text
    return name


def produce(client: httpx.Client, name: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post(f"/api/stations/{name}/messages", json={"messages": list(items)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def send_header(client: httpx.Client, name: str, msg_id: str, data: Any) -> tuple[str, bool]:
    r = client.post(
        f"/v1/stream/{name}",
        headers={**JSON, "Msg-Id": msg_id},
        content=json.dumps(data).encode(),
    )
    assert r.status_code in (200, 204), r.text
    return r.headers["Msg-Offset"], r.headers["Msg-Duplicate"] == "true"


def browse(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    start = "-1"
    while True:
        r = client.get(f"/api/stations/{name}/messages", params={"offset": start, "limit": "1000"})
        assert r.status_code == 200, r.text
        page = r.json()
        out += page["messages"]
        if page["upToDate"]:
            return out
        start = page["nextOffset"]


def stats(client: httpx.Client, name: str) -> dict[str, Any]:
    r = client.get(f"/api/stations/{name}")
    assert r.status_code == 200, r.text
    return r.json()["stats"]


def eventually(check: Callable[[], bool], timeout: float = 8.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(0.05)


Record = tuple[str, str, bool]  # (msg id, offset answered, duplicate)


def check_exactly_once(records: list[Record], messages: list[dict[str, Any]]) -> None:
    """Each id stored once, every answer for it names that one message's offset."""
    offsets: dict[str, set[str]] = defaultdict(set)
    stored: dict[str, int] = defaultdict(int)
    for msg_id, off, duplicate in records:
        offsets[msg_id].add(off)
        stored[msg_id] += not duplicate
    split = {i: o for i, o in offsets.items() if len(o) != 1}
    assert not split, f"ids answered with more than one offset: {split}"
    twice = {i: n for i, n in stored.items() if n != 1}
    assert not twice, f"ids not stored exactly once (id: times stored): {twice}"

    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids)), "an id is in the station twice"
    assert sorted(ids) == sorted(offsets), "the station holds other ids than were sent"
    for m in messages:
        assert {m["offset"]} == offsets[m["id"]], m
        assert m["data"]["id"] == m["id"], m
    # Ordered by the database: the stored offsets are exactly 0 .. n-1.
    assert [m["offset"] for m in messages] == [offset(i) for i in range(len(messages))]


# -- exactly once under concurrency -----------------------------------------------------------


def test_overlapping_ids_through_two_processes_are_stored_once(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    ca, cb = clients
    name = new_station(ca, idempotencyWindowMs=LONG_WINDOW)
    pool = [f"order-{i}" for i in range(60)]
    workers, rounds = 12, 20
    start = threading.Barrier(workers)

    def worker(w: int) -> list[Record]:
        rng = random.Random(w)
        out: list[Record] = []
        start.wait()
        for j in range(rounds):
            client = ca if (w + j) % 2 == 0 else cb
            if rng.random() < 0.3:
                msg_id = rng.choice(pool)
                off, dup = send_header(client, name, msg_id, {"id": msg_id, "w": w, "j": j})
                out.append((msg_id, off, dup))
                continue
            # A batch, sometimes repeating an id inside itself.
            ids = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
            items = [{"id": i, "data": {"id": i, "w": w, "j": j}} for i in ids]
            results = produce(client, name, *items)
            out += [(i, r["offset"], r["duplicate"]) for i, r in zip(ids, results, strict=True)]
        return out

    with ThreadPoolExecutor(workers) as pool_exec:
        records = [r for rs in pool_exec.map(worker, range(workers)) for r in rs]

    messages = browse(cb, name)
    check_exactly_once(records, messages)
    assert browse(ca, name) == messages
    n = len(messages)
    assert n == len({r[0] for r in records}) > 40
    for client in (ca, cb):
        s = stats(client, name)
        assert (s["messages"], s["idsInWindow"], s["tailOffset"]) == (n, n, offset(n))


def test_one_id_fired_at_both_processes_at_once(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    ca, cb = clients
    name = new_station(ca, idempotencyWindowMs=LONG_WINDOW)
    racers, ids = 8, [f"race-{k}" for k in range(12)]
    barrier = threading.Barrier(racers)

    def racer(r: int) -> list[Record]:
        client = ca if r % 2 == 0 else cb
        out: list[Record] = []
        for msg_id in ids:
            barrier.wait()  # everyone sends this id at the same moment
            data = {"id": msg_id, "racer": r}
            if r % 4 < 2:
                res = produce(client, name, {"id": msg_id, "data": data})[0]
                out.append((msg_id, res["offset"], res["duplicate"]))
            else:
                out.append((msg_id, *send_header(client, name, msg_id, data)))
        return out

    with ThreadPoolExecutor(racers) as pool_exec:
        records = [r for rs in pool_exec.map(racer, range(racers)) for r in rs]
    assert len(records) == racers * len(ids)
    check_exactly_once(records, browse(ca, name))
    assert [m["id"] for m in browse(cb, name)] == ids


def test_plain_appends_through_two_processes_are_ordered(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    """Without ids every append is stored; the database hands out each offset once."""
    ca, cb = clients
    name = new_station(ca)
    per_worker, workers = 15, 8

    def worker(w: int) -> list[str]:
        client = ca if w % 2 == 0 else cb
        return [
            produce(client, name, {"data": {"w": w, "i": i}})[0]["offset"]
            for i in range(per_worker)
        ]

    with ThreadPoolExecutor(workers) as pool_exec:
        answered = [o for os in pool_exec.map(worker, range(workers)) for o in os]
    total = per_worker * workers
    assert sorted(answered) == [offset(i) for i in range(total)]
    messages = browse(cb, name)
    assert len(messages) == total
    # Each writer's own messages are in the order it sent them.
    for w in range(workers):
        assert [m["data"]["i"] for m in messages if m["data"]["w"] == w] == list(range(per_worker))


def race_creates(
    clients: tuple[httpx.Client, httpx.Client], create: Callable[[httpx.Client, str], int]
) -> None:
    """Four creates of one new name at the same moment, two through each process: one creates
    it (201), the others find it (200). A lost race on the unique name is no 500."""
    ca, cb = clients
    for _ in range(6):
        name = f"mp-create-{uuid.uuid4().hex[:8]}"
        barrier = threading.Barrier(4)

        def one(i: int, name: str = name, barrier: threading.Barrier = barrier) -> int:
            barrier.wait()
            return create(ca if i % 2 == 0 else cb, name)

        with ThreadPoolExecutor(4) as pool_exec:
            statuses = sorted(pool_exec.map(one, range(4)))
        assert statuses == [200, 200, 200, 201], statuses


def test_concurrent_creates_through_the_management_api(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    race_creates(clients, lambda c, n: c.post("/api/stations", json={"name": n}).status_code)


def test_concurrent_creates_through_durable_streams_put(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    race_creates(clients, lambda c, n: c.put(f"/v1/stream/{n}", headers=JSON).status_code)


# -- live reads wake across processes ---------------------------------------------------------


@pytest.mark.parametrize("direction", ["a-waits-b-appends", "b-waits-a-appends"])
def test_long_poll_wakes_on_append_at_the_other_process(
    clients: tuple[httpx.Client, httpx.Client], direction: str
) -> None:
    ca, cb = clients
    waiter, appender = (ca, cb) if direction == "a-waits-b-appends" else (cb, ca)
    name = new_station(ca)
    produce(ca, name, {"data": "before"})
    tail = stats(cb, name)["tailOffset"]
    assert tail == offset(1)

    answer: dict[str, Any] = {}

    def poll() -> None:
        began = time.monotonic()
        r = waiter.get(
            f"/v1/stream/{name}",
            params={"offset": tail, "live": "long-poll"},
            timeout=LIVE_TIMEOUT_MS / 1000 + 10,
        )
        answer.update(response=r, began=began, ended=time.monotonic())

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.6)  # the poll is parked at the tail by now
    assert "response" not in answer, "the long-poll returned before anything was appended"
    appended = time.monotonic()
    produce(appender, name, {"id": "wake", "data": "after"})
    thread.join(LIVE_TIMEOUT_MS / 1000 + 15)
    assert not thread.is_alive()

    r = answer["response"]
    assert r.status_code == 200, r.text
    assert r.json() == ["after"]
    assert r.headers["Stream-Next-Offset"] == offset(2)
    woke_after = answer["ended"] - appended
    assert woke_after < 2.0, f"the long-poll woke {woke_after:.2f} s after the append"


def test_sse_reader_wakes_on_append_at_the_other_process(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    ca, cb = clients
    name = new_station(ca)
    events: list[tuple[float, str]] = []
    connected = threading.Event()

    def read() -> None:
        url = f"/v1/stream/{name}"
        params = {"offset": offset(0), "live": "sse"}
        with ca.stream("GET", url, params=params, timeout=LIVE_TIMEOUT_MS / 1000 + 10) as r:
            assert r.status_code == 200
            connected.set()
            kind = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind == "data":
                    events.append((time.monotonic(), line.split(":", 1)[1]))
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert connected.wait(10)
    time.sleep(0.6)
    assert not events
    appended = time.monotonic()
    produce(cb, name, {"data": {"via": "b"}})
    thread.join(LIVE_TIMEOUT_MS / 1000 + 15)
    assert events, "the SSE reader saw no data"
    at, payload = events[0]
    assert json.loads(payload) == [{"via": "b"}]
    assert at - appended < 2.0, f"the SSE reader woke {at - appended:.2f} s after the append"


# -- windows, restarts and retention across processes ------------------------------------------


def test_window_patched_at_one_process_applies_at_the_other(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    ca, cb = clients
    # 2 s: the PATCH must come while the id is in it (300 ms was not always enough for a
    # produce and a PATCH on a box running three test workers, whose processes may wait a few
    # hundred milliseconds for a CPU).
    grow = new_station(ca, idempotencyWindowMs=2000)
    shrink = new_station(ca, idempotencyWindowMs=LONG_WINDOW)
    # Grown at B while the id is still inside its 2 s window at A.
    assert produce(ca, grow, {"id": "x", "data": 1})[0]["duplicate"] is False
    grow_stored = time.monotonic()  # after the id was stored
    r = cb.patch(f"/api/stations/{grow}", json={"idempotencyWindowMs": LONG_WINDOW})
    assert r.status_code == 200, r.text
    assert produce(ca, grow, {"id": "x", "data": 1})[0]["duplicate"] is True
    # Shrunk at B while A holds the id in its hot cache.
    assert produce(ca, shrink, {"id": "x", "data": 1})[0]["duplicate"] is False
    assert produce(ca, shrink, {"id": "x", "data": 1})[0]["duplicate"] is True
    r = cb.patch(f"/api/stations/{shrink}", json={"idempotencyWindowMs": 100})
    assert r.status_code == 200, r.text
    shrunk = time.monotonic()  # the shrink station's id was stored before this
    # Past both short windows: grow's first 2 s and shrink's 100 ms, each with 0.3 s to spare.
    time.sleep(max(0.0, grow_stored + 2.3 - time.monotonic(), shrunk + 0.4 - time.monotonic()))
    assert produce(ca, shrink, {"id": "x", "data": 2})[0] == {
        "offset": offset(1),
        "duplicate": False,
    }
    assert produce(ca, grow, {"id": "x", "data": 2})[0] == {"offset": offset(0), "duplicate": True}
    assert send_header(cb, grow, "x", 3) == (offset(0), True)


def test_ids_survive_kill_of_either_process(pair: tuple[Server, Server]) -> None:
    a, b = pair
    try:
        with httpx.Client(base_url=a.url, timeout=30) as ca:
            name = new_station(ca, idempotencyWindowMs=LONG_WINDOW)
            items = [{"id": f"a{i}", "data": {"id": f"a{i}"}} for i in range(3)]
            first = produce(ca, name, *items)
        a.kill()
        with httpx.Client(base_url=b.url, timeout=30) as cb:
            assert produce(cb, name, *items) == [{**r, "duplicate": True} for r in first]
            assert produce(cb, name, {"id": "b0", "data": {"id": "b0"}})[0]["offset"] == offset(3)
        a.start()
        b.kill()
        with httpx.Client(base_url=a.url, timeout=30) as ca:
            assert send_header(ca, name, "b0", {"id": "b0"}) == (offset(3), True)
            assert send_header(ca, name, "a1", {"id": "a1"}) == (offset(1), True)
            assert [m["id"] for m in browse(ca, name)] == ["a0", "a1", "a2", "b0"]
    finally:
        for server in pair:
            if server.proc is None or server.proc.poll() is not None:
                server.start()


def test_retention_with_two_processes_keeps_counts_right(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    """Both processes enforce retention on the same stations while both append: the stats must
    still match what is stored, and dropped ids stay duplicates at either process."""
    ca, cb = clients
    name = new_station(ca, idempotencyWindowMs=LONG_WINDOW, retention={"maxMessages": 3})
    stop = time.monotonic() + 1.5
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    def worker(w: int) -> list[str]:
        client = ca if w % 2 == 0 else cb
        sent: list[str] = []
        while time.monotonic() < stop:
            with lock:
                ids = [f"r{next(counter)}" for _ in range(3)]
            produce(client, name, *({"id": i, "data": {"id": i}} for i in ids))
            sent += ids
            time.sleep(0.02)
        return sent

    with ThreadPoolExecutor(4) as pool_exec:
        sent = [i for ids in pool_exec.map(worker, range(4)) for i in ids]

    def settled() -> bool:
        return stats(ca, name)["messages"] == 3 and len(browse(cb, name)) == 3

    eventually(settled, what="retention to keep 3 messages")
    kept = browse(ca, name)
    for client in (ca, cb):
        s = stats(client, name)
        assert s["messages"] == len(kept) == 3
        assert s["bytes"] == sum(len(json.dumps(m["data"], separators=(",", ":"))) for m in kept)
        assert s["tailOffset"] == offset(len(sent))
        assert s["idsInWindow"] == len(sent)
    dropped = [i for i in sent if i not in {m["id"] for m in kept}][:5]
    for client, msg_id in zip([ca, cb] * 3, dropped, strict=False):
        assert produce(client, name, {"id": msg_id, "data": {"id": msg_id}})[0]["duplicate"]


def test_retention_enforced_by_two_processes_at_once_counts_once(pg_url: str) -> None:
    """Two processes' schedulers may enforce one station's retention at the same moment. Staged
    here with two transactions in lock step (over HTTP the overlap is a matter of luck): the
    second must not take the messages the first dropped off ``msg_count`` a second time."""
    from sqlalchemy import select

    from stations.domain import reads, retention
    from stations.domain.idwindow import IdWindow
    from stations.domain.lifecycle import CreateRequest, create
    from stations.domain.log import AppendRequest, append
    from stations.domain.offsets import EARLIEST
    from stations.domain.station import parse_config
    from stations.store import db
    from stations.store.clock import now_ms
    from stations.store.schema import streams
    from stations.store.writer import Batch

    engine = db.make_engine(pg_url)
    try:
        db.upgrade(engine)
        config = parse_config({"name": "r", "retention": {"maxMessages": 2}})
        with engine.connect() as conn, conn.begin():
            batch = Batch(conn, now_ms())
            request = CreateRequest("r", "application/json", config, compare_config=True)
            create(batch, IdWindow(), request)
            append(batch, IdWindow(), AppendRequest("r", "application/json", [b"1"] * 6))
            batch.flush()

        first = engine.connect()
        first_tx = first.begin()
        assert retention.enforce(Batch(first, now_ms())) == 4  # not committed yet
        second_dropped: list[int] = []

        def second() -> None:
            with engine.connect() as conn, conn.begin():
                second_dropped.append(retention.enforce(Batch(conn, now_ms())))

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)  # the second blocks on the first's locks
        first_tx.commit()
        first.close()
        thread.join(30)
        assert second_dropped == [0]
        with engine.connect() as conn:
            count = conn.execute(select(streams.c.msg_count)).scalar_one()
            # Retained messages as a reader sees them (one row may hold several messages).
            page = reads.read_messages(
                conn, "r", EARLIEST, now=now_ms(), limit=100, max_bytes=1 << 20
            )
        assert (count, len(page.messages)) == (2, 2)
    finally:
        engine.dispose()


def test_transactions_crossing_stations_both_ways_never_answer_a_deadlock(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    """Dead letters on B lock B, then A (B forwards its dead letters to A); a transaction that
    acks on B and produces to A locks A, then B. Through two processes PostgreSQL aborts one
    of two such transactions as deadlocked: it must be run again, not answered 503. Every
    message then ends acked (one message produced to A each) or dead-lettered (forwarded to
    A), once. Found by a review: 95 of 400 ack transactions answered 503 before."""
    ca, cb = clients
    a = new_station(ca)
    b = new_station(ca, dls={"forwardTo": a})
    total = 400
    for start in range(0, total, 200):
        body = {"messages": [{"data": k} for k in range(start, start + 200)]}
        assert ca.post(f"/api/stations/{b}/messages", json=body).status_code == 200
    assert ca.put(f"/api/stations/{b}/groups/g", json={"maxMsgDeliveries": 1}).status_code == 201
    refused: list[str] = []

    def work(client: httpx.Client, kind: str) -> int:
        done = 0
        while True:
            r = client.post(f"/api/stations/{b}/groups/g/fetch", json={"max": 1, "consumer": kind})
            assert r.status_code == 200, r.text
            if not r.json()["messages"]:
                return done
            m = r.json()["messages"][0]
            settle = {"station": b, "group": "g", "offset": m["offset"]}
            settle["deliveryCount"] = m["deliveryCount"]
            if kind == "dead-letter":
                body: dict[str, Any] = {"deadLetter": [settle]}
            else:
                body = {"ack": [settle], "produce": [{"station": a, "data": {"acked": m["data"]}}]}
            r = client.post("/api/transactions", json=body)
            if r.status_code != 200:
                refused.append(f"{r.status_code} {r.text[:200]}")
            done += 1

    with ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(work, c, k) for c, k in ((ca, "dead-letter"), (cb, "ack")) * 2]
        assert sum(run.result() for run in runs) == total
    assert refused == []
    stored = ca.get(f"/api/stations/{a}").json()["stats"]["messages"]
    assert stored == total  # one per message: its ack's produce or its forwarded dead letter
    view = ca.get(f"/api/stations/{b}/groups").json()["groups"][0]
    assert (view["inFlight"], view["pending"]) == (0, 0)


def test_an_id_sweep_deletes_by_the_window_in_force_when_it_deletes(pg_url: str) -> None:
    """The id sweep finds the due stations without a lock; a PATCH that grew the window in
    another process right after must decide which ids go. Staged in lock step: the sweep used
    the window it had read and deleted ids the grown window still holds, and another process
    then took a retry of one of them for a new message."""
    from stations.domain.catalog import patch_station
    from stations.domain.idwindow import IdWindow
    from stations.domain.lifecycle import CreateRequest, create
    from stations.domain.log import AppendRequest, append
    from stations.domain.station import parse_config
    from stations.store import db, idtable, upkeep
    from stations.store.clock import now_ms
    from stations.store.writer import Batch

    engine = db.make_engine(pg_url)
    try:
        db.upgrade(engine)
        # 10 s: the ids must still be inside it when the PATCH below grows it.
        config = parse_config({"name": "w", "idempotencyWindowMs": 10_000})
        with engine.connect() as conn, conn.begin():
            batch = Batch(conn, now_ms())
            request = CreateRequest("w", "application/json", config, compare_config=True)
            create(batch, IdWindow(), request)
            ids: list[str | None] = ["a", "b", "c"]
            append(batch, IdWindow(), AppendRequest("w", "application/json", [b"1"] * 3, ids))
            batch.flush()

        sweeper = engine.connect()
        sweep_tx = sweeper.begin()
        later = Batch(sweeper, now_ms() + 20_000)  # the ids are past the 10 s window by then
        (due,) = upkeep.ids_due(sweeper, later.now)
        with engine.connect() as conn, conn.begin():  # another process grows the window
            grow = {"idempotencyWindowMs": 3_600_000}
            patching = Batch(conn, now_ms())
            patch_station(patching, IdWindow(), "w", grow)
            patching.flush()
        IdWindow().sweep(later, due)
        sweep_tx.commit()
        sweeper.close()
        with engine.connect() as conn:
            assert idtable.counts(conn, now_ms() + 20_000).get(due.id) == 3
    finally:
        engine.dispose()
