"""The client core: what a request and its answer are, whatever carries them.

As in httpx, one core and two transports: ``BaseHttp`` holds what every request shares (the
bearer token, JSON bodies, error answers turned into ``StationsError``); ``stations.client.http.Http``
sends over one aiohttp session, ``stations.client.blocking.BlockingHttp`` over ``http.client``
for code without an event loop (Spark executors). This module imports neither, so the blocking
side needs no aiohttp.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from stations.client.errors import (
    BadRequest,
    NotFound,
    StationNotFound,
    StationsError,
    error_for,
)

DEFAULT_URL = "http://127.0.0.1:4437"
# Longer than the server's long-poll timeout (30 s by default) and SSE lifetime (60 s), so a
# read that is merely waiting is not mistaken for a dead connection.
LIVE_READ_TIMEOUT = 75.0


@dataclass(frozen=True)
class Reply:
    """One answer, whole. ``headers`` look names up case-insensitively in both transports."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:  # a proxy's or a login page's answer, say: not a Stations server
            raise StationsError(
                f"the answer (HTTP {self.status}) is not JSON; is the URL a Stations server? "
                f"It began: {self.body[:60]!r}",
                headers=self.headers,
            ) from None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def flag(self, name: str) -> bool:
        """A protocol boolean header: present only when exactly ``true`` (any case)."""
        return (self.headers.get(name) or "").lower() == "true"


def check_server(url: str, token: str | None, timeout: float) -> None:
    """What a connection needs, checked before any is made, so that a mistyped URL, a token
    read with its line end, or a nonsense timeout is one clear ``ValueError`` naming what is
    wrong, not an error from deep inside a transport (where a URL without ``http://`` was
    retried as a failed connection, for ever by a reader)."""
    check_url(url)
    if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
        raise ValueError("token must be visible ASCII characters (no spaces or line ends)")
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout})")


def check_url(url: str) -> None:
    """``check_server``'s test of the URL alone."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port out of range
    except ValueError as exc:
        raise ValueError(f"url {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url {url!r} must be http:// or https:// and name a host")
    if port == 0:
        raise ValueError(f"url {url!r} has port 0")


def path_segment(name: str, field: str) -> str:
    """A station, group or cursor name as one path segment of the management API (``/``
    becomes ``%2F``). ``.`` and ``..`` are refused before sending (``BadRequest`` naming
    ``field``): URL clients and proxies resolve them away, so ``DELETE .../cursors/..`` could
    reach ``/api/stations/{station}/``."""
    if name in (".", ".."):
        raise BadRequest(f"{field} may not be {name!r}: it is a relative path segment", field=field)
    return quote(name, safe="")


def stream_path(name: str) -> str:
    """A station name as a stream path under ``/v1/stream/`` (``/`` stays a separator)."""
    return quote(name, safe="/")


def json_body(value: Any) -> bytes:
    """A request's JSON body: compact, and NaN / Infinity refused (they are not JSON)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


class BaseHttp:
    """What both transports share: the token and fixed headers, JSON bodies, and turning an
    error answer into the matching ``StationsError``."""

    def __init__(
        self,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.token = token
        self.timeout = timeout
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _merge(self, headers: Mapping[str, str] | None) -> dict[str, str]:
        return {**self._headers, **(headers or {})} if headers else self._headers

    @staticmethod
    def _body(
        json_value: Any, data: bytes | None, headers: Mapping[str, str] | None
    ) -> tuple[bytes | None, Mapping[str, str] | None]:
        if json_value is None:
            return data, headers
        return json_body(json_value), {"Content-Type": "application/json", **(headers or {})}

    @staticmethod
    def checked(
        reply: Reply, *, what: str = "", not_found: type[NotFound] = StationNotFound
    ) -> Reply:
        """``reply`` when it is a 2xx, else its ``StationsError`` raised."""
        if not reply.ok:
            raise error_for(reply.status, reply.headers, reply.body, what=what, not_found=not_found)
        return reply
