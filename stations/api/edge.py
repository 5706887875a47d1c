"""The one middleware every request passes through, doing in order what the server checks and
adds around a handler:

1. the drain's count of requests in progress (``stations.api.drain``) and the request metrics
   (``stations_http_requests``, latency), whatever the answer;
2. the ``Host`` check (``headers.refused_host``);
3. CORS preflights, answered here (``headers.preflight``);
4. request bodies declared too large, expectations other than ``100-continue`` and bodies
   sent with a ``Content-Encoding`` (``limits.refused_length``, ``refused_expect``,
   ``refused_encoding``);
5. token-less modes: writes sent by foreign web pages (``headers.refused_origin``); else the
   bearer token (``auth.refused``); then a management route's query parameters
   (``params.refused_query``);
6. a slot for a waiting read (``limits.ReaderSlots``), then the handler;
7. what the handler raised, as the JSON error it means (``errors.answer``);
8. the console's security headers on its pages. CORS and the other headers every response
   carries are added as it is prepared (``headers.on_prepare``), streams included.

It was nine middlewares, one for each, each a coroutine frame more on every request: folding
them into one took single appends from 10.5-10.9k to 12.1-13.3k requests a second (wrk, 32
connections), about a sixth of the server's CPU per request.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from stations.api import access, auth, errors, headers, limits, params
from stations.api.drain import DRAIN, Drain
from stations.api.limits import READERS
from stations.api.metrics import METRICS, Metrics


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    app = request.app
    metrics: Metrics = app[METRICS]
    drain: Drain = app[DRAIN]
    started = time.perf_counter()
    task = drain.enter()
    status: int | None = 500
    try:
        response: web.StreamResponse | None = headers.refused_host(request)
        if response is None:
            response = await _checked(request, handler)
            if request.path.startswith("/ui"):
                headers.console(response)
        if isinstance(response, web.FileResponse) and not response.prepared:
            # its status (304, 206, 416) is decided as it is sent: counted then
            request[_FILE_STARTED] = started
            status = None
        elif access.gone(request):  # its client left while it was being sent
            status = access.CLIENT_CLOSED
        else:
            status = response.status
        return response
    except web.HTTPException as exc:  # an answer already (a redirect): aiohttp sends it
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = access.CLIENT_CLOSED
        access.write_cancelled(request, started)
        raise
    finally:
        drain.leave(task)
        if status is not None:
            metrics.observe(request, status, time.perf_counter() - started)


_FILE_STARTED: web.RequestKey[float] = web.RequestKey("file_started", float)


async def count_file(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``on_response_prepare``: a console file's count, by the status it is sent with."""
    started = request.get(_FILE_STARTED)
    if started is not None and isinstance(request, web.Request):
        metrics: Metrics = request.app[METRICS]
        metrics.observe(request, response.status, time.perf_counter() - started)


async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Steps 3 to 7."""
    if request.method == "OPTIONS":
        return headers.preflight(request)
    refusal = (
        limits.refused_length(request)
        or limits.refused_expect(request)
        or limits.refused_encoding(request)
        or headers.refused_origin(request)
        or auth.refused(request)
    )
    if refusal is not None:
        return refusal
    try:
        params.refused_query(request)
        if limits.waits(request):
            slots = request.app[READERS]
            refused = slots.refusal(request.get(auth.TOKEN))
            if refused is not None and request.query.get("live") != "sse":
                # A long-poll or fetch whose answer is ready needs no slot (see NO_WAIT);
                # an SSE connection always waits.
                request[limits.NO_WAIT] = refused
                return await handler(request)
            with slots.slot(request.get(auth.TOKEN)):
                try:
                    return await handler(request)
                except asyncio.CancelledError:
                    if not _revoked(request, slots):
                        raise
                    return auth.revoked_answer()
        return await handler(request)
    except asyncio.CancelledError:
        errors.gone(request)
        raise
    except Exception as exc:
        return errors.answer(request, exc, internals=auth.may_see_internals(request))


def _revoked(request: web.Request, slots: limits.ReaderSlots) -> bool:
    """Whether the wait was ended by its token's revocation (``ReaderSlots.revoke``) rather
    than by its client leaving, and can still be answered 401."""
    if not slots.take_back(asyncio.current_task()):
        return False
    # An answer already under way cannot become a 401: its connection is cut (an SSE ends
    # whole by itself).
    return request.writer is None or request.writer.output_size == 0
