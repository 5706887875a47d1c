"""The Durable Streams protocol at ``/v1/stream/{name}``, plus the Msg-Id layer (§3)."""

from __future__ import annotations

import base64
import random
import re
import time
from datetime import datetime

from aiohttp import web

from stations import framing
from stations.errors import BadRequest
from stations.lifecycle import CreateRequest
from stations.log import AppendRequest, AppendResult, ReadResult
from stations.offsets import NOW, BadOffset, decode, encode
from stations.producers import parse_headers
from stations.station import default_config
from stations.streams import StreamState, is_json_type

PREFIX = "/v1/stream/"
MAX_READ_BYTES = 4 * 1024 * 1024  # a catch-up response carries at most about this much
CURSOR_EPOCH = datetime(2024, 10, 9).timestamp()
CURSOR_INTERVAL_S = 20
_TTL = re.compile(r"^(0|[1-9][0-9]*)$")
_SUB = re.compile(r"^(0|[1-9][0-9]*)$")
_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,256}$")
CACHEABLE = "public, max-age=60, stale-while-revalidate=300"


def service(request: web.Request):  # type: ignore[no-untyped-def]
    return request.app["service"]


def stream_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > 1024:
        raise BadRequest("the stream path must be 1 to 1024 characters", "path")
    return name


def _is_true(value: str | None) -> bool:
    return value is not None and value.lower() == "true"


def _offset(request: web.Request, param: str = "offset") -> int | None:
    """The requested position; None means ``now`` (the tail)."""
    values = request.query.getall(param, [])
    if len(values) > 1:
        raise BadRequest("offset may be given once", param)
    token = values[0] if values else "-1"
    if token == NOW:
        return None
    try:
        return decode(token)
    except BadOffset:
        raise BadRequest(f"malformed offset {token!r}", param) from None


def _stream_headers(response: web.StreamResponse, state: StreamState) -> None:
    response.headers["Content-Type"] = state.content_type
    if state.ttl_seconds is not None:
        response.headers["Stream-TTL"] = str(state.ttl_seconds)
    if state.expires_at is not None:
        response.headers["Stream-Expires-At"] = (
            datetime.fromtimestamp(state.expires_at / 1000).astimezone().isoformat()
        )


