"""The idempotent producer (Durable Streams §5.2.1): fire-and-forget appends, batched and
pipelined, exactly once per (producer id, epoch, seq).

Beyond the TypeScript client it retries: a batch that got no answer, a 429 or a 5xx is sent again
with the *same* (epoch, seq), so a batch the server already stored comes back 204 (duplicate =
success) and is never stored twice; batches keep their order because a later batch that overtook
a retrying one gets a 409 "expected an earlier seq", waits for it, and is sent again.

Memory is bounded: ``append()`` raises ``BufferFull`` while ``max_buffered_bytes`` of data are
unacknowledged; ``await wait_for_capacity()`` waits for room.

Throughput: JSON values are encoded with orjson (json.dumps where orjson would differ) straight
into the batch being filled; a batch whose ``linger_ms`` is up while every send slot is busy
keeps filling until one is free, as Kafka's producer does; and ``wait_for_capacity()`` in a tight
append loop yields to the event loop now and then, so batches are sent while the loop goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from stations.client.batching import OBJ, RAW, TEXT, Batch, batch_body, json_bytes
from stations.client.core import check_url
from stations.client.errors import (
    BufferFull,
    ConnectionFailed,
    EpochInUse,
    PayloadTooLarge,
    ProducerClosed,
    ProducerFenced,
    SequenceGap,
    ServerError,
    StationsError,
    error_for,
    may_have_acted,
)
from stations.client.handle import StationHandle
from stations.client.http import Http, Reply
from stations.client.models import is_json_type
from stations.client.retry import DEFAULT_RETRY, Backoff, RetryPolicy
from stations.client.session import ProducerSession

logger = logging.getLogger("stations.client.producer")

_MISSING: Any = object()

# wait_for_capacity() yields to the event loop at least once in this many calls (about 1 ms of
# appending), so that a loop that never awaits anything else still lets sends and answers run.
_YIELD_EVERY = 1000

_CONTAINERS = (dict, list)  # tuples, not X | Y: no union object built on every call
_BYTES = (bytes, bytearray, memoryview)


class IdempotentProducer:
    """Exactly-once, ordered, batched appends to one stream.

    ``target`` is a ``Station`` (its client's session and token are used) or a stream URL such as
    ``http://host/v1/stream/orders`` on any Durable Streams server.

    For a JSON stream ``append()`` takes any JSON value (``bytes`` are taken as one already
    serialised JSON value); for other streams ``bytes`` or ``str`` (UTF-8).
    """

    def __init__(
        self,
        target: StationHandle | str,
        producer_id: str,
        *,
        epoch: int = 0,
        auto_claim: bool = False,
        max_batch_bytes: int = 1024 * 1024,
        max_batch_messages: int = 100_000,
        linger_ms: float = 5,
        max_in_flight: int = 5,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        on_error: Callable[[StationsError], None] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        content_type: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if min(max_batch_bytes, max_batch_messages, max_in_flight) <= 0 or linger_ms < 0:
            raise ValueError("linger_ms must be >= 0, max_* must be > 0")
        if max_buffered_bytes < max_batch_bytes:
            raise ValueError("max_buffered_bytes must be at least max_batch_bytes")
        if isinstance(target, str):
            check_url(target)
            self.url = target
            self._http = Http(token, headers=headers)
            self._owns_http = True
        else:
            self.url = target.url
            self._http = target.client.http
            self._owns_http = False
            content_type = content_type or target.content_type
        self._session = ProducerSession(producer_id, epoch=epoch, content_type=content_type)
        self.producer_id = producer_id
        self.auto_claim = auto_claim
        self.max_batch_bytes = max_batch_bytes
        # A server refuses an append of more messages than its --max-append-messages (413,
        # default 524288; 100000 before): a megabyte of tiny messages ("0") is half a million.
        self.max_batch_messages = max_batch_messages
        self.linger = linger_ms / 1000
        self.max_in_flight = max_in_flight
        self.max_buffered_bytes = max_buffered_bytes
        self.on_error = on_error
        self.retry = retry
        self._content_type = content_type
        self._json: bool | None = None if content_type is None else is_json_type(content_type)
        self._resolving: asyncio.Task[None] | None = None

        # Until a batch of the current epoch succeeded, only one batch is in flight: a server
        # that sees seq 1 of a new epoch before seq 0 refuses it (400), and with auto_claim the
        # first answer may move us to another epoch anyway.
        self._established = False
        self._orders = 0
        # The batch being filled: messages joined in _pending_data once the content type is
        # known (cheaper than a list of small bytes objects kept alive), else in _pending_items.
        self._pending_data = bytearray()
        self._pending_items: list[tuple[int, bytes]] | None = None
        self._pending_count = 0
        self._pending_bytes = 0
        # A batch was sealed since wait_for_capacity() last yielded to the event loop, and how
        # often it returned at once since: see wait_for_capacity().
        self._kick = False
        self._calls_since_yield = 0
        self._linger_timer: asyncio.TimerHandle | None = None
        # The pending batch has lingered long enough but every send slot was busy: it goes on
        # growing (up to max_batch_bytes) and is sealed as soon as a slot is free.
        self._linger_due = False
        self._queue: deque[Batch] = deque()  # sealed, not yet sent
        self._unsettled: deque[Batch] = deque()  # sealed, not yet settled, in order
        self._in_flight: dict[Batch, asyncio.Task[None]] = {}
        self._buffered = 0
        self._fenced_epoch: int | None = None
        self._fence_error: ProducerFenced | None = None
        # A batch the server refused as too large (413) was split: the seq it was refused at,
        # the lowest if several were. Nothing is sent until no batch is in flight, then
        # everything queued is renumbered from there (see _split).
        self._split_seq: int | None = None
        # The server forgot this producer (see the gap below): claim a new epoch even
        # without auto_claim.
        self._forgotten = False
        self._error: StationsError | None = None
        self._closed = False
        self._close_task: asyncio.Task[str | None] | None = None
        self._changed = asyncio.Event()
        self._last_offset: str | None = None
        if not isinstance(target, str):
            # Closing its client flushes it, however it was made (station.producer() or
            # directly): appends are only queued, and the session is the client's.
            target.client._adopt(self)

    # -- state ----------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._session.epoch

    @property
    def next_seq(self) -> int:
        return self._session.next_seq

    @property
    def buffered_bytes(self) -> int:
        """Bytes appended and not yet acknowledged by the server."""
        return self._buffered

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def last_offset(self) -> str | None:
        """The greatest ``Stream-Next-Offset`` of an append this producer stored."""
        return self._last_offset

    @property
    def error(self) -> StationsError | None:
        """The error that stopped the producer, if any."""
        return self._error

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, done: Callable[[], bool]) -> None:
        while True:
            changed = self._changed
            if done():
                return
            await changed.wait()

    # -- appending ------------------------------------------------------------------------------

    def append(self, data: Any) -> None:
        """Queue one message and return at once; it is sent within ``linger_ms``, when the batch
        reaches ``max_batch_bytes`` or ``max_batch_messages``, or on ``flush()``. Needs a
        running event loop.

        The batches go out while the caller's code lets the event loop run: any ``await``, and
        ``await wait_for_capacity()`` in an append loop does it whenever a batch is ready."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ProducerClosed("the producer is closed")
        if self._buffered >= self.max_buffered_bytes:
            raise BufferFull(
                f"{self._buffered} bytes are waiting for the server "
                f"(max_buffered_bytes={self.max_buffered_bytes}); await wait_for_capacity()"
            )
        kind, payload = self._encode(data)
        size = len(payload) + 1  # + the separator in a JSON array
        if self._pending_count and self._pending_bytes + size > self.max_batch_bytes:
            self._seal()
        if self._pending_items is not None or self._json is None:
            if self._pending_items is None:  # the first message of the batch decides
                self._pending_items = []
            self._pending_items.append((kind, payload))
        else:
            if self._json and self._pending_count:
                self._pending_data += b","
            self._pending_data += payload
        self._pending_count += 1
        self._pending_bytes += size
        self._buffered += size
        if (
            self._pending_bytes >= self.max_batch_bytes
            or self._pending_count >= self.max_batch_messages
        ):
            self._seal()
        elif self._linger_timer is None and not self._linger_due:
            self._linger_timer = asyncio.get_running_loop().call_later(self.linger, self._lingered)

    def _encode(self, data: Any) -> tuple[int, bytes]:
        if isinstance(data, _CONTAINERS) and self._json:  # the common case first
            return RAW, json_bytes(data)
        if isinstance(data, _BYTES):
            return RAW, bytes(data)
        if isinstance(data, str):
            if self._json is None:
                return TEXT, data.encode()
            return RAW, (json_bytes(data) if self._json else data.encode())
        if self._json is False:
            raise TypeError(f"a {self._content_type} stream takes bytes or str, not {type(data)}")
        return (OBJ if self._json is None else RAW), json_bytes(data)

    def _lingered(self) -> None:
        """``linger_ms`` after the first message of the pending batch: seal it, unless it would
        only wait in the queue; then it keeps filling until a send slot is free (as Kafka's
        producer does), so that a busy producer sends fewer, fuller batches."""
        self._linger_timer = None
        if self._slot_free():
            self._seal()
        else:
            self._linger_due = True

    def _slot_free(self) -> bool:
        limit = self.max_in_flight if self._established else 1
        return not self._queue and len(self._in_flight) < limit

    def _seal(self) -> None:
        """Close the pending batch and queue it for sending."""
        self._linger_due = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._pending_count:
            return
        data = None if self._pending_items is not None else bytes(self._pending_data)
        batch = Batch(data, self._pending_items, self._pending_bytes, self._orders)
        self._orders += 1
        self._clear_pending()
        self._kick = True
        batch.epoch, batch.seq = self._session.take_seq()
        self._queue.append(batch)
        self._unsettled.append(batch)
        self._pump()

    def _clear_pending(self) -> None:
        self._pending_data = bytearray()
        self._pending_items = None
        self._pending_count = self._pending_bytes = 0

    def _pump(self) -> None:
        """Start sending queued batches, up to the in-flight limit."""
        if self._error is not None or self._fenced_epoch is not None or self._split_seq is not None:
            return
        if self._json is None:
            if self._resolving is None:
                self._resolving = asyncio.get_running_loop().create_task(self._resolve())
            return
        limit = self.max_in_flight if self._established else 1
        while self._queue and len(self._in_flight) < limit:
            batch = self._queue.popleft()
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._in_flight[batch] = task
        if self._linger_due and self._slot_free():
            self._seal()  # queues the batch that lingered and sends it (calls _pump again)

    async def start(self) -> None:
        """Learn the stream's content type now (otherwise done before the first batch), so a
        missing stream raises ``StationNotFound`` here. ``async with`` calls it."""
        if self._json is None:
            if self._resolving is None:
                self._resolving = asyncio.get_running_loop().create_task(self._resolve())
            await asyncio.shield(self._resolving)
        if self._error is not None:
            raise self._error

    async def _resolve(self) -> None:
        """Learn the stream's content type (HEAD) before the first batch goes out."""
        backoff = Backoff(self.retry)
        while True:
            try:
                reply = await self._http.request("HEAD", self.url)
                if reply.status != 200:
                    raise error_for(reply.status, reply.headers, b"", what=f"HEAD {self.url}")
                break
            except StationsError as exc:
                try:
                    await backoff.wait(exc)
                except StationsError:
                    self._fail(exc)
                    await self._release()
                    return
            except Exception as exc:
                # Not an answer (the caller's own aiohttp session closed, a bug): stop loudly.
                # Lost in this background task, it left flush() waiting forever.
                error = StationsError(f"learning the content type of {self.url} failed: {exc!r}")
                error.__cause__ = exc
                self._fail(error)
                await self._release()
                return
        self._content_type = reply.header("Content-Type") or "application/octet-stream"
        self._session.content_type = self._content_type
        self._json = is_json_type(self._content_type)
        self._pump()

    # -- sending ----------------------------------------------------------------------------------

    def _body(self, batch: Batch) -> bytes:
        return batch_body(batch, bool(self._json), self._content_type)

    async def _send(self, batch: Batch) -> None:
        try:
            await self._send_until_settled(batch)
        except StationsError as exc:
            self._settle(batch, exc)
        except Exception as exc:  # a bug or a TypeError in _body: fail loudly, not silently
            self._settle(batch, StationsError(f"sending a batch failed: {exc!r}"))
        except BaseException:  # cancelled, or the loop is going away: send nothing more
            self._in_flight.pop(batch, None)
            raise
        self._in_flight.pop(batch, None)
        self._after_send()

    async def _send_until_settled(self, batch: Batch) -> None:
        body = self._body(batch)
        backoff = Backoff(self.retry)
        while True:
            if self._error is not None:
                raise self._error
            if self._held(batch):
                self._queue.append(batch)  # renumbered once nothing is in flight
                return
            headers = self._session.headers(batch.epoch, batch.seq)
            try:
                reply = await self._http.request("POST", self.url, data=body, headers=headers)
            except StationsError as exc:
                if _maybe_stored(exc):
                    batch.maybe_stored = True
                # Same (epoch, seq) again: the server deduplicates.
                await self._retry_or_give_up(backoff, exc, batch)
                continue
            if reply.status == 204 and not batch.maybe_stored:
                # Nothing of ours can have been stored under this (epoch, seq): another
                # instance used it, and taking the 204 as success would drop this batch.
                self._fenced(batch, self._epoch_in_use(batch.epoch, batch.seq))
                return
            if reply.status in (200, 204):
                self._stored(batch, reply)
                return
            if _maybe_stored(reply):
                batch.maybe_stored = True
            error = self._session.error(reply, batch.epoch, batch.seq)
            if isinstance(error, ProducerFenced):
                self._fenced(batch, error)
                return
            if isinstance(error, PayloadTooLarge) and self._split(batch, error):
                return
            if (
                isinstance(error, SequenceGap)
                and error.expected_seq == 0 < batch.seq
                and self._earlier_settled(batch)
            ):
                # Every batch before this one was stored, yet the server expects seq 0: it
                # has forgotten this producer (idle past the server's --producer-expiry-ms,
                # 7 days by default). A new epoch from seq 0 stores this batch and the rest
                # once each: none of them can have been stored, an earlier attempt of this
                # one whose answer was lost included (stored, it would have left a session
                # just written, and this attempt would be its duplicate).
                self._forgotten = True
                self._fenced_epoch = max(self._fenced_epoch or 0, batch.epoch)
                self._queue.append(batch)
                return
            if isinstance(error, SequenceGap) and error.expected_seq < batch.seq:
                # An earlier batch has not arrived yet (it is in flight or being retried): wait
                # for it, then send this one again.
                earlier_done = self._earlier_settled(batch)
                await self._wait_until(
                    lambda: (
                        self._earlier_settled(batch)
                        or self._error is not None
                        or self._fenced_epoch is not None
                        or self._held(batch)
                    )
                )
                if self._fenced_epoch is not None and self._error is None:
                    self._fenced(batch, None)
                    return
                if self._held(batch):
                    continue  # back to the queue at the top of the loop
                if earlier_done:  # nothing to wait for, yet the server still wants another seq
                    try:
                        await backoff.wait(_as_retryable(error))
                    except StationsError:
                        raise error from None
                continue
            await self._retry_or_give_up(backoff, error, batch)  # unless retryable (429, 5xx)

    async def _retry_or_give_up(self, backoff: Backoff, exc: StationsError, batch: Batch) -> None:
        """Wait before the next attempt, or raise ``exc`` saying what became of the batch:
        the last attempt's error alone said ``sent=False`` (a refused connection) when an
        earlier attempt had perhaps stored it (found by a review)."""
        try:
            await backoff.wait(exc)
        except StationsError as final:
            if batch.maybe_stored:
                if isinstance(final, ConnectionFailed):
                    final.sent = True
                final.add_note(
                    f"producer {self.producer_id} gave up on epoch {batch.epoch} seq "
                    f"{batch.seq}: an earlier attempt's answer was lost, so that batch may "
                    "have been stored"
                )
            raise

    def _epoch_in_use(self, epoch: int, seq: int) -> EpochInUse:
        return EpochInUse(
            f"producer {self.producer_id} epoch {epoch} seq {seq} was already stored before "
            "this producer sent it: another instance used this producer id and epoch (start "
            "each run with a higher epoch, or set auto_claim=True)",
            current_epoch=epoch,
        )

    def _split(self, batch: Batch, error: PayloadTooLarge) -> bool:
        """The server refused ``batch`` as too large (413: more messages than its
        ``--max-append-messages``, or a body over its size limit). Nothing was stored and the
        seq is unused, so the batch becomes smaller ones, the first under the same (epoch,
        seq), the rest numbered after it once the batches in flight are back (see
        ``_after_send``), and later batches are no larger than the limit the server named.
        False when it cannot be split (one message, or not a JSON stream): the 413 is final."""
        elements = _json_elements(self._body(batch)) if self._json else None
        if elements is None or len(elements) < 2:
            return False
        count = len(elements)
        limit = _message_limit(error)
        if limit is not None and limit < count:
            self.max_batch_messages = min(self.max_batch_messages, limit)
            per_part = limit
        else:  # the body was too large in bytes (or the server named no limit): halves
            per_part = (count + 1) // 2
            self.max_batch_bytes = min(self.max_batch_bytes, max(1, batch.size // 2))
        parts: list[Batch] = []
        given = 0
        for start in range(0, count, per_part):
            chunk = elements[start : start + per_part]
            # Buffer accounting: the parts' sizes add up to the batch's, as _settle subtracts.
            size = (
                batch.size - given
                if start + per_part >= count
                else batch.size * len(chunk) // count
            )
            given += size
            part = Batch(b",".join(chunk), None, size, batch.order, batch.epoch, batch.seq)
            parts.append(part)
        at = self._unsettled.index(batch)
        del self._unsettled[at]
        for i, part in enumerate(parts):
            self._unsettled.insert(at + i, part)
        self._queue.extend(parts)
        batch.settled = True  # replaced by its parts
        if self._split_seq is None or batch.seq < self._split_seq:
            self._split_seq = batch.seq
        logger.info(
            "producer %s: the server refused %d messages in one append (%s); sending them in "
            "%d appends",
            self.producer_id,
            count,
            error.message,
            len(parts),
        )
        self._notify()  # batches waiting for an earlier one go back to the queue
        return True

    def _held(self, batch: Batch) -> bool:
        """Whether ``batch`` comes after a batch being split: it must not be sent under its
        seq, which now belongs to a part, and it is numbered again."""
        return self._split_seq is not None and batch.seq > self._split_seq

    def _in_order(self, batches: deque[Batch]) -> list[Batch]:
        """``batches`` in the order they were appended (a split batch's parts share its
        ``order``; ``_unsettled`` holds them in place)."""
        rank = {b: i for i, b in enumerate(self._unsettled)}
        return sorted(batches, key=lambda b: rank.get(b, len(rank)))

    def _earlier_settled(self, batch: Batch) -> bool:
        return not self._unsettled or self._unsettled[0] is batch

    def _stored(self, batch: Batch, reply: Reply) -> None:
        offset = reply.header("Stream-Next-Offset")
        if reply.status == 200 and offset and (self._last_offset or "") < offset:
            self._last_offset = offset
        if not self._established:
            self._established = True
        self._settle(batch, None)

    def _settle(self, batch: Batch, error: StationsError | None) -> None:
        if batch.settled:
            return
        batch.settled = True
        if batch in self._unsettled:
            self._unsettled.remove(batch)
        self._buffered -= batch.size
        if error is not None:
            self._fail(error)
        self._notify()

    def _fail(self, error: StationsError) -> None:
        """Stop for good: with a batch lost, later ones cannot keep their order."""
        if self._error is not None:
            return
        self._error = error
        logger.warning("producer %s stopped: %s", self.producer_id, error)
        dropped = list(self._unsettled)
        self._queue.clear()
        self._clear_pending()
        self._linger_due = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        for batch in dropped:
            if batch not in self._in_flight:
                batch.settled = True
                self._unsettled.remove(batch)
        self._buffered = sum(b.size for b in self._unsettled)
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception:
                logger.exception("on_error raised")
        self._notify()

    def _fenced(self, batch: Batch, exc: ProducerFenced | None) -> None:
        """A newer epoch owns this producer id. The batch goes back to the queue; once nothing
        is in flight any more, ``_after_send`` claims a new epoch or gives up."""
        if exc is not None:
            self._fenced_epoch = max(self._fenced_epoch or 0, exc.current_epoch)
            self._fence_error = exc
        self._queue.append(batch)

    def _after_send(self) -> None:
        if self._fenced_epoch is not None and not self._in_flight:
            fenced, self._fenced_epoch = self._fenced_epoch, None
            forgotten, self._forgotten = self._forgotten, False
            if not self.auto_claim and not forgotten:
                assert self._fence_error is not None
                self._fail(self._fence_error)
                return
            # Claim the next epoch and renumber everything not yet stored from seq 0, in order.
            # A batch whose first attempt got no answer under the old epoch may have been stored
            # then: across an epoch change delivery is at-least-once (protocol §5.2.1).
            self._session.claim_after(fenced)
            self._established = False
            self._split_seq = None  # renumbered here too
            pending = self._in_order(self._queue)
            for batch in pending:
                batch.epoch, batch.seq = self._session.take_seq()
                batch.maybe_stored = False
            self._queue = deque(pending)
            logger.info("producer %s claimed epoch %d", self.producer_id, self._session.epoch)
        elif self._split_seq is not None and not self._in_flight and self._error is None:
            # Every batch not yet stored is queued: number them again from the refused seq, in
            # order (the server stored nothing at or after it). maybe_stored goes: none of
            # these seqs can hold anything of ours.
            self._session.next_seq, self._split_seq = self._split_seq, None
            pending = self._in_order(self._queue)
            for batch in pending:
                batch.epoch, batch.seq = self._session.take_seq()
                batch.maybe_stored = False
            self._queue = deque(pending)
        self._notify()
        self._pump()

    # -- waiting and ending -------------------------------------------------------------------------

    async def wait_for_capacity(self) -> None:
        """Wait until ``append()`` accepts data again (the buffer is below
        ``max_buffered_bytes``). Raises the producer's error if it stopped.

        Also the point where a tight append loop lets the producer work: when there is room it
        still yields to the event loop once a batch was sealed, and every so many calls, so that
        batches go out (and answers come in) while the caller goes on appending."""
        if self._buffered < self.max_buffered_bytes and self._error is None:
            self._calls_since_yield += 1
            if self._kick or self._calls_since_yield >= _YIELD_EVERY:
                self._kick = False
                self._calls_since_yield = 0
                await asyncio.sleep(0)
            return
        if self._buffered >= self.max_buffered_bytes:
            self._seal()  # no point lingering while the caller is blocked
        await self._wait_until(
            lambda: self._buffered < self.max_buffered_bytes or self._error is not None
        )
        if self._error is not None:
            raise self._error

    async def flush(self) -> None:
        """Send what is pending and wait until every appended message is acknowledged."""
        self._seal()
        await self._wait_until(lambda: not self._unsettled or self._error is not None)
        if self._error is not None:
            raise self._error

    async def close(self, final_message: Any = _MISSING) -> str | None:
        """Flush, then close the stream (EOF), appending ``final_message`` atomically if given.

        Idempotent: later calls return the same final offset. Returns ``Stream-Next-Offset``."""
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.get_running_loop().create_task(self._close(final_message))
        return await asyncio.shield(self._close_task)

    async def _close(self, final_message: Any) -> str | None:
        try:
            await self.flush()
            await self.start()
            body = b""
            if final_message is not _MISSING:
                final = Batch(None, [self._encode(final_message)], 0, -1)
                body = self._body(final)
            offset = await self._post_close(body)
            if offset and (self._last_offset or "") < offset:
                self._last_offset = offset
            return offset
        finally:
            await self._release()

    async def _post_close(self, body: bytes) -> str | None:
        backoff = Backoff(self.retry)
        session = self._session
        seq = session.next_seq
        maybe_stored = False  # as for a batch: a 204 before then is another instance's
        while True:
            headers = session.headers(session.epoch, seq, close=True, body=bool(body))
            try:
                reply = await self._http.request("POST", self.url, data=body, headers=headers)
            except StationsError as exc:
                if _maybe_stored(exc):
                    maybe_stored = True
                await backoff.wait(exc)
                continue
            # A close that closed says so (``Stream-Closed``, on its retry too): a 2xx without
            # it answered a duplicate of another instance's append at this seq, and nothing
            # was closed. Only a close with a final message tells "stored" (200) from
            # "duplicate" (204): one of another instance's close with its own final message.
            duplicate = reply.status in (200, 204) and not reply.flag("Stream-Closed")
            if duplicate or (reply.status == 204 and body and not maybe_stored):
                if not self.auto_claim:
                    raise self._epoch_in_use(session.epoch, seq)
                session.claim_after(session.epoch)
                seq = 0
                continue
            if reply.status in (200, 204):
                session.next_seq = seq + 1
                return reply.header("Stream-Next-Offset")
            if _maybe_stored(reply):
                maybe_stored = True
            error = session.error(reply, session.epoch, seq, what="close")
            if isinstance(error, ProducerFenced) and self.auto_claim:
                session.claim_after(error.current_epoch)
                seq = 0
                maybe_stored = False
                continue
            if isinstance(error, SequenceGap) and error.expected_seq == 0 < seq:
                # Forgotten by the server (see ``_send``): the close opens a new epoch.
                session.claim_after(session.epoch)
                seq = 0
                continue
            await backoff.wait(error)

    async def detach(self) -> None:
        """Stop without closing the stream: flush what was appended, then refuse appends.
        Errors were already reported through ``on_error`` and ``error``; none is raised."""
        self._closed = True
        try:
            await self.flush()
        except StationsError:
            pass
        finally:
            await self._release()

    async def on_client_close(self) -> None:
        """Its ``Client`` is closing: finish a close() under way, else ``detach()``."""
        if self._close_task is not None:
            await asyncio.gather(self._close_task, return_exceptions=True)
        else:
            await self.detach()

    async def _release(self) -> None:
        """Close the session this producer made (a stream-URL target). Also called when the
        content type could not be learnt: the producer is then stopped for good with nothing
        sent, and a caller that drops it after the error left the session open."""
        if self._owns_http:
            await self._http.close()

    async def __aenter__(self) -> IdempotentProducer:
        try:
            await self.start()
        except BaseException:
            # __aexit__ does not run after a failed __aenter__, and the caller has no reference
            # to close: stop here. Cancelled (a timeout), the lookup would otherwise go on and
            # reopen the session behind the caller's back.
            self._closed = True
            if self._resolving is not None:
                self._resolving.cancel()
            await self._release()
            raise
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        # Leaving the block normally flushes and detaches; the stream stays open (call close()
        # for EOF). On an exception, still deliver what was appended.
        if self._close_task is not None:
            # close() was called; its caller may have stopped waiting (a timeout): let it end
            # rather than close the session under it, and report its failure.
            (outcome,) = await asyncio.gather(self._close_task, return_exceptions=True)
            await self._release()
            if exc_type is None and isinstance(outcome, Exception):
                raise outcome
            return
        try:
            if exc_type is None:
                await self.flush()
        finally:
            await self.detach()


def _maybe_stored(outcome: StationsError | Reply) -> bool:
    """Whether a failed attempt may have stored its request all the same, so that a 204
    (duplicate) answering a retry of it is its own: it went out and no answer came back, or
    the server answered 5xx (it may fail after its commit), but not 503: nothing was decided
    (taken as maybe stored, a rerun's 204 looked like its own and its batch was dropped)."""
    if isinstance(outcome, StationsError):
        return may_have_acted(outcome)
    return outcome.status >= 500 and outcome.status != 503


_DECODER = json.JSONDecoder(
    parse_float=lambda _: None, parse_int=lambda _: None, parse_constant=lambda _: None
)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_NAMED_LIMIT = re.compile(r"at most (\d+)")


def _json_elements(body: bytes) -> list[bytes] | None:
    """The elements of a JSON array body, each as sent (only their boundaries are parsed:
    numbers are not converted), or None when it is not one."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    end = len(text.rstrip(" \t\n\r"))
    at = _JSON_SPACE.match(text).end()  # type: ignore[union-attr]
    if text[at : at + 1] != "[" or text[end - 1 : end] != "]":
        return None
    end -= 1
    at = _JSON_SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    elements: list[bytes] = []
    while at < end:
        try:
            _, stop = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        if stop > end:  # a malformed value ran into the array's closing bracket
            return None
        elements.append(text[at:stop].encode())
        at = _JSON_SPACE.match(text, stop).end()  # type: ignore[union-attr]
        if at < end:
            if text[at] != ",":
                return None
            at = _JSON_SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    return elements


def _message_limit(error: PayloadTooLarge) -> int | None:
    """The most messages an append may carry, as a 413 of this server names it ("an append
    takes at most N"); None from a 413 about bytes or from another server."""
    if "messages" not in error.message:
        return None
    match = _NAMED_LIMIT.search(error.message)
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def _as_retryable(exc: StationsError) -> StationsError:
    """A 409 that should resolve by itself, made retryable for the backoff's give-up clock."""
    retry = ServerError(exc.message, status=exc.status, headers=exc.headers)
    retry.__cause__ = exc
    return retry
