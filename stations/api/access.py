"""The access log: one line per request, including those whose client left.

aiohttp writes a line per answer it sends, with the status the answer was begun with. Two
kinds of request would be logged wrong by that alone: a handler cancelled because its client
left (aiohttp writes nothing), and an answer already streaming (SSE, a large catch-up page)
when its client left (aiohttp writes its 200). Both are logged, and counted in the metrics,
with nginx's 499 "client closed request".
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from stations.api import keys
from stations.repeats import Repeats

CLIENT_CLOSED = 499

_GONE: web.RequestKey[bool] = web.RequestKey("client_gone", bool)

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


class AccessFile(logging.handlers.WatchedFileHandler):
    """The access log's file: a file logrotate moved away is opened anew at the next line,
    and lines that cannot be written (a full disk) are told once, then counted, on the
    server's log; the logging module's default printed a traceback per request."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._failures = Repeats(logging.getLogger("stations"), f"writing the access log {path}")
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)
        if not self._failed:
            self._failures.succeeded()

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:  # its last lines could not be written either: already told
            self._failures.failed(exc, traceback=False)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self._failed = True
        exc = sys.exc_info()[1]
        if exc is not None:
            self._failures.failed(exc, traceback=False)
