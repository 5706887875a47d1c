"""SQL of consumer groups: the ``groups`` rows and their ``deliveries`` (see
``stations.domain.groups`` for what they mean). Every function runs inside the caller's
transaction; the domain decides, this module only reads and writes rows."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Connection, Table, and_, case, delete, func, insert, select, update

from stations.store import db, sql
from stations.store.schema import deliveries, dls, groups, lease_ranges, messages, streams

__all__ = ["Connection"]


def create(conn: Connection, values: dict[str, Any]) -> int:
    group_id: int = conn.execute(
        insert(groups).values(**values).returning(groups.c.id)
    ).scalar_one()
    return group_id


def change(conn: Connection, group_id: int, **values: Any) -> None:
    conn.execute(update(groups).where(groups.c.id == group_id).values(**values))


def remove(conn: Connection, group_id: int) -> None:
    conn.execute(delete(deliveries).where(deliveries.c.group_id == group_id))
    conn.execute(delete(lease_ranges).where(lease_ranges.c.group_id == group_id))
    conn.execute(delete(groups).where(groups.c.id == group_id))


def of_stream(conn: Connection, stream_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(groups).where(groups.c.stream_id == stream_id).order_by(groups.c.name)
    ).all()
    return [dict(r._mapping) for r in rows]


def page(
    conn: Connection, stream_id: int, after: str | None, prefix: str, contains: str, limit: int
) -> list[dict[str, Any]]:
    """One page of the stream's groups by name (see ``db.name_page``), read through the
    (stream_id, name) index: ``ux_groups_stream_name``, on PostgreSQL its code point twin
    ``ix_groups_stream_name_c``."""
    query = select(groups).where(groups.c.stream_id == stream_id)
    query = db.name_page(conn, query, groups.c.name, after, prefix, contains, limit)
    return [dict(r._mapping) for r in conn.execute(query).all()]


def furthest_behind(
    conn: Connection, stream_id: int, head: int, tail: int, prefix: str, contains: str, limit: int
) -> list[dict[str, Any]]:
    """The stream's ``limit`` groups (those starting with ``prefix`` and holding ``contains``)
    with the most messages left, then by name. A group's lag is ``tail - max(cursor, head)``,
    at least 0 (``stations.domain.groups.lag``): the order of the cursor held between ``head``
    and ``tail``. It reads the row of every group of the stream (through the stream's part of
    its index) to sort them, none of their deliveries."""
    held = case(
        (groups.c.cursor < head, head), (groups.c.cursor > tail, tail), else_=groups.c.cursor
    )
    query = select(groups).where(groups.c.stream_id == stream_id)
    query = db.name_filter(conn, query, groups.c.name, prefix, contains)
    query = query.order_by(held, db.by_code_point(conn, groups.c.name)).limit(limit)
    return [dict(r._mapping) for r in conn.execute(query).all()]


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
    in_ranges = conn.execute(
        select(
            func.coalesce(func.sum(lease_ranges.c.last_seq - lease_ranges.c.first_seq + 1), 0)
        ).where(lease_ranges.c.group_id == group_id)
    ).scalar_one()
    return int(waiting), int(in_flight) + int(in_ranges)


# -- deliveries and lease ranges --------------------------------------------------------------
#
# The fetch and ack hot path is plain SQL on the driver's cursor (``sql.query``): one statement
# per step, whatever the batch size (a range or an array parameter, not one parameter per row),
# and no SQLAlchemy statement building or result processing, which cost more than SQLite's own
# work. A fetch's new messages are leased as one ``lease_ranges`` row; an ack of them deletes
# that row. Only what else happens to a leased message (a nack, an expiry, a dead-letter, a
# partial ack) turns positions of a range into ``deliveries`` rows or smaller ranges: callers see
# one set of open deliveries either way.

Lease = tuple[int, str, int]  # (seq, consumer, due) of a position cut out of a range


@cache
def _sql(mark: str, lock: str) -> dict[str, str]:
    m = mark
    return {
        "load": f"SELECT {_GROUP_COLUMNS} FROM groups WHERE stream_id = {m} AND name = {m}{lock}",
        # Waiting deliveries that are due (the first ``limit`` by offset), leases of deliveries
        # rows past their deadline, and (kind 2) lease ranges past theirs.
        "due_and_expired": "SELECT seq, delivery_count, 1 FROM deliveries WHERE group_id = "
        f"{m} AND consumer IS NOT NULL AND due <= {m} "
        "UNION ALL SELECT * FROM (SELECT seq, delivery_count, 0 FROM deliveries "
        f"WHERE group_id = {m} AND consumer IS NULL AND due <= {m} ORDER BY seq LIMIT {m}) AS w "
        f"UNION ALL SELECT first_seq, last_seq, 2 FROM lease_ranges WHERE group_id = {m} "
        f"AND due <= {m}",
        "lease_range": "INSERT INTO lease_ranges (group_id, first_seq, last_seq, consumer, due) "
        f"VALUES ({m}, {m}, {m}, {m}, {m})",
        "lease_range_cte": "WITH leased AS (INSERT INTO lease_ranges (group_id, first_seq, "
        f"last_seq, consumer, due) VALUES ({m}, {m}, {m}, {m}, {m})) "
        f"UPDATE groups SET cursor = {m} WHERE id = {m}",
        "move_cursor": f"UPDATE groups SET cursor = {m} WHERE id = {m}",
        "take_ranges": f"DELETE FROM lease_ranges WHERE group_id = {m} AND first_seq <= {m} "
        f"AND last_seq >= {m} RETURNING first_seq, last_seq, consumer, due",
        "take_expired_ranges": f"DELETE FROM lease_ranges WHERE group_id = {m} AND due <= {m} "
        "RETURNING first_seq, last_seq, consumer, due",
        "ranges_over": "SELECT first_seq, last_seq, consumer, due FROM lease_ranges "
        f"WHERE group_id = {m} AND first_seq <= {m} AND last_seq >= {m}",
    }


def _statement(conn: Connection, name: str) -> str:
    return _sql(db.mark(conn), db.row_lock(conn))[name]


_GROUP_COLUMNS = ", ".join(c.name for c in groups.columns)


def load(conn: Connection, stream_id: int, name: str, *, lock: bool) -> dict[str, Any] | None:
    """A group's row; with ``lock`` a row lock (PostgreSQL) serializes its ops across
    processes."""
    text = _sql(db.mark(conn), db.row_lock(conn) if lock else "")["load"]
    found = sql.query(conn, text, (stream_id, name))
    if not found:
        return None
    return dict(zip(groups.columns.keys(), found[0], strict=True))


def due_and_expired(
    conn: Connection, group_id: int, now: int, limit: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """In one statement: (seq, delivery count) of the waiting deliveries that are due, the
    first ``limit`` in offset order, and of every lease past its deadline."""
    rows = sql.query(
        conn,
        _statement(conn, "due_and_expired"),
        (group_id, now, group_id, now, limit, group_id, now),
    )
    due = [(int(seq), int(count)) for seq, count, kind in rows if kind == 0]
    expired = [(int(seq), int(count)) for seq, count, kind in rows if kind == 1]
    if any(kind == 2 for _, _, kind in rows):
        expired += [(seq, 1) for seq, _, _ in _expand_expired(conn, group_id, now)]
        expired.sort()
    return due, expired


def _expand_expired(conn: Connection, group_id: int, now: int) -> list[Lease]:
    """Lease ranges past their deadline become ``deliveries`` rows (still leased, now
    expired), which expiry then settles message by message."""
    taken = sql.query(conn, _statement(conn, "take_expired_ranges"), (group_id, now))
    leases = [(seq, c, d) for f, la, c, d in taken for seq in range(f, la + 1)]
    _insert_leases(conn, group_id, leases)
    return leases


def _insert_leases(conn: Connection, group_id: int, leases: list[Lease]) -> None:
    """One INSERT ... SELECT per consumer, not an executemany: SQLite runs that row by row,
    and a dead letter or nack of thousands cuts thousands of leases out of ranges."""
    by_consumer: dict[str, list[tuple[int, int]]] = {}
    for seq, consumer, due in leases:
        by_consumer.setdefault(consumer, []).append((seq, due))
    m = db.mark(conn)
    for consumer, pairs in by_consumer.items():
        sql.execute(
            conn,
            "INSERT INTO deliveries (group_id, seq, delivery_count, consumer, due, redrives) "
            f"SELECT {m}, p.a, 1, {m}, p.b, 0 FROM ({db.int_pairs_rows(conn)}) AS p",
            (group_id, consumer, *db.int_pairs(conn, pairs)),
        )


def _cut(conn: Connection, group_id: int, seqs: list[int]) -> list[Lease]:
    """Take the positions ``seqs`` out of the group's lease ranges (what is left of a range
    stays a range, or several); returns the positions taken with their leases."""
    if not seqs:
        return []
    wanted = set(seqs)
    taken = sql.query(conn, _statement(conn, "take_ranges"), (group_id, max(wanted), min(wanted)))
    if not taken:
        return []
    out: list[Lease] = []
    rest: list[tuple[int, int, int, str, int]] = []
    for first, last, consumer, due in taken:
        run_start = None
        for seq in range(first, last + 1):
            if seq in wanted:
                out.append((seq, consumer, due))
                if run_start is not None:
                    rest.append((group_id, run_start, seq - 1, consumer, due))
                    run_start = None
            elif run_start is None:
                run_start = seq
        if run_start is not None:
            rest.append((group_id, run_start, last, consumer, due))
    _insert_ranges(conn, rest)
    return out


def _insert_ranges(conn: Connection, ranges: list[tuple[int, int, int, str, int]]) -> None:
    """Lease ranges (group id, first, last, consumer, due): one INSERT ... SELECT per lease
    (consumer and deadline), not an executemany, which SQLite runs row by row (a dead letter
    of every other message of a fetch leaves a range between each two)."""
    if len(ranges) <= 1:  # a partial ack: the plain statement
        if ranges:
            sql.execute(conn, _statement(conn, "lease_range"), ranges[0])
        return
    by_lease: dict[tuple[int, str, int], list[tuple[int, int]]] = {}
    for group_id, first, last, consumer, due in ranges:
        by_lease.setdefault((group_id, consumer, due), []).append((first, last))
    m = db.mark(conn)
    for (group_id, consumer, due), pairs in by_lease.items():
        sql.execute(
            conn,
            "INSERT INTO lease_ranges (group_id, first_seq, last_seq, consumer, due) "
            f"SELECT {m}, p.a, p.b, {m}, {m} FROM ({db.int_pairs_rows(conn)}) AS p",
            (group_id, consumer, due, *db.int_pairs(conn, pairs)),
        )


def expired_leases(conn: Connection, group_id: int, now: int) -> list[tuple[int, int]]:
    """(seq, delivery count) of leases past their deadline."""
    _expand_expired(conn, group_id, now)
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
    # One parameter for the whole list: PostgreSQL's driver takes at most 65,535, and a
    # consumer that died may hold more leases than that.
    sql.execute(
        conn,
        f"UPDATE deliveries SET consumer = NULL, fetched_due = NULL WHERE group_id = "
        f"{db.mark(conn)} AND "
        f"{db.int_list_match(conn, 'seq')}",
        (group_id, db.int_list(conn, seqs)),
    )


def lease_new(
    conn: Connection, group_id: int, first: int, last: int, consumer: str, deadline: int
) -> None:
    """First deliveries of the messages at positions first..last, taken from the log, as one
    lease range; the cursor moves past them."""
    if db.modifying_ctes(conn):  # one round trip: the insert rides in a CTE of the update
        sql.execute(
            conn,
            _statement(conn, "lease_range_cte"),
            (group_id, first, last, consumer, deadline, last, group_id),
        )
        return
    sql.execute(conn, _statement(conn, "lease_range"), (group_id, first, last, consumer, deadline))
    sql.execute(conn, _statement(conn, "move_cursor"), (last, group_id))


def lease_again(
    conn: Connection, group_id: int, seqs: list[int], consumer: str, deadline: int
) -> None:
    m = db.mark(conn)
    sql.execute(
        conn,
        f"UPDATE deliveries SET delivery_count = abs(delivery_count) + 1, consumer = {m}, "
        f"due = {m}, fetched_due = NULL WHERE group_id = {m} AND "
        f"{db.int_list_match(conn, 'seq')}",
        (consumer, deadline, group_id, db.int_list(conn, seqs)),
    )


def waiting_delivered(conn: Connection, group_id: int, times: int) -> list[tuple[int, int]]:
    """Deliveries waiting to be made again (not leased) of messages delivered ``times`` times
    or more: (seq, delivery count), by offset."""
    m = db.mark(conn)
    rows = sql.query(
        conn,
        f"SELECT seq, delivery_count FROM deliveries WHERE group_id = {m} "
        f"AND consumer IS NULL AND abs(delivery_count) >= {m} ORDER BY seq",
        (group_id, times),
    )
    return [(int(seq), abs(int(count))) for seq, count in rows]


def forget(conn: Connection, group_id: int, seqs: list[int]) -> None:
    """Delete deliveries (acked, dead-lettered, or dropped by retention)."""
    rest = set(seqs) - {seq for seq, _, _ in _cut(conn, group_id, seqs)}
    if rest:
        # One parameter for the whole list: PostgreSQL's driver takes at most 65,535.
        sql.execute(
            conn,
            f"DELETE FROM deliveries WHERE group_id = {db.mark(conn)} AND "
            f"{db.int_list_match(conn, 'seq')}",
            (group_id, db.int_list(conn, sorted(rest))),
        )


def settle(conn: Connection, group_id: int, seqs: list[int]) -> list[int]:
    """Delete the open deliveries (leased, or lease expired) at ``seqs``; returns the positions
    it deleted. An ack of what one fetch took is one statement."""
    settled = [seq for seq, _, _ in _cut(conn, group_id, seqs)]
    rest = set(seqs).difference(settled)
    if not rest:
        return settled
    where = db.int_list_match(conn, "seq")
    m = db.mark(conn)
    rows = sql.query(
        conn,
        f"DELETE FROM deliveries WHERE group_id = {m} AND {where} AND delivery_count > 0 "
        "RETURNING seq",
        (group_id, db.int_list(conn, sorted(rest))),
    )
    return settled + [int(r[0]) for r in rows]


def extend(
    conn: Connection,
    group_id: int,
    seqs: list[int],
    deadline: int,
    now: int,
    consumer: str | None,
) -> list[int]:
    """Leases at ``seqs`` that are held (not past their deadline, by ``consumer`` if given)
    run until ``deadline``; returns the positions extended. The lease keeps its name: the deadline
    it was fetched with stays in ``fetched_due``. An extended position leaves its lease range
    for a ``deliveries`` row, as a nack's does."""
    if not seqs:
        return []
    _insert_leases(conn, group_id, _cut(conn, group_id, seqs))
    m = db.mark(conn)
    by_consumer = f" AND consumer = {m}" if consumer is not None else ""
    rows = sql.query(
        conn,
        f"UPDATE deliveries SET fetched_due = COALESCE(fetched_due, due), due = {m} "
        f"WHERE group_id = {m} AND {db.int_list_match(conn, 'seq')} AND consumer IS NOT NULL "
        f"AND delivery_count > 0 AND due > {m}{by_consumer} RETURNING seq",
        (
            deadline,
            group_id,
            db.int_list(conn, sorted(set(seqs))),
            now,
            *([consumer] if consumer is not None else []),
        ),
    )
    return [int(r[0]) for r in rows]


