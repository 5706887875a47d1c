"""Outgoing webhook calls: one aiohttp client session with bounded connections, timeouts,
no redirects, and a resolver that refuses private, link-local (and, unless allowed, loopback)
addresses, so a host name that resolves somewhere it must not go is refused at connect time too
(a DNS answer can change after the URL was checked)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from stations.domain.subscriptions.errors import UrlRejected
from stations.domain.subscriptions.urls import address_refusal, check_webhook_url

TIMEOUT = aiohttp.ClientTimeout(total=10, connect=5)
MAX_ANSWER = 64 * 1024  # the webhook's answer is read up to this size


class SafeResolver(AbstractResolver):
    def __init__(self, allow_loopback: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_loopback = allow_loopback

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [
            r
            for r in results
            if address_refusal(ipaddress.ip_address(r["host"]), self._allow_loopback) is None
        ]
        if not allowed:
            raise OSError(f"webhook host {host} resolves only to refused addresses")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


async def resolve_refusal(url: str, allow_loopback: bool) -> None:
    """Check a webhook URL when it is registered: literal addresses now, host names through DNS
    (a name that does not resolve yet is accepted; the connect-time check still applies)."""
    host, literal = check_webhook_url(url, allow_loopback)
    if literal or host.lower().rstrip(".") == "localhost":
        return
    resolver = DefaultResolver()
    try:
        results = await resolver.resolve(host, 0, socket.AF_UNSPEC)
    except UnicodeError:  # IDNA refuses it (an empty label, one over 63 characters)
        raise UrlRejected("webhook.url: the host name is not a valid name", "webhook.url") from None
    except OSError:
        return
    finally:
        await resolver.close()
    for r in results:
        reason = address_refusal(ipaddress.ip_address(r["host"]), allow_loopback)
        if reason:
            raise UrlRejected(
                f"webhook.url: {host} resolves to a refused address ({reason})", "webhook.url"
            )


class WebhookSender:
    def __init__(self, allow_loopback: bool, concurrency: int = 32) -> None:
        self._allow_loopback = allow_loopback
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._concurrency, resolver=SafeResolver(self._allow_loopback)
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=TIMEOUT)
        return self._session

    async def send(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
        # A literal address skips the resolver: check it again (the server's options may differ
        # from when the subscription was made).
        try:
            check_webhook_url(url, self._allow_loopback)
        except UrlRejected:
            return False, False
        async with self._client().post(
            url, data=body, headers=headers, allow_redirects=False
        ) as response:
            if not 200 <= response.status < 300:
                return False, False
            raw = await response.content.read(MAX_ANSWER)
        answer: Any = None
        try:
            import json

            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        return True, isinstance(answer, dict) and answer.get("done") is True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
