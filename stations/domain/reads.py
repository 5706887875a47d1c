"""Reading the log: catch-up pages for the Durable Streams door, and single messages with
their ids and headers for the management API, consumer groups and the DLS.

A ``messages`` row holds ``span`` consecutive messages ending at position ``seq``. Reads clip
rows to the positions asked for, follow a fork into its source up to the fork offset, and stop
near a byte budget. They go through the driver's own cursor: on a catch-up of a million messages
SQLAlchemy's per-row result processing would cost more than SQLite itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import Connection

from stations.domain.errors import BadRequest, Gone
from stations.domain.log import live_stream
from stations.domain.streams import StreamState, load, segments

SEP = b"\n"  # between the messages of a multi-message JSON row
# Rows per query: the first query asks for one row (a row may hold thousands of messages, and a
# consumer fetch may want only a few), each next one for four times more, while the reader
# wants more.
FIRST_PAGE, MAX_PAGE = 1, 4096


@dataclass
class Message:
    seq: int
    data: bytes
    msg_id: str | None
    headers: str | None
    stored_at: int


@dataclass
class ReadResult:
    state: StreamState
    start: int
    next: int
    up_to_date: bool
    count: int = 0  # messages in this result
    # The payload as pieces: for JSON, each piece is one or more messages joined by ","; for
    # other types, raw bytes. Filled by ``read``; ``read_messages`` fills ``messages`` instead.
    parts: list[bytes] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        """EOF: the stream is closed and this result reaches its final offset."""
        return self.state.closed and self.next >= self.state.tail


Row = tuple[int, int, bytes, str | None, str | None, int]  # seq, span, data, id, headers, time


def open_stream(conn: Connection, name: str, now: int) -> StreamState:
    return live_stream(load(conn, name), name, now)


def _rows(conn: Connection, state: StreamState, after: int) -> Iterator[tuple[Row, int, int]]:
    """Rows holding positions after ``after``, each with the positions (lo, hi] to take."""
    raw = conn.connection.cursor()
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = (
        "SELECT seq, span, data, msg_id, headers, stored_at FROM messages "
        f"WHERE stream_id = {mark} AND seq > {mark} ORDER BY seq LIMIT {mark}"
    )
    try:
        for stream_id, lo, hi in segments(conn, state):
            start = max(lo, after)
            if hi is not None and hi <= start:
                continue
            cursor, page = start, FIRST_PAGE
            while True:
                raw.execute(sql, (stream_id, cursor, page))
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


def _split(row: Row) -> list[bytes]:
    return row[2].split(SEP) if row[1] > 1 else [row[2]]


def _begin(state: StreamState, position: int | None) -> tuple[int, int]:
    """(where the client asked to start, where reading really starts)."""
    if position is None:
        position = state.tail
    if position > state.tail:
        raise BadRequest("offset is beyond the tail of the stream", "offset")
    if 0 < position < state.head:
        raise Gone("offset is before the earliest retained message", "offset")
    return position, max(position, state.head)


def read(
    conn: Connection, name: str, position: int | None, *, now: int, max_bytes: int
) -> ReadResult:
    """A catch-up page after ``position`` (None: the tail), about ``max_bytes`` long."""
    state = open_stream(conn, name, now)
    position, start = _begin(state, position)
    result = ReadResult(state, position, start, start >= state.tail)
    size = 0
    json_rows = state.is_json
    for row, lo, hi in _rows(conn, state, start):
        span, data = row[1], row[2]
        if hi - lo == span:  # the whole row
            piece = data.replace(SEP, b",") if span > 1 and json_rows else data
        else:
            first = row[0] - span
            piece = b",".join(_split(row)[lo - first : hi - first])
        result.parts.append(piece)
        result.count += hi - lo
        result.next = hi
        size += len(piece)
        if size >= max_bytes:
            break
    result.up_to_date = result.next >= state.tail
    return result


def scan(conn: Connection, state: StreamState, after: int) -> Iterator[Message]:
    """Every message after ``after``, one by one, with its id, headers and store time."""
    for row, lo, hi in _rows(conn, state, after):
        first = row[0] - row[1]
        pieces = _split(row)
        for position in range(lo + 1, hi + 1):
            yield Message(position, pieces[position - first - 1], row[3], row[4], row[5])


def read_messages(
    conn: Connection, name: str, position: int, *, now: int, limit: int, max_bytes: int
) -> ReadResult:
    """Up to ``limit`` messages after ``position``, one by one (the management API)."""
    state = open_stream(conn, name, now)
    position, start = _begin(state, position)
    result = ReadResult(state, position, start, start >= state.tail)
    size = 0
    for message in scan(conn, state, start):
        result.messages.append(message)
        result.next = message.seq
        size += len(message.data)
        if len(result.messages) >= limit or size >= max_bytes:
            break
    result.count = len(result.messages)
    result.up_to_date = result.next >= state.tail
    return result


def messages_at(conn: Connection, state: StreamState, positions: list[int]) -> list[Message]:
    """The messages at ``positions`` that still exist (retention may have dropped some)."""
    out: list[Message] = []
    for lo, hi in _runs(sorted(set(positions))):
        for message in scan(conn, state, max(lo - 1, state.head)):
            if message.seq > hi:
                break
            out.append(message)
    return out


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Consecutive positions as (first, last) ranges, so each range is one scan."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], p)
        else:
            runs.append((p, p))
    return runs