def open_deliveries(conn: Connection, group_id: int, seqs: list[int]) -> dict[int, int]:
    """Delivered and not yet settled (leased, or its lease expired): seq → delivery count.
    The positions asked for leave their lease ranges for ``deliveries`` rows, which a nack,
    a dead-letter or a transaction then changes one by one."""
    _insert_leases(conn, group_id, _cut(conn, group_id, seqs))
    # One parameter for the list: SQLAlchemy's IN of thousands cost more than the query.
    rows = sql.query(
        conn,
        f"SELECT seq, delivery_count FROM deliveries WHERE group_id = {db.mark(conn)} AND "
        f"{db.int_list_match(conn, 'seq')} AND delivery_count > 0",
        (group_id, db.int_list(conn, sorted(set(seqs)))),
    )
    return {int(seq): int(count) for seq, count in rows}


def leases(
    conn: Connection, group_id: int, seqs: list[int]
) -> dict[int, tuple[int, str | None, int, int]]:
    """seq → (delivery count, consumer, due, the deadline it was fetched with: the lease's
    name) of the group's deliveries at ``seqs``."""
    if not seqs:
        return {}
    wanted = set(seqs)
    # One parameter for the list, on the driver (as ``open_deliveries``): SQLAlchemy building
    # an IN of a transaction's hundred positions cost more than the query.
    rows = sql.query(
        conn,
        "SELECT seq, delivery_count, consumer, due, COALESCE(fetched_due, due) FROM deliveries "
        f"WHERE group_id = {db.mark(conn)} AND {db.int_list_match(conn, 'seq')}",
        (group_id, db.int_list(conn, sorted(wanted))),
    )
    found: dict[int, tuple[int, str | None, int, int]] = {
        seq: (count, consumer, due, fetched) for seq, count, consumer, due, fetched in rows
    }
    ranges = sql.query(conn, _statement(conn, "ranges_over"), (group_id, max(wanted), min(wanted)))
    for first, last, consumer, due in ranges:
        for seq in wanted.intersection(range(first, last + 1)):
            found[seq] = (1, consumer, due, due)
    return found


