"""Server-Sent Events reads (Durable Streams §5.8): every data event is followed by a control
event; the server ends the connection after ``sse_lifetime_s`` so CDNs can collapse."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re

from aiohttp import web

from stations.api import access, keys, reading
from stations.api.drain import DRAIN
from stations.api.limits import READERS
from stations.api.reading import MAX_READ_BYTES, cursor
from stations.domain.budget import Overloaded
from stations.domain.offsets import Start, encode
from stations.domain.service import Service
from stations.errors import StationsError
from stations.records import is_json_type

_LINES = re.compile(r"\r\n|\r|\n")
MAX_LEAD = 3  # a character's bytes before its last: the most a text page may end inside of


def _data_line(line: str) -> str:
    # SSE readers drop one space after "data:": a line that starts with a space gets one more,
    # so its own survive. Others stay "data:x" (the conformance suite matches that literally).
    return f"data: {line}\n" if line.startswith(" ") else f"data:{line}\n"


def _event(kind: str, payload: str) -> bytes:
    lines = _LINES.split(payload)
    return (f"event: {kind}\n" + "".join(map(_data_line, lines)) + "\n").encode()


def _continues(parts: list[bytes]) -> bool:
    """Whether the first byte of ``parts`` continues a UTF-8 character begun before them."""
    first = next((part for part in parts if part), b"")
    return bool(first) and 0x80 <= first[0] < 0xC0


async def _lead_bytes(svc: Service, name: str, position: int, stream: tuple[int, int]) -> bytes:
    """The first bytes of the character the stored text up to ``position`` ends inside of
    (empty if it ends on a character's end), as an SSE connection reading past ``position``
    would hold them in its ``TextCarry``."""
    tail = b""
    for _ in range(MAX_LEAD):  # those bytes are in the last three messages (none is empty)
        if len(tail) >= MAX_LEAD or position <= 0:
            break
        try:
            before = await svc.read_or_wait(name, position - 1, 0, max_bytes=1, stream=stream)
        except StationsError:  # gone (retention, deletion): no earlier bytes to join
            break
        if not before.count or before.next - before.count != position - 1:
            break  # retention dropped message ``position``: reading started after it
        tail = before.parts[0][-MAX_LEAD:] + tail
        position -= 1
    # UTF-8 resynchronizes at each lead byte: what a decoder holds after the last few bytes
    # is what it would hold after the whole text.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(tail[-MAX_LEAD:])
    return bytes(decoder.getstate()[0])


async def serve_sse(request: web.Request, name: str, position: Start | None) -> web.StreamResponse:
    svc = request.app[keys.SERVICE]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.app[keys.SSE_LIFETIME_S]
    # A shared read (timeout 0: at once, even empty), like the long-poll's.
    first = await svc.read_or_wait(name, position, 0, max_bytes=MAX_READ_BYTES)
    await svc.touch(first.state)
    state = first.state
    response = web.StreamResponse(status=200)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    ct = state.content_type.lower()
    if not (is_json_type(ct) or ct.startswith("text/")):
        response.headers["Stream-SSE-Data-Encoding"] = "base64"
    await response.prepare(request)
    client_cursor = request.query.get("cursor")
    sent_cursor = 0
    carry = reading.TextCarry() if ct.startswith("text/") and not is_json_type(ct) else None
    result, opening = first, True
    del first  # a page is held (and counted in the memory budget) only while it is sent
    resumed = carry is not None  # until its first data: may start inside a character
    try:
        while True:
            # A data event and its control event go out back to back, with no await between
            # them when both are small; large data events go out in drained chunks.
            data = b""
            if resumed and result.count:
                resumed = False
                assert carry is not None
                # Text pages are one message per append: this page starts after message
                # next - count. An earlier connection ended there holding a character's first
                # bytes, never sent (its control event's offset is this one): take them again.
                start = result.next - result.count
                if start > 0 and _continues(result.parts):
                    stream = (state.id, state.created_at)
                    try:
                        carry.pending = await _lead_bytes(svc, name, start, stream)
                    except Overloaded:  # nothing sent of this page: the client comes back
                        break
            if result.count:
                if carry is not None:
                    data = carry.data(request, result, _event)
                else:
                    data = reading.sse_data(request, result, _event)
            chunk = b""
            if result.count or opening or result.closed:
                opening = False
                control: dict[str, object] = {"streamNextOffset": encode(result.next)}
                if result.closed:
                    control["streamClosed"] = True
                    control["upToDate"] = True
                else:
                    # Each event answers the cursor the client sent, as a long-poll would,
                    # never below the last one sent here. Answering the previous event's
                    # instead added jitter on every event: hours ahead of the clock within
                    # a minute, a cursor no other reader shares (no CDN collapsing).
                    sent_cursor = max(sent_cursor, int(cursor(client_cursor)))
                    control["streamCursor"] = str(sent_cursor)
                    if result.up_to_date:
                        control["upToDate"] = True
                chunk += _event("control", json.dumps(control, separators=(",", ":")))
            if len(data) + len(chunk) <= reading.CHUNK:
                chunk = data + chunk
            elif data:
                await reading.send(response, data)
            del data
            if chunk:
                await response.write(chunk)
            if result.closed:
                break
            position = result.next
            # Caught up, an SSE reader may wait for minutes: its last page must not stay held
            # (and counted in the read budget) all that time.
            del result
            remaining = deadline - loop.time()
            if remaining <= 0 or svc.ending:  # a shutdown ends the response whole
                break
            try:
                result = await svc.read_or_wait(
                    name,
                    position,
                    remaining,
                    max_bytes=MAX_READ_BYTES,
                    stream=(state.id, state.created_at),
                )
            except StationsError:  # the stream went (deleted, expired, created again): it ends
                break
            except Overloaded:  # no read budget now: the client reconnects, as at its lifetime
                break
            state = result.state
    except (ConnectionError, asyncio.CancelledError) as exc:
        reading.forget(exc)
        with contextlib.suppress(NameError):  # unless it was let go while waiting
            del result  # this frame outlives the call in the exception's cycle
        if isinstance(exc, asyncio.CancelledError) and not (
            request.app[DRAIN].draining or request.app[READERS].take_back(asyncio.current_task())
        ):
            raise  # its client left while it waited: the edge logs and counts the 499
        # A shutdown's drain, or its token's revocation, ends the response as a whole (the
        # client reads again from the last event's offset, a revoked token gets its 401
        # then); a write that found the client gone is a 499.
        if not isinstance(exc, asyncio.CancelledError):
            access.left(request)
        return response
    await response.write_eof()
    return response
