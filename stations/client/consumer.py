"""Consumer groups: leased messages with ack, nack and dead-letter.

Acks are batched: ``await msg.ack()`` queues the offset and returns; queued acks go out in one
request after ``ack_interval_ms``, before the next fetch once ``ack_batch_size`` are waiting, and
on ``close()``. ``await msg.ack(wait=True)`` sends at once (with whatever else is queued) and waits
for the server's answer. A request carries at most 10,000 offsets (the server's limit); more go
in several.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stations.client.errors import (
    BadRequest,
    Conflict,
    ConsumerClosed,
    StationsError,
    error_for,
    is_retryable,
    may_have_acted,
)
from stations.client.handle import StationHandle
from stations.client.models import GroupInfo, _time, message_data
from stations.client.retry import PATIENT_RETRY, Backoff, RetryPolicy
from stations.client.seek import SeekResult, Target
from stations.client.transaction import Transaction

logger = logging.getLogger("stations.client.consumer")

# Offsets per ack request: the server refuses more (400 naming ``offsets``).
MAX_SETTLE_OFFSETS = 10_000


def _requests(messages: list[Message]) -> list[list[Message]]:
    """``messages`` in requests of at most 10,000, no offset twice in one: the answer's
    ``unknown`` names offsets, so with two deliveries of a message in one request (a stale one
    beside the live one) it could not tell which was extended."""
    out: list[tuple[list[Message], set[str]]] = []
    for m in messages:
        for request, offsets in out:
            if len(request) < MAX_SETTLE_OFFSETS and m.offset not in offsets:
                request.append(m)
                offsets.add(m.offset)
                break
        else:
            out.append(([m], {m.offset}))
    return [request for request, _ in out]


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(eq=False)
class Message:
    """One leased delivery. Settle it with exactly one of ``ack``, ``nack`` or
    ``dead_letter``; otherwise it is delivered again once its lease expires."""

    data: Any
    headers: dict[str, str]
    msg_id: str | None
    offset: str
    delivery_count: int
    ack_deadline: datetime | None
    _consumer: Consumer = field(repr=False)
    # The ackDeadline as the server wrote it: with the offset and count it names this lease
    # (a seek or replay delivers the message again from count 1, with another deadline).
    lease: str | None = field(default=None, repr=False)

    async def ack(self, *, wait: bool = False) -> bool | None:
        """Queue the ack (batched). With ``wait=True`` send it at once (with the acks queued
        meanwhile) and return True when the server settled it, False when it no longer knew
        the delivery (it was delivered again). Raises ``ConsumerClosed`` once its consumer or
        client is closed: the ack would be lost."""
        return await self._consumer._ack(self.offset, wait)

    async def extend(self, lease_ms: int | None = None) -> bool:
        """Keep working on the message: its lease runs ``lease_ms`` from now (default the
        group's ``max_ack_time_ms``) and ``ack_deadline`` says until when. False, doing
        nothing, when this lease is no longer held (it expired: the message may be another
        consumer's delivery by now, and it is processed twice if this one goes on)."""
        return await self._consumer.extend([self], lease_ms) == 1

    def _lease_item(self) -> dict[str, Any]:
        """This delivery as the server names it (a later delivery of the message is not it)."""
        return {
            "offset": self.offset,
            "deliveryCount": self.delivery_count,
            "ackDeadline": self.lease,
        }

    async def nack(self, delay_ms: int = 0) -> bool:
        """Give the message back; it is delivered again after ``delay_ms``. False, doing
        nothing, when this lease is no longer held (it expired: the message may be another
        consumer's delivery by now, which a nack must not take away)."""
        return await self._consumer._settle_lease(lambda tx: tx.nack(self, delay_ms))

    async def dead_letter(self, reason: str | None = None) -> bool:
        """Move the message straight to the dead-letter store with ``reason`` as its error.
        False, doing nothing, when this lease is no longer held (as ``nack``)."""
        return await self._consumer._settle_lease(lambda tx: tx.dead_letter(self, reason))


class Consumer:
    """An async iterator of ``Message`` from one consumer group; ``async with`` ensures the
    group first and, on exit, sends the queued acks and hands back unread prefetched messages."""

    def __init__(
        self,
        station: StationHandle,
        group: str,
        *,
        consumer: str | None = None,
        batch_size: int = 10,
        wait_ms: int = 1000,
        max_ack_time_ms: int | None = None,
        max_msg_deliveries: int | None = None,
        start_from: str | None = None,
        ack_interval_ms: float = 50,
        ack_batch_size: int | None = None,
        retry: RetryPolicy = PATIENT_RETRY,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be > 0")
        self.station = station
        self.group = group
        self.name = consumer or default_consumer_name()
        self.batch_size = batch_size
        self.wait_ms = wait_ms
        self.ack_interval = ack_interval_ms / 1000
        self.ack_batch_size = ack_batch_size or batch_size
        self.retry = retry
        self._group_settings: dict[str, Any] = {
            "max_ack_time_ms": max_ack_time_ms,
            "max_msg_deliveries": max_msg_deliveries,
            "start_from": start_from,
        }
        self._started = False
        self._closed = False  # close() began: nothing more is handed out
        # close() sent its last acks: an ack now would be dropped, so ack() raises instead.
        self._finished = False
        self._buffer: deque[Message] = deque()
        self._acks: dict[str, list[asyncio.Future[bool]]] = {}
        self._ack_timer: asyncio.Handle | None = None
        self._ack_now = False  # _ack_timer is a flush on the next turn of the loop
        self._flushes: set[asyncio.Task[None]] = set()
        # One future per flush_acks() under way, in any task: close() waits for them, or the
        # client closed the session under an ack request and the ack was lost.
        self._sending: set[asyncio.Future[None]] = set()
        self._close_task: asyncio.Task[None] | None = None
        # close() spends one give_up_after on all its requests (acks, then the give-back), not
        # one each: with the server down it took twice as long as documented (found by a
        # review). Set, the settling requests of close share it.
        self._close_backoff: Backoff | None = None
        # A settling request of close() gave up on no answer (the server is down): the rest
        # of the give-back is skipped, its leases expire anyway.
        self._unreachable = False
        # The fetch request under way, which close() cancels: left to run, it could lease
        # a message that came meanwhile, only to give it back, a delivery used up unread.
        self._fetching: asyncio.Task[dict[str, Any]] | None = None
        self.info: GroupInfo | None = None
        # The last fetch said the station is closed and the group has nothing left: iteration
        # ends there (it waited out wait_ms again and again).
        self.station_closed = False
        # Closing its client closes it, however it was made (station.consumer() or directly).
        station.client._adopt(self)

    def _url(self, action: str) -> str:
        return self.station.group_url(self.group) + "/" + action

    async def start(self) -> GroupInfo:
        """Create the group if needed (PUT; the same settings again are a no-op)."""
        self.info = await self.station.ensure_group(self.group, **self._group_settings)
        self._started = True
        return self.info

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        while True:
            if self._closed:
                # close() gives the buffer back: a message handed out now could not be acked.
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            messages = await self.fetch()
            if self._closed:
                # close() ran while this fetch waited, and took the buffer before these came.
                await self._give_back(messages)
                raise StopAsyncIteration
            if not messages and self.station_closed:
                raise StopAsyncIteration
            self._buffer.extend(messages)

    async def fetch(
        self, max_messages: int | None = None, wait_ms: int | None = None
    ) -> list[Message]:
        """Lease up to ``max_messages`` (default ``batch_size``), waiting up to ``wait_ms`` for
        the first. Connection errors and 5xx are retried: an unanswered fetch only leaves
        leases that expire and are delivered again."""
        if not self._started:
            await self.start()
        if len(self._acks) >= self.ack_batch_size:
            await self.flush_acks()
        wait = self.wait_ms if wait_ms is None else wait_ms
        body = {"max": max_messages or self.batch_size, "waitMs": wait, "consumer": self.name}
        if self._closed:
            return []
        self._fetching = asyncio.ensure_future(
            self._call("fetch", body, read_timeout=wait / 1000 + 30)
        )
        try:
            reply = await self._fetching
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task's own cancellation
            return []  # close() ended the wait: a fetch whose client went leases nothing
        finally:
            self._fetching = None
        self.station_closed = reply.get("closed") is True
        return [self._message(view) for view in (reply.get("messages") or [])]

    def _message(self, view: dict[str, Any]) -> Message:
        return Message(
            data=message_data(view),
            headers=view.get("headers") or {},
            msg_id=view.get("id"),
            offset=view["offset"],
            delivery_count=view.get("deliveryCount", 1),
            ack_deadline=_time(view.get("ackDeadline")),
            _consumer=self,
            lease=view.get("ackDeadline"),
        )

    async def _call(
        self, action: str, body: dict[str, Any], read_timeout: float | None = None
    ) -> dict[str, Any]:
        http = self.station.client.http
        # A fetch may wait out any outage; settling gives up in time (the lease then expires
        # and the message comes again), so close() cannot hang forever.
        if action == "fetch":
            backoff = Backoff(self.retry)
        else:
            backoff = self._close_backoff or Backoff(self.station.client.retry)
        while True:
            try:
                reply = await http.request(
                    "POST", self._url(action), json_body=body, read_timeout=read_timeout
                )
                if reply.ok:
                    return reply.json() or {}
                raise error_for(
                    reply.status, reply.headers, reply.body, what=f"{action} on group {self.group}"
                )
            except StationsError as exc:
                if action == "fetch" and self._closed:
                    # Closed meanwhile (its client too, maybe): retrying would go on forever on
                    # a new session; leases it may have taken expire.
                    return {}
                # A nack or dead-letter the server may have carried out is not sent again: by
                # then the message may be another consumer's lease, which it would take away
                # (an ack by offset has no such effect). The lease expires; the message comes
                # again.
                if action in ("nack", "dead-letter") and may_have_acted(exc):
                    raise
                await backoff.wait(exc)

    # -- settling ---------------------------------------------------------------------------------

    async def _ack(self, offset: str, wait: bool) -> bool | None:
        if self._finished or self.station.client.http.final:
            # Queued now it would never be sent, and a caller told nothing processes the
            # message again after its lease; an ack made while close() runs is still sent.
            raise ConsumerClosed(
                f"the consumer of group {self.group} is closed: the ack of {offset} was not "
                "sent (the message will be delivered again)"
            )
        waiters = self._acks.setdefault(offset, [])
        future: asyncio.Future[bool] | None = None
        if wait:
            future = asyncio.get_running_loop().create_future()
            waiters.append(future)
        if len(self._acks) >= max(self.ack_batch_size, 1000):
            await self.flush_acks()
        else:
            self._schedule_flush(now=wait)
        return await future if future is not None else None

    def _schedule_flush(self, *, now: bool) -> None:
        """Flush after ``ack_interval_ms``, or with ``now`` (someone waits for the answer) on
        the next turn of the loop, so that acks made in the same moment (a gather) share a
        request."""
        loop = asyncio.get_running_loop()
        if now and not self._ack_now:
            if self._ack_timer is not None:
                self._ack_timer.cancel()
            self._ack_timer = loop.call_soon(self._flush_soon)
            self._ack_now = True
        elif self._ack_timer is None:
            self._ack_timer = loop.call_later(self.ack_interval, self._flush_soon)

    def _cancel_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._ack_now = False

    def _flush_soon(self) -> None:
        self._ack_timer = None
        self._ack_now = False
        task = asyncio.get_running_loop().create_task(self.flush_acks())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush_acks(self) -> None:
        """Send every queued ack now: one request per 10,000 offsets (the server's limit)."""
        self._cancel_timer()
        if not self._acks:
            return
        acks, self._acks = self._acks, {}
        sending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sending.add(sending)
        try:
            offsets = list(acks)
            for start in range(0, len(offsets), MAX_SETTLE_OFFSETS):
                chunk = {o: acks[o] for o in offsets[start : start + MAX_SETTLE_OFFSETS]}
                try:
                    answer = await self._call("ack", {"offsets": list(chunk)})
                except asyncio.CancelledError:
                    # The caller was cancelled (a timeout around fetch(), a shutdown): queue
                    # what was not answered again, so the next flush or close() sends it
                    # (acks by offset may go twice).
                    requeued = offsets[start:]
                    for offset in requeued:
                        self._acks.setdefault(offset, []).extend(acks[offset])
                    # And without waiting for one: an ack(wait=True) of another task among them
                    # waited forever when this consumer was not used again.
                    self._schedule_flush(now=any(acks[offset] for offset in requeued))
                    raise
                except Exception as exc:
                    # A StationsError: the leases expire and the messages come again
                    # (at-least-once, never lost). Anything else (the caller's own aiohttp
                    # session closed, a bug) too, but it must reach the waiters: in a
                    # background flush it was lost, and ack(wait=True) waited forever.
                    logger.warning(
                        "acking %d messages failed: %s",
                        len(chunk),
                        exc,
                        exc_info=not isinstance(exc, StationsError),
                    )
                    if self._close_backoff is not None and is_retryable(exc):
                        self._unreachable = True
                    for waiters in chunk.values():
                        for future in waiters:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                self._answered(chunk, answer)
        finally:
            self._sending.discard(sending)
            sending.set_result(None)

    def _answered(
        self, acks: dict[str, list[asyncio.Future[bool]]], answer: dict[str, Any]
    ) -> None:
        unknown = set(answer.get("unknown") or [])
        unheard = sorted(offset for offset in unknown if not acks.get(offset))
        if unheard:
            # Nobody waits for these answers: mostly a lease that expired while the message was
            # processed, which was then delivered again (processed twice); say so, or it goes
            # unnoticed. (A retry whose lost first attempt acked lands here too.)
            logger.warning(
                "group %s no longer knew %d acked message(s): acked already, or delivered again "
                "after their lease expired (process within max_ack_time_ms): %s",
                self.group,
                len(unheard),
                ", ".join(unheard[:10]),
            )
        for offset, waiters in acks.items():
            for future in waiters:
                if not future.done():
                    future.set_result(offset not in unknown)

    async def _settle_lease(self, settle: Callable[[Transaction], None]) -> bool:
        """Settle one delivery by its lease (offset, delivery count, deadline), through the
        transactions route, which refuses a lease no longer held: by offset alone, a consumer
        whose lease had expired nacked (or dead-lettered) the delivery another consumer was
        processing, and the message went to a third at once (found by a review)."""
        tx = self.transaction()
        settle(tx)
        try:
            await tx.commit()
        except Conflict as exc:
            if (exc.field or "").endswith(".offset"):  # not held, expired, or moved on
                return False
            raise
        return True

    async def nack(self, offsets: list[str], delay_ms: int = 0) -> int:
        answer = await self._call("nack", {"offsets": offsets, "delayMs": delay_ms})
        return int(answer.get("nacked", 0))

    async def extend(self, messages: list[Message], lease_ms: int | None = None) -> int:
        """Extend the leases of ``messages`` this consumer still holds (see
        ``Message.extend``), in one request per 10,000; returns how many it held. Each names
        its delivery (offset, delivery count, the deadline its fetch answered, which stays its
        name in a transaction): a later delivery of the same message is left alone."""
        extended = 0
        for chunk in _requests(messages):
            body: dict[str, Any] = {"consumer": self.name}
            if all(m.lease is not None for m in chunk):
                body["leases"] = [m._lease_item() for m in chunk]
            else:  # a server that answers no deadline: by offset
                body["offsets"] = [m.offset for m in chunk]
            if lease_ms is not None:
                body["leaseMs"] = lease_ms
            answer = await self._call("extend", body)
            unknown = set(answer.get("unknown") or ())
            deadline = _time(answer.get("leaseUntil"))
            for m in chunk:
                if m.offset not in unknown and deadline is not None:
                    m.ack_deadline = deadline
            extended += int(answer.get("extended", 0))
        return extended

    async def dead_letter(self, offsets: list[str], reason: str | None = None) -> int:
        body: dict[str, Any] = {"offsets": offsets}
        if reason is not None:
            body["reason"] = reason
        answer = await self._call("dead-letter", body)
        return int(answer.get("deadLettered", 0))

    def transaction(self) -> Transaction:
        """Settle messages and produce to any stations atomically:
        ``async with consumer.transaction() as tx: tx.produce(...); tx.ack(msg)``."""
        return Transaction(self.station.client, self.name)

    async def seek(self, to: Target) -> SeekResult:
        """Move this consumer's group (see ``Station.seek``); prefetched messages are dropped,
        their leases being revoked by the seek. Queued acks go first: sent after the seek, an
        ack (by offset) settled the replayed delivery of its message before it was processed."""
        # Those other tasks' background flushes have under way too: one answered after the
        # seek settled the replayed delivery (found by a review).
        await self._send_acks()
        self._buffer.clear()
        return await self.station.seek(self.group, to)

    async def on_client_close(self) -> None:
        """Its ``Client`` is closing: ``close()``."""
        await self.close()

    async def close(self) -> None:
        """Send queued acks and give back prefetched messages that were never handed out, so
        they are delivered again at once instead of after their lease (a nack: it counts toward
        ``maxMsgDeliveries`` as an expiry would, and one at its last delivery goes to the DLS;
        with a limit of 1, ``batch_size=1`` prefetches nothing). Ack requests other tasks
        have under way are waited for, and acks made while it runs are sent; after it, ``ack()``
        raises ``ConsumerClosed`` and iterating ends. A fetch waiting in another task is
        cancelled: the server leases nothing to a fetch whose client went (one answered at
        that very moment leaves leases that expire), where one left to wait could lease a
        message produced meanwhile only for it to be given back, a delivery used up unread.
        Called again, or by several tasks, it waits for the same close and then sends acks
        queued again by a cancelled flush."""
        if self._close_task is None:
            self._closed = True
            if self._fetching is not None:
                self._fetching.cancel()
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        # Shielded: a caller that stops waiting (a timeout) leaves the close running, and the
        # client's close() waits for it instead of closing the session under its requests.
        await asyncio.shield(self._close_task)
        await self.flush_acks()

    async def _close(self) -> None:
        self._close_backoff = Backoff(self.station.client.retry)
        try:
            await self._send_acks()
            unread = list(self._buffer)
            self._buffer.clear()
            if self._unreachable and unread:
                logger.warning(
                    "not giving back %d prefetched messages: the server did not answer (they "
                    "come again after their lease)",
                    len(unread),
                )
            else:
                await self._give_back(unread)
        finally:
            self._finished = True
        # Acks made while the messages were given back; none are accepted from here on.
        await self._send_acks()

    async def _send_acks(self) -> None:
        """Wait for ack requests under way (any task's), then send the queued acks."""
        while self._flushes or self._sending:
            await asyncio.gather(*self._flushes, *self._sending, return_exceptions=True)
        await self.flush_acks()

    async def _give_back(self, messages: list[Message]) -> None:
        """Nack leases nobody will process, so they come again at once (best effort: failing,
        they come again after their lease). Each names its delivery: a prefetched lease that
        expired meanwhile may be another consumer's delivery now, which a nack by offset took
        away (and sent to a third consumer, or to the DLS, while it was processed). Once the
        server did not answer in time, the rest is not tried (close() has one deadline)."""
        for chunk in _requests(messages):
            if self._unreachable:
                logger.warning("giving back %d messages skipped: no answer", len(chunk))
                continue
            offsets = {"offsets": [m.offset for m in chunk]}
            try:
                if all(m.lease is not None for m in chunk):
                    try:
                        await self._call("nack", {"leases": [m._lease_item() for m in chunk]})
                    except BadRequest as exc:
                        if exc.field != "leases":
                            raise
                        # A server from before nack took leases (a rolling upgrade that
                        # updated clients first): by offset, as then.
                        await self._call("nack", offsets)
                else:  # a server that answers no deadline: by offset
                    await self._call("nack", offsets)
            except StationsError as exc:
                logger.warning("giving back %d messages failed: %s", len(chunk), exc)
                # Retried until the deadline (a nack that may have acted is raised at once,
                # without saying the server is down).
                if self._close_backoff is not None and is_retryable(exc):
                    self._unreachable = not may_have_acted(exc)