def postpone(conn: Connection, group_id: int, seqs: list[int], due: int) -> None:
    """Nacked: waiting until ``due``; the negative count marks the delivery settled."""
    m = db.mark(conn)
    sql.execute(
        conn,
        f"UPDATE deliveries SET consumer = NULL, due = {m}, fetched_due = NULL, "
        "delivery_count = -delivery_count "
        f"WHERE group_id = {m} AND {db.int_list_match(conn, 'seq')}",
        (due, group_id, db.int_list(conn, sorted(set(seqs)))),
    )


def requeue(conn: Connection, group_id: int, entries: list[tuple[int, int]], due: int) -> None:
    """DLS entries, (seq, redrives), back in their group's queue, not delivered yet, due at
    ``due``, carrying how often each was redriven; a statement per step whatever their number.
    Not a message after the group's cursor (a seek went back past it): the log delivers it
    anyway, and a row beside the lease the log gives it would be a second copy that outlives
    the ack of the first. Nor one the group has delivered again since (a seek back past its
    dead letter): that delivery stands, its holder's ack must settle it."""
    if not entries:
        return
    redrives_of = dict(entries)  # one row per message (the last entry's count, as in turn)
    for seq, (count, _, _, _) in leases(conn, group_id, list(redrives_of)).items():
        if count > 0:  # delivered and not settled: leased, or its lease ran out
            del redrives_of[seq]
    if not redrives_of:
        return
    forget(conn, group_id, sorted(redrives_of))
    cursor = conn.execute(select(groups.c.cursor).where(groups.c.id == group_id)).scalar()
    if cursor is None:
        return
    pairs = [(seq, redrives) for seq, redrives in redrives_of.items() if seq <= cursor]
    if pairs:
        m = db.mark(conn)
        sql.execute(
            conn,
            "INSERT INTO deliveries (group_id, seq, delivery_count, consumer, due, redrives) "
            f"SELECT {m}, p.a, 0, NULL, {m}, p.b FROM ({db.int_pairs_rows(conn)}) AS p",
            (group_id, due, *db.int_pairs(conn, pairs)),
        )


