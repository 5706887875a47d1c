"""SQL for Durable Streams subscriptions (the decisions are in stations/domain/subscriptions/).

Rows travel as plain dicts. Reads of a subscription inside the writer's transaction lock its
row on PostgreSQL (``FOR UPDATE``), so two processes woken by the same append serialize on it
and only one of them starts the wake.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from stations.store import db
from stations.store.schema import ds_signing_keys, ds_subscription_streams, ds_subscriptions
from stations.store.schema import streams as streams_table

Row = dict[str, Any]
_CHUNK = 500  # ids per IN (...) list

# Built once: constructing a Core statement costs more than running these small ones.
_GET = select(ds_subscriptions).where(ds_subscriptions.c.id == bindparam("sub_id"))
_GET_LOCKED = _GET.with_for_update()
_INSERT_LINK = insert(ds_subscription_streams)
_LINKS = (
    select(ds_subscription_streams)
    .where(ds_subscription_streams.c.subscription_id == bindparam("sub_id"))
    .order_by(ds_subscription_streams.c.path)
)
_TAIL = select(streams_table.c.name, streams_table.c.tail).where(
    streams_table.c.name == bindparam("name"), streams_table.c.deleted.is_(False)
)


def get(conn: Connection, sub_id: str, *, lock: bool = False) -> Row | None:
    row = conn.execute(_GET_LOCKED if lock else _GET, {"sub_id": sub_id}).mappings().first()
    return dict(row) if row is not None else None


def insert_subscription(conn: Connection, row: Row) -> bool:
    """Whether it went in: not when another process created the same id meanwhile (its row
    was not there to lock when this transaction looked; a second INSERT was a 500)."""
    return db.insert_if_absent(conn, ds_subscriptions, row, [ds_subscriptions.c.id])


def update_subscription(conn: Connection, sub_id: str, values: Row) -> None:
    conn.execute(update(ds_subscriptions).where(ds_subscriptions.c.id == sub_id).values(**values))


def delete_subscription(conn: Connection, sub_id: str) -> bool:
    conn.execute(
        delete(ds_subscription_streams).where(ds_subscription_streams.c.subscription_id == sub_id)
    )
    return (
        conn.execute(delete(ds_subscriptions).where(ds_subscriptions.c.id == sub_id)).rowcount > 0
    )


def links(conn: Connection, sub_id: str) -> list[Row]:
    return [dict(r) for r in conn.execute(_LINKS, {"sub_id": sub_id}).mappings()]


def links_at(conn: Connection, sub_id: str, paths: list[str]) -> list[Row]:
    """The subscription's links to any of ``paths``."""
    out: list[Row] = []
    for i in range(0, len(paths), _CHUNK):
        query = select(ds_subscription_streams).where(
            ds_subscription_streams.c.subscription_id == sub_id,
            ds_subscription_streams.c.path.in_(paths[i : i + _CHUNK]),
        )
        out.extend(dict(r) for r in conn.execute(query).mappings())
    return out


def insert_link(conn: Connection, sub_id: str, path: str, *, explicit: bool, acked: int) -> None:
    conn.execute(
        _INSERT_LINK,
        {
            "subscription_id": sub_id,
            "path": path,
            "explicit": explicit,
            "glob": not explicit,
            "acked": acked,
        },
    )


def update_link(conn: Connection, sub_id: str, path: str, values: Row) -> None:
    conn.execute(
        update(ds_subscription_streams)
        .where(ds_subscription_streams.c.subscription_id == sub_id)
        .where(ds_subscription_streams.c.path == path)
        .values(**values)
    )


def delete_link(conn: Connection, sub_id: str, path: str) -> None:
    conn.execute(
        delete(ds_subscription_streams)
        .where(ds_subscription_streams.c.subscription_id == sub_id)
        .where(ds_subscription_streams.c.path == path)
    )


def forget_stream(conn: Connection, path: str) -> None:
    """A deleted stream's cursors start again: a link only a pattern made goes (the pattern
    links the stream again, from its start, when it is created again); one the subscription
    names stays, at the start.

    First it locks the rows of the subscriptions following it and of those holding a snapshot
    (PostgreSQL; in one statement, in id order, so that two purges cannot deadlock). A claim
    locks its row before it reads the tails for its snapshot, so one in progress commits
    before the purge reads the snapshots (``snapshots``), and one that comes later waits and
    finds the stream gone. Else the purge missed a snapshot written at the same moment, and a
    later ``done`` acked the deleted stream's tail on a stream created again under the name."""
    links = ds_subscription_streams.c
    if db.shared(conn):
        subs = ds_subscriptions.c
        following = select(links.subscription_id).where(links.path == path)
        conn.execute(
            select(subs.id)
            .where(subs.id.in_(following) | subs.snapshot.is_not(None))
            .order_by(subs.id)
            .with_for_update()
        )
    conn.execute(
        delete(ds_subscription_streams).where(links.path == path, links.explicit.is_(False))
    )
    conn.execute(
        update(ds_subscription_streams)
        .where(links.path == path, links.explicit.is_(True))
        .values(acked=0)
    )


def unclaimed_wakes_on(conn: Connection, wake_stream: str) -> list[str]:
    """Ids of the subscriptions whose open wake, claimed by nobody, was announced on
    ``wake_stream``."""
    query = select(ds_subscriptions.c.id).where(
        ds_subscriptions.c.wake_stream == wake_stream,
        ds_subscriptions.c.wake_id.is_not(None),
        ds_subscriptions.c.holder.is_(None),
    )
    return sorted(sub_id for (sub_id,) in conn.execute(query))


