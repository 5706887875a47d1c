"""SQL of consumer groups: the ``groups`` rows and their ``deliveries`` (see
``stations.domain.groups`` for what they mean). Every function runs inside the caller's
transaction; the domain decides, this module only reads and writes rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, select, update

from stations.store import db
from stations.store.schema import deliveries, groups, messages, streams

__all__ = ["Connection"]


def load(conn: Connection, stream_id: int, name: str, *, lock: bool) -> dict[str, Any] | None:
    """A group's row; with ``lock`` a row lock (PostgreSQL) serializes its ops across
    processes."""
    query = select(groups).where(groups.c.stream_id == stream_id, groups.c.name == name)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return dict(row._mapping) if row is not None else None


def create(conn: Connection, values: dict[str, Any]) -> int:
    group_id: int = conn.execute(
        insert(groups).values(**values).returning(groups.c.id)
    ).scalar_one()
    return group_id


def change(conn: Connection, group_id: int, **values: Any) -> None:
    conn.execute(update(groups).where(groups.c.id == group_id).values(**values))


def remove(conn: Connection, group_id: int) -> None:
    conn.execute(delete(deliveries).where(deliveries.c.group_id == group_id))
    conn.execute(delete(groups).where(groups.c.id == group_id))


def of_stream(conn: Connection, stream_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(groups).where(groups.c.stream_id == stream_id).order_by(groups.c.name)
    ).all()
    return [dict(r._mapping) for r in rows]


def ids_of_stream(conn: Connection, stream_id: int) -> set[int]:
    return set(conn.execute(select(groups.c.id).where(groups.c.stream_id == stream_id)).scalars())


def queue_sizes(conn: Connection, group_id: int) -> tuple[int, int]:
    """(waiting, in flight) deliveries of a group."""
    waiting, in_flight = conn.execute(
        select(
            func.count().filter(deliveries.c.consumer.is_(None)),
            func.count().filter(deliveries.c.consumer.is_not(None)),
        ).where(deliveries.c.group_id == group_id)
    ).one()
    return int(waiting), int(in_flight)


# -- deliveries -------------------------------------------------------------------------------
#
# The fetch and ack hot path is plain SQL on the driver: one statement per step, whatever the
# batch size (a range or an array parameter, not one parameter per row), so a fetch or an ack
# costs PostgreSQL a fixed few round trips and SQLite no per-row statement compilation.


def _mark(conn: Connection) -> str:
    return db.mark(conn)


def due_and_expired(
    conn: Connection, group_id: int, now: int, limit: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """In one statement: (seq, delivery count) of the waiting deliveries that are due, the
    first ``limit`` in offset order, and of every lease past its deadline."""
    m = _mark(conn)
    rows = conn.exec_driver_sql(
        f"SELECT seq, delivery_count, 1 FROM deliveries WHERE group_id = {m} "
        f"AND consumer IS NOT NULL AND due <= {m} "
        "UNION ALL SELECT * FROM (SELECT seq, delivery_count, 0 FROM deliveries "
        f"WHERE group_id = {m} AND consumer IS NULL AND due <= {m} ORDER BY seq LIMIT {m}) AS w",
        (group_id, now, group_id, now, limit),
    ).all()
    due = [(int(seq), int(count)) for seq, count, leased in rows if not leased]
    expired = [(int(seq), int(count)) for seq, count, leased in rows if leased]
    return due, expired


def expired_leases(conn: Connection, group_id: int, now: int) -> list[tuple[int, int]]:
    """(seq, delivery count) of leases past their deadline."""
    rows = conn.execute(
        select(deliveries.c.seq, deliveries.c.delivery_count).where(
            deliveries.c.group_id == group_id,
            deliveries.c.consumer.is_not(None),
            deliveries.c.due <= now,
        )
    ).all()
    return [(seq, count) for seq, count in rows]


def release(conn: Connection, group_id: int, seqs: list[int]) -> None:
    """Expired leases wait for the next fetch, due at once (their deadline has passed)."""
    conn.execute(
        update(deliveries)
        .where(deliveries.c.group_id == group_id, deliveries.c.seq.in_(seqs))
        .values(consumer=None)
    )


def due_waiting(conn: Connection, group_id: int, now: int, limit: int) -> list[tuple[int, int]]:
    """(seq, delivery count) of waiting deliveries that are due, in offset order."""
    rows = conn.execute(
        select(deliveries.c.seq, deliveries.c.delivery_count)
        .where(
            deliveries.c.group_id == group_id,
            deliveries.c.consumer.is_(None),
            deliveries.c.due <= now,
        )
        .order_by(deliveries.c.seq)
        .limit(limit)
    ).all()
    return [(seq, count) for seq, count in rows]


def lease_new(
    conn: Connection, group_id: int, first: int, last: int, consumer: str, deadline: int
) -> None:
    """First deliveries of the messages at positions first..last, taken from the log; the
    cursor moves past them."""
    if db.has_series(conn):  # one round trip: the rows come from a series, the cursor moves in a CTE
        conn.exec_driver_sql(
            "WITH leased AS (INSERT INTO deliveries (group_id, seq, delivery_count, consumer, due)"
            " SELECT %s, s, 1, %s, %s FROM generate_series(%s::bigint, %s::bigint) AS s)"
            " UPDATE groups SET cursor = %s WHERE id = %s",
            (group_id, consumer, deadline, first, last, last, group_id),
        )
        return
    conn.exec_driver_sql(
        "INSERT INTO deliveries (group_id, seq, delivery_count, consumer, due) "
        "VALUES (?, ?, 1, ?, ?)",
        [(group_id, s, consumer, deadline) for s in range(first, last + 1)],
    )
    conn.exec_driver_sql("UPDATE groups SET cursor = ? WHERE id = ?", (last, group_id))


def lease_again(
    conn: Connection, group_id: int, seqs: list[int], consumer: str, deadline: int
) -> None:
    conn.execute(
        update(deliveries)
        .where(deliveries.c.group_id == group_id, deliveries.c.seq.in_(seqs))
        .values(
            delivery_count=func.abs(deliveries.c.delivery_count) + 1,
            consumer=consumer,
            due=deadline,
        )
    )


def forget(conn: Connection, group_id: int, seqs: list[int]) -> None:
    """Delete deliveries (acked, dead-lettered, or dropped by retention)."""
    conn.execute(
        delete(deliveries).where(deliveries.c.group_id == group_id, deliveries.c.seq.in_(seqs))
    )


def settle(conn: Connection, group_id: int, seqs: list[int]) -> list[int]:
    """Delete the open deliveries (leased, or lease expired) at ``seqs`` in one statement;
    returns the positions it deleted."""
    where = db.int_list_match(conn, "seq")
    arg = db.int_list(conn, seqs)
    m = _mark(conn)
    rows = conn.exec_driver_sql(
        f"DELETE FROM deliveries WHERE group_id = {m} AND {where} AND delivery_count > 0 "
        "RETURNING seq",
        (group_id, arg),
    ).all()
    return [int(r[0]) for r in rows]


def open_deliveries(conn: Connection, group_id: int, seqs: list[int]) -> dict[int, int]:
    """Delivered and not yet settled (leased, or its lease expired): seq → delivery count."""
    rows = conn.execute(
        select(deliveries.c.seq, deliveries.c.delivery_count).where(
            deliveries.c.group_id == group_id,
            deliveries.c.seq.in_(seqs),
            deliveries.c.delivery_count > 0,
        )
    ).all()
    return {seq: count for seq, count in rows}


def leases(
    conn: Connection, group_id: int, seqs: list[int]
) -> dict[int, tuple[int, str | None, int]]:
    """seq → (delivery count, consumer, due) of the group's deliveries at ``seqs``."""
    rows = conn.execute(
        select(
            deliveries.c.seq, deliveries.c.delivery_count, deliveries.c.consumer, deliveries.c.due
        ).where(deliveries.c.group_id == group_id, deliveries.c.seq.in_(seqs))
    ).all()
    return {seq: (count, consumer, due) for seq, count, consumer, due in rows}


