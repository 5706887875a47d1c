"""``Client`` (station management) and ``Station`` (one station's messages, readers, producers,
consumer groups and dead letters)."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

import aiohttp

from stations.client.consumer import Consumer
from stations.client.core import check_server
from stations.client.errors import (
    ConnectionFailed,
    StationsError,
    is_retryable,
    may_have_acted,
)
from stations.client.handle import ClientChild
from stations.client.http import DEFAULT_URL, LIVE_READ_TIMEOUT, Http, path_segment, stream_path
from stations.client.models import (
    ConsumerDefaults,
    CursorInfo,
    CursorPage,
    DeadLetter,
    DeadLetterPage,
    DeadLetterSettings,
    GroupInfo,
    GroupPage,
    MessagePage,
    NewMessage,
    Produced,
    Retention,
    StationInfo,
    StoredMessage,
    _time,
    message_data,
    to_wire,
)
from stations.client.producer import IdempotentProducer
from stations.client.reader import Live, StreamReader
from stations.client.retry import DEFAULT_RETRY, PATIENT_RETRY, Backoff, RetryPolicy
from stations.client.seek import SeekResult, Target, seek
from stations.client.transaction import Transaction

Settings = Mapping[str, Any]

logger = logging.getLogger("stations.client")

MAX_DLS_IDS = 10_000  # ids per DLS replay or drop request (the server's limit)


def _settings(
    *,
    idempotency_window_ms: int | None,
    retention: Retention | Settings | None,
    dls: DeadLetterSettings | Settings | None,
    consumer_defaults: ConsumerDefaults | Settings | None,
) -> dict[str, Any]:
    """The given settings as camelCase JSON; None means "leave as is / use the default"."""
    body: dict[str, Any] = {}
    if idempotency_window_ms is not None:
        body["idempotencyWindowMs"] = idempotency_window_ms
    for key, value in (
        ("retention", retention),
        ("dls", dls),
        ("consumerDefaults", consumer_defaults),
    ):
        if value is not None:
            body[key] = to_wire(value)
    return body


class Client:
    """A Stations server. ``async with Client(url, token) as client: ...`` closes the session."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        check_server(url, token, timeout)
        self.url = url.rstrip("/")
        self.http = Http(token, timeout=timeout, session=session)
        # How long produce(), a transaction's commit, a consumer's acks and a producer made
        # here (unless given its own) retry what may be retried (``give_up_after``).
        self.retry = retry
        # Producers and consumers on its session, made by its stations or directly: their
        # appends and acks are only queued, so close() delivers them before the session goes
        # (they were silently lost). Weak: one the program dropped has nothing left queued
        # (a pending timer or send keeps it alive until then).
        self._children: weakref.WeakSet[ClientChild] = weakref.WeakSet()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _adopt(self, child: ClientChild) -> None:
        self._children.add(child)

    async def close(self) -> None:
        """Flush the producers and close the consumers on this client, made by its stations
        or directly (see their ``detach()`` and ``close()``: the stream stays open), then close
        the session; later requests (a reader still tailing) raise ``StationsError``."""
        try:
            children = list(self._children)
            outcomes = await asyncio.gather(
                *(child.on_client_close() for child in children), return_exceptions=True
            )
            for child, outcome in zip(children, outcomes, strict=True):
                # Closing goes on for the others, but a failure is not swallowed unseen.
                if isinstance(outcome, Exception):
                    logger.warning(
                        "closing %r with its client failed: %s",
                        child,
                        outcome,
                        exc_info=outcome,
                    )
        finally:
            await self.http.close(final=True)

    def _api(self, *parts: str) -> str:
        return "/".join([self.url + "/api/stations", *parts])

    # -- stations -------------------------------------------------------------------------------

    async def create_station(
        self,
        name: str,
        *,
        content_type: str = "application/json",
        idempotency_window_ms: int | None = None,
        retention: Retention | Settings | None = None,
        dls: DeadLetterSettings | Settings | None = None,
        consumer_defaults: ConsumerDefaults | Settings | None = None,
    ) -> StationInfo:
        """Create a station. The same name with the same config again is fine (``created`` is
        then False); with another config it raises ``Conflict``."""
        body = {"name": name, "contentType": content_type}
        body.update(
            _settings(
                idempotency_window_ms=idempotency_window_ms,
                retention=retention,
                dls=dls,
                consumer_defaults=consumer_defaults,
            )
        )
        reply = await self.http.call("POST", self._api(), body, what=f"create station {name}")
        return StationInfo.from_wire(reply.json(), created=reply.status == 201)

    async def get_station(self, name: str) -> StationInfo:
        reply = await self.http.call(
            "GET", self._api(path_segment(name, "station")), what=f"station {name}"
        )
        return StationInfo.from_wire(reply.json())

    async def list_stations(self) -> list[StationInfo]:
        reply = await self.http.call("GET", self._api(), what="list stations")
        return [StationInfo.from_wire(v) for v in reply.json().get("stations", [])]

    async def patch_station(
        self,
        name: str,
        *,
        idempotency_window_ms: int | None = None,
        retention: Retention | Settings | None = None,
        dls: DeadLetterSettings | Settings | None = None,
        consumer_defaults: ConsumerDefaults | Settings | None = None,
        created_at: datetime | str | None = None,
    ) -> StationInfo:
        """Change mutable settings. A mapping changes only the keys it names
        (``retention={"max_age_ms": 60_000}``); a dataclass sets every field of its section.
        ``created_at`` (a ``StationInfo.created_at``): only the station created then; one
        deleted and created again since raises ``Conflict`` (field ``createdAt``) unchanged."""
        body = _settings(
            idempotency_window_ms=idempotency_window_ms,
            retention=retention,
            dls=dls,
            consumer_defaults=consumer_defaults,
        )
        reply = await self.http.call(
            "PATCH",
            self._api(path_segment(name, "station")),
            body,
            what=f"patch station {name}",
            params=_created(created_at),
        )
        return StationInfo.from_wire(reply.json())

    async def delete_station(self, name: str, *, created_at: datetime | str | None = None) -> None:
        """Delete a station with its messages, groups and dead letters. ``created_at`` (a
        ``StationInfo.created_at``): only the station created then; one deleted and created
        again since raises ``Conflict`` (field ``createdAt``) and stays."""
        await self.http.call(
            "DELETE",
            self._api(path_segment(name, "station")),
            what=f"delete station {name}",
            params=_created(created_at),
        )

    def station(self, name: str, *, content_type: str | None = None) -> Station:
        """A handle on a station (no request is made)."""
        return Station(self, name, content_type=content_type)

    def transaction(self, consumer: str | None = None) -> Transaction:
        """An atomic set of settlements and messages across stations (see
        ``stations.client.transaction``)."""
        return Transaction(self, consumer)

    def stream_url(self, name: str) -> str:
        return f"{self.url}/v1/stream/{stream_path(name)}"

    async def healthy(self) -> bool:
        try:
            reply = await self.http.request("GET", self.url + "/healthz")
        except Exception:
            return False
        return reply.status == 200


