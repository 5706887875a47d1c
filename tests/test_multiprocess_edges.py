"""Several ``stations serve`` processes on one PostgreSQL database: state one process keeps in
RAM that another process changes behind its back (a review of the edges).

- Msg-Id caches: an id that expired and was stored again through the other process must not
  come back with its old offset when the window later grows.
- LISTEN/NOTIFY: a LISTEN connection that goes silent (the network drops it without a reset,
  as a NAT or a failover does) must be noticed, or readers at that process never again see
  the other process's appends (they keep answering from their last look at the tail).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

JSON = {"Content-Type": "application/json"}


def offset(position: int) -> str:
    return f"{position:016d}_{0:016d}"


def new_station(client: httpx.Client, **config: Any) -> str:
    name = f"mpe-{uuid.uuid4().hex[:10]}"
    r = client.post("/api/stations", json={"name": name, **config})
    assert r.status_code == 201, r.text
    return name


def produce(client: httpx.Client, name: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post(f"/api/stations/{name}/messages", json={"messages": list(items)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


# -- Msg-Id caches ----------------------------------------------------------------------------


def test_id_stored_again_at_the_other_process_keeps_its_new_offset_when_the_window_grows(
    pg_url: str, make_server: Any
) -> None:
    """A stores id x (offset 0, in A's cache); its 2 s window passes; B stores x again
    (offset 1). The window then grows: x is a duplicate of offset 1 at both processes. Before,
    A's cache still held x -> 0, which the grown window made look live again: A answered
    duplicate of offset 0, a message that is no longer the one stored under x.

    The window must grow while x -> 1 is still in it (else x may be swept and stored again, as
    it should be): 2 s, not the 300 ms that a loaded box once let pass before the PATCH."""
    a, b = make_server(pg_url), make_server(pg_url)
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url) as cb:
        name = new_station(ca, idempotencyWindowMs=2000)
        assert produce(ca, name, {"id": "x", "data": 0})[0] == {
            "offset": offset(0),
            "duplicate": False,
        }
        time.sleep(2.3)  # past the window
        assert produce(cb, name, {"id": "x", "data": 1})[0] == {
            "offset": offset(1),
            "duplicate": False,
        }
        r = cb.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": 60_000})
        assert r.status_code == 200, r.text
        for client in (cb, ca):
            assert produce(client, name, {"id": "x", "data": 2})[0] == {
                "offset": offset(1),
                "duplicate": True,
            }
            r = client.post(f"/v1/stream/{name}", headers={**JSON, "Msg-Id": "x"}, content=b"3")
            assert r.status_code in (200, 204), r.text
            assert (r.headers["Msg-Offset"], r.headers["Msg-Duplicate"]) == (offset(1), "true")
        messages = ca.get(f"/api/stations/{name}/messages", params={"offset": "-1"}).json()
        assert [(m["offset"], m["id"]) for m in messages["messages"]] == [
            (offset(0), "x"),
            (offset(1), "x"),
        ]


def test_a_shrink_after_a_grow_does_not_bring_back_what_the_grow_forgot(
    pg_url: str, make_server: Any
) -> None:
    """A stores y; its 1 s window passes; B grows the window, then shrinks it. A's cache still
    held y -> 0, which the grow had told it not to trust; the shrink lowered that mark again,
    A trusted its cache, and answered a new y as a duplicate of offset 0: it was not stored."""
    a, b = make_server(pg_url), make_server(pg_url)
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url) as cb:
        name = new_station(ca, idempotencyWindowMs=1000)
        assert produce(ca, name, {"id": "y", "data": 0})[0] == {
            "offset": offset(0),
            "duplicate": False,
        }
        time.sleep(1.2)  # past the window
        for window in (60_000, 30_000):
            r = cb.patch(f"/api/stations/{name}", json={"idempotencyWindowMs": window})
            assert r.status_code == 200, r.text
        assert produce(ca, name, {"id": "y", "data": 1})[0] == {
            "offset": offset(1),
            "duplicate": False,
        }


# -- LISTEN/NOTIFY ------------------------------------------------------------------------------


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.listen = False  # this connection sent LISTEN
        self.frozen = False  # bytes are dropped both ways, the sockets stay open


class SilentDropProxy:
    """A TCP proxy in front of PostgreSQL that can make the LISTEN connections through it go
    silent, as a network that drops a connection without a reset does: nothing arrives and
    nothing fails. Other connections, and LISTEN connections made later, pass."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.pairs: list[_Pair] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            pair = _Pair(client, socket.create_connection(self.target))
            with self.lock:
                self.pairs.append(pair)
            for src, dst in ((pair.client, pair.upstream), (pair.upstream, pair.client)):
                args = (pair, src, dst)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    @staticmethod
    def _pump(pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if src is pair.client and b"LISTEN stations" in data:
                    pair.listen = True
                if not pair.frozen:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            s.close()

    def listening(self) -> int:
        with self.lock:
            return sum(p.listen and not p.frozen for p in self.pairs)

    def silence_listeners(self) -> int:
        with self.lock:
            live = [p for p in self.pairs if p.listen and not p.frozen]
            for pair in live:
                pair.frozen = True
            return len(live)

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for pair in self.pairs:
                pair.client.close()
                pair.upstream.close()


@pytest.fixture
def proxy(pg_url: str) -> Iterator[SilentDropProxy]:
    host, port = pg_url.split("@", 1)[1].split("/", 1)[0].split(":")
    p = SilentDropProxy((host, int(port)))
    yield p
    p.close()


def test_a_listen_connection_gone_silent_is_replaced(
    pg_url: str, make_server: Any, proxy: SilentDropProxy
) -> None:
    """A's LISTEN connection goes silent (no reset, no error) after a long-poll at A saw the
    tail. B appends. A must notice within seconds and hear of commits again. Before, A waited
    on the silent connection for ever; its readers answered from their last look at the tail
    (the notifier keeps it until a commit is announced), so every long-poll at A timed out
    empty, for good, while the station held a new message."""
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    proxied = pg_url.replace(host_port, f"127.0.0.1:{proxy.port}")
    a = make_server(proxied, "--long-poll-timeout-ms", "2000")
    b = make_server(pg_url)
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url) as cb:
        name = new_station(cb)
        produce(cb, name, {"data": 0})
        params = {"offset": offset(1), "live": "long-poll"}
        r = ca.get(f"/v1/stream/{name}", params=params)  # A looks at the tail: nothing new
        assert r.status_code == 204, r.text
        assert proxy.silence_listeners() == 1
        produce(cb, name, {"data": 1})
        began = time.monotonic()
        while True:
            r = ca.get(f"/v1/stream/{name}", params=params)
            if r.status_code == 200 or time.monotonic() - began > 30:
                break
            assert r.status_code == 204, r.text
        assert r.status_code == 200, f"A saw nothing in {time.monotonic() - began:.0f} s"
        assert r.json() == [1]
        assert time.monotonic() - began < 15
        assert proxy.listening() == 1  # a new LISTEN connection, heard again
        # Later commits at B wake a reader at A promptly again.
        answer: dict[str, Any] = {}
        params = {"offset": offset(2), "live": "long-poll"}
        waiter = threading.Thread(
            target=lambda: answer.update(r=ca.get(f"/v1/stream/{name}", params=params))
        )
        waiter.start()
        time.sleep(0.5)
        produce(cb, name, {"data": 2})
        waiter.join(10)
        assert (answer["r"].status_code, answer["r"].json()) == (200, [2])


def test_a_subscription_made_while_the_listen_connection_was_silent_is_known_after(
    pg_url: str, make_server: Any, proxy: SilentDropProxy
) -> None:
    """B makes a pull-wake subscription while A's LISTEN connection is silent, then B goes
    away. Once A hears again, an append at A wakes the subscription. Before, A only took up
    subscriptions whose change it was told of: this one stayed unknown to A until A restarted,
    and appends through A woke nothing."""
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    a = make_server(
        pg_url.replace(host_port, f"127.0.0.1:{proxy.port}"), "--long-poll-timeout-ms", "2000"
    )
    b = make_server(pg_url)
    uid = uuid.uuid4().hex[:8]
    wake, sub = f"wake-{uid}", f"sub-{uid}"
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url) as cb:
        assert cb.put(f"/v1/stream/{wake}", json=[]).status_code == 201
        assert proxy.silence_listeners() == 1
        r = cb.put(
            f"/v1/stream/__ds/subscriptions/{sub}",
            json={"type": "pull-wake", "pattern": f"jobs-{uid}/*", "wake_stream": wake},
        )
        assert r.status_code == 201, r.text
        b.kill()
        began = time.monotonic()
        while proxy.listening() != 1:  # A's new LISTEN connection
            assert time.monotonic() - began < 20, "A never replaced its LISTEN connection"
            time.sleep(0.1)
        time.sleep(0.5)
        r = ca.put(f"/v1/stream/jobs-{uid}/a", json=[{"job": 1}])
        assert r.status_code == 201, r.text
        events: list[Any] = []
        began = time.monotonic()
        while not events and time.monotonic() - began < 10:
            r = ca.get(f"/v1/stream/{wake}", params={"offset": "-1", "live": "long-poll"})
            events = r.json() if r.status_code == 200 else []
        assert [e["subscription_id"] for e in events] == [sub]


