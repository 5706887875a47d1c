"""Domain errors → HTTP answers: ``{"error": {"code", "message", "field"}}``, never a 500 for
bad input."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from stations.domain import errors
from stations.domain.budget import Overloaded
from stations.domain.log import SequenceGap, StreamClosed
from stations.domain.offsets import encode

logger = logging.getLogger("stations.api")

STATUS = {
    errors.BadRequest: 400,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Gone: 410,
    errors.TooLarge: 413,
    errors.Unavailable: 503,
}
RETRY_AFTER_S = 1  # what a 503 asks a client to wait before retrying


def error_response(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body = {"error": {"code": code, "message": message, "field": field}}
    return web.json_response(body, status=status)


def from_domain(exc: errors.StationsError) -> web.Response:
    status = next(s for cls, s in STATUS.items() if isinstance(exc, cls))
    response = error_response(status, exc.code, exc.message, exc.field)
    if isinstance(exc, StreamClosed):
        response.headers["Stream-Closed"] = "true"
        response.headers["Stream-Next-Offset"] = encode(int(exc.extra["next_offset"]))  # type: ignore[call-overload]
    elif isinstance(exc, SequenceGap):
        response.headers["Producer-Expected-Seq"] = str(exc.extra["expected"])
        response.headers["Producer-Received-Seq"] = str(exc.extra["received"])
    elif isinstance(exc, errors.Forbidden) and "epoch" in exc.extra:
        response.headers["Producer-Epoch"] = str(exc.extra["epoch"])
    elif isinstance(exc, errors.Unavailable):
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def as_station(exc: errors.StationsError) -> errors.StationsError:
    """The management API names the resource a station: the domain, shared with the Durable
    Streams door, says "stream X ..."."""
    if exc.message.startswith("stream "):
        exc.message = "station " + exc.message[len("stream ") :]
    return exc


@web.middleware
async def error_middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
    try:
        return await handler(request)
    except errors.StationsError as exc:
        if request.path.startswith("/api/"):
            exc = as_station(exc)
        return from_domain(exc)
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            reason, field = exc.reason, None
            if exc.status == 413:
                reason = f"the request body is larger than {request.client_max_size} bytes"
                field = "body"
            return error_response(exc.status, exc.reason.lower().replace(" ", "_"), reason, field)
        raise
    except ConnectionResetError:
        # The client went away (mid-upload, say): nothing to answer and nothing wrong here.
        logger.info(
            "client %s disconnected during %s %s", request.remote, request.method, request.path
        )
        return error_response(400, "disconnected", "the client closed the connection")
    except asyncio.CancelledError:
        # The same, noticed by aiohttp first: it cancels the handler of a client that left.
        logger.info(
            "client %s disconnected during %s %s", request.remote, request.method, request.path
        )
        raise
    except Overloaded:
        raise  # the overload middleware, outside this one, answers 503 with Retry-After
    except Exception:
        # A bug: logged with its traceback, answered in the same JSON shape as every error.
        logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")
