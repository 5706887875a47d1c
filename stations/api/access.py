"""The access log: one line per request, including those whose client left.

aiohttp writes a line per answer it sends, with the status the answer was begun with. Two
kinds of request would be logged wrong by that alone: a handler cancelled because its client
left (aiohttp writes nothing), and an answer already streaming (SSE, a large catch-up page)
when its client left (aiohttp writes its 200). Both are logged, and counted in the metrics,
with nginx's 499 "client closed request".
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from stations.api import keys

CLIENT_CLOSED = 499

_GONE = "stations.client_gone"

# What the lines hold: the client's address, the request line, the status, the body's bytes,
# the seconds taken and the user agent (aiohttp's '%a "%r" %s %b %Tf "%{User-Agent}i"').
_LINE = '%s "%s %s HTTP/%d.%d" %d %s %.6f "%s"'


def left(request: web.BaseRequest) -> None:
    """Mark ``request`` as one whose client left while its answer was being sent."""
    request[_GONE] = True


def gone(request: web.BaseRequest) -> bool:
    return bool(request.get(_GONE))


def write(
    logger: logging.Logger, request: web.BaseRequest, status: int, size: str, seconds: float
) -> None:
    version = request.version
    logger.info(
        _LINE,
        request.remote,
        request.method,
        request.path_qs,
        version.major,
        version.minor,
        status,
        size,
        seconds,
        request.headers.get("User-Agent", "-"),
    )


def write_cancelled(request: web.Request, started: float) -> None:
    """The line aiohttp leaves out: a handler cancelled because its client left."""
    logger = request.app.get(keys.ACCESS_LOG)
    if logger is not None:
        write(logger, request, CLIENT_CLOSED, "-", time.perf_counter() - started)


class AccessLogger(AbstractAccessLogger):
    """aiohttp's per-answer line, with 499 for an answer its client left during."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        status = CLIENT_CLOSED if gone(request) else response.status
        write(self.logger, request, status, str(response.body_length), time)
