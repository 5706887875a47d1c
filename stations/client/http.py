"""The HTTP transport shared by the SDK: one aiohttp session, the bearer token, and transport
failures turned into ``ConnectionFailed``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from stations.client.errors import ConnectionFailed, NotFound, StationNotFound, error_for

DEFAULT_URL = "http://127.0.0.1:4437"
# Longer than the server's long-poll timeout (30 s by default) and SSE lifetime (60 s), so a
# read that is merely waiting is not mistaken for a dead connection.
LIVE_READ_TIMEOUT = 75.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def flag(self, name: str) -> bool:
        """A protocol boolean header: present only when exactly ``true`` (any case)."""
        return (self.headers.get(name) or "").lower() == "true"


def path_segment(name: str) -> str:
    """A station name as one path segment of the management API (``/`` becomes ``%2F``)."""
    return quote(name, safe="")


def stream_path(name: str) -> str:
    """A station name as a stream path under ``/v1/stream/`` (``/`` stays a separator)."""
    return quote(name, safe="/")


class Http:
    """An aiohttp session created on first use (it needs a running loop), closed by ``close()``
    only when this object created it."""

    def __init__(
        self,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.token = token
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise RuntimeError("the aiohttp session given to the client is closed")
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout)
            )
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    def _merge(self, headers: Mapping[str, str] | None) -> dict[str, str]:
        return {**self._headers, **(headers or {})}

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Reply:
        """Send one request and read the whole answer; any status comes back as a Reply."""
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=read_timeout or self.timeout
        )
        try:
            async with self.session().request(
                method,
                URL(url, encoded=True),
                data=data,
                headers=self._merge(headers),
                params=params,
                timeout=timeout,
            ) as response:
                body = await response.read()
                return Reply(response.status, response.headers, body)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def open(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        """Start a streaming request (SSE); the caller reads and releases the response."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=read_timeout or self.timeout
        )
        try:
            return await self.session().request(
                method,
                URL(url, encoded=True),
                headers=self._merge(headers),
                params=params,
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def call(
        self,
        method: str,
        url: str,
        json_body: Any = None,
        *,
        what: str = "",
        not_found: type[NotFound] = StationNotFound,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        """A management API call: the Reply on 2xx, else the matching ``StationsError``."""
        reply = await self.request(method, url, json_body=json_body, params=params)
        if not reply.ok:
            raise error_for(reply.status, reply.headers, reply.body, what=what, not_found=not_found)
        return reply
