"""The Durable Streams protocol at ``/v1/stream/{name}``, plus the Msg-Id layer (§3)."""

from __future__ import annotations

import re
from urllib.parse import unquote

from aiohttp import web
from multidict import CIMultiDictProxy

from stations.api import keys, reading
from stations.api.auth import TOKENS, needs, require_station
from stations.api.limits import LIMITS, may_wait, no_slot
from stations.api.public import own_url
from stations.api.reading import MAX_READ_BYTES, cursor
from stations.api.sse import serve_sse
from stations.domain import framing, instants
from stations.domain.lifecycle import CreateRequest, framed
from stations.domain.log import AppendRequest, AppendResult
from stations.domain.offsets import EARLIEST, NOW, BadOffset, Start, decode_start, encode
from stations.domain.producers import parse_headers
from stations.domain.reads import ReadResult
from stations.domain.station import default_config, validate_name
from stations.errors import BadRequest, TooLarge
from stations.records import StreamState, is_json_type

PREFIX = "/v1/stream/"
_TTL = re.compile(r"^(0|[1-9][0-9]*)$")
_SUB = re.compile(r"^(0|[1-9][0-9]*)$")
_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,256}$")
# Control characters, and the surrogates that stand for header bytes that were not UTF-8.
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(rf"^{_TOKEN}/{_TOKEN}[ \t]*(;[\x20-\x7e\t]*)?$")
MAX_CONTENT_TYPE = 255  # streams.content_type is a 255-character column
MAX_STREAM_SEQ = 1024  # streams.stream_seq is a 1024-character column
MAX_TTL_S = (2**53 - 1) // 1000  # the TTL in milliseconds stays a JavaScript-safe integer
# Caches keep a read but ask again each time (its ETag names the stream and the range, so an
# unchanged one costs a 304), not "max-age=60, stale-while-revalidate=300" as PROTOCOL.md §8.1
# suggests: an append, a close, or the stream deleted and created again changes what the same
# URL answers (a page behind the tail, or a long-poll without a cursor, only the last), and
# browsers kept such answers for minutes: web pages read old contents, and after a re-create
# the deleted stream's (found by reviews with the TS client in Chromium).
CACHEABLE = "public, no-cache"
# With tokens a read is one token's answer: "public" would let a shared cache (a CDN) store it
# although the request carried Authorization (RFC 9111 §3.5) and hand it to other tokens or none.
CACHEABLE_PRIVATE = "private, no-cache"


def service(request: web.Request):  # type: ignore[no-untyped-def]
    return request.app[keys.SERVICE]


def stream_name(request: web.Request) -> str:
    return _valid_name(request.match_info["name"], "path")


def _valid_name(name: str, field: str) -> str:
    """One set of name rules for both doors: a stream is a station, so its name follows the
    management API's rules (no ``__ds/`` prefix, which the protocol keeps for its own routes, no
    ``.``/``..`` or empty segments, no ``{}``)."""
    return validate_name(name, field)


def _content_type(value: str) -> str:
    """A syntactically valid media type (RFC 9110 §8.3.1), or 400."""
    value = value.strip()
    if len(value) > MAX_CONTENT_TYPE or not _MEDIA_TYPE.match(value):
        raise BadRequest(
            "Content-Type must be a media type such as application/json", "Content-Type"
        )
    return value


def _is_true(value: str | None) -> bool:
    return value is not None and value.lower() == "true"


def _offset(request: web.Request, param: str = "offset") -> Start | None:
    """Where the read starts (``EARLIEST`` for ``-1``); None means ``now`` (the tail)."""
    values = request.query.getall(param, [])
    if len(values) > 1:
        raise BadRequest("offset may be given once", param)
    token = values[0] if values else "-1"
    if token == NOW:
        return None
    try:
        return decode_start(token)
    except BadOffset:
        raise BadRequest(f"malformed offset {token!r}", param) from None


def _stream_headers(response: web.StreamResponse, state: StreamState) -> None:
    response.headers["Content-Type"] = state.content_type
    if state.ttl_seconds is not None:
        response.headers["Stream-TTL"] = str(state.ttl_seconds)
    if state.expires_at is not None:
        response.headers["Stream-Expires-At"] = instants.format_ms(state.expires_at)


# Milliseconds since it, in integers: through float seconds, 9999-12-31T23:59:59.999Z came back
# one millisecond early.
# -- create -----------------------------------------------------------------------------------


def _parse_expires(value: str) -> int:
    return instants.parse(value, "Stream-Expires-At", rfc3339=True).ms