def page_params(
    limit: int, after: str | None, prefix: str | None, contains: str | None
) -> dict[str, str]:
    """The query of one page of a station's groups or cursors (the API pages both alike)."""
    params = {"limit": str(limit)}
    if after is not None:
        params["after"] = after
    if prefix:
        params["prefix"] = prefix
    if contains:
        params["contains"] = contains
    return params


class Station:
    """One station: produce with message ids, read the stream, produce idempotently, consume
    through groups, and inspect the dead-letter store."""

    def __init__(self, client: Client, name: str, *, content_type: str | None = None) -> None:
        self.client = client
        self.name = name
        self.content_type = content_type
        self.url = client.stream_url(name)

    def __repr__(self) -> str:
        return f"Station({self.name!r})"

    def _api(self, *parts: str) -> str:
        return self.client._api(path_segment(self.name, "station"), *parts)

    def group_url(self, group: str) -> str:
        return self._api("groups", path_segment(group, "group"))

    def cursor_url(self, cursor: str) -> str:
        return self._api("cursors", path_segment(cursor, "cursor"))

    async def info(self) -> StationInfo:
        info = await self.client.get_station(self.name)
        self.content_type = info.content_type
        return info

    async def patch(self, **settings: Any) -> StationInfo:
        return await self.client.patch_station(self.name, **settings)

    async def delete(self, *, created_at: datetime | str | None = None) -> None:
        await self.client.delete_station(self.name, created_at=created_at)

    # -- producing with message ids -------------------------------------------------------------

    async def produce(
        self, data: Any, msg_id: str | None = None, headers: Mapping[str, str] | None = None
    ) -> Produced:
        """Store one message. With ``msg_id``, a second message with the same id inside the
        station's idempotency window is not stored: the result says ``duplicate=True`` and
        carries the original's offset."""
        return (await self.produce_many([NewMessage(data, msg_id, headers)]))[0]

    async def produce_many(self, messages: Iterable[NewMessage | Any]) -> list[Produced]:
        """Store messages in one request (one transaction), in order; items that are not
        ``NewMessage`` are taken as the data of a message without id or headers.

        There is no batching here: a request carries at most 10000 messages, or the server's
        ``--max-append-messages`` if lower; more is refused whole (``BadRequest``, ``field``
        ``"messages"``, "at most N messages per request") and nothing is stored, so send a
        longer list in slices (as ``stations produce`` does).

        Retried on connection errors and 5xx only when every message has an id: the id makes
        the retry safe (a message stored by the lost attempt comes back as a duplicate) while
        it is in the station's idempotency window, so after a lost answer a retry is sent only
        if the server takes it (within the client's ``timeout``) inside the window counted
        from that attempt's sending; else the error is raised. Without ids only what stored
        nothing is retried: a 429, a 503, a refused connection."""
        wire = [_wire_message(m if isinstance(m, NewMessage) else NewMessage(m)) for m in messages]
        if not wire:
            return []
        safe = all("id" in m for m in wire)
        backoff = Backoff(self.client.retry)
        unsure_since: float | None = None  # when the first attempt that may have stored was sent
        while True:
            sent = time.monotonic()
            try:
                reply = await self.client.http.call(
                    "POST",
                    self._api("messages"),
                    {"messages": wire},
                    what=f"produce to {self.name}",
                )
                break
            except StationsError as exc:
                if may_have_acted(exc) and unsure_since is None:
                    unsure_since = sent
                if not (is_retryable(exc) and (safe or not may_have_acted(exc))):
                    _unsure(exc, unsure_since, safe)
                    raise
                try:
                    await backoff.wait(exc)
                    if unsure_since is not None:
                        await self._inside_window(unsure_since, exc, backoff)
                except StationsError as final:
                    raise _unsure(final, unsure_since, safe) from None
        return [Produced(r["offset"], bool(r["duplicate"])) for r in reply.json()["results"]]

    async def _inside_window(self, since: float, exc: StationsError, backoff: Backoff) -> None:
        """Return if a retry sent now reaches the server while the ids of the attempt sent at
        ``since`` (whose answer was lost) are surely remembered; else raise ``exc``. Their
        window runs from that attempt's commit, which came after its sending; the retry may be
        taken as late as the client's timeout after it is sent. The default window (2 min)
        was shorter than the SDK's default patience (2 min after the first failure, which
        itself came a timeout after the sending): a retry stored the messages again. The
        window is read from the server each time (a PATCH may have shortened it)."""
        while True:
            try:
                info = await self.client.get_station(self.name)
                break
            except StationsError as failed:
                if not is_retryable(failed):
                    exc.add_note(f"the station's idempotency window could not be read: {failed}")
                    raise exc from None
                await backoff.wait(exc)
        window_s = info.idempotency_window_ms / 1000
        late = time.monotonic() + self.client.http.timeout + WINDOW_MARGIN_S - since
        if late > window_s:
            exc.add_note(
                f"not sent again: a retry taken {late:.0f} s after the attempt whose answer was "
                f"lost would be outside the station's idempotency window ({window_s:g} s) and "
                "could store the messages twice"
            )
            raise exc

    async def browse(self, offset: str = "-1", limit: int = 100) -> MessagePage:
        """Up to ``limit`` messages from ``offset`` with their ids, headers and times."""
        reply = await self.client.http.call(
            "GET",
            self._api("messages"),
            params={"offset": offset, "limit": str(limit)},
            what=f"browse {self.name}",
        )
        body = reply.json()
        return MessagePage(
            [
                StoredMessage(
                    m["offset"],
                    m.get("id"),
                    m.get("headers") or {},
                    message_data(m),
                    _time(m.get("time")),
                )
                for m in body.get("messages", [])
            ],
            body.get("nextOffset", offset),
            bool(body.get("upToDate")),
        )

    # -- the stream ---------------------------------------------------------------------------------

    def read(
        self,
        offset: str = "-1",
        live: Live = None,
        *,
        retry: RetryPolicy = PATIENT_RETRY,
        read_timeout: float = LIVE_READ_TIMEOUT,
    ) -> StreamReader:
        """Batches from ``offset`` (``"-1"`` start, ``"now"`` tail). ``live=None`` stops when up
        to date; ``"long-poll"`` / ``"sse"`` follow the stream until it is closed."""
        return StreamReader(
            self.client.http,
            self.url,
            offset=offset,
            live=live,
            content_type=self.content_type,
            retry=retry,
            read_timeout=read_timeout,
        )

    def producer(
        self,
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
        retry: RetryPolicy | None = None,
        content_type: str | None = None,
    ) -> IdempotentProducer:
        """An ``IdempotentProducer`` on this station (see its options; ``retry`` defaults to
        the client's), on the client's session and token; closing the client flushes it."""
        return IdempotentProducer(
            self,
            producer_id,
            epoch=epoch,
            auto_claim=auto_claim,
            max_batch_bytes=max_batch_bytes,
            max_batch_messages=max_batch_messages,
            linger_ms=linger_ms,
            max_in_flight=max_in_flight,
            max_buffered_bytes=max_buffered_bytes,
            on_error=on_error,
            retry=self.client.retry if retry is None else retry,
            content_type=content_type,
        )

    # -- consumer groups ------------------------------------------------------------------------------

    def consumer(
        self,
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
    ) -> Consumer:
        """A ``Consumer`` of ``group`` (created on start if needed); see its options. Closing
        the client closes it (its queued acks are sent)."""
        return Consumer(
            self,
            group,
            consumer=consumer,
            batch_size=batch_size,
            wait_ms=wait_ms,
            max_ack_time_ms=max_ack_time_ms,
            max_msg_deliveries=max_msg_deliveries,
            start_from=start_from,
            ack_interval_ms=ack_interval_ms,
            ack_batch_size=ack_batch_size,
            retry=retry,
        )

    async def ensure_group(
        self,
        group: str,
        *,
        max_ack_time_ms: int | None = None,
        max_msg_deliveries: int | None = None,
        start_from: str | None = None,
        exists: bool | None = None,
    ) -> GroupInfo:
        """Create the group, or update its limits; ``start_from`` is ``"earliest"``,
        ``"latest"`` or an offset (only used when the group is created). ``exists=False``
        only creates (a standing group is left as it is: ``PreconditionFailed``),
        ``exists=True`` only updates (a missing group is not made: ``PreconditionFailed``):
        the server decides, in the write itself."""
        headers = {} if exists is None else {"If-Match" if exists else "If-None-Match": "*"}
        body: dict[str, Any] = {}
        if max_ack_time_ms is not None:
            body["maxAckTimeMs"] = max_ack_time_ms
        if max_msg_deliveries is not None:
            body["maxMsgDeliveries"] = max_msg_deliveries
        if start_from is not None:
            body["startFrom"] = start_from
        reply = await self.client.http.call(
            "PUT",
            self.group_url(group),
            body,
            what=f"group {group} on {self.name}",
            headers=headers,
        )
        return GroupInfo.from_wire(reply.json(), created=reply.status == 201)

    async def seek(self, group: str, to: Target) -> SeekResult:
        """Move ``group`` to ``"earliest"``, ``"now"``, an offset, or a time (an aware
        ``datetime`` or epoch ms); see ``stations.client.seek`` for leases in flight."""
        return await seek(self, group, to)

    async def groups(self) -> list[GroupInfo]:
        reply = await self.client.http.call(
            "GET", self._api("groups"), what=f"groups of {self.name}"
        )
        return [GroupInfo.from_wire(g) for g in reply.json().get("groups", [])]

    async def group_page(
        self,
        limit: int = 100,
        after: str | None = None,
        *,
        prefix: str | None = None,
        contains: str | None = None,
        order: Literal["name", "lag"] = "name",
    ) -> GroupPage:
        """One page of the station's groups by name (``limit`` 1 to 1000): those after
        ``after`` (pass the page's ``next`` for the next page), starting with ``prefix`` and
        holding ``contains`` (ignoring case), each with its figures. ``order="lag"``: the
        ``limit`` groups furthest behind, largest lag first, as one page (``next`` is None;
        ``after`` is refused). ``groups()`` answers them all at once."""
        params = page_params(limit, after, prefix, contains)
        if order != "name":
            params["order"] = order
        reply = await self.client.http.call(
            "GET", self._api("groups"), params=params, what=f"groups of {self.name}"
        )
        body = reply.json()
        return GroupPage([GroupInfo.from_wire(g) for g in body.get("groups", [])], body.get("next"))

    async def delete_group(self, group: str) -> None:
        await self.client.http.call(
            "DELETE", self.group_url(group), what=f"delete group {group} on {self.name}"
        )

    # -- reader cursors ------------------------------------------------------------------------------

    async def cursors(self) -> list[CursorInfo]:
        """Every reader cursor of the station, by name, with its lag (one request)."""
        reply = await self.client.http.call(
            "GET", self._api("cursors"), what=f"cursors of {self.name}"
        )
        return [CursorInfo.from_wire(c) for c in reply.json().get("cursors", [])]

    async def cursor_page(
        self,
        limit: int = 100,
        after: str | None = None,
        *,
        prefix: str | None = None,
        contains: str | None = None,
    ) -> CursorPage:
        """One page of the station's reader cursors by name (``limit`` 1 to 1000): those after
        ``after`` (pass the page's ``next`` for the next page), starting with ``prefix`` and
        holding ``contains`` (ignoring case). ``cursors()`` answers them all at once."""
        params = page_params(limit, after, prefix, contains)
        reply = await self.client.http.call(
            "GET", self._api("cursors"), params=params, what=f"cursors of {self.name}"
        )
        body = reply.json()
        return CursorPage(
            [CursorInfo.from_wire(c) for c in body.get("cursors", [])], body.get("next")
        )

    async def cursor(self, name: str) -> CursorInfo:
        """One reader cursor: ``CursorNotFound`` if it is missing, ``StationNotFound`` if the
        station is."""
        reply = await self.client.http.call(
            "GET", self.cursor_url(name), what=f"cursor {name} on {self.name}"
        )
        return CursorInfo.from_wire(reply.json())

    async def commit_cursor(self, name: str, offset: str) -> CursorInfo:
        """Store ``offset`` as the cursor's position (the cursor is made on its first commit;
        it may move back). ``offset`` is an offset of this station, up to its tail, or
        ``"-1"``: nothing read yet. Needs a token that may consume."""
        reply = await self.client.http.call(
            "PUT",
            self.cursor_url(name),
            {"offset": offset},
            what=f"commit cursor {name} on {self.name}",
        )
        return CursorInfo.from_wire(reply.json())

    async def delete_cursor(self, name: str) -> None:
        """Forget a reader cursor (an admin token): ``CursorNotFound`` if it is missing,
        ``StationNotFound`` if the station is."""
        await self.client.http.call(
            "DELETE", self.cursor_url(name), what=f"delete cursor {name} on {self.name}"
        )

    # -- dead-letter store ------------------------------------------------------------------------------

    async def dead_letters(
        self, group: str | None = None, limit: int = 100, after: str | None = None
    ) -> DeadLetterPage:
        """DLS entries, oldest first; pass the page's ``next`` as ``after`` for the next page."""
        params = {"limit": str(limit)}
        if group is not None:
            params["group"] = group
        if after is not None:
            params["after"] = after
        reply = await self.client.http.call(
            "GET", self._api("dls"), params=params, what=f"dead letters of {self.name}"
        )
        body = reply.json()
        return DeadLetterPage(
            [DeadLetter.from_wire(e) for e in body.get("entries", [])], body.get("next")
        )

    async def replay_dead_letters(
        self,
        ids: Iterable[str] | None = None,
        *,
        all: bool = False,
        group: str | None = None,
        delay_ms: int = 0,
    ) -> int:
        """Send entries back to their group's queue with a fresh delivery count, due after
        ``delay_ms``; returns how many went back (ids of no entry are skipped). ``group``: only
        that group's entries (of those listed, or of all). More than 10,000 ids (the server's
        limit per request) go in several requests (see ``drop_dead_letters``)."""
        options: dict[str, Any] = {}
        if group is not None:
            options["group"] = group
        if delay_ms:
            options["delayMs"] = delay_ms
        what = f"replay dead letters of {self.name}"
        return await self._dls("replay", "replayed", ids, all, options, what)

    async def drop_dead_letters(
        self, ids: Iterable[str] | None = None, *, all: bool = False
    ) -> int:
        """Delete entries for good; returns how many were dropped (ids of no entry are
        skipped). More than 10,000 ids (the server's limit per request) go in several
        requests, and the counts are added up; when one fails, the error says how many the
        requests before it handled (those stay done) and its ``field`` indexes ``ids``."""
        what = f"drop dead letters of {self.name}"
        return await self._dls("drop", "dropped", ids, all, {}, what)

    async def _dls(
        self,
        action: str,
        counted: str,
        ids: Iterable[str] | None,
        all: bool,
        options: dict[str, Any],
        what: str,
    ) -> int:
        async def send(selection: dict[str, Any]) -> int:
            reply = await self.client.http.call(
                "POST", self._api("dls", action), {**selection, **options}, what=what
            )
            return int(reply.json().get(counted, 0))

        if all:
            return await send({"all": True})
        listed = list(ids or [])
        if not listed:
            return await send({"ids": []})  # refused by the server, as before: nothing named
        done = 0
        for start in range(0, len(listed), MAX_DLS_IDS):
            try:
                done += await send({"ids": listed[start : start + MAX_DLS_IDS]})
            except StationsError as exc:
                if start:
                    _retell_chunk(exc, start, done)
                raise
        return done


