"""``DELETE /api/stations/{name}?createdAt=...``: delete only the station created then. Without
it, a client (the console's Overview) that loaded a station, which was then deleted and created
again elsewhere, deleted the NEW station. Against live servers on SQLite and PostgreSQL; on
PostgreSQL also through two processes sharing the database, where the check and the delete
must be one transaction."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.harness import Server

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=JSON, timeout=15) as client:
        yield client


def _create(client: httpx.Client, name: str) -> str:
    answer = client.post("/api/stations", json={"name": name})
    assert answer.status_code == 201, answer.text
    created: str = answer.json()["createdAt"]
    return created


def _delete(client: httpx.Client, name: str, created_at: str | None = None) -> httpx.Response:
    query = "" if created_at is None else "?createdAt=" + quote(created_at, safe="")
    return client.delete(f"/api/stations/{quote(name, safe='')}{query}")


def test_a_station_created_again_is_not_deleted_by_the_old_ones_created_at(
    http: httpx.Client,
) -> None:
    old = _create(http, "shop/orders")
    http.post("/api/stations/shop%2Forders/messages", json={"messages": [{"data": 1}]})
    assert _delete(http, "shop/orders").status_code == 204
    new = _create(http, "shop/orders")
    assert new != old
    http.post("/api/stations/shop%2Forders/messages", json={"messages": [{"data": 2}]})

    refused = _delete(http, "shop/orders", old)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "conflict"
    assert error["field"] == "createdAt"
    assert error["message"].startswith(f"station shop/orders was created at {new}"), error
    # Nothing was deleted: the new station and its message are there.
    view = http.get("/api/stations/shop%2Forders").json()
    assert view["createdAt"] == new
    assert view["stats"]["messages"] == 1

    # Its own createdAt deletes it; written with another offset, it is the same instant.
    assert _delete(http, "shop/orders", new.replace("Z", "+00:00")).status_code == 204
    assert http.get("/api/stations/shop%2Forders").status_code == 404


def test_without_created_at_and_for_no_station_the_delete_answers_as_before(
    http: httpx.Client,
) -> None:
    created = _create(http, "plain")
    assert _delete(http, "plain").status_code == 204
    # No station of that name: 404 whatever createdAt says.
    missing = _delete(http, "plain", created)
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "bad",
    [
        "yesterday",
        "2026-11-28",  # a date alone
        "2026-11-28T09:43:52.123",  # no offset: which instant is unsaid
        "2026-11-28T09:43:52.1234Z",  # finer than a createdAt ever is
        "2026-11-28T09:43:52.123\x00Z",
    ],
)
def test_a_malformed_created_at_is_a_400_naming_it_and_deletes_nothing(
    http: httpx.Client, bad: str
) -> None:
    _create(http, "kept")
    try:
        answer = _delete(http, "kept", bad)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["field"] == "createdAt"
        assert http.get("/api/stations/kept").status_code == 200
        twice = http.delete("/api/stations/kept?createdAt=a&createdAt=b")
        assert twice.status_code == 400
        assert twice.json()["error"]["field"] == "createdAt"
    finally:
        assert _delete(http, "kept").status_code == 204


def _race(
    delete_old: Callable[[], httpx.Response],
    recreate: Callable[[], str],
) -> tuple[list[int], str]:
    """Run ``delete_old`` again and again while ``recreate`` deletes the station and creates it
    again; the statuses of ``delete_old``'s answers and the new station's createdAt."""
    statuses: list[int] = []
    done = threading.Event()
    started = threading.Event()

    def hammer() -> None:
        while True:
            statuses.append(delete_old().status_code)
            started.set()
            if done.is_set():
                return

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        started.wait(10)
        new = recreate()
    finally:
        done.set()
        worker.join(30)
    return statuses, new


def _check_race(
    old_side: httpx.Client, new_side: httpx.Client, name: str, rounds: int = 15
) -> None:
    for _ in range(rounds):
        old = _create(new_side, name)

        def recreate() -> str:
            # Unconditional: 404 if the conditional delete came first.
            assert _delete(new_side, name).status_code in (204, 404)
            return _create(new_side, name)

        statuses, new = _race(lambda old=old: _delete(old_side, name, old), recreate)
        assert set(statuses) <= {204, 404, 409}, statuses
        assert statuses.count(204) <= 1, statuses
        # Whatever the order, the station created after the old one was deleted stands: a
        # delete naming the old one never took it.
        view = new_side.get(f"/api/stations/{quote(name, safe='')}")
        assert view.status_code == 200, (statuses, view.text)
        assert view.json()["createdAt"] == new
        assert _delete(new_side, name, new).status_code == 204


def test_a_delete_naming_the_old_station_never_takes_one_created_meanwhile(
    http: httpx.Client,
) -> None:
    """Conditional deletes sent without pause while the station is deleted and created again:
    each is decided on the row it deletes, in the same transaction."""
    with httpx.Client(base_url=str(http.base_url), headers=JSON, timeout=15) as other:
        _check_race(http, other, "raced")


def test_two_processes_on_postgresql_decide_the_precondition_with_the_delete(
    pg_url: str,
    make_server: Callable[..., Server],
) -> None:
    """Two servers on one PostgreSQL database: one deletes the station and creates it again,
    the other sends deletes naming the old one. None of them may take the new station."""
    a, b = make_server(pg_url), make_server(pg_url)
    with (
        httpx.Client(base_url=a.url, headers=JSON, timeout=15) as old_side,
        httpx.Client(base_url=b.url, headers=JSON, timeout=15) as new_side,
    ):
        _check_race(old_side, new_side, "shared/raced")


def test_a_delete_sent_before_the_station_was_created_again_is_decided_when_it_runs(
    pg_url: str,
    make_server: Callable[..., Server],
) -> None:
    """A's writer is held (another session locks a station its queued produce writes), and a
    delete naming the old station is queued behind it; meanwhile B deletes the station and
    creates it again. When A's writer goes on, its delete finds the new station: a 409, and
    the new station stands. (Checked when the request came in, it would have passed and then
    deleted the new station.)"""
    import psycopg

    a, b = make_server(pg_url), make_server(pg_url)
    with (
        httpx.Client(base_url=a.url, headers=JSON, timeout=30) as old_side,
        httpx.Client(base_url=b.url, headers=JSON, timeout=30) as new_side,
        psycopg.connect(pg_url) as holder,
    ):
        _create(new_side, "blocker")
        old = _create(new_side, "target")
        holder.execute("SELECT id FROM streams WHERE name = 'blocker' FOR UPDATE")
        answers: dict[str, httpx.Response] = {}

        def send(key: str, call: Callable[[], httpx.Response]) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.__setitem__(key, call()))
            thread.start()
            return thread

        held = send(
            "produce",
            lambda: old_side.post(
                "/api/stations/blocker/messages", json={"messages": [{"data": 1}]}
            ),
        )
        _wait_for_a_lock_wait(pg_url)
        deleting = send("delete", lambda: _delete(old_side, "target", old))
        assert _delete(new_side, "target").status_code == 204
        new = _create(new_side, "target")
        holder.rollback()  # A's writer goes on
        held.join(30)
        deleting.join(30)
        assert answers["produce"].status_code == 200, answers["produce"].text
        assert answers["delete"].status_code == 409, answers["delete"].text
        assert answers["delete"].json()["error"]["field"] == "createdAt"
        assert new_side.get("/api/stations/target").json()["createdAt"] == new


def _wait_for_a_lock_wait(url: str, timeout: float = 10.0) -> None:
    """Until a session of this database waits for a lock (PostgreSQL tells it only when asked:
    pg_stat_activity)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as watcher:
        deadline = time.monotonic() + timeout
        while True:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            assert time.monotonic() < deadline, "the writer never waited for the lock"
            time.sleep(0.02)
