"""What consumers and producers need of a ``Station`` and its ``Client``, as protocols.

``Station`` hands itself to the ``Consumer`` and ``IdempotentProducer`` it makes; typing that
argument with these protocols instead of the class keeps those modules from importing
``stations.client.client``, which imports them (no import circle, not even for type checking).
"""

from __future__ import annotations

from typing import Protocol

from stations.client.http import Http
from stations.client.models import GroupInfo
from stations.client.retry import RetryPolicy
from stations.client.seek import SeekResult, Target


class ClientChild(Protocol):
    """A producer or consumer on a client's session, with work that is only queued."""

    async def on_client_close(self) -> None: ...


class ClientHandle(Protocol):
    """The server a station lives on: its base URL and its HTTP session (with the token)."""

    url: str
    http: Http
    retry: RetryPolicy

    def _adopt(self, child: ClientChild) -> None:
        """Have ``close()`` deliver what ``child`` holds before the session goes."""


class StationHandle(Protocol):
    """One station, as ``stations.client.Station`` offers it."""

    @property
    def client(self) -> ClientHandle: ...

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def content_type(self) -> str | None: ...

    def group_url(self, group: str) -> str: ...

    async def ensure_group(
        self,
        group: str,
        *,
        max_ack_time_ms: int | None = None,
        max_msg_deliveries: int | None = None,
        start_from: str | None = None,
        exists: bool | None = None,
    ) -> GroupInfo: ...

    async def seek(self, group: str, to: Target) -> SeekResult: ...