def raise_lease_floor(conn: Connection, group_id: int, now: int) -> int | None:
    """Lift the group's lease floor above every lease name it handed out (``groups.fence``):
    its floor plus one, ``now`` plus its ack time, the bound of names given with a longer
    one; returns the floor, None without the group. (It kept the floor when that was the
    larger, one below the ``floor + 1`` names fetches had handed out.)"""
    m = db.mark(conn)
    found = sql.query(
        conn,
        f"UPDATE groups SET lease_floor = {db.greatest(conn)}(lease_floor + 1, "
        f"{m} + max_ack_time_ms, names_bound) WHERE id = {m} RETURNING lease_floor",
        (now, group_id),
    )
    return int(found[0][0]) if found else None


def take(conn: Connection, group_id: int, seqs: list[int]) -> dict[int, int]:
    """Delete the deliveries at ``seqs`` (they leave the queue for the DLS), however many in a
    fixed number of statements; returns seq → how often each had been redriven from the DLS
    (a lease of a range never was: it is missing, as is a position without a delivery)."""
    m = db.mark(conn)
    rows = sql.query(
        conn,
        f"DELETE FROM deliveries WHERE group_id = {m} AND {db.int_list_match(conn, 'seq')} "
        "RETURNING seq, redrives",
        (group_id, db.int_list(conn, sorted(set(seqs)))),
    )
    taken = {int(seq): int(redrives) for seq, redrives in rows}
    # Callers cut their positions out of ranges already (to read their delivery counts).
    _cut(conn, group_id, [seq for seq in seqs if seq not in taken])
    return taken