def snapshots(conn: Connection) -> list[tuple[str, str]]:
    """(subscription id, snapshot JSON) of the wakes in flight that hold one, locked
    (PostgreSQL: a claim writing one at the same moment commits first, and its snapshot is
    read, not overwritten with the one before)."""
    query = (
        select(ds_subscriptions.c.id, ds_subscriptions.c.snapshot)
        .where(ds_subscriptions.c.snapshot.is_not(None))
        .order_by(ds_subscriptions.c.id)
        .with_for_update()
    )
    return [(sub_id, snapshot) for sub_id, snapshot in conn.execute(query)]


def tails(conn: Connection, paths: Iterable[str]) -> dict[str, int]:
    """The tail position of each live stream among ``paths`` (absent ones are missing)."""
    names = list(dict.fromkeys(paths))
    out: dict[str, int] = {}
    if len(names) == 1:
        row = conn.execute(_TAIL, {"name": names[0]}).first()
        return {row[0]: row[1]} if row is not None else {}
    for i in range(0, len(names), _CHUNK):
        query = select(streams_table.c.name, streams_table.c.tail).where(
            streams_table.c.name.in_(names[i : i + _CHUNK]), streams_table.c.deleted.is_(False)
        )
        out.update({name: tail for name, tail in conn.execute(query)})
    return out


def incarnations(conn: Connection, paths: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(id, created_at) of each live stream among ``paths``: a stream deleted and created
    again under its name differs in one of them (unless SQLite gave the same id back within
    the same millisecond)."""
    names = list(dict.fromkeys(paths))
    out: dict[str, tuple[int, int]] = {}
    for i in range(0, len(names), _CHUNK):
        query = select(streams_table.c.name, streams_table.c.id, streams_table.c.created_at).where(
            streams_table.c.name.in_(names[i : i + _CHUNK]), streams_table.c.deleted.is_(False)
        )
        out.update({name: (sid, created) for name, sid, created in conn.execute(query)})
    return out


def stream_names(conn: Connection) -> list[str]:
    query = select(streams_table.c.name).where(streams_table.c.deleted.is_(False))
    return [name for (name,) in conn.execute(query)]


def definitions(conn: Connection, ids: Iterable[str] | None = None) -> list[Row]:
    """What the in-memory wake index needs: pattern, wake stream, webhook URL and explicit paths
    per id."""
    query = select(
        ds_subscriptions.c.id,
        ds_subscriptions.c.pattern,
        ds_subscriptions.c.wake_stream,
        ds_subscriptions.c.webhook_url,
    )
    link_query = select(
        ds_subscription_streams.c.subscription_id, ds_subscription_streams.c.path
    ).where(ds_subscription_streams.c.explicit.is_(True))
    rows: list[Row] = []
    wanted = None if ids is None else list(ids)
    chunks = (
        [None]
        if wanted is None
        else [wanted[i : i + _CHUNK] for i in range(0, len(wanted), _CHUNK)]
    )
    for chunk in chunks:
        q, lq = query, link_query
        if chunk is not None:
            q = q.where(ds_subscriptions.c.id.in_(chunk))
            lq = lq.where(ds_subscription_streams.c.subscription_id.in_(chunk))
        explicit: dict[str, list[str]] = {}
        for sub_id, path in conn.execute(lq):
            explicit.setdefault(sub_id, []).append(path)
        for r in conn.execute(q).mappings():
            rows.append({**r, "explicit": explicit.get(r["id"], [])})
    return rows


def deadlines(conn: Connection, ids: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """(id, the earliest moment something is due) for subscriptions with a wake in flight."""
    query = select(
        ds_subscriptions.c.id,
        ds_subscriptions.c.next_attempt_at,
        ds_subscriptions.c.lease_expires_at,
    ).where(ds_subscriptions.c.wake_id.is_not(None))
    wanted = None if ids is None else list(ids)
    chunks = (
        [None]
        if wanted is None
        else [wanted[i : i + _CHUNK] for i in range(0, len(wanted), _CHUNK)]
    )
    out: list[tuple[str, int]] = []
    for chunk in chunks:
        q = query if chunk is None else query.where(ds_subscriptions.c.id.in_(chunk))
        for sub_id, attempt_at, lease_at in conn.execute(q):
            due = [t for t in (attempt_at, lease_at) if t is not None]
            if due:
                out.append((sub_id, min(due)))
    return out


def all_ids(conn: Connection) -> list[str]:
    return [sub_id for (sub_id,) in conn.execute(select(ds_subscriptions.c.id))]


def signing_keys(conn: Connection) -> list[Row]:
    query = select(ds_signing_keys).order_by(ds_signing_keys.c.created_at, ds_signing_keys.c.kid)
    return [dict(r) for r in conn.execute(query).mappings()]


def add_signing_key(conn: Connection, kid: str, private_pem: str, created_at: int) -> None:
    """Insert unless a key exists already: of two processes starting at once, one key wins."""
    db.lock_table(conn, ds_signing_keys)
    if conn.execute(select(ds_signing_keys.c.kid).limit(1)).first() is None:
        conn.execute(
            insert(ds_signing_keys).values(kid=kid, private_pem=private_pem, created_at=created_at)
        )
