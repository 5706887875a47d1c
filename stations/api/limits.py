"""Connection limits and timeouts: the server cannot be pinned by clients that hold sockets open.

- ``max_connections``: beyond it a new connection is answered ``503`` (JSON) and closed, before
  any file descriptor runs out (the file-descriptor soft limit is raised to the hard one first).
- ``max_waiting_readers``: long-poll and SSE requests in progress; beyond it a reader gets
  ``503`` with ``Retry-After``, so waiting readers never take the slots producers and
  ``/healthz`` need. With tokens, one token holds at most ``max_waiting_readers_per_token`` of
  them (half by default), so no token can keep the others from reading.
- ``head_timeout_s``: a request head begun but not complete in time is answered ``408``
  and the connection closed (slowloris); ``body_timeout_s``: a request body not complete in
  time is answered ``408``.
- ``idle_timeout_s``: a keep-alive connection with no request closes.
- ``send_timeout_s``: a response the client stops reading (the socket stays full) closes.
- ``max_append_messages``: messages one JSON append may carry (an array's elements); beyond
  it the append is refused (``413`` on ``/v1/stream``, ``400`` on the management produce) as
  soon as its body is parsed, so one 64 MiB body of ``[0,0,...]`` cannot become 33 million
  messages to write out, store and index in one transaction.

Request bodies are taken as sent: a body with a ``Content-Encoding`` is refused (``415``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from stations.api import auth, errors, headers
from stations.api.errors import error_response
from stations.domain.budget import Overloaded

logger = logging.getLogger("stations.api.limits")

FD_RESERVE = 128  # descriptors kept for the database, files and the listener
WAITING_READERS_SHARE = 0.9  # of max_connections, by default
REFUSERS = 64  # connections being refused at once; more are dropped at once

# Why the connection layer closed or refused a connection by itself, before or around any
# handler (so in no request's count): ``stations_connections_closed_total{reason}``.
CLOSE_REASONS = (
    "max_connections",  # over --max-connections: a 503, or dropped when many are refused
    "head_timeout",  # a request head not in within --head-timeout-s: 408
    "body_timeout",  # a request body not in within --body-timeout-s: 408
    "malformed",  # a request aiohttp could not parse: 400
    "send_timeout",  # its client read nothing for --send-timeout-s
    "slow_client",  # its client read nothing while other reads waited for read memory
)
Closed = Callable[[str], None]  # counts one close by its reason


def _uncounted(reason: str) -> None:
    pass


@dataclass(frozen=True)
class Limits:
    max_connections: int = 10_000
    max_waiting_readers: int = 9_000
    max_waiting_readers_per_token: int | None = None  # None: half of max_waiting_readers
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 75.0
    send_timeout_s: float = 30.0
    # The most a 1 MiB JSON array holds ("1," each): the TS client's IdempotentProducer sends
    # batches of up to 1 MiB, and at 100,000 one of tiny messages was refused, every batch after
    # it too (found by a review).
    max_append_messages: int = 524_288


def raise_nofile() -> int:
    """Raise the file-descriptor soft limit to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)  # Linux nr_open
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def default_max_connections(nofile: int) -> int:
    return max(nofile - FD_RESERVE, 16)