def clear(conn: Connection, group_id: int) -> tuple[int, int, int]:
    """Drop every delivery of a group (a seek); returns (leases revoked, waiting dropped, the
    latest deadline the revoked leases were fetched with, or 0: their names, which new leases
    must not take; an extension's later deadline is no name)."""
    revoked, dropped = queue_sizes(conn, group_id)[::-1]
    latest = max(
        conn.execute(
            select(func.max(func.coalesce(deliveries.c.fetched_due, deliveries.c.due))).where(
                deliveries.c.group_id == group_id, deliveries.c.consumer.is_not(None)
            )
        ).scalar_one()
        or 0,
        conn.execute(
            select(func.max(lease_ranges.c.due)).where(lease_ranges.c.group_id == group_id)
        ).scalar_one()
        or 0,
    )
    conn.execute(delete(deliveries).where(deliveries.c.group_id == group_id))
    conn.execute(delete(lease_ranges).where(lease_ranges.c.group_id == group_id))
    return revoked, dropped, int(latest)


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
            | groups.c.id.in_(select(lease_ranges.c.group_id).where(lease_ranges.c.due <= now))
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
    found = [
        conn.execute(select(func.min(table.c.due)).where(table.c.due > now)).scalar()
        for table in (deliveries, lease_ranges)
    ]
    values = [int(v) for v in found if v is not None]
    return min(values) if values else None


