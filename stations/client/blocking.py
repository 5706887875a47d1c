"""The blocking transport of the client core, and a blocking idempotent producer on it.

For code that has no event loop and should not start one: Spark executors run each task in a
plain Python worker. ``BlockingHttp`` keeps one keep-alive ``http.client`` connection to one
server; ``BlockingProducer`` drives the sans-IO ``ProducerSession`` over it. Only the standard
library is needed here (no aiohttp), which keeps executors' requirements small.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import urlencode, urlsplit

from stations.client.core import BaseHttp, Reply
from stations.client.errors import (
    ConnectionFailed,
    NotFound,
    RateLimited,
    ServerError,
    StationNotFound,
    StationsError,
    may_have_acted,
)
from stations.client.retry import Backoff, RetryPolicy
from stations.client.session import Appended, ProducerSession

T = TypeVar("T")

# Answers worth sending again (no answer at all is ConnectionFailed).
_RETRYABLE_ANSWERS = (RateLimited, ServerError)


class BlockingHttp(BaseHttp):
    """Requests to one server (``base_url``) over one keep-alive connection.

    ``url`` arguments are paths on that server (``/api/stations``) or absolute URLs of it.
    With a ``retry`` policy, ``call`` sends again after no answer, a 429 or a 5xx: use it only
    for requests that are safe to repeat."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(token, timeout=timeout, headers=headers)
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the url must be http(s)://host[:port] (got {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self.retry = retry
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> BlockingHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _target(self, url: str, params: Mapping[str, str] | None) -> str:
        if url.startswith(self.base_url):
            url = url[len(self.base_url) :] or "/"
        elif not url.startswith("/"):
            raise ValueError(f"{url} is not on {self.base_url}")
        path = self._prefix + url
        return f"{path}?{urlencode(params)}" if params else path

    def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request and read the whole answer; any status comes back as a Reply."""
        data, headers = self._body(json_body, data, headers)
        target = self._target(url, params)
        try:
            conn = self._connection()
            conn.request(method, target, body=data, headers=self._merge(headers))
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()  # the connection's state is unknown: start a new one next time
            raise ConnectionFailed(
                f"{method} {self.base_url}{url}: {type(exc).__name__}: {exc}"
            ) from exc
        # HTTPMessage looks names up case-insensitively, like aiohttp's headers.
        return Reply(response.status, cast(Mapping[str, str], response.headers), body)

    def call(
        self,
        method: str,
        url: str,
        json_body: Any = None,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        what: str = "",
        not_found: type[NotFound] = StationNotFound,
    ) -> Reply:
        """The Reply on 2xx, else the matching ``StationsError`` (after the retries, if any)."""

        def attempt() -> Reply:
            reply = self.request(
                method, url, json_body=json_body, data=data, headers=headers, params=params
            )
            return self.checked(reply, what=what or f"{method} {url}", not_found=not_found)

        return attempt() if self.retry is None else retrying(self.retry, attempt)


def retrying(policy: RetryPolicy, attempt: Callable[[], T]) -> T:
    """``attempt()`` until it answers: no answer, 429 and 5xx sleep and try again under
    ``policy``; other errors, or giving up, raise."""
    backoff: Backoff | None = None
    while True:
        try:
            return attempt()
        except (ConnectionFailed, *_RETRYABLE_ANSWERS) as exc:
            backoff = backoff or Backoff(policy)
            backoff.wait_blocking(exc)


class BlockingProducer:
    """An idempotent producer for code without an event loop: each ``append(body)`` is one
    request with the session's next ``Producer-Seq``, sent until it is answered (no answer,
    429 and 5xx are retried with the *same* seq, so the server deduplicates a retry).

    ``url`` is the stream's URL (or its path on ``http``'s server); ``body`` is the request
    body in the stream's content type (a JSON array of messages on a JSON stream)."""

    def __init__(
        self, http: BlockingHttp, url: str, session: ProducerSession, retry: RetryPolicy
    ) -> None:
        self.http = http
        self.url = url
        self.session = session
        self.retry = retry
        # The body of an append that failed after the server may have stored it: its seq is
        # not used up, and another body under it would be answered as a duplicate and lost.
        self._unsure: bytes | None = None

    def append(self, body: bytes) -> bool:
        """True when the server stored the body, False when it had it already (a replay).
        Raises ``ProducerFenced`` when a newer epoch took over, other errors as they come.
        After an error that leaves the outcome unknown (no answer, a 5xx), only that same body
        may be appended next: its answer then says whether it had been stored."""
        if self._unsure is not None and body != self._unsure:
            raise StationsError(
                "the previous append's outcome is unknown (its answer was lost or it failed "
                "with a 5xx): append the same body again to learn it, or start a new epoch"
            )
        epoch, seq = self.session.epoch, self.session.next_seq
        headers = self.session.headers(epoch, seq)

        def attempt() -> Appended:
            try:
                reply = self.http.request("POST", self.url, data=body, headers=headers)
                return self.session.outcome(reply, epoch, seq)
            except StationsError as exc:
                # Any attempt, not only the last: a lost answer then a 503 may still be stored.
                if may_have_acted(exc):
                    self._unsure = body
                raise

        appended = retrying(self.retry, attempt)
        self._unsure = None
        self.session.next_seq = seq + 1
        return appended.stored

    def close(self) -> None:
        self.http.close()
