"""Reading the log: catch-up pages for the Durable Streams door, and single messages with
their ids and headers for the management API, consumer groups and the DLS.

A ``messages`` row holds ``span`` consecutive messages ending at position ``seq``. Reads clip
rows to the positions asked for, follow a fork into its source up to the fork offset, and stop
near a byte budget. The rows come from the store (``stations.store.messages``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from stations.domain.log import live_stream, unpack
from stations.domain.offsets import EARLIEST, Start
from stations.errors import BadRequest, Gone
from stations.records import StreamState
from stations.store import messages as stored
from stations.store.db import Tx
from stations.store.messages import Row
from stations.store.streams import inherited_head, load

SEP = b"\n"  # between the messages of a multi-message JSON row


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


def open_stream(tx: Tx, name: str, now: int) -> StreamState:
    """The stream as a read sees it: a fork starts where its sources' retention left it."""
    state = live_stream(load(tx, name), name, now)
    if state.fork_of is not None:
        state.head = inherited_head(tx, state)  # this copy is read, never written back
    return state


def _split(row: Row) -> list[bytes]:
    return row[2].split(SEP) if row[1] > 1 else [row[2]]


def _begin(state: StreamState, position: Start | None) -> tuple[int, int]:
    """(where the client asked to start, where reading really starts). None is the tail."""
    if position is EARLIEST:
        return 0, state.head
    if position is None:
        position = state.tail
    if position > state.tail:
        raise BadRequest("offset is beyond the tail of the stream", "offset")
    # Position 0 too: the zero offset is a token clients were given (a new stream's
    # Stream-Next-Offset, the first message's offset), and a reader resuming there must learn
    # that messages are gone (PROTOCOL.md §5.6), as at any later dropped offset.
    if position < state.head:
        raise Gone("offset is before the earliest retained message", "offset")
    return position, position


def read(tx: Tx, name: str, position: Start | None, *, now: int, max_bytes: int) -> ReadResult:
    """A catch-up page after ``position`` (None: the tail), about ``max_bytes`` long."""
    state = open_stream(tx, name, now)
    position, start = _begin(state, position)
    result = ReadResult(state, position, start, start >= state.tail)
    size = 0
    json_rows = state.is_json
    for row, lo, hi in stored.rows(tx, state, start):
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


def scan(tx: Tx, state: StreamState, after: int) -> Iterator[Message]:
    """Every message after ``after``, one by one, with its id, headers and store time."""
    for row, lo, hi in stored.rows(tx, state, after):
        first, span = row[0] - row[1], row[1]
        pieces = _split(row)
        ids, headers = unpack(row[3], span), unpack(row[4], span)
        for position in range(lo + 1, hi + 1):
            k = position - first - 1
            yield Message(position, pieces[k], ids[k], headers[k], row[5])


def read_messages(
    tx: Tx, name: str, position: Start, *, now: int, limit: int, max_bytes: int
) -> ReadResult:
    """Up to ``limit`` messages after ``position``, one by one (the management API)."""
    state = open_stream(tx, name, now)
    position, start = _begin(state, position)
    result = ReadResult(state, position, start, start >= state.tail)
    size = 0
    for message in scan(tx, state, start):
        result.messages.append(message)
        result.next = message.seq
        size += len(message.data)
        if len(result.messages) >= limit or size >= max_bytes:
            break
    result.count = len(result.messages)
    result.up_to_date = result.next >= state.tail
    return result


def messages_at(tx: Tx, state: StreamState, positions: list[int]) -> list[Message]:
    """The messages at ``positions`` that still exist (retention may have dropped some)."""
    return [Message(*m) for m in pieces_at(tx, state, positions)]


Piece = tuple[int, bytes, str | None, str | None, int]  # seq, data, msg_id, headers, stored_at


def dropped_through(tx: Tx, state: StreamState, *, share: bool = False) -> int:
    """The last position retention dropped; a fork's counts its sources' too. ``share``: a
    writer that deletes what it decides by it holds the sources' rows until its commit, so
    another process's retention on them waits (or is seen)."""
    return inherited_head(tx, state, share=share) if state.fork_of is not None else state.head


def pieces_at(
    tx: Tx,
    state: StreamState,
    positions: list[int],
    max_bytes: int | None = None,
    *,
    head: int | None = None,
) -> list[Piece]:
    """``messages_at`` as plain tuples: a consumer fetch takes hundreds at a time. With
    ``max_bytes``, reading stops once the pieces taken (their own bytes, not their rows')
    come past it: what is returned is then the pieces of a prefix of ``positions``. ``head``:
    the last position retention dropped, if not the state's own (a fork's, with its
    sources')."""
    out: list[Piece] = []
    size = taken = 0
    dropped = state.head if head is None else head
    for lo, hi in _runs(sorted(set(positions))):
        if max_bytes is not None and size > max_bytes:
            break
        lo = max(lo, dropped + 1)  # retention dropped the positions up to the head
        if lo > hi:
            continue
        for row, first, last in stored.rows(tx, state, lo - 1):
            if first >= hi:  # past the run: never another position's message
                break
            seq, span, data, msg_id, headers, stored_at = row
            start = seq - span  # the position before the row's first message
            take_to = min(last, hi)
            if span == 1:
                out.append((seq, data, msg_id, headers, stored_at))
            elif msg_id is None and headers is None:  # a Durable Streams batch append
                pieces = data.split(SEP)
                out.extend(
                    (p, pieces[p - start - 1], None, None, stored_at)
                    for p in range(first + 1, take_to + 1)
                )
            else:  # a produce's messages, their ids and headers packed beside them
                pieces, ids, heads = data.split(SEP), unpack(msg_id, span), unpack(headers, span)
                for p in range(first + 1, take_to + 1):
                    k = p - start - 1
                    out.append((p, pieces[k], ids[k], heads[k], stored_at))
            if max_bytes is not None:
                # The pieces' bytes, as the caller counts them: a row's own size would stop
                # this read while the caller still counts room (a row of 9 MB, 500 kB of it
                # wanted), and the positions not reached would look dropped to it.
                size += sum(len(piece[1]) for piece in out[taken:])
                taken = len(out)
                if size > max_bytes:
                    break
            if last >= hi:
                break
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
