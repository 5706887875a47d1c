"""Reading a stream (Durable Streams §5.6-5.8): catch-up, long-poll and SSE, resuming from the
last offset after connection errors and 5xx answers, ending at stream closure."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from stations.client.core import check_url
from stations.client.errors import ConnectionFailed, StationsError, error_for
from stations.client.http import LIVE_READ_TIMEOUT, Http, Reply
from stations.client.models import is_json_type
from stations.client.retry import PATIENT_RETRY, Backoff, RetryPolicy

Live = Literal["long-poll", "sse"] | None


@dataclass(frozen=True)
class ReadBatch:
    """What one response (or one SSE data/control pair) carried.

    ``items`` are the decoded JSON messages for a JSON stream, otherwise one ``bytes`` chunk
    (byte streams have no message boundaries). ``offset`` is ``Stream-Next-Offset``: store it
    and read from it to resume right after this batch."""

    items: list[Any]
    offset: str
    up_to_date: bool
    closed: bool


class StreamReader:
    """An async iterator of ``ReadBatch``. Leaving ``async for station.read(...)`` by
    ``break`` (or an exception) releases its connection at once; a reader kept in a variable
    holds an SSE connection until it is dropped, so use ``async with`` (or
    ``contextlib.aclosing``, or ``aclose()``) when you may stop early.

    ``live=None`` reads what is there and stops when up to date; ``"long-poll"`` and ``"sse"``
    follow the stream until it is closed. Only batches with items are yielded."""

    def __init__(
        self,
        http: Http,
        url: str,
        *,
        offset: str = "-1",
        live: Live = None,
        content_type: str | None = None,
        retry: RetryPolicy = PATIENT_RETRY,
        read_timeout: float = LIVE_READ_TIMEOUT,
        owns_http: bool = False,
    ) -> None:
        if live not in (None, "long-poll", "sse"):
            raise ValueError("live must be None, 'long-poll' or 'sse'")
        self.url = url
        self.live = live
        # The generator reads through ``_read``, never through this object: holding each
        # other, reader and generator lived until the garbage collector ran, and so did the
        # SSE connection of a ``break``. This way the loop that drops the reader drops the
        # generator too, and asyncio closes it (and its connection) at once.
        self._read = _Read(http, url, offset, live, content_type, retry, read_timeout, owns_http)
        self._gen: AsyncGenerator[ReadBatch, None] | None = None

    @property
    def offset(self) -> str:
        """The offset to resume from: after the last batch yielded (or the start offset)."""
        return self._read.offset

    @property
    def closed(self) -> bool:
        """True once the stream's closure (EOF) was seen."""
        return self._read.closed

    @property
    def up_to_date(self) -> bool:
        return self._read.up_to_date

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> ReadBatch:
        if self._gen is None:
            self._gen = self._read.batches()
        try:
            return await self._gen.__anext__()
        except asyncio.CancelledError:
            # The cancellation (Ctrl-C on the blocking client, a timeout) ended the generator;
            # kept, it answered StopAsyncIteration as if the stream had ended. The next call
            # starts a new one from ``offset``, after the last batch handed out.
            self._gen = None
            raise

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()
        elif self._read.owns_http:
            await self._read.http.close()

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Read:
    """A reader's state and the generators that read: what ``StreamReader`` hands out."""

    def __init__(
        self,
        http: Http,
        url: str,
        offset: str,
        live: Live,
        content_type: str | None,
        retry: RetryPolicy,
        read_timeout: float,
        owns_http: bool,
    ) -> None:
        self.http = http
        self.url = url
        self.live = live
        self.offset = offset
        self.owns_http = owns_http
        self._content_type = content_type
        self._retry = retry
        self._read_timeout = read_timeout
        self._cursor: str | None = None
        self.closed = False
        self.up_to_date = False

    async def batches(self) -> AsyncGenerator[ReadBatch, None]:
        source = self._sse() if self.live == "sse" else self._polls()
        try:
            async for batch in source:
                yield batch
        finally:
            # Ended early (aclose, a break): the source's own finally closes its response now,
            # before the session goes, rather than when the source is collected.
            await source.aclose()
            if self.owns_http:
                await self.http.close()

    def _advance(self, offset: str | None, up_to_date: bool, closed: bool) -> None:
        if offset:
            self.offset = offset
        self.up_to_date = up_to_date or closed
        self.closed = closed

    # -- catch-up and long-poll ---------------------------------------------------------------

    async def _get(self, params: dict[str, str]) -> Reply:
        reply = await self.http.request(
            "GET", self.url, params=params, read_timeout=self._read_timeout
        )
        if reply.status not in (200, 204):
            raise error_for(reply.status, reply.headers, reply.body, what=f"read {self.url}")
        return reply

    async def _polls(self) -> AsyncGenerator[ReadBatch, None]:
        backoff = Backoff(self._retry)
        while True:
            params = {"offset": self.offset}
            if self.live is not None:
                params["live"] = self.live
                if self._cursor:
                    params["cursor"] = self._cursor
            try:
                reply = await self._get(params)
            except StationsError as exc:
                await backoff.wait(exc)  # connection errors, 429 and 5xx: resume from _offset
                continue
            backoff.reset()
            self._cursor = reply.header("Stream-Cursor") or self._cursor
            closed = reply.flag("Stream-Closed")
            self._advance(
                reply.header("Stream-Next-Offset"), reply.flag("Stream-Up-To-Date"), closed
            )
            items = self._decode(reply) if reply.status == 200 else []
            if items:
                yield ReadBatch(items, self.offset, self.up_to_date, closed)
            if closed or (self.live is None and self.up_to_date):
                return

    def _decode(self, reply: Reply) -> list[Any]:
        content_type = reply.header("Content-Type") or self._content_type
        if is_json_type(content_type):
            if not reply.body.strip():
                return []
            parsed = json.loads(reply.body)
            return parsed if isinstance(parsed, list) else [parsed]
        return [reply.body] if reply.body else []

    # -- SSE ----------------------------------------------------------------------------------

    async def _learn_content_type(self, backoff: Backoff) -> str:
        """SSE answers are ``text/event-stream``: ask the stream itself (HEAD) whether it is JSON."""
        while self._content_type is None:
            try:
                reply = await self.http.request("HEAD", self.url)
                if reply.status != 200:
                    raise error_for(reply.status, reply.headers, b"", what=f"HEAD {self.url}")
                self._content_type = reply.header("Content-Type") or "application/octet-stream"
            except StationsError as exc:
                await backoff.wait(exc)
        backoff.reset()
        return self._content_type

    async def _sse(self) -> AsyncGenerator[ReadBatch, None]:
        backoff = Backoff(self._retry)
        json_mode = is_json_type(await self._learn_content_type(backoff))
        while True:
            params = {"offset": self.offset, "live": "sse"}
            if self._cursor:
                params["cursor"] = self._cursor
            try:
                response = await self.http.open(
                    "GET",
                    self.url,
                    params=params,
                    headers={"Accept": "text/event-stream"},
                    read_timeout=self._read_timeout,
                )
            except ConnectionFailed as exc:
                await backoff.wait(exc)
                continue
            saw_control = False
            try:
                if response.status != 200:
                    body = await response.read()
                    await backoff.wait(
                        error_for(response.status, response.headers, body, what="read (SSE)")
                    )
                    continue
                base64_data = (
                    response.headers.get("Stream-SSE-Data-Encoding", "").lower() == "base64"
                )
                items: list[Any] = []
                async for event, data in _sse_events(response.content):
                    if event == "data":
                        items.extend(_sse_items(data, json_mode, base64_data))
                    elif event == "control":
                        control = json.loads(data)
                        saw_control = True
                        backoff.reset()
                        self._cursor = control.get("streamCursor") or self._cursor
                        closed = control.get("streamClosed") is True
                        self._advance(
                            control.get("streamNextOffset"), control.get("upToDate") is True, closed
                        )
                        if items:
                            yield ReadBatch(items, self.offset, self.up_to_date, closed)
                            items = []
                        if closed:
                            return
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                # Data events not yet confirmed by a control event are dropped: reading again
                # from the last control offset delivers them once.
                await backoff.wait(ConnectionFailed(f"SSE connection lost: {exc!r}"))
                continue
            finally:
                response.close()
            if not saw_control:
                await backoff.wait(ConnectionFailed("SSE connection ended without an event"))
            # Otherwise the server ended the connection on schedule (CDN collapsing): reconnect.


