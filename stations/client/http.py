"""The asyncio transport of the client core (``stations.client.core``): one aiohttp session;
transport failures become ``ConnectionFailed``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from yarl import URL

from stations.client.core import (
    DEFAULT_URL,
    LIVE_READ_TIMEOUT,
    BaseHttp,
    Reply,
    path_segment,
    stream_path,
)
from stations.client.errors import ConnectionFailed, NotFound, StationNotFound, StationsError

__all__ = [
    "DEFAULT_URL",
    "LIVE_READ_TIMEOUT",
    "BaseHttp",
    "Http",
    "Reply",
    "path_segment",
    "stream_path",
]


class Http(BaseHttp):
    """The asyncio transport: an aiohttp session created on first use (it needs a running
    loop), closed by ``close()`` only when this object created it."""

    def __init__(
        self,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(token, timeout=timeout, headers=headers)
        self._session = session
        self._owns_session = session is None
        self._final = False

    @property
    def final(self) -> bool:
        """``close(final=True)`` ran (its ``Client`` is closed): no request goes out any more."""
        return self._final

    def session(self) -> aiohttp.ClientSession:
        if self._final:
            # Not ConnectionFailed: that is retried, and a reader or retry outliving its client
            # went on for ever on a new session that nobody closed.
            raise StationsError("the client is closed")
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise RuntimeError("the aiohttp session given to the client is closed")
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout)
            )
        return self._session

    async def close(self, *, final: bool = False) -> None:
        """Close the session this object created. ``final`` (``Client.close()``): later
        requests raise ``StationsError`` instead of opening a new session."""
        self._final = self._final or final
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

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
        data, headers = self._body(json_body, data, headers)
        response = await self.open(
            method, url, data=data, headers=headers, params=params, read_timeout=read_timeout
        )
        try:
            async with response:
                return Reply(response.status, response.headers, await response.read())
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def open(
        self,
        method: str,
        url: str,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        """Start a request; the caller reads and releases the response (SSE reads it as it
        comes)."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=read_timeout or self.timeout
        )
        try:
            return await self.session().request(
                method,
                URL(url, encoded=True),
                data=data,
                headers=self._merge(headers),
                params=params,
                timeout=timeout,
            )
        except aiohttp.ClientConnectorError as exc:  # no connection: nothing was sent
            message = f"{method} {url}: {type(exc).__name__}: {exc}"
            raise ConnectionFailed(message, sent=False) from exc
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
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """A management API call: the Reply on 2xx, else the matching ``StationsError``."""
        reply = await self.request(method, url, json_body=json_body, params=params, headers=headers)
        return self.checked(reply, what=what, not_found=not_found)
