"""Group seek: move a consumer group to an offset, a time, the earliest retained message or now
(``POST /api/stations/{name}/groups/{group}/seek``).

A seek is a clean cut: the group's leases in flight are revoked (settling them answers
unknown; a transaction settling them raises ``Conflict``) and its waiting redeliveries are
dropped. Delivery goes on from the new position with fresh delivery counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from stations.client.http import Http


class _Client(Protocol):
    http: Http


class _Station(Protocol):
    """What a seek needs of ``stations.client.Station`` (a protocol: no import circle)."""

    name: str

    @property
    def client(self) -> _Client: ...

    def group_url(self, group: str) -> str: ...


Target = str | datetime | int


@dataclass(frozen=True)
class SeekResult:
    cursor: str  # the group's cursor: the next message delivered is the one after it
    revoked: int  # leases in flight that were revoked
    dropped: int  # waiting redeliveries that were dropped


def seek_body(to: Target) -> dict[str, Any]:
    """``"earliest"``, ``"now"`` or an offset token; a ``datetime`` (aware) for a time; an
    ``int`` is epoch milliseconds."""
    if isinstance(to, datetime):
        if to.tzinfo is None:
            raise ValueError("seek to a datetime needs a time zone (use datetime.now(UTC))")
        return {"time": to.isoformat()}
    if isinstance(to, int) and not isinstance(to, bool):
        return {"time": to}
    if isinstance(to, str):
        return {"to": to}
    raise TypeError("seek to earliest, now, an offset, a datetime or epoch ms")


async def seek(station: _Station, group: str, to: Target) -> SeekResult:
    reply = await station.client.http.call(
        "POST",
        station.group_url(group) + "/seek",
        seek_body(to),
        what=f"seek group {group} on {station.name}",
    )
    body = reply.json()
    return SeekResult(body["cursor"], int(body["revoked"]), int(body["dropped"]))
