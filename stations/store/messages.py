"""The ``messages`` table: pages of a stream's rows for readers, and retention's drops.

A row holds ``span`` consecutive messages ending at position ``seq``. Pages go through the
driver's own cursor: on a catch-up of a million messages SQLAlchemy's per-row result
processing would cost more than SQLite itself.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from sqlalchemy import and_, delete, func, or_, select

from stations.records import StreamState
from stations.store import db, sql
from stations.store.db import Tx
from stations.store.schema import messages, streams
from stations.store.streams import segments

Row = tuple[int, int, bytes, str | None, str | None, int]  # seq, span, data, id, headers, time
# Rows per query: the first query asks for one row (a row may hold thousands of messages, and a
# consumer fetch may want only a few), each next one for four times more, while the reader
# wants more.
FIRST_PAGE, MAX_PAGE = 1, 4096
CHUNK = 10_000  # rows retention looks at per station and pass


def rows(tx: Tx, state: StreamState, after: int) -> Iterator[tuple[Row, int, int]]:
    """Rows holding positions after ``after``, each with the positions (lo, hi] to take."""
    conn = db.conn_of(tx)
    raw = conn.connection.cursor()
    mark = db.mark(conn)
    query = (
        "SELECT seq, span, data, msg_id, headers, stored_at FROM messages "
        f"WHERE stream_id = {mark} AND seq > {mark} ORDER BY seq LIMIT {mark}"
    )
    try:
        for stream_id, lo, hi in segments(tx, state):
            start = max(lo, after)
            if hi is not None and hi <= start:
                continue
            cursor, page = start, FIRST_PAGE
            while True:
                raw.execute(query, (stream_id, cursor, page))
                fetched = raw.fetchall()
                for row in fetched:
                    first = row[0] - row[1]
                    if hi is not None and first >= hi:
                        break
                    yield row, max(first, start), row[0] if hi is None else min(row[0], hi)
                else:
                    if len(fetched) == page:
                        cursor, page = fetched[-1][0], min(page * 4, MAX_PAGE)
                        continue
                break
    finally:
        raw.close()


def holding(tx: Tx, stream_id: int, positions: list[int]) -> list[tuple[int, int, int]]:
    """(seq, span, data bytes) of the rows of ``stream_id`` that hold ``positions``, by seq, in
    two statements however many positions and however spread out: one probes the primary key
    for the first row at or after each position (a row may hold many positions), one reads
    those rows' sizes (a join of the two scanned every row of the stream on PostgreSQL). A
    position retention dropped has no row."""
    if not positions:
        return []
    conn = db.conn_of(tx)
    m = db.mark(conn)
    firsts = sql.query(
        conn,
        f"SELECT DISTINCT (SELECT min(seq) FROM messages WHERE stream_id = {m} AND seq >= p.a) "
        f"FROM ({db.int_rows(conn)}) AS p",
        (stream_id, db.int_list(conn, positions)),
    )
    seqs = sorted(int(seq) for (seq,) in firsts if seq is not None)
    if not seqs:
        return []
    found = sql.query(
        conn,
        f"SELECT seq, span, length(data) FROM messages WHERE stream_id = {m} AND "
        f"{db.int_list_match(conn, 'seq')} ORDER BY seq",
        (stream_id, db.int_list(conn, seqs)),
    )
    wanted = sorted(positions)
    out = []
    for seq, span, size in found:
        # The first row at or after a position holds it unless a gap (retention) lies between.
        k = bisect_right(wanted, int(seq) - int(span))
        if k < len(wanted) and wanted[k] <= seq:
            out.append((int(seq), int(span), int(size)))
    return out


def rows_at(tx: Tx, stream_id: int, seqs: list[int]) -> list[Row]:
    """The rows of ``stream_id`` ending at ``seqs`` (see ``holding``), by seq, in one
    statement."""
    if not seqs:
        return []
    conn = db.conn_of(tx)
    found = sql.query(
        conn,
        "SELECT seq, span, data, msg_id, headers, stored_at FROM messages "
        f"WHERE stream_id = {db.mark(conn)} AND {db.int_list_match(conn, 'seq')} ORDER BY seq",
        (stream_id, db.int_list(conn, seqs)),
    )
    return [(int(q), int(n), bytes(d), i, h, int(t)) for q, n, d, i, h, t in found]


def newest_stored_by(tx: Tx, stream_id: int, after: int, cutoff: int) -> int | None:
    """The last position after ``after`` of a row stored at or before ``cutoff``."""
    seq: int | None = (
        db.conn_of(tx)
        .execute(
            select(func.max(messages.c.seq)).where(
                messages.c.stream_id == stream_id,
                messages.c.seq > after,
                messages.c.stored_at <= cutoff,
            )
        )
        .scalar()
    )
    return seq


def oldest_stored_after(tx: Tx, stream_id: int, after: int) -> int | None:
    """When the first row holding a position after ``after`` was stored (None: no such row)."""
    stored: int | None = (
        db.conn_of(tx)
        .execute(
            select(messages.c.stored_at)
            .where(messages.c.stream_id == stream_id, messages.c.seq > after)
            .order_by(messages.c.seq)
            .limit(1)
        )
        .scalar()
    )
    return stored


def sizes(tx: Tx, stream_id: int, after: int) -> list[tuple[int, int, int]]:
    """(seq, span, bytes of its messages) of the first ``CHUNK`` rows after ``after`` (a row
    of several JSON messages without the newlines between them)."""
    result = db.conn_of(tx).execute(
        select(
            messages.c.seq,
            messages.c.span,
            func.length(messages.c.data) - messages.c.span + 1,
        )
        .where(messages.c.stream_id == stream_id, messages.c.seq > after)
        .order_by(messages.c.seq)
        .limit(CHUNK)
    )
    return [(seq, span, size) for seq, span, size in result]


def message_sizes(tx: Tx, stream_id: int, seq: int) -> list[int]:
    """The bytes of each message of the row ending at ``seq``, first to last."""
    data = (
        db.conn_of(tx)
        .execute(
            select(messages.c.data).where(messages.c.stream_id == stream_id, messages.c.seq == seq)
        )
        .scalar_one()
    )
    return [len(piece) for piece in bytes(data).split(b"\n")]


def drop_through(tx: Tx, stream_id: int, after: int, head: int, dropped: int) -> int:
    """Drop the messages at positions ``after`` < p <= ``head``: delete the rows wholly at or
    below ``head``, move the stream's head there and take ``dropped`` messages and their bytes
    off its counts; returns the bytes.

    A row of several messages (JSON, joined by "\n") that the head cuts through stays until its
    last message goes, but the bytes of its messages that are dropped are counted now, and its
    separators never: the counts always match the messages a reader can still get."""
    conn = db.conn_of(tx)
    whole: int = conn.execute(
        select(
            func.coalesce(func.sum(func.length(messages.c.data) - messages.c.span + 1), 0)
        ).where(
            messages.c.stream_id == stream_id,
            messages.c.seq - messages.c.span >= after,
            messages.c.seq <= head,
        )
    ).scalar_one()
    # The rows the two ends cut through (at most two; one if both cut the same row).
    cut = conn.execute(
        select(messages.c.seq, messages.c.span, messages.c.data).where(
            messages.c.stream_id == stream_id,
            or_(
                and_(messages.c.seq - messages.c.span < after, messages.c.seq > after),
                and_(messages.c.seq - messages.c.span < head, messages.c.seq > head),
            ),
        )
    ).all()
    dropped_bytes = whole
    for seq, span, data in cut:
        first = seq - span + 1  # position of the row's first message
        pieces = bytes(data).split(b"\n") if span > 1 else [bytes(data)]
        lo, hi = max(after + 1, first), min(head, seq)
        dropped_bytes += sum(len(p) for p in pieces[lo - first : hi - first + 1])
    conn.execute(delete(messages).where(messages.c.stream_id == stream_id, messages.c.seq <= head))
    conn.execute(
        streams.update()
        .where(streams.c.id == stream_id)
        .values(
            head=head,
            msg_count=streams.c.msg_count - dropped,
            byte_count=streams.c.byte_count - dropped_bytes,
        )
    )
    return int(dropped_bytes)