def postpone(conn: Connection, group_id: int, seqs: list[int], due: int) -> None:
    """Nacked: waiting until ``due``; the negative count marks the delivery settled."""
    conn.execute(
        update(deliveries)
        .where(deliveries.c.group_id == group_id, deliveries.c.seq.in_(seqs))
        .values(consumer=None, due=due, delivery_count=-deliveries.c.delivery_count)
    )


def requeue(conn: Connection, group_id: int, seq: int, due: int, redrives: int = 0) -> None:
    """A DLS entry back in its group's queue, not delivered yet, due at ``due``, carrying how
    often it was redriven."""
    forget(conn, group_id, [seq])
    conn.execute(
        insert(deliveries).values(
            group_id=group_id,
            seq=seq,
            delivery_count=0,
            consumer=None,
            due=due,
            redrives=redrives,
        )
    )


def take(conn: Connection, group_id: int, seq: int) -> int:
    """Delete one delivery (it leaves the queue for the DLS); return how often it had been
    redriven from the DLS."""
    redrives = conn.execute(
        select(deliveries.c.redrives).where(
            deliveries.c.group_id == group_id, deliveries.c.seq == seq
        )
    ).scalar()
    forget(conn, group_id, [seq])
    return int(redrives or 0)


def clear(conn: Connection, group_id: int) -> tuple[int, int]:
    """Drop every delivery of a group (a seek); returns (leases revoked, waiting dropped)."""
    revoked, dropped = queue_sizes(conn, group_id)[::-1]
    conn.execute(delete(deliveries).where(deliveries.c.group_id == group_id))
    return revoked, dropped