def _fork_source(value: str) -> str:
    path = value.split("?", 1)[0]
    if path.startswith(PREFIX):
        path = path[len(PREFIX) :]
    path = path.lstrip("/")
    if not path:
        raise BadRequest("Stream-Forked-From must name a stream", "Stream-Forked-From")
    return _valid_name(unquote(path), "Stream-Forked-From")


def _one(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """A header that may be given once: two copies (which a proxy may keep either of) would
    leave which one decides, say, a message's exactly-once id to chance."""
    value = headers.get(name)
    if value is not None and len(headers.getall(name)) > 1:
        raise BadRequest(f"{name} may be given once", name)
    return value


@needs("admin")
async def put_stream(request: web.Request) -> web.Response:
    name = stream_name(request)
    h = request.headers
    if "Msg-Id" in h:
        # It was ignored: the initial message stored without the id, and a POST of the same
        # id stored it again.
        raise BadRequest(
            "Msg-Id is not taken when a stream is created: append the message with POST",
            "Msg-Id",
        )
    content_type = (_one(h, "Content-Type") or "").strip()
    content_type_given = bool(content_type)
    content_type = _content_type(content_type) if content_type else "application/octet-stream"
    ttl = _one(h, "Stream-TTL")
    expires = _one(h, "Stream-Expires-At")
    if ttl is not None and expires is not None:
        raise BadRequest("send Stream-TTL or Stream-Expires-At, not both", "Stream-TTL")
    ttl_seconds = None
    if ttl is not None:
        if not _TTL.match(ttl):
            raise BadRequest("Stream-TTL must be a non-negative integer", "Stream-TTL")
        if len(ttl) > len(str(MAX_TTL_S)) or int(ttl) > MAX_TTL_S:
            raise BadRequest(f"Stream-TTL must be at most {MAX_TTL_S} seconds", "Stream-TTL")
        ttl_seconds = int(ttl)
    expires_at = _parse_expires(expires) if expires is not None else None
    fork_from = _one(h, "Stream-Forked-From")
    fork_offset = None
    sub_offset = 0
    if fork_from is None:
        for header in ("Stream-Fork-Offset", "Stream-Fork-Sub-Offset"):
            if header in h:
                raise BadRequest(f"{header} needs Stream-Forked-From", header)
    if fork_from is not None:
        fork_from = _fork_source(fork_from)
        # The fork reads its source: the token must cover the source too (CONTRACT.md §5).
        require_station(request, fork_from, "Stream-Forked-From")
        if "Stream-Fork-Offset" in h:
            token = h["Stream-Fork-Offset"]
            try:
                start = decode_start(token)
                # ``-1``, the beginning: a fork that holds none of its source, as at offset 0.
                fork_offset = 0 if start is EARLIEST else start
            except BadOffset:
                raise BadRequest("malformed Stream-Fork-Offset", "Stream-Fork-Offset") from None
        if "Stream-Fork-Sub-Offset" in h:
            # More digits than any stream has bytes is past every data boundary anyway.
            sub = h["Stream-Fork-Sub-Offset"]
            if not _SUB.match(sub) or len(sub) > 18:
                raise BadRequest(
                    "Stream-Fork-Sub-Offset must be a non-negative integer",
                    "Stream-Fork-Sub-Offset",
                )
            sub_offset = int(h["Stream-Fork-Sub-Offset"])
    body = await request.read()
    svc = service(request)
    cap = request.app[LIMITS].max_append_messages
    # A fork without a Content-Type takes its source's, and its body is framed as that type
    # in the create's transaction, where the source is known.
    inherits = fork_from is not None and not content_type_given
    initial = [] if inherits else framed(body, content_type, cap)
    req = CreateRequest(
        name=name,
        content_type=content_type,
        config=default_config(name, content_type),
        ttl_seconds=ttl_seconds,
        expires_at=expires_at,
        closed=_is_true(_one(h, "Stream-Closed")),
        initial=initial,
        fork_from=fork_from,
        fork_offset=fork_offset,
        fork_sub_offset=sub_offset,
        # A plain PUT without one asks for the default type, compared as any other.
        content_type_given=not inherits,
        initial_body=body if inherits else None,
        initial_cap=cap,
    )
    result = await svc.create(req)
    state = result.state
    response = web.Response(status=201 if result.created else 200)
    _stream_headers(response, state)
    response.headers["Stream-Next-Offset"] = encode(state.tail)
    if state.closed:
        response.headers["Stream-Closed"] = "true"
    if result.created:
        # Where clients reach it: behind a proxy, not this process's own address.
        response.headers["Location"] = own_url(request, request.rel_url.raw_path)
    return response


# -- append -----------------------------------------------------------------------------------


@needs("produce")
async def post_stream(request: web.Request) -> web.Response:
    name = stream_name(request)
    h = request.headers
    close = _is_true(_one(h, "Stream-Closed"))
    producer = parse_headers(
        _one(h, "Producer-Id"), _one(h, "Producer-Epoch"), _one(h, "Producer-Seq")
    )
    msg_id = _one(h, "Msg-Id")
    if msg_id is not None and not _PRINTABLE.match(msg_id):
        raise BadRequest("Msg-Id must be 1 to 256 printable ASCII characters", "Msg-Id")
    stream_seq = _one(h, "Stream-Seq")
    if stream_seq is not None and (
        len(stream_seq) > MAX_STREAM_SEQ or _NOT_TEXT.search(stream_seq)
    ):
        raise BadRequest(
            f"Stream-Seq must be at most {MAX_STREAM_SEQ} characters of text", "Stream-Seq"
        )
    body = await request.read()
    # An empty Content-Type is no Content-Type; a close-only request may carry any.
    content_type = (_one(h, "Content-Type") or "").strip() or None
    req = AppendRequest(
        name=name,
        content_type=content_type,
        close=close,
        producer=producer,
        stream_seq=stream_seq,
    )
    if body:
        try:
            if content_type is None:
                raise BadRequest("an append with a body needs a Content-Type", "Content-Type")
            try:
                _content_type(content_type)
            except BadRequest:
                req.content_type = None  # not a type the stream's could be compared with
                raise
            if is_json_type(content_type):
                req.messages = framing.split_json(
                    body,
                    allow_empty=False,
                    max_messages=request.app[LIMITS].max_append_messages,
                )
            else:
                req.messages = [body]
            if msg_id is not None:
                if len(req.messages) != 1:
                    raise BadRequest(
                        "with Msg-Id the body must carry exactly one message", "Msg-Id"
                    )
                req.msg_ids = [msg_id]
        except (BadRequest, TooLarge) as exc:
            req.body_error = exc
            req.messages = []
    elif msg_id is not None:
        # A close-only request stores no message for the id to name (CONTRACT.md §3).
        req.body_error = BadRequest("with Msg-Id the body must carry exactly one message", "Msg-Id")
    elif not close:
        req.body_error = BadRequest("an append needs a body (or Stream-Closed: true)", "body")
    result = await service(request).append(req)
    return append_response(result, producer is not None, msg_id is not None)


def append_response(result: AppendResult, with_producer: bool, with_msg_id: bool) -> web.Response:
    stored = any(not dup for _, dup in result.results) or (
        not result.results and not result.producer_duplicate
    )
    status = 204
    if with_producer and not result.producer_duplicate and result.results:
        status = 200
    response = web.Response(status=status)
    response.headers["Stream-Next-Offset"] = encode(result.tail)
    if result.closed:
        response.headers["Stream-Closed"] = "true"
    if with_producer and result.producer is not None:
        response.headers["Producer-Epoch"] = str(result.producer.epoch)
        response.headers["Producer-Seq"] = str(result.producer_seq)
    if with_msg_id and result.results:
        offset, duplicate = result.results[0]
        response.headers["Msg-Duplicate"] = "true" if duplicate else "false"
        if offset is not None:
            response.headers["Msg-Offset"] = encode(offset)
    elif with_msg_id:
        response.headers["Msg-Duplicate"] = "true" if not stored else "false"
    return response


# -- read -------------------------------------------------------------------------------------


def _etag(result: ReadResult) -> str:
    # The first position really read, not the one asked for: once retention drops messages,
    # a read from -1 answers other bytes up to the same tail, so it needs another tag.
    tag = f"{result.state.id}:{result.next - result.count}:{result.next}"
    if result.closed:
        tag += ":c"
    return f'"{tag}"'


def _cacheable(request: web.Request) -> str:
    return CACHEABLE_PRIVATE if request.app[TOKENS] else CACHEABLE


def _none_match(header: str | None, etag: str) -> bool:
    """RFC 9110 §13.1.2: ``*`` or any listed tag equal to ours by weak comparison (a ``W/``
    prefix does not count), so caches and clients that weaken or list tags get their 304."""
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == etag for t in header.split(","))