async def _sse_events(stream: aiohttp.StreamReader) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs. Lines are split by hand: aiohttp's readline() refuses long lines,
    and one data line can carry megabytes of JSON. A line ends in CRLF, LF or a lone CR, as
    the SSE format has it: another Durable Streams server may end its lines in CR alone."""
    buffer = bytearray()
    event, data = "message", list[str]()
    ended = False
    searched = 0  # the buffer holds no line end before this (a line longer than a chunk)
    chunks = stream.iter_any().__aiter__()
    while not ended:
        try:
            buffer += await chunks.__anext__()
        except StopAsyncIteration:
            ended = True
        lines = _Lines(buffer, searched)
        while (end := lines.next_end()) >= 0:
            if buffer[end] == 0x0D and end + 1 == len(buffer) and not ended:
                break  # a CR the chunk ends on: the LF of a CRLF may be in the next one
            line = buffer[lines.start : end].decode("utf-8")
            lines.start = end + 2 if buffer[end : end + 2] == b"\r\n" else end + 1
            if not line:
                if data or event != "message":
                    yield event, "\n".join(data)
                event, data = "message", []
                continue
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
        del buffer[: lines.start]
        searched = max(len(buffer) - 1, 0)  # all but a CR the chunk may have ended on


class _Lines:
    """Where the lines of ``buffer`` end, from ``start`` on. The next CR and the next LF are
    each found once and kept until passed: a chunk of many LF-ended lines was searched for a
    CR to its end once per line. ``searched``: no line ends before it (the part of a long line
    the last chunks brought)."""

    def __init__(self, buffer: bytearray, searched: int) -> None:
        self.buffer = buffer
        self.start = 0
        self._floor = searched
        self._cr = self._lf = -2  # -2: not searched yet; -1: none in the buffer

    def next_end(self) -> int:
        """Where the line from ``start`` ends (its CR or LF), or -1."""
        start = max(self.start, self._floor)
        if -1 < self._cr < self.start or self._cr == -2:
            self._cr = self.buffer.find(b"\r", start)
        if -1 < self._lf < self.start or self._lf == -2:
            self._lf = self.buffer.find(b"\n", start)
        cr, lf = self._cr, self._lf
        return lf if cr < 0 else cr if lf < 0 else min(cr, lf)


def _sse_items(data: str, json_mode: bool, base64_data: bool) -> list[Any]:
    if base64_data:
        raw = base64.b64decode(data.replace("\n", "").replace("\r", ""))
        return [raw] if raw else []
    if json_mode:
        if not data.strip():
            return []
        parsed = json.loads(data)
        return parsed if isinstance(parsed, list) else [parsed]
    return [data.encode()] if data else []


def read_stream(
    url: str,
    offset: str = "-1",
    live: Live = None,
    *,
    token: str | None = None,
    content_type: str | None = None,
    retry: RetryPolicy = PATIENT_RETRY,
    read_timeout: float = LIVE_READ_TIMEOUT,
    session: aiohttp.ClientSession | None = None,
) -> StreamReader:
    """Read any Durable Streams URL (``http://host/v1/stream/name`` on Stations)."""
    check_url(url)
    return StreamReader(
        Http(token, session=session),
        url,
        offset=offset,
        live=live,
        content_type=content_type,
        retry=retry,
        read_timeout=read_timeout,
        owns_http=True,
    )
