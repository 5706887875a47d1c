"""What catch-up, long-poll and SSE reads share: page bodies, cursors and back-pressured writes.

A page's body is built once per page object (many long-poll or SSE readers woken by one append
share one page) and counted in the service's memory budget for as long as the page lives. It
goes out in bounded chunks, each awaited until the connection drained, so a client that does not
read holds at most a chunk or two in the transport beside the shared page.
"""

from __future__ import annotations

import base64
import codecs
import random
import re
import time
import traceback
import weakref
from collections.abc import Callable
from datetime import datetime

from aiohttp import web

from stations.api import access, keys
from stations.domain import framing
from stations.domain.reads import ReadResult
from stations.records import StreamState

MAX_READ_BYTES = 4 * 1024 * 1024  # a catch-up response carries at most about this much
CHUNK = 64 * 1024  # one write; aiohttp drains the transport after each 64 KiB written
CURSOR_EPOCH = datetime(2024, 10, 9).timestamp()
CURSOR_INTERVAL_S = 20
_CURSOR = re.compile(r"^[0-9]{1,18}$")
MAX_CURSOR = 10**18 - 1

# Bodies built from a page, by (id of the page, kind); each lives exactly as long as its page.
_built: dict[tuple[int, str], bytes] = {}


def cursor(client_cursor: str | None) -> str:
    """Interval-based cursor, never going backwards for a client (§10.1)."""
    current = int((time.time() - CURSOR_EPOCH) // CURSOR_INTERVAL_S)
    # A cursor is only an echo: anything but a plausible interval number is ignored.
    if client_cursor and _CURSOR.match(client_cursor) and int(client_cursor) >= current:
        # Capped at the largest cursor taken back: one past it would be ignored when echoed,
        # and the next answer would go back to the current interval.
        ahead = int(client_cursor) + random.randint(1, 3600 // CURSOR_INTERVAL_S)
        return str(min(ahead, MAX_CURSOR))
    return str(current)


def _join(state: StreamState, result: ReadResult) -> bytes:
    return framing.join_json(result.parts) if state.is_json else b"".join(result.parts)


def sse_payload(state: StreamState, result: ReadResult) -> str:
    """The text of one ``data`` event: JSON array, text as is, other types base64."""
    if state.is_json:
        return _join(state, result).decode()
    raw = b"".join(result.parts)
    if state.content_type.lower().startswith("text/"):
        return raw.decode("utf-8", errors="replace")
    return base64.b64encode(raw).decode()


def _cached(
    kind: str, request: web.Request, result: ReadResult, build: Callable[[], bytes]
) -> bytes:
    key = (id(result), kind)
    body = _built.get(key)
    if body is None:
        body = _built[key] = build()
        weakref.finalize(result, _built.pop, key, None)
        request.app[keys.SERVICE].budget.charge(result, len(body))
    return body


def sse_data(request: web.Request, result: ReadResult, event: Callable[[str, str], bytes]) -> bytes:
    """The ``data`` event of a page, built once per page."""
    return _cached("sse", request, result, lambda: event("data", sse_payload(result.state, result)))


class TextCarry:
    """A text stream's bytes are whatever was appended: a character may be split between two
    appends, and so between two SSE events. Each SSE connection keeps the bytes of a character
    its last event ended inside and puts them before the next page's, instead of writing the
    halves as two replacement characters."""

    def __init__(self) -> None:
        self.pending = b""

    def data(
        self, request: web.Request, result: ReadResult, event: Callable[[str, str], bytes]
    ) -> bytes:
        if not self.pending and _complete_utf8(_tail(result.parts)):
            return sse_data(request, result, event)  # the common case: shared with others
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(self.pending + b"".join(result.parts), final=result.closed)
        self.pending = decoder.getstate()[0]
        return event("data", text) if text else b""


def _tail(parts: list[bytes]) -> bytes:
    """The last (up to) four bytes of ``parts`` joined, without joining them all."""
    tail = b""
    for part in reversed(parts):
        tail = part[-4:] + tail
        if len(tail) >= 4:
            break
    return tail


def _complete_utf8(raw: bytes) -> bool:
    """Whether ``raw`` does not end inside a character (its last lead byte has its
    continuation bytes)."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte < 0x80:
            return True
        if byte >= 0xC0:  # a lead byte: 2, 3 or 4 bytes long
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back >= need
    return True


def forget(exc: BaseException) -> None:
    """Drop the locals of the frames a disconnect's traceback holds.

    aiohttp's drain future holds the exception, whose traceback holds the frame that awaited
    the future: a cycle only the cyclic collector frees, late, with the page inside.
    """
    traceback.clear_frames(exc.__traceback__)


def connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def send(response: web.StreamResponse, data: bytes) -> None:
    """Write ``data`` in bounded chunks, each drained before the next (back-pressure)."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        await response.write(view[start : start + CHUNK])


async def send_built(request: web.Request, response: web.Response) -> web.StreamResponse:
    """Send an answer built whole (a page of the management API, a fetch), a large one in
    drained chunks: the caller, which counted its bytes in the read budget, holds them until
    the client has taken them (aiohttp would hold the body, uncounted, for as long as a client
    that stopped reading lets it)."""
    body = response.body
    assert isinstance(body, bytes)
    if len(body) <= CHUNK or request.method == "HEAD":  # a HEAD answer leaves the body out
        return response
    stream = web.StreamResponse(status=response.status, headers=response.headers)
    stream.content_length = len(body)
    try:
        await stream.prepare(request)
        await send(stream, body)
        await stream.write_eof()
    except ConnectionError as exc:
        del body, response  # this frame outlives the call in the exception's cycle
        _left(request, exc)
    return stream


def _left(request: web.Request, exc: ConnectionError) -> None:
    """The client left while an answer was sent: said in the access log, the connection
    closed, the page freed at once (no traceback keeps it)."""
    forget(exc)
    access.left(request)
    if request.transport is not None:
        request.transport.close()


def _pieces(result: ReadResult) -> list[bytes]:
    """The body of a page as pieces to write, without joining them (no copy of the page)."""
    if not result.state.is_json:
        return result.parts
    pieces = [b"["]
    for part in result.parts:
        pieces += (part, b",")
    pieces[-1] = b"]" if result.parts else b"[]"
    return pieces


async def respond(
    request: web.Request, response: web.Response, result: ReadResult
) -> web.StreamResponse:
    """Answer with ``result``'s page as the body: small pages in one piece, larger ones in
    drained chunks straight from the page's parts. A client that leaves ends it quietly (and
    promptly frees the page: no traceback keeps it)."""
    pieces = _pieces(result)
    length = sum(map(len, pieces))
    if length <= CHUNK:
        response.body = b"".join(pieces)
        return response
    stream = web.StreamResponse(status=response.status, headers=response.headers)
    stream.content_length = length
    batch: list[bytes] = []
    size = 0
    try:
        await stream.prepare(request)
        for piece in pieces:
            if len(piece) >= CHUNK:
                if batch:
                    await stream.write(b"".join(batch))
                    batch, size = [], 0
                await send(stream, piece)
                continue
            batch.append(piece)
            size += len(piece)
            if size >= CHUNK:
                await stream.write(b"".join(batch))
                batch, size = [], 0
        if batch:
            await stream.write(b"".join(batch))
        await stream.write_eof()
    except ConnectionError as exc:
        del pieces, batch, result  # this frame outlives the call in the exception's cycle
        _left(request, exc)
    return stream