def has_deliveries(conn: Connection, group_id: int) -> bool:
    """Whether the group has a message leased, or waiting to be delivered again."""
    return any(
        conn.execute(select(table.c.group_id).where(table.c.group_id == group_id).limit(1)).first()
        is not None
        for table in (deliveries, lease_ranges)
    )


def group_next_due(conn: Connection, group_id: int, now: int) -> int | None:
    """When the next lease of one group expires or its next waiting delivery falls due,
    whichever process leased or nacked it."""
    found = [
        conn.execute(
            select(func.min(table.c.due)).where(table.c.group_id == group_id, table.c.due > now)
        ).scalar()
        for table in (deliveries, lease_ranges)
    ]
    values = [int(v) for v in found if v is not None]
    return min(values) if values else None


def first_groups(conn: Connection, upto: str, limit: int) -> list[Any]:
    """The first ``limit`` groups by station and group name of the live stations named up to
    ``upto`` (``stream_id``, ``station``, ``name``, ``cursor`` and the station's ``tail``,
    ``head`` and ``fork_of``): one statement for all stations."""
    return list(
        conn.execute(
            select(
                groups.c.id,
                groups.c.stream_id,
                streams.c.name.label("station"),
                groups.c.name,
                groups.c.cursor,
                streams.c.tail,
                streams.c.head,
                streams.c.fork_of,
            )
            .join(streams, streams.c.id == groups.c.stream_id)
            .where(streams.c.deleted.is_(False), streams.c.name <= upto)
            .order_by(streams.c.name, groups.c.name)
            .limit(limit)
        )
    )