def _retell_chunk(exc: StationsError, start: int, done: int) -> None:
    """``exc`` of the request of ``ids[start:]`` told as of the caller's whole list: its
    ``ids.N`` field counted from the list's start, and what the requests before it did (the
    same exception, so the same class and status)."""
    message = exc.message
    index = (exc.field or "").removeprefix("ids.")
    if exc.field is not None and exc.field != index and index.isascii() and index.isdigit():
        field = f"ids.{start + int(index)}"
        # The server's message names the field too ("ids.1 is not a DLS entry id").
        message = re.sub(rf"\b{re.escape(exc.field)}\b", field, message, count=1)
        exc.field = field
    exc.message = f"{message}; {done} of the first {start} ids were handled before"
    exc.args = (exc.message,)


# Slack between the client's clock and the server's taking of a retry (the network, a queue).
WINDOW_MARGIN_S = 1.0


def _unsure(exc: StationsError, since: float | None, ids: bool) -> StationsError:
    """``exc`` as the produce's outcome, saying when the messages may have been stored (an
    attempt's answer was lost, or was a 5xx): the last error alone (a refused connection, a
    503) said nothing had been, and a user who sent them again stored them twice."""
    if since is not None:
        if isinstance(exc, ConnectionFailed):
            exc.sent = True
        exc.add_note(
            "the messages may have been stored (an attempt's answer was lost)"
            + ("" if ids else "; give them message ids to make sending them again safe")
        )
    return exc


def _wire_message(message: NewMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {}
    if message.msg_id is not None:
        wire["id"] = message.msg_id
    if message.headers:
        wire["headers"] = dict(message.headers)
    if isinstance(message.data, bytes | bytearray | memoryview):
        wire["dataBase64"] = base64.b64encode(bytes(message.data)).decode()
    else:
        wire["data"] = message.data
    return wire


def _created(created_at: datetime | str | None) -> dict[str, str] | None:
    """The ``createdAt`` precondition as the API takes it (to the millisecond, with its
    offset); a string is sent as given (the ``createdAt`` of a view)."""
    if created_at is None:
        return None
    if isinstance(created_at, datetime):
        if created_at.tzinfo is None:
            raise ValueError("created_at needs its time zone (StationInfo.created_at has it)")
        created_at = created_at.isoformat(timespec="milliseconds")
    return {"createdAt": created_at}
