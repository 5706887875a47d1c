"""One exception hierarchy for everything the SDK raises.

Every error answer of the server becomes a ``StationsError`` subclass chosen by its status (and,
for the Durable Streams protocol, by its headers), so callers catch ``StationNotFound`` or
``ProducerFenced`` instead of digging through status codes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any


class StationsError(Exception):
    """Base class of every SDK error. ``status`` is the HTTP status, or None for local errors."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.code = code
        self.field = field
        self.headers: Mapping[str, str] = headers or {}


class ConnectionFailed(StationsError):
    """No HTTP answer: the connection was refused, dropped or timed out. ``sent``: False only
    when no connection was made, so the server surely did nothing; else it may have acted on
    the request (its answer was lost)."""

    def __init__(self, message: str, *, sent: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.sent = sent


class BadRequest(StationsError):
    """400: the input was refused; ``field`` names the offending field as a dotted path."""

    status = 400


class Unauthorized(StationsError):
    """401: no token, or one the server does not know (never issued, or revoked)."""

    status = 401


class Forbidden(StationsError):
    """403: the token's role or station patterns do not allow this."""

    status = 403


class ProducerFenced(Forbidden):
    """403 with ``Producer-Epoch``: a newer epoch of this producer id took over (zombie fencing)."""

    def __init__(self, message: str, *, current_epoch: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.current_epoch = current_epoch


class EpochInUse(ProducerFenced):
    """The server already held a (producer id, epoch, seq) before this producer first sent it:
    another instance (an earlier run, or a twin) used the same producer id and epoch, so the
    batch's 204 "duplicate" would silently drop new data. Start each run with a higher epoch,
    or let ``auto_claim`` move on to the next one. ``current_epoch`` is the epoch in use;
    ``status`` is a fence's 403, though the server's answer was a 204."""


class NotFound(StationsError):
    status = 404


class StationNotFound(NotFound):
    """404 for a station (a station is a stream, so this is also "stream not found")."""


class GroupNotFound(NotFound):
    """404 for a consumer group."""


class CursorNotFound(NotFound):
    """404 for a reader cursor."""


class Conflict(StationsError):
    """409: a station exists with another config, a content type mismatch, ..."""

    status = 409


class StreamClosed(Conflict):
    """409 with ``Stream-Closed: true``: the stream is closed; ``final_offset`` is its end."""

    def __init__(self, message: str, *, final_offset: str | None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.final_offset = final_offset


class SequenceGap(Conflict):
    """409 with ``Producer-Expected-Seq``: the server expected another producer sequence."""

    def __init__(self, message: str, *, expected_seq: int, received_seq: int, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.expected_seq = expected_seq
        self.received_seq = received_seq


class Gone(StationsError):
    """410: the stream was deleted, or the offset is before the retained data."""

    status = 410


class PreconditionFailed(StationsError):
    """412: a condition the request set does not hold (``ensure_group(..., exists=)``:
    the group exists, or does not); ``field`` names the header."""

    status = 412


class PayloadTooLarge(StationsError):
    status = 413


class RateLimited(StationsError):
    """429; ``retry_after`` (seconds) when the server said how long to wait."""

    status = 429

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(StationsError):
    """5xx; ``retry_after`` (seconds) when the server sent one (503)."""

    status = 500

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ProducerClosed(StationsError):
    """``append()`` after ``close()`` or ``detach()``."""


class ConsumerClosed(StationsError):
    """``ack()`` after the consumer (or its ``Client``) is closed: the ack could no longer be
    sent, and the message will be delivered again."""


class BufferFull(StationsError):
    """``append()`` while the producer holds ``max_buffered_bytes`` of unacknowledged data.

    Await ``producer.wait_for_capacity()`` and append again."""


_BY_STATUS: dict[int, type[StationsError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    429: RateLimited,
}


def _digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` is true of "²" too, which ``int`` refuses (a header
    is read as Latin-1, so a stray byte from a proxy can be one)."""
    return text.isascii() and text.isdigit()


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date)."""
    value = headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if _digits(value):
        return float(value)
    try:
        from datetime import UTC, datetime

        when = parsedate_to_datetime(value)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _describe(body: bytes) -> tuple[str | None, str | None, str | None]:
    """(message, code, field) from a Stations JSON error or a plain-text body."""
    if not body:
        return None, None, None
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500] or None, None, None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return error.get("message"), error.get("code"), error.get("field")
    if isinstance(error, str):
        return error, None, None
    return None, None, None


def _html(headers: Mapping[str, str], body: bytes) -> bool:
    content_type = headers.get("Content-Type", "").lower()
    return content_type.startswith("text/html") or body.lstrip()[:1] == b"<"


def error_for(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    what: str = "",
    not_found: type[NotFound] = StationNotFound,
) -> StationsError:
    """The exception for an error answer. ``what`` says what was asked (used when the answer
    has no message); ``not_found`` is the 404 class when the server does not name a group."""
    message, code, field = _describe(body)
    if not message:  # e.g. a HEAD answer: say what was asked instead
        message = f"{what}: HTTP {status}" if what else f"HTTP {status}"
        if status == 401:
            # A producer's or an SSE reader's first request is a HEAD: a token revoked while
            # the program ran said only "HTTP 401" there.
            message += ": no token, or the server refused the token (unknown to it, or revoked)"
    common: dict[str, Any] = {"status": status, "code": code, "field": field, "headers": headers}
    if _html(headers, body):
        # A proxy's error page, or another web server at this URL: its 404 says nothing of a
        # station, and the page itself is no message (it was printed whole).
        message = (
            f"{what + ': ' if what else ''}HTTP {status} with an HTML page, not an answer of "
            "Stations (a proxy's error, or another server at this URL?)"
        )
        if status >= 500:
            return ServerError(message, retry_after=retry_after(headers), **common)
        return StationsError(message, headers=headers)  # no Stations status: not "not found"
    if status == 403 and _digits(headers.get("Producer-Epoch", "")):
        return ProducerFenced(message, current_epoch=int(headers["Producer-Epoch"]), **common)
    if status == 409 and headers.get("Stream-Closed", "").lower() == "true":
        return StreamClosed(message, final_offset=headers.get("Stream-Next-Offset"), **common)
    if status == 409 and _digits(headers.get("Producer-Expected-Seq", "")):
        received = headers.get("Producer-Received-Seq", "")
        return SequenceGap(
            message,
            expected_seq=int(headers["Producer-Expected-Seq"]),
            received_seq=int(received) if _digits(received) else -1,
            **common,
        )
    if status == 404 and code == "no_route":
        # No route at that path (the base URL's path is wrong): nothing said of a station.
        return StationsError(message, **common)
    if status == 404:
        # "group", or a transaction item's "ack.0.group"
        named_group = field is not None and (field == "group" or field.endswith(".group"))
        cls: type[StationsError] = GroupNotFound if named_group else not_found
        if field == "cursor":
            cls = CursorNotFound
        return cls(message, **common)
    if status == 429:
        return RateLimited(message, retry_after=retry_after(headers), **common)
    if status >= 500:
        return ServerError(message, retry_after=retry_after(headers), **common)
    return _BY_STATUS.get(status, StationsError)(message, **common)


def may_have_acted(exc: BaseException) -> bool:
    """Whether the server may have carried out the request that failed so: its answer was
    lost, or it failed (5xx) other than by refusing it untouched (503: overloaded, or the
    database unavailable, nothing decided)."""
    if isinstance(exc, ConnectionFailed):
        return exc.sent
    return isinstance(exc, ServerError) and exc.status != 503


def is_retryable(exc: BaseException) -> bool:
    """Worth sending again: no answer, overload (429) or a server-side failure (5xx)."""
    return isinstance(exc, ConnectionFailed | RateLimited | ServerError)