def queue_figures(conn: Connection, group_ids: list[int]) -> dict[int, tuple[int, int, int]]:
    """(waiting, in flight, dead-lettered) of each group, as ``queue_sizes`` counts the first
    two: one statement for all, each figure a subquery on the group's own index range."""
    if not group_ids:
        return {}
    d, r = deliveries, lease_ranges
    # Not what retention dropped (up to the station's head): those deliveries have nothing
    # left to deliver and stay only until a fetch forgets them, or a transaction acks them.
    # (A fork's group may still count those its source's retention dropped.)
    kept = streams.c.head
    waiting = select(func.count()).where(
        d.c.group_id == groups.c.id, d.c.consumer.is_(None), d.c.seq > kept
    )
    leased = select(func.count()).where(
        d.c.group_id == groups.c.id, d.c.consumer.is_not(None), d.c.seq > kept
    )
    first = getattr(func, db.greatest(conn))(r.c.first_seq, kept + 1)
    ranged = select(func.coalesce(func.sum(r.c.last_seq - first + 1), 0)).where(
        r.c.group_id == groups.c.id, r.c.last_seq > kept
    )
    # Through the DLS's (stream_id, id) index: it has none on group_id.
    dead = select(func.count()).where(
        dls.c.stream_id == groups.c.stream_id, dls.c.group_id == groups.c.id
    )
    rows = conn.execute(
        select(
            groups.c.id,
            waiting.scalar_subquery(),
            leased.scalar_subquery(),
            ranged.scalar_subquery(),
            dead.scalar_subquery(),
        )
        .join(streams, streams.c.id == groups.c.stream_id)
        .where(groups.c.id.in_(group_ids))
    )
    return {gid: (int(w), int(f) + int(rs), int(x)) for gid, w, f, rs, x in rows}


def count_by_stream(conn: Connection, table: Table, stream_ids: list[int]) -> dict[int, int]:
    """Rows of ``table`` per station of ``stream_ids``: the ids go as one parameter, however
    many (a list of every station: PostgreSQL's driver takes at most 65,535 parameters)."""
    if not stream_ids:
        return {}
    found = sql.query(
        conn,
        f"SELECT stream_id, count(*) FROM {table.name} "
        f"WHERE {db.int_list_match(conn, 'stream_id')} GROUP BY stream_id",
        (db.int_list(conn, stream_ids),),
    )
    return {int(sid): int(n) for sid, n in found}


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, int]:
    return count_by_stream(conn, groups, stream_ids)


def purge_stream(conn: Connection, stream_id: int) -> None:
    ids = select(groups.c.id).where(groups.c.stream_id == stream_id)
    conn.execute(delete(deliveries).where(deliveries.c.group_id.in_(ids)))
    conn.execute(delete(lease_ranges).where(lease_ranges.c.group_id.in_(ids)))
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
