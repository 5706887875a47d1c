"""The log: appending messages to a stream and reading them back.

An append is decided and written inside the writer's transaction: the messages, the stream's
tail, the producer session and the message ids commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import overload

from stations.domain import framing, retention
from stations.domain import producers as sessions
from stations.domain.idwindow import IdWindow
from stations.domain.producers import Producer, Verdict
from stations.domain.streams import same_content_type
from stations.errors import BadRequest, Conflict, Forbidden, Gone, NotFound, TooLarge
from stations.records import StreamState
from stations.store import sql
from stations.store.writer import Batch

SEP = b"\n"  # between the messages of a multi-message JSON row (see schema.messages)
# Between the ids, and between the headers, of a multi-message row: neither a Msg-Id (printable
# ASCII) nor compact JSON headers can hold a newline. An empty field is a message without one.
FIELD_SEP = "\n"


def pack(values: list[str | None]) -> str | None:
    """The ids (or headers) of a multi-message row as one column value; None if none has one."""
    if not any(values):
        return None
    return FIELD_SEP.join([v or "" for v in values])


def unpack(value: str | None, span: int) -> list[str | None]:
    """A row's ids (or headers), one per message: the inverse of ``pack``."""
    if value is None:
        return [None] * span
    if span == 1:
        return [value]
    return [v or None for v in value.split(FIELD_SEP)]


class SequenceGap(Conflict):
    """A producer request ahead of its turn; the caller may wait for the missing ones."""

    def __init__(self, expected: int, received: int, producer: Producer, stream: str) -> None:
        super().__init__(
            f"Producer-Seq {received} is ahead of the expected {expected}",
            "Producer-Seq",
            expected=expected,
            received=received,
        )
        self.producer = producer
        self.stream = stream


class NewEpochGap(SequenceGap, BadRequest):
    """A new epoch must start at seq 0 (400, Durable Streams §5.2.1). As a gap it is held first:
    a pipelining producer's seq 0 of its new epoch may still be on its way."""

    code = BadRequest.code

    def __init__(self, received: int, producer: Producer, stream: str) -> None:
        super().__init__(0, received, producer, stream)
        self.message = "a new Producer-Epoch must start at Producer-Seq 0"
        self.args = (self.message,)


class StreamClosed(Conflict):
    def __init__(self, tail: int) -> None:
        super().__init__("the stream is closed", None, closed=True, next_offset=tail)


@dataclass
class AppendRequest:
    name: str
    content_type: str | None = None
    messages: Sequence[bytes] = field(default_factory=list)  # a JSON array: a framing.Span
    msg_ids: list[str | None] | None = None
    headers: list[str | None] | None = None
    close: bool = False
    producer: Producer | None = None
    stream_seq: str | None = None
    # A body error is reported only after the closed check, as the protocol orders them.
    body_error: BadRequest | TooLarge | None = None


Outcome = tuple[int | None, bool]  # (offset, duplicate) of one message


class Fresh(Sequence[Outcome]):
    """The outcome of ``n`` new messages stored from offset ``first`` on: what an append
    without message ids answers, without a tuple per message."""

    __slots__ = ("first", "n")
    duplicates = 0

    def __init__(self, first: int, n: int) -> None:
        self.first, self.n = first, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Outcome]:
        return zip(range(self.first, self.first + self.n), repeat(False))

    @overload
    def __getitem__(self, index: int) -> Outcome: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Outcome]: ...
    def __getitem__(self, index: int | slice) -> Outcome | Sequence[Outcome]:
        if isinstance(index, slice):
            return list(self)[index]
        return range(self.first, self.first + self.n)[index], False


@dataclass
class AppendResult:
    tail: int
    closed: bool
    producer_duplicate: bool = False
    producer: Producer | None = None
    producer_seq: int | None = None  # highest accepted seq of the producer's epoch
    # (offset, duplicate) per message; offset None when a duplicate's original is unknown
    results: Sequence[Outcome] = field(default_factory=list)


def _session(batch: Batch, state: StreamState, producer_id: str) -> sessions.Session | None:
    key = (state.id, producer_id)
    if key not in batch.sessions:
        row = sql.session(batch.conn, state.id, producer_id)
        batch.sessions[key] = sessions.Session(*row) if row else None
    found: sessions.Session | None = batch.sessions[key]
    return found


def live_stream(state: StreamState | None, name: str, now: int) -> StreamState:
    if state is None or (state.expired(now) and not state.deleted):
        raise NotFound(f"stream {name} not found")
    if state.deleted:
        raise Gone(f"stream {name} was deleted")
    return state