def cursor(client_cursor: str | None) -> str:
    """Interval-based cursor, never going backwards for a client (§10.1)."""
    current = int((time.time() - CURSOR_EPOCH) // CURSOR_INTERVAL_S)
    if client_cursor is not None and client_cursor.isdigit() and int(client_cursor) >= current:
        return str(int(client_cursor) + random.randint(1, 3600 // CURSOR_INTERVAL_S))
    return str(current)


# -- create -----------------------------------------------------------------------------------


def _parse_expires(value: str) -> int:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadRequest(
            "Stream-Expires-At must be an RFC 3339 timestamp", "Stream-Expires-At"
        ) from None
    if parsed.tzinfo is None:
        raise BadRequest("Stream-Expires-At needs a time zone offset", "Stream-Expires-At")
    return int(parsed.timestamp() * 1000)


def _fork_source(value: str) -> str:
    path = value.split("?", 1)[0]
    if path.startswith(PREFIX):
        path = path[len(PREFIX) :]
    path = path.lstrip("/")
    if not path:
        raise BadRequest("Stream-Forked-From must name a stream", "Stream-Forked-From")
    from urllib.parse import unquote

    return unquote(path)


async def put_stream(request: web.Request) -> web.Response:
    name = stream_name(request)
    h = request.headers
    content_type_given = "Content-Type" in h
    content_type = h.get("Content-Type", "application/octet-stream").strip()
    if not content_type:
        content_type = "application/octet-stream"
    ttl = h.get("Stream-TTL")
    expires = h.get("Stream-Expires-At")
    if ttl is not None and expires is not None:
        raise BadRequest("send Stream-TTL or Stream-Expires-At, not both", "Stream-TTL")
    ttl_seconds = None
    if ttl is not None:
        if not _TTL.match(ttl):
            raise BadRequest("Stream-TTL must be a non-negative integer", "Stream-TTL")
        ttl_seconds = int(ttl)
    expires_at = _parse_expires(expires) if expires is not None else None
    fork_from = h.get("Stream-Forked-From")
    fork_offset = None
    sub_offset = 0
    if fork_from is None:
        for header in ("Stream-Fork-Offset", "Stream-Fork-Sub-Offset"):
            if header in h:
                raise BadRequest(f"{header} needs Stream-Forked-From", header)
    if fork_from is not None:
        fork_from = _fork_source(fork_from)
        if "Stream-Fork-Offset" in h:
            token = h["Stream-Fork-Offset"]
            try:
                fork_offset = decode(token)
            except BadOffset:
                raise BadRequest("malformed Stream-Fork-Offset", "Stream-Fork-Offset") from None
        if "Stream-Fork-Sub-Offset" in h:
            if not _SUB.match(h["Stream-Fork-Sub-Offset"]):
                raise BadRequest(
                    "Stream-Fork-Sub-Offset must be a non-negative integer",
                    "Stream-Fork-Sub-Offset",
                )
            sub_offset = int(h["Stream-Fork-Sub-Offset"])
    body = await request.read()
    svc = service(request)
    json_mode = is_json_type(content_type)
    initial = framing.split_json(body, allow_empty=True) if json_mode else ([body] if body else [])
    req = CreateRequest(
        name=name,
        content_type=content_type,
        config=default_config(name, content_type),
        ttl_seconds=ttl_seconds,
        expires_at=expires_at,
        closed=_is_true(h.get("Stream-Closed")),
        initial=initial,
        fork_from=fork_from,
        fork_offset=fork_offset,
        fork_sub_offset=sub_offset,
        content_type_given=content_type_given,
    )
    result = await svc.create(req)
    state = result.state
    response = web.Response(status=201 if result.created else 200)
    _stream_headers(response, state)
    response.headers["Stream-Next-Offset"] = encode(state.tail)
    if state.closed:
        response.headers["Stream-Closed"] = "true"
    if result.created:
        response.headers["Location"] = str(request.url.with_query(None))
    return response


# -- append -----------------------------------------------------------------------------------


async def post_stream(request: web.Request) -> web.Response:
    name = stream_name(request)
    h = request.headers
    close = _is_true(h.get("Stream-Closed"))
    producer = parse_headers(h.get("Producer-Id"), h.get("Producer-Epoch"), h.get("Producer-Seq"))
    msg_id = h.get("Msg-Id")
    if msg_id is not None and not _PRINTABLE.match(msg_id):
        raise BadRequest("Msg-Id must be 1 to 256 printable ASCII characters", "Msg-Id")
    body = await request.read()
    content_type = h.get("Content-Type")
    req = AppendRequest(
        name=name,
        content_type=content_type,
        close=close,
        producer=producer,
        stream_seq=h.get("Stream-Seq"),
    )
    if body:
        try:
            if content_type is None:
                raise BadRequest("an append with a body needs a Content-Type", "Content-Type")
            if is_json_type(content_type):
                req.messages = framing.split_json(body, allow_empty=False)
            else:
                req.messages = [body]
            if msg_id is not None:
                if len(req.messages) != 1:
                    raise BadRequest(
                        "with Msg-Id the body must carry exactly one message", "Msg-Id"
                    )
                req.msg_ids = [msg_id]
        except BadRequest as exc:
            req.body_error = exc
            req.messages = []
    elif msg_id is not None and not close:
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
        response.headers["Msg-Offset"] = encode(offset)
    elif with_msg_id:
        response.headers["Msg-Duplicate"] = "true" if not stored else "false"
    return response


# -- read -------------------------------------------------------------------------------------


def _body(state: StreamState, result: ReadResult) -> bytes:
    items = [m.data for m in result.messages]
    return framing.join_json(items) if state.is_json else b"".join(items)


def _etag(result: ReadResult) -> str:
    tag = f"{result.state.id}:{result.start}:{result.next}"
    if result.closed:
        tag += ":c"
    return f'"{tag}"'


def _read_headers(response: web.StreamResponse, result: ReadResult) -> None:
    _stream_headers(response, result.state)
    response.headers["Stream-Next-Offset"] = encode(result.next)
    if result.up_to_date:
        response.headers["Stream-Up-To-Date"] = "true"
    if result.closed:
        response.headers["Stream-Closed"] = "true"


async def get_stream(request: web.Request) -> web.StreamResponse:
    name = stream_name(request)
    live = request.query.get("live")
    if live not in (None, "long-poll", "sse"):
        raise BadRequest("live must be long-poll or sse", "live")
    if live is not None and "offset" not in request.query:
        raise BadRequest("live reads need an offset", "offset")
    position = _offset(request)
    svc = service(request)
    state = await svc.stream(name)
    await svc.touch(state)
    if live == "sse":
        from api.sse import serve_sse

        return await serve_sse(request, name, position)
    if live == "long-poll":
        timeout = request.app["long_poll_timeout_s"]
        result = await svc.read_or_wait(name, position, timeout, max_bytes=MAX_READ_BYTES)
        if not result.messages:
            response = web.Response(status=204)
            _read_headers(response, result)
            response.headers["Stream-Up-To-Date"] = "true"
            if not result.closed:
                response.headers["Stream-Cursor"] = cursor(request.query.get("cursor"))
            response.headers["Cache-Control"] = "no-store"
            return response
        response = web.Response(status=200, body=_body(result.state, result))
        _read_headers(response, result)
        response.headers["ETag"] = _etag(result)
        response.headers["Cache-Control"] = CACHEABLE
        if not result.closed:
            response.headers["Stream-Cursor"] = cursor(request.query.get("cursor"))
        return response
    result = await svc.read(name, position, max_bytes=MAX_READ_BYTES)
    if position is None:
        response = web.Response(status=200, body=b"[]" if state.is_json else b"")
        _read_headers(response, result)
        response.headers["Stream-Up-To-Date"] = "true"
        response.headers["Cache-Control"] = "no-store"
        return response
    etag = _etag(result)
    if request.headers.get("If-None-Match") == etag:
        response = web.Response(status=304)
        response.headers["ETag"] = etag
        response.headers["Stream-Next-Offset"] = encode(result.next)
        return response
    response = web.Response(status=200, body=_body(result.state, result))
    _read_headers(response, result)
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = CACHEABLE
    return response


async def head_stream(request: web.Request) -> web.Response:
    state = await service(request).stream(stream_name(request))
    response = web.Response(status=200)
    _stream_headers(response, state)
    response.headers["Stream-Next-Offset"] = encode(state.tail)
    if state.closed:
        response.headers["Stream-Closed"] = "true"
    response.headers["Cache-Control"] = "no-store"
    return response


async def delete_stream(request: web.Request) -> web.Response:
    await service(request).delete(stream_name(request))
    return web.Response(status=204)


def sse_payload(state: StreamState, result: ReadResult) -> str:
    """The text of one ``data`` event: JSON array, text as is, other types base64."""
    if state.is_json:
        return _body(state, result).decode()
    raw = b"".join(m.data for m in result.messages)
    if state.content_type.lower().startswith("text/"):
        return raw.decode("utf-8", errors="replace")
    return base64.b64encode(raw).decode()


def routes() -> list[web.RouteDef]:
    path = PREFIX + "{name:.+}"
    return [
        web.put(path, put_stream),
        web.post(path, post_stream),
        web.get(path, get_stream, allow_head=False),
        web.head(path, head_stream),
        web.delete(path, delete_stream),
    ]