def _read_headers(response: web.StreamResponse, result: ReadResult) -> None:
    _stream_headers(response, result.state)
    response.headers["Stream-Next-Offset"] = encode(result.next)
    if result.up_to_date:
        response.headers["Stream-Up-To-Date"] = "true"
    if result.closed:
        response.headers["Stream-Closed"] = "true"


@needs("consume")
async def get_stream(request: web.Request) -> web.StreamResponse:
    name = stream_name(request)
    if len(request.query.getall("live", [])) > 1:  # as offset: which one was meant is unsaid
        raise BadRequest("live may be given once", "live")
    live = request.query.get("live")
    if live not in (None, "long-poll", "sse"):
        raise BadRequest("live must be long-poll or sse", "live")
    if live is not None and "offset" not in request.query:
        raise BadRequest("live reads need an offset", "offset")
    position = _offset(request)
    svc = service(request)
    if live == "sse":
        return await serve_sse(request, name, position)
    if live == "long-poll":
        # No read of the stream first: the many readers of one stream share reads, and a
        # reader at a tail they already saw waits without touching the database.
        timeout = request.app[keys.LONG_POLL_TIMEOUT_S] if may_wait(request) else 0
        result = await svc.read_or_wait(name, position, timeout, max_bytes=MAX_READ_BYTES)
        if not result.count and not result.closed and not may_wait(request):
            # It would wait, and no slot is free for it: refused before it touches the
            # stream (a 503 keeps a TTL stream alive no more than it waits).
            raise no_slot(request)
        await svc.touch(result.state)
        if not result.count:
            response = web.Response(status=204)
            _read_headers(response, result)
            response.headers["Stream-Up-To-Date"] = "true"
            if not result.closed:
                response.headers["Stream-Cursor"] = cursor(request.query.get("cursor"))
            response.headers["Cache-Control"] = "no-store"
            return response
        response = web.Response(status=200)
        _read_headers(response, result)
        response.headers["ETag"] = _etag(result)
        # ``offset=now`` names no position: a cache would hand this page to later readers
        # asking for what comes next (PROTOCOL.md §8 keeps ``now`` answers out of caches).
        now = request.query.get("offset") == NOW
        response.headers["Cache-Control"] = "no-store" if now else _cacheable(request)
        if not result.closed:
            response.headers["Stream-Cursor"] = cursor(request.query.get("cursor"))
        return await reading.respond(request, response, result)
    state = await svc.stream(name)
    await svc.touch(state)
    result = await svc.read(
        name, position, max_bytes=MAX_READ_BYTES, alive=lambda: reading.connected(request)
    )
    if position is None:
        response = web.Response(status=200, body=b"[]" if state.is_json else b"")
        _read_headers(response, result)
        response.headers["Stream-Up-To-Date"] = "true"
        response.headers["Cache-Control"] = "no-store"
        return response
    etag = _etag(result)
    # Nothing yet at an open tail: the next read there finds new data or EOF (PROTOCOL.md
    # §10.1), which a shared cache keeping this answer would hide for its max-age.
    fresh = result.count or result.closed
    cache_control = _cacheable(request) if fresh else "no-store"
    if _none_match(request.headers.get("If-None-Match"), etag):
        response = web.Response(status=304)
        response.headers["ETag"] = etag
        # A cache that revalidated takes the 304's Cache-Control (RFC 9110 §15.4.5).
        response.headers["Cache-Control"] = cache_control
        response.headers["Stream-Next-Offset"] = encode(result.next)
        return response
    response = web.Response(status=200)
    _read_headers(response, result)
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = cache_control
    return await reading.respond(request, response, result)


@needs("read")
async def head_stream(request: web.Request) -> web.Response:
    state = await service(request).stream(stream_name(request))
    # The stream's state as a tag, as the reference server gives one (the TS client's
    # head().etag was undefined here): the stream, its tail, and whether it is closed.
    etag = f'"{state.id}:-1:{state.tail}{":c" if state.closed else ""}"'
    # A poller that sends the tag back learns "nothing changed" as RFC 9110 §13.1.2 says a
    # HEAD is answered (it was always a 200).
    response = web.Response(
        status=304 if _none_match(request.headers.get("If-None-Match"), etag) else 200
    )
    _stream_headers(response, state)
    response.headers["Stream-Next-Offset"] = encode(state.tail)
    if state.closed:
        response.headers["Stream-Closed"] = "true"
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "no-store"
    return response


@needs("admin")
async def delete_stream(request: web.Request) -> web.Response:
    await service(request).delete(stream_name(request))
    return web.Response(status=204)


def routes() -> list[web.RouteDef]:
    path = PREFIX + "{name:.+}"
    return [
        web.put(path, put_stream),
        web.post(path, post_stream),
        web.get(path, get_stream, allow_head=False),
        web.head(path, head_stream),
        web.delete(path, delete_stream),
    ]