def in_use(state: StreamState | None, name: str, batch: Batch) -> StreamState:
    """``live_stream`` for an op that uses the stream (a consumer group's fetch, ack, nack,
    seek; a replay; a cursor's commit): like a read or an append, it renews a TTL stream's
    idle countdown. A group working through a ``Stream-TTL`` station saw it expire under its
    leases (acks 404, the unread messages deleted): only Durable Streams reads and appends
    renewed it."""
    state = live_stream(state, name, batch.now)
    if state.ttl_seconds is not None:
        state.accessed_at = batch.now
        batch.dirty[state.id] = state
    return state


def _check_content_type(state: StreamState, req: AppendRequest) -> None:
    """A body sent as another type than the stream's, or as none, is a 409 (PROTOCOL.md
    §5.2); a close alone sends no body. A body that could not be read and came without a
    type is answered by what reading it found."""
    if not req.messages and (req.body_error is None or req.content_type is None):
        return
    if req.content_type is None or not same_content_type(req.content_type, state.content_type):
        raise Conflict(
            f"Content-Type {req.content_type!r} does not match the stream's {state.content_type!r}",
            "Content-Type",
        )


def append(batch: Batch, window: IdWindow, req: AppendRequest) -> AppendResult:
    state = live_stream(batch.stream(req.name), req.name, batch.now)
    producer = req.producer

    if state.closed:
        closer = (state.closer_id, state.closer_epoch, state.closer_seq)
        if producer is not None and closer == (producer.id, producer.epoch, producer.seq):
            return AppendResult(state.tail, True, True, producer, producer.seq)
        # A close-only request is idempotent, except from a producer: only the tuple that
        # closed the stream is its retry (PROTOCOL.md §5.2.1); any other may be a fenced one.
        if req.close and not req.messages and req.body_error is None and producer is None:
            return AppendResult(state.tail, True)
        repeated = _closing_repeat(batch, window, state, req)
        if repeated is not None:
            return repeated
        raise StreamClosed(state.tail)
    if req.body_error is not None:
        # A body read as another type than the stream's: the mismatch is the answer (409,
        # PROTOCOL.md §5.2), not what reading it as that type ran into.
        _check_content_type(state, req)
        raise req.body_error
    if not req.messages and not req.close:
        raise BadRequest("an append needs a body (or Stream-Closed: true to close)")
    _check_content_type(state, req)

    session = None
    if producer is not None:
        session = _session(batch, state, producer.id)
        verdict = sessions.decide(session, producer)
        if verdict is Verdict.STALE_EPOCH:
            assert session is not None
            raise Forbidden("stale Producer-Epoch", "Producer-Epoch", epoch=session.epoch)
        if verdict is Verdict.NEW_EPOCH_GAP:
            raise NewEpochGap(producer.seq, producer, req.name)
        if verdict is Verdict.GAP:
            raise SequenceGap(
                sessions.expected_seq(session, producer), producer.seq, producer, req.name
            )
        if verdict is Verdict.DUPLICATE:
            assert session is not None
            originals = _original_offsets(batch, window, state, req)
            return AppendResult(
                state.tail, state.closed, True, producer, session.last_seq, originals
            )

    if (
        req.stream_seq is not None
        and state.stream_seq is not None
        and (req.stream_seq <= state.stream_seq)
    ):
        # A retry whose messages are all stored already (by their Msg-Ids) is a duplicate
        # (CONTRACT.md §3: the success a stored append would get), not this 409, which left
        # the client unable to tell whether its message had been stored.
        # A producer's request goes the producer's way (its session must move on with it).
        known = _all_known(batch, window, state, req) if producer is None else None
        if known is not None and not req.close:
            return AppendResult(state.tail, state.closed, False, None, None, known)
        raise Conflict(
            f"Stream-Seq {req.stream_seq!r} is not above {state.stream_seq!r}", "Stream-Seq"
        )

    results: Sequence[Outcome]
    before = state.tail
    if not req.msg_ids:
        # The common case, kept tight: every message is new.
        base, now, n = state.tail, batch.now, len(req.messages)
        if n > 1 and state.is_json and not req.headers:
            # One row for the whole request: positions stay per message, the row is shared.
            data = framing.joined(req.messages)
            batch.rows.append((state.id, base + n, data, None, None, now, n))
        else:
            headers = req.headers or [None] * n
            batch.rows.extend(
                (state.id, base + k, data, None, headers[k - 1], now, 1)
                for k, data in enumerate(req.messages, 1)
            )
        state.tail += n
        state.msg_count += n
        state.byte_count += framing.size(req.messages)
        results = Fresh(base, n)
    else:
        headers = req.headers or [None] * len(req.messages)
        results = _append_tagged(batch, window, state, req, headers)
    if state.tail > before:  # stored: a maxAgeMs rule drops it by then
        retention.look_by(batch, state, retention.max_age_ms(state))

    if producer is not None:
        batch.sessions[(state.id, producer.id)] = sessions.Session(producer.epoch, producer.seq)
        batch.dirty_sessions.add((state.id, producer.id))
    if req.stream_seq is not None and (state.tail > before or req.close):
        # Not taken by a request that stored nothing (every message a duplicate by its id):
        # the writer's next message, sent with that seq, was refused as not above it.
        state.stream_seq = req.stream_seq
    if req.close:
        state.closed = True
        if producer is not None:
            state.closer_id, state.closer_epoch, state.closer_seq = (
                producer.id,
                producer.epoch,
                producer.seq,
            )
    state.accessed_at = batch.now
    batch.touch(state)
    return AppendResult(
        state.tail, state.closed, False, producer, producer.seq if producer else None, results
    )


