"""The server's errors, raised by the domain and the store alike. The HTTP layer maps each to a
status code; neither the domain nor the store sees HTTP. (The SDK has its own:
``stations.client.errors``.)"""

from __future__ import annotations


class StationsError(Exception):
    code = "error"

    def __init__(self, message: str, field: str | None = None, **extra: object) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra

    def __str__(self) -> str:
        # ``detail``: the database's own words, in logs and tracebacks; an HTTP answer carries
        # them only to whom it may (``stations.api.errors.from_domain``).
        detail = self.extra.get("detail")
        return f"{self.message} ({detail})" if detail else self.message


class BadRequest(StationsError):
    code = "bad_request"


class NotFound(StationsError):
    code = "not_found"


class Gone(StationsError):
    code = "gone"


class Conflict(StationsError):
    code = "conflict"


class PreconditionFailed(StationsError):
    """A condition the request set (``If-Match``, ``If-None-Match``) does not hold."""

    code = "precondition_failed"


class Forbidden(StationsError):
    code = "forbidden"


class TooLarge(StationsError):
    code = "too_large"


class Unavailable(StationsError):
    """The database or the disk failed: nothing was decided, the client may retry."""

    code = "unavailable"


class OutcomeUnknown(StationsError):
    """The database connection was lost while it committed, and the outcome could not be
    learned again in time: the request may have been carried out. Not a 503, which says that
    nothing was decided: retrying this blindly could store twice."""

    code = "outcome_unknown"