def test_readers_and_fetchers_recover_when_the_listen_connection_is_killed(
    pg_url: str, make_server: Any
) -> None:
    """The database ends A's LISTEN connection (pg_terminate_backend, as a restart or an
    operator does) while a long-poll and a group fetch wait at A. B then appends: both are
    answered, and later appends at B wake readers at A promptly again."""
    import psycopg

    a = make_server(pg_url, "--long-poll-timeout-ms", "20000")
    b = make_server(pg_url)
    with httpx.Client(base_url=a.url, timeout=60) as ca, httpx.Client(base_url=b.url) as cb:
        name = new_station(cb)
        assert cb.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
        answers: dict[str, httpx.Response] = {}

        def poll(at: str) -> None:
            params = {"offset": at, "live": "long-poll"}
            answers["poll"] = ca.get(f"/v1/stream/{name}", params=params)

        def fetch() -> None:
            body = {"max": 5, "waitMs": 20_000, "consumer": "c"}
            answers["fetch"] = ca.post(f"/api/stations/{name}/groups/g/fetch", json=body)

        waiters = [threading.Thread(target=poll, args=(offset(0),)), threading.Thread(target=fetch)]
        for t in waiters:
            t.start()
        time.sleep(1.0)  # both LISTEN connections have worked a while (see pgnotify.STEADY_S)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'stations listen'"
            ).fetchall()
        assert killed == [(True,), (True,)]  # A's and B's
        time.sleep(0.2)
        began = time.monotonic()
        produce(cb, name, {"data": "x"})
        for t in waiters:
            t.join(30)
        assert answers["poll"].status_code == 200 and answers["poll"].json() == ["x"]
        assert answers["fetch"].status_code == 200
        assert [m["data"] for m in answers["fetch"].json()["messages"]] == ["x"]
        assert time.monotonic() - began < 5
        # Heard again: the next append at B wakes a reader at A at once.
        time.sleep(1.5)
        waiter = threading.Thread(target=poll, args=(offset(1),))
        waiter.start()
        time.sleep(0.5)
        began = time.monotonic()
        produce(cb, name, {"data": "y"})
        waiter.join(30)
        assert answers["poll"].json() == ["y"]
        assert time.monotonic() - began < 2
        # Ended again a second later: counted, not another line (at most one a minute).
        with psycopg.connect(pg_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'stations listen'"
            ).fetchall()
        assert killed == [(True,), (True,)]
        time.sleep(1.0)
    # One line for a dropped connection replaced at once: it was an ERROR (an outage's
    # words) and a "works again" line for every such drop.
    for server in (a, b):
        lines = [line for line in server.log().splitlines() if "LISTEN" in line]
        assert len(lines) == 1 and "WARNING" in lines[0], lines
        assert "LISTEN connection (ended; reconnecting at once) failed: " in lines[0]


def test_a_process_lets_go_of_the_ids_it_cached_for_a_station_another_deleted(
    pg_url: str,
) -> None:
    """A process caches the ids it stores (up to 50,000 per station). Deleted through another
    process, the station's cache stayed for good: short-lived stations grew the process without
    bound. The id sweep lets go of caches of stations that are gone."""
    import asyncio

    from stations.domain.scheduler import Scheduler
    from stations.domain.service import Service

    async def run() -> None:
        a, b = Service(pg_url), Service(pg_url)
        await a.start()
        await b.start()
        try:
            await a.create_station({"name": "short"})
            await a.create_station({"name": "kept"})
            for name in ("short", "kept"):
                await a.produce(name, {"messages": [{"id": f"m{k}", "data": k} for k in range(3)]})
            short = (await a.station("short"))["name"]
            assert short == "short"
            cached = set(a.ids._caches)
            assert len(cached) == 2
            await b.delete("short")
            await Scheduler(a).sweep_ids()
            left = set(a.ids._caches)
            assert len(left) == 1 and left < cached, (cached, left)
            # The kept station's ids still answer retries from RAM and the table alike.
            again = await a.produce("kept", {"messages": [{"id": "m1", "data": 1}]})
            assert again[0].results[0][1] is True
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())