# -- the scheduler's tick -----------------------------------------------------------------------


def groups_with_expired(conn: Connection, now: int) -> list[tuple[str, str]]:
    """(station, group) of groups holding expired leases, in one lock order for every
    process's tick (PostgreSQL): stations by name, then groups by name."""
    rows = conn.execute(
        select(streams.c.name, groups.c.name)
        .join(streams, streams.c.id == groups.c.stream_id)
        .where(
            groups.c.id.in_(
                select(deliveries.c.group_id).where(
                    deliveries.c.consumer.is_not(None), deliveries.c.due <= now
                )
            )
        )
        .order_by(streams.c.name, groups.c.name)
    ).all()
    return [(station, group) for station, group in rows]


def due_stations(conn: Connection, since: int, now: int) -> set[str]:
    """Stations with waiting deliveries that fell due in (since, now]."""
    rows = conn.execute(
        select(streams.c.name)
        .select_from(
            deliveries.join(groups, groups.c.id == deliveries.c.group_id).join(
                streams, streams.c.id == groups.c.stream_id
            )
        )
        .where(
            and_(
                deliveries.c.consumer.is_(None),
                deliveries.c.due > since,
                deliveries.c.due <= now,
            )
        )
        .distinct()
    ).all()
    return {r[0] for r in rows}


def next_due(conn: Connection, now: int) -> int | None:
    value = conn.execute(select(func.min(deliveries.c.due)).where(deliveries.c.due > now)).scalar()
    return None if value is None else int(value)


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, int]:
    rows = conn.execute(
        select(groups.c.stream_id, func.count())
        .where(groups.c.stream_id.in_(stream_ids))
        .group_by(groups.c.stream_id)
    ).all()
    return {sid: n for sid, n in rows}


def purge_stream(conn: Connection, stream_id: int) -> None:
    ids = select(groups.c.id).where(groups.c.stream_id == stream_id)
    conn.execute(delete(deliveries).where(deliveries.c.group_id.in_(ids)))
    conn.execute(delete(groups).where(groups.c.stream_id == stream_id))


# -- seeking by time ------------------------------------------------------------------------------


def first_stored_at_or_after(
    conn: Connection, stream_id: int, after: int, upto: int | None, when: int
) -> int | None:
    """The position of the first message of ``stream_id`` in (after, upto] stored at or after
    ``when`` (ms), or None. Store times rise with positions, so this is a binary search over
    rows by primary key: about log2(rows) point reads, no index on time needed."""

    def row_at(position: int) -> tuple[int, int, int] | None:
        # The row holding ``position``: the first with seq >= position.
        row = conn.execute(
            select(messages.c.seq, messages.c.span, messages.c.stored_at)
            .where(messages.c.stream_id == stream_id, messages.c.seq >= position)
            .order_by(messages.c.seq)
            .limit(1)
        ).first()
        if row is None or (upto is not None and row[0] - row[1] >= upto):
            return None
        return int(row[0]), int(row[1]), int(row[2])

    last = conn.execute(
        select(messages.c.seq, messages.c.span, messages.c.stored_at)
        .where(
            messages.c.stream_id == stream_id,
            messages.c.seq > after,
            *([messages.c.seq - messages.c.span < upto] if upto is not None else []),
        )
        .order_by(messages.c.seq.desc())
        .limit(1)
    ).first()
    if last is None or int(last[2]) < when:
        return None
    lo, hi = after + 1, int(last[0]) if upto is None else min(int(last[0]), upto)
    while lo < hi:  # the smallest position whose row was stored at or after ``when``
        mid = (lo + hi) // 2
        found = row_at(mid)
        if found is not None and found[2] >= when:
            hi = mid
        else:
            lo = (found[0] + 1) if found is not None else mid + 1
    # A multi-message row shares one store time: its first position counts.
    found = row_at(lo)
    if found is None:
        return None
    return max(after + 1, found[0] - found[1] + 1)
