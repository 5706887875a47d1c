"""Domain errors → HTTP answers: ``{"error": {"code", "message", "field"}}``, never a 500 for
bad input."""

from __future__ import annotations

import logging

from aiohttp import web

from stations import errors
from stations.api.public import path_as_asked
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
    errors.PreconditionFailed: 412,
    errors.TooLarge: 413,
    errors.Unavailable: 503,
    errors.OutcomeUnknown: 500,  # done or not: unlike a 503, a client may not simply retry
}
RETRY_AFTER_S = 1  # what a 503 asks a client to wait before retrying


def error_response(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body = {"error": {"code": code, "message": message, "field": field}}
    return web.json_response(body, status=status)


def from_domain(exc: errors.StationsError, *, internals: bool = True) -> web.Response:
    """``internals``: whether the answer may carry the database's own words (``detail``)."""
    status = next(s for cls, s in STATUS.items() if isinstance(exc, cls))
    response = error_response(status, exc.code, str(exc) if internals else exc.message, exc.field)
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


def answer(request: web.Request, exc: Exception, *, internals: bool = True) -> web.Response:
    """The JSON answer to what a handler raised. An HTTP exception that is an answer already
    (a redirect, a JSON error) is raised again, for aiohttp to send as it is. ``internals``:
    whether the request may read the database's own words (see ``auth.may_see_internals``)."""
    if isinstance(exc, errors.StationsError):
        station = as_station(exc) if request.path.startswith("/api/") else exc
        return from_domain(station, internals=internals)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400 or exc.content_type == "application/json":
            raise exc
        reason, field = exc.reason, None
        if exc.status == 404 and request.match_info.route.resource is None:
            # No route has this path: a URL with a proxy's prefix, or a typo. Its own code, so
            # that clients (the SDK, the CLI, the console) do not take it for a station or
            # group that is not there, or was deleted.
            asked = path_as_asked(request)
            through = "" if asked is None else f"; {asked} through --public-url"
            return error_response(
                404, "no_route", f"nothing is served at {request.path}{through} (is the URL right?)"
            )
        if exc.status == 413:
            reason = f"the request body is larger than {request.client_max_size} bytes"
            field = "body"
        response = error_response(exc.status, exc.reason.lower().replace(" ", "_"), reason, field)
        if "Allow" in exc.headers:  # a 405 names the methods the resource takes (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    if isinstance(exc, Overloaded):  # the read budget or the waiting readers' slots
        response = error_response(503, "overloaded", exc.message)
        response.headers["Retry-After"] = str(exc.retry_after_s)
        response.force_close()  # a refused reader must not keep its connection either
        return response
    if isinstance(exc, ConnectionResetError):
        # The client went away (mid-upload, say): nothing to answer and nothing wrong here.
        gone(request)
        return error_response(400, "disconnected", "the client closed the connection")
    # A bug: logged with its traceback, answered in the same JSON shape as every error.
    logger.error("unexpected error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal", "internal server error")


def gone(request: web.Request) -> None:
    """The client left during its request (aiohttp cancels the handler, or a read or write
    fails): logged at INFO, it is no fault of the server's."""
    logger.info("client %s disconnected during %s %s", request.remote, request.method, request.path)