def _all_known(
    batch: Batch, window: IdWindow, state: StreamState, req: AppendRequest
) -> list[Outcome] | None:
    """Each message's (offset, duplicate) when every one has a Msg-Id the station's window
    holds, so a retry stores nothing; else None."""
    if not req.msg_ids or not req.messages or any(m is None for m in req.msg_ids):
        return None
    wanted = [m for m in req.msg_ids if m is not None]
    known = window.lookup_many(batch, state, wanted)
    if any(m not in known for m in wanted):
        return None
    return [(known[m] - 1, True) for m in wanted]


def _closing_repeat(
    batch: Batch, window: IdWindow, state: StreamState, req: AppendRequest
) -> AppendResult | None:
    """A closing request whose messages are all stored already, known by their Msg-Ids (the
    retry of the request that closed the stream, say): what it asks for holds, so it is
    answered as the duplicate it is, as a producer's closing retry is, not 409 "closed",
    which left the client unable to tell whether its last message had been stored."""
    if not req.close or req.producer is not None or req.body_error is not None:
        return None
    known = _all_known(batch, window, state, req)
    if known is None:
        return None
    return AppendResult(state.tail, True, False, None, None, known)


def _append_tagged(
    batch: Batch,
    window: IdWindow,
    state: StreamState,
    req: AppendRequest,
    headers: list[str | None],
) -> list[tuple[int | None, bool]]:
    """Messages with Msg-Ids: those still in the window are duplicates, not stored.

    The stored ones get consecutive positions, so on a JSON stream they share one row, as a
    plain append's do (their ids and headers packed beside the data, see ``pack``): a row per
    message cost more than all the rest of the request."""
    assert req.msg_ids is not None
    known = window.lookup_many(batch, state, [m for m in req.msg_ids if m is not None])
    results: list[tuple[int | None, bool]] = []
    stored: dict[str, int] = {}
    datas: list[bytes] = []
    ids: list[str | None] = []
    kept: list[str | None] = []
    tail = state.tail
    for data, msg_id, header in zip(req.messages, req.msg_ids, headers, strict=True):
        if msg_id is not None:
            # Ids repeated inside one request are duplicates of the first.
            original = stored.get(msg_id) or known.get(msg_id)
            if original is not None:
                results.append((original - 1, True))
                continue
            stored[msg_id] = tail + 1
        results.append((tail, False))
        tail += 1
        datas.append(data)
        ids.append(msg_id)
        kept.append(header)
    n, now = len(datas), batch.now
    if n > 1 and state.is_json:
        batch.rows.append((state.id, tail, SEP.join(datas), pack(ids), pack(kept), now, n))
    else:
        batch.rows.extend(
            (state.id, state.tail + k, data, msg_id, header, now, 1)
            for k, (data, msg_id, header) in enumerate(zip(datas, ids, kept, strict=True), 1)
        )
    state.tail = tail
    state.msg_count += n
    state.byte_count += sum(map(len, datas))
    window.remember(batch, state, stored)
    return results


def _original_offsets(
    batch: Batch, window: IdWindow, state: StreamState, req: AppendRequest
) -> list[tuple[int | None, bool]]:
    """For a producer duplicate: where its tagged messages were stored, where still known."""
    if not req.msg_ids:
        return []
    out: list[tuple[int | None, bool]] = []
    for msg_id in req.msg_ids:
        original = window.lookup(batch, state, msg_id) if msg_id else None
        # An id that has left the window no longer says where its message went.
        out.append((None if original is None else original - 1, True))
    return out