def _refusal(status: int, code: str, message: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()
    head = (
        f"HTTP/1.1 {status} {'Service Unavailable' if status == 503 else 'Request Timeout'}\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n"
    )
    if retry_after is not None:
        head += f"Retry-After: {retry_after}\r\n"
    return head.encode() + b"\r\n" + body


TOO_MANY_CONNECTIONS = _refusal(
    503, "too_many_connections", "the server is at its connection limit; retry shortly", 1
)
HEAD_TIMEOUT = _refusal(408, "request_timeout", "the request head did not arrive in time")


class _Refuser(asyncio.Protocol):
    """Answers one connection over the cap with 503 and closes it, without parsing much."""

    def __init__(self, site: CappedSite) -> None:
        self._site = site
        self._transport: asyncio.Transport | None = None
        self._seen = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._site.refusing += 1
        # Answer when the request head is in (or at once after a short wait), so the client
        # reads the 503 instead of a reset.
        self._timer = asyncio.get_running_loop().call_later(1.0, self._answer)

    def data_received(self, data: bytes) -> None:
        self._seen = (self._seen + data)[-4:]
        if b"\r\n\r\n" in self._seen or b"\n\n" in self._seen:
            self._answer()

    def _answer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._site.closed("max_connections")
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._site.refusing -= 1
        self._transport = None


class SlowClients:
    """Connections whose client stopped reading (its socket full, the writes paused), and
    since when. While reads wait for read memory, those paused for a while are closed, as a
    broker drops a slow consumer: their pages hold the budget, and a handful of clients that
    never read would otherwise have every other read wait and be refused for as long as
    ``send_timeout_s`` (and again each time they reconnect)."""

    def __init__(self, closed: Closed = _uncounted) -> None:
        self.paused: dict[GuardedHandler, float] = {}
        self.closed = closed

    def close_paused(self, for_s: float) -> int:
        """Close every connection paused for ``for_s`` seconds or more; returns how many."""
        now = asyncio.get_running_loop().time()
        slow = [h for h, since in self.paused.items() if now - since >= for_s]
        for handler in slow:
            self.paused.pop(handler, None)
            if handler.transport is not None:
                self.closed("slow_client")
                handler.transport.abort()
        if slow:
            logger.info(
                "closed %d connection(s) whose client stopped reading while other reads waited "
                "for read memory",
                len(slow),
            )
        return len(slow)


class BodyTimeout(web.HTTPRequestTimeout, TimeoutError):
    """What reading a body that did not arrive in time raises: a 408 for a handler reading
    it, and a ``TimeoutError`` for aiohttp's lingering close, which drops the body of a
    request answered without reading it (a 413, a long-poll) and ends quietly on a timeout;
    any other exception there was logged at ERROR as unhandled, with a traceback."""


class GuardedHandler(RequestHandler):
    """aiohttp's request handler with head, body and send timeouts."""

    def __init__(
        self,
        limits: Limits,
        slow: SlowClients | None = None,
        closed: Closed = _uncounted,
        **kwargs: Any,
    ) -> None:
        # Bodies are never decoded (encoding_middleware refuses coded ones): no decompression
        # work for a body nobody will store, and no parser error on one aiohttp cannot decode.
        kwargs["auto_decompress"] = False
        super().__init__(keepalive_timeout=limits.idle_timeout_s, **kwargs)
        self._limits = limits
        self._slow = slow
        self._closed = closed
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    def _busy(self) -> bool:
        return bool(getattr(self, "_request_in_progress", False) or self._messages)

    def data_received(self, data: bytes) -> None:
        # Called for every read of a body too (aiohttp resumes its parser with b""): the
        # common case, nothing new and a request in progress, does no more than it must.
        idle = not self._busy()
        messages = self._messages
        before = len(messages)
        super().data_received(data)
        # Every request whose head is in gets a deadline for its body.
        for i in range(before, len(messages)):
            payload = messages[i][1]
            if not payload.is_eof():
                timer = asyncio.get_running_loop().call_later(
                    self._limits.body_timeout_s, self._body_timeout, payload
                )
                payload.on_eof(timer.cancel)
        if messages:
            self._cancel_head_timer()
        elif idle and self._head_timer is None:
            # The first bytes of a request head: it must be complete in time.
            self._head_timer = asyncio.get_running_loop().call_later(
                self._limits.head_timeout_s, self._head_timeout
            )

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (an over-long header line, a malformed head) is
        the client's error: a JSON 400 like every refusal, logged as one line at INFO, not a
        traceback at ERROR that any client could fill the log with."""
        if isinstance(exc, UnicodeEncodeError) and not request.headers.get("Expect", "").isascii():
            # aiohttp answers Expect before any middleware, and its refusal of a value that is
            # not UTF-8 failed to encode that value into its own message: a 500 and a traceback.
            logger.info("refused a request from %s: its Expect is not ASCII", request.remote)
            self._closed("malformed")
            response = error_response(
                417, "expectation_failed", "Expect may only be 100-continue", "Expect"
            )
            response.force_close()
            return response
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was started; the malformed request ends it")
        if isinstance(exc, LineTooLong):
            text = "the request line or a header is too long (at most 8190 bytes each)"
        else:
            text = "malformed request: " + _what_failed(exc)
        reason = text.removeprefix("malformed request: ")
        logger.info("refused a malformed request from %s: %s", request.remote, reason)
        self._closed("malformed")
        response = error_response(status, "bad_request", text)
        response.force_close()
        return response

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._busy() or self.transport is None:
            return
        logger.info("closing a connection whose request head did not arrive in time")
        self._closed("head_timeout")
        transport = self.transport  # force_close() lets go of it
        transport.write(HEAD_TIMEOUT)
        self.force_close()
        transport.close()

    def _body_timeout(self, payload: Any) -> None:
        if payload.is_eof():
            return
        logger.info("a request body did not arrive within %ss", self._limits.body_timeout_s)
        self._closed("body_timeout")
        # The handler reading the body gets 408; the rest of the body is not waited for, and
        # the connection closes after the answer (its framing is lost).
        payload.set_exception(BodyTimeout())
        payload.feed_eof()
        self.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        # The client stopped reading: it has ``send_timeout_s`` to take some more (less when
        # its pages keep other reads waiting: SlowClients).
        if self._send_timer is None:
            loop = asyncio.get_running_loop()
            self._send_timer = loop.call_later(self._limits.send_timeout_s, self._send_timeout)
            if self._slow is not None:
                self._slow.paused[self] = loop.time()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._slow is not None:
            self._slow.paused.pop(self, None)

    def _send_timeout(self) -> None:
        self._send_timer = None
        if self.transport is not None:
            logger.info("closing a connection whose client stopped reading")
            self._closed("send_timeout")
            self.transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._slow is not None:
            self._slow.paused.pop(self, None)
        super().connection_lost(exc)


class CappedSite(web.SockSite):
    """A listening socket whose connections are counted and capped."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: Any,
        limits: Limits,
        closed: Closed = _uncounted,
        **kwargs: Any,
    ) -> None:
        """``closed``: counts the connections it closes or refuses by itself, by reason."""
        super().__init__(runner, sock, **kwargs)
        self.limits = limits
        self.refusing = 0
        self.handshakes = 0  # HTTPS connections accepted, their TLS handshake not done yet
        self._handshaking: set[asyncio.Task[None]] = set()  # (the loop keeps weak references)
        self.slow: SlowClients | None = runner.app.get(SLOW_CLIENTS)
        self.closed = closed

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        if len(server._connections) + self.handshakes >= self.limits.max_connections:
            if self.refusing >= REFUSERS or self._ssl_context is not None:
                # (A 503 in the clear means nothing to a client that speaks TLS.)
                self.closed("max_connections")
                return _Dropper()
            return _Refuser(self)
        if self._ssl_context is not None:
            return _TlsStart(self)
        return self._handler()

    def _handler(self) -> GuardedHandler:
        server = self._runner.server
        assert server is not None
        return GuardedHandler(
            self.limits,
            self.slow,
            self.closed,
            manager=server,
            loop=server._loop,
            **_kwargs(server),
        )

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        # TLS, if any, is started per connection once it is counted (``_TlsStart``).
        self._server = await loop.create_server(
            self._protocol, sock=self._sock, backlog=self._backlog
        )

    def start_tls(self, fd: int) -> None:
        self.handshakes += 1
        task = asyncio.ensure_future(self._serve_tls(fd))
        self._handshaking.add(task)
        task.add_done_callback(self._handshaking.discard)

    async def _serve_tls(self, fd: int) -> None:
        """Serve the accepted connection ``fd`` with TLS, its handshake within
        --head-timeout-s (a slow one holds a connection as a slow head would)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(fileno=fd)
        try:
            await loop.connect_accepted_socket(
                self._handler,
                sock,
                ssl=self._ssl_context,
                ssl_handshake_timeout=self.limits.head_timeout_s,
            )
        except Exception as exc:  # a failed, abandoned or timed-out handshake
            logger.debug("TLS handshake failed: %r", exc)
            sock.close()
        finally:
            self.handshakes -= 1


class _TlsStart(asyncio.Protocol):
    """An HTTPS connection, accepted in the clear so that it counts against --max-connections
    from its accept, as a plain one does (``CappedSite.handshakes``); served by
    ``create_server(ssl=...)``, it counted only once its handshake was done, and clients that
    never began one held descriptors past the cap. Its socket is taken from the plain
    transport before that reads anything (a duplicate of its descriptor) and served anew with
    TLS (``CappedSite.start_tls``): handed to ``loop.start_tls`` instead, under uvloop the
    plain transport had read the ClientHello first (half of 1,000 handshakes failed)."""

    def __init__(self, site: CappedSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        plain = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        try:
            fd = os.dup(plain.get_extra_info("socket").fileno())
        except OSError as exc:  # out of descriptors
            logger.warning("cannot take over a connection for TLS: %s", exc.strerror)
            plain.abort()
            return
        plain.abort()  # closes its descriptor; the connection lives on in ``fd``
        self._site.start_tls(fd)


class _Dropper(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


def _kwargs(server: Any) -> dict[str, Any]:
    kwargs = dict(getattr(server, "_kwargs", {}))
    kwargs.pop("keepalive_timeout", None)
    return kwargs


# -- waiting readers --------------------------------------------------------------------------


class ReaderSlots:
    def __init__(self, limit: int, per_key: int | None = None) -> None:
        self.limit = limit
        # What one key (a token) may hold: a token that keeps re-polling would otherwise win
        # every slot its own answers free, and every other token's reads get 503.
        self.per_key = per_key if per_key is not None else max(1, limit // 2)
        self.used = 0
        self.by_key: Counter[object] = Counter()
        # Called whenever ``used`` changes (a shutdown's drain waits for only readers to be left).
        self.changed: Callable[[], None] | None = None
        # The handlers waiting with a key, so that revoking a token ends its waits at once
        # (``revoke``), and those revoke ended, so that they answer 401 rather than 499.
        self.waiting: dict[asyncio.Task[Any], object] = {}
        self.revoked: set[asyncio.Task[Any]] = set()

    def refusal(self, key: object | None = None) -> Overloaded | None:
        """Why a reader with ``key`` gets no slot now, or None."""
        if self.used >= self.limit:
            return Overloaded(
                f"the server already serves {self.limit} waiting readers (long-poll and SSE); "
                "retry shortly"
            )
        if key is not None and self.by_key[key] >= self.per_key:
            return Overloaded(
                f"this token already holds {self.per_key} waiting readers (long-poll, SSE and "
                "group fetches), its share of the server's; retry shortly"
            )
        return None

    @contextlib.contextmanager
    def slot(self, key: object | None = None) -> Iterator[None]:
        """A waiting reader's slot; ``key`` (its token, None without tokens) is held to its
        share."""
        refused = self.refusal(key)
        if refused is not None:
            raise refused
        task = asyncio.current_task()
        self.used += 1
        if key is not None:
            self.by_key[key] += 1
            if task is not None:
                self.waiting[task] = key
        if self.changed is not None:
            self.changed()
        try:
            yield
        finally:
            self.used -= 1
            if key is not None:
                self.by_key[key] -= 1
                if not self.by_key[key]:
                    del self.by_key[key]
                if task is not None:
                    self.waiting.pop(task, None)
                    self.revoked.discard(task)
            if self.changed is not None:
                self.changed()

    def revoke(self, still_valid: Callable[[object], bool]) -> int:
        """End the waits (long-poll, SSE, group fetch) whose key is no longer valid; return
        how many. A token revoked, or changed in role or stations, held its waits to their
        end: up to a group fetch's 300 s, leasing messages to a client that could not ack."""
        ended = 0
        for task, key in list(self.waiting.items()):
            if not still_valid(key) and task not in self.revoked:
                self.revoked.add(task)
                task.cancel()
                ended += 1
        return ended

    def take_back(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether ``revoke`` cancelled ``task`` (not its client leaving, nor a drain); if it
        did, the cancellation is taken back for the handler to answer."""
        if task is None or task not in self.revoked:
            return False
        task.uncancel()
        return True


# A long-poll or a group fetch that found no slot (``ReaderSlots``): it is answered if what it
# asks for is there already, and refused with this instead of waiting. Readers holding the
# slots re-asked within milliseconds of each answer and kept them: the others got 503 on
# every try, their data ready (found by a review with the TS client).
NO_WAIT: web.RequestKey[Overloaded] = web.RequestKey("no_wait", Overloaded)


def may_wait(request: web.Request) -> bool:
    return NO_WAIT not in request


def no_slot(request: web.Request) -> Overloaded:
    return request[NO_WAIT]


def waits(request: web.Request) -> bool:
    """Long-poll and SSE reads, and group fetches (which may wait for messages): each takes
    one of the ``ReaderSlots``."""
    if request.path.startswith("/v1/stream/"):
        return request.method == "GET" and request.query.get("live") in ("long-poll", "sse")
    return request.method == "POST" and request.path.endswith("/fetch")


# -- request bodies ---------------------------------------------------------------------------


def refused_length(request: web.Request) -> web.Response | None:
    """A body whose declared length is over the limit gets ``413`` before it is read: it was
    read up to the limit first, or a client that sent its head alone waited out the body
    timeout for a 408."""
    length = request.content_length
    if length is None or length <= request.client_max_size:
        return None
    # The answer aiohttp's own refusal, once it has read past the limit, is given.
    too_large = web.HTTPRequestEntityTooLarge(max_size=request.client_max_size, actual_size=length)
    response = errors.answer(request, too_large)
    response.force_close()  # no handler reads the body (aiohttp drops what comes, a while)
    return response


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """Every route's ``Expect`` handler (aiohttp runs it before any middleware): a body
    declared too large is not asked for with ``100 Continue`` (the middleware answers 413,
    ``refused_length``, after the Host check and counted as every answer is), nor is one
    with an expectation the server does not know (``refused_expect``: 417), nor one the
    middleware will refuse for its Host, Origin or token (a client without a token, or out
    of its scope, was asked for its 64 MiB before its 401 or 403); otherwise
    ``100 Continue``."""
    if (
        refused_length(request) is not None
        or refused_expect(request) is not None
        or headers.refused_host(request) is not None
        or headers.refused_origin(request) is not None
        or auth.refused(request) is not None
    ):
        return None
    if request.version == HttpVersion11:  # (Expect means nothing before: RFC 9110 10.1.1)
        assert request.writer is not None
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer proper has not begun
    return None


def refused_expect(request: web.Request) -> web.Response | None:
    """An ``Expect`` other than ``100-continue`` (HTTP/1.1) gets ``417``, as the JSON error
    every refusal is; aiohttp's own answer was plain text quoting the value back."""
    expect = request.headers.get("Expect")
    if expect is None or request.version != HttpVersion11 or expect.lower() == "100-continue":
        return None
    response = error_response(
        417, "expectation_failed", "Expect may only be 100-continue", "Expect"
    )
    response.force_close()  # a body may follow, or not: its framing is in doubt
    return response


def with_expect_continue(defs: Iterable[web.AbstractRouteDef]) -> list[web.AbstractRouteDef]:
    """``defs`` with ``expect_continue`` as their ``Expect`` handler."""
    return [
        web.RouteDef(d.method, d.path, d.handler, {**d.kwargs, "expect_handler": expect_continue})
        if isinstance(d, web.RouteDef)
        else d
        for d in defs
    ]


def refused_encoding(request: web.Request) -> web.Response | None:
    """A request body with a ``Content-Encoding`` other than ``identity`` gets ``415`` (RFC
    7694). Decoding gzip or deflate took the 64 MiB limit after decompression, but a corrupt
    body was a 500, a truncated one was stored truncated, and a coding aiohttp does not know
    (``compress``, ``x-gzip``, two codings) was stored still coded, as if it were the data."""
    if "Content-Encoding" not in request.headers:
        return None
    codings = [
        c.strip().lower()
        for value in request.headers.getall("Content-Encoding", [])
        for c in value.split(",")
    ]
    if request.body_exists and any(c not in ("", "identity") for c in codings):
        response = error_response(
            415,
            "unsupported_content_encoding",
            "request bodies are taken as sent: send them without a Content-Encoding",
            "Content-Encoding",
        )
        response.headers["Accept-Encoding"] = "identity"
        response.force_close()  # no handler reads the coded body (aiohttp drops it, a while)
        return response
    return None


# Its object in the application (see stations.api.keys).
LIMITS: web.AppKey[Limits] = web.AppKey("limits")
READERS: web.AppKey[ReaderSlots] = web.AppKey("readers")
SLOW_CLIENTS: web.AppKey[SlowClients] = web.AppKey("slow_clients")


# aiohttp's parse errors name the problem, then quote what they stopped at (``: b'...'``, a
# line break, or the URL itself): those bytes may hold a bearer token or a token in a query.
# Only a reason made of words is kept.
_REASON = re.compile(r"[A-Za-z][A-Za-z0-9 ,'-]*")


def _what_failed(exc: HttpProcessingError) -> str:
    """aiohttp's reason for refusing a request, without the request bytes it quotes."""
    reason = (exc.message or "").split(":", 1)[0].split("\n", 1)[0].strip()
    if not _REASON.fullmatch(reason) or " " not in reason:  # "http" of a quoted URL, say
        return type(exc).__name__
    return " ".join(reason.split())[:200]
