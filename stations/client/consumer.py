"""Consumer groups: leased messages with ack, nack and dead-letter.

Acks are batched: ``await msg.ack()`` queues the offset and returns; queued acks go out in one
request after ``ack_interval_ms``, before the next fetch once ``ack_batch_size`` are waiting, and
on ``close()``. ``await msg.ack(wait=True)`` waits for the server's answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stations.client.errors import StationsError, error_for, may_have_acted
from stations.client.handle import StationHandle
from stations.client.models import GroupInfo, _time, message_data
from stations.client.retry import DEFAULT_RETRY, PATIENT_RETRY, Backoff, RetryPolicy
from stations.client.seek import SeekResult, Target
from stations.client.transaction import Transaction

logger = logging.getLogger("stations.client.consumer")


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
        """Queue the ack (batched). With ``wait=True`` send it now-ish and return True when the
        server settled it, False when it no longer knew the delivery (it was delivered again)."""
        return await self._consumer._ack(self.offset, wait)

    async def nack(self, delay_ms: int = 0) -> bool:
        """Give the message back; it is delivered again after ``delay_ms``."""
        return await self._consumer.nack([self.offset], delay_ms) == 1

    async def dead_letter(self, reason: str | None = None) -> bool:
        """Move the message straight to the dead-letter store with ``reason`` as its error."""
        return await self._consumer.dead_letter([self.offset], reason) == 1


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
        self._closed = False
        self._buffer: deque[Message] = deque()
        self._acks: dict[str, list[asyncio.Future[bool]]] = {}
        self._ack_timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self.info: GroupInfo | None = None

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
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._buffer.extend(await self.fetch())
        return self._buffer.popleft()

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
        reply = await self._call("fetch", body, read_timeout=wait / 1000 + 30)
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
        backoff = Backoff(self.retry if action == "fetch" else DEFAULT_RETRY)
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
        waiters = self._acks.setdefault(offset, [])
        future: asyncio.Future[bool] | None = None
        if wait:
            future = asyncio.get_running_loop().create_future()
            waiters.append(future)
        if len(self._acks) >= max(self.ack_batch_size, 1000):
            await self.flush_acks()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(
                self.ack_interval, self._flush_soon
            )
        return await future if future is not None else None

    def _flush_soon(self) -> None:
        self._ack_timer = None
        task = asyncio.get_running_loop().create_task(self.flush_acks())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush_acks(self) -> None:
        """Send every queued ack now, in one request."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if not self._acks:
            return
        acks, self._acks = self._acks, {}
        try:
            answer = await self._call("ack", {"offsets": list(acks)})
        except asyncio.CancelledError:
            # The caller was cancelled (a timeout around fetch(), a shutdown): queue the acks
            # again, so the next flush or close() sends them (acks by offset may go twice).
            for offset, waiters in acks.items():
                self._acks.setdefault(offset, []).extend(waiters)
            raise
        except StationsError as exc:
            # The leases expire and the messages come again: at-least-once, never lost.
            logger.warning("acking %d messages failed: %s", len(acks), exc)
            for waiters in acks.values():
                for future in waiters:
                    if not future.done():
                        future.set_exception(exc)
            return
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

    async def nack(self, offsets: list[str], delay_ms: int = 0) -> int:
        answer = await self._call("nack", {"offsets": offsets, "delayMs": delay_ms})
        return int(answer.get("nacked", 0))

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
        await self.flush_acks()
        self._buffer.clear()
        return await self.station.seek(self.group, to)

    async def on_client_close(self) -> None:
        """Its ``Client`` is closing: ``close()``."""
        await self.close()

    async def close(self) -> None:
        """Send queued acks and give back prefetched messages that were never handed out, so
        they are delivered again at once instead of after their lease."""
        if self._closed:
            await self.flush_acks()  # those a cancelled close() queued again
            return
        self._closed = True
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self.flush_acks()
        unread = [m.offset for m in self._buffer]
        self._buffer.clear()
        if unread:
            try:
                await self.nack(unread)
            except StationsError as exc:
                logger.warning("giving back %d messages failed: %s", len(unread), exc)
