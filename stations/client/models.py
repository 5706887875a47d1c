"""Typed results: the management API's camelCase JSON as frozen dataclasses."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def to_wire(value: Any) -> Any:
    """A settings dataclass or mapping as camelCase JSON (snake_case keys are converted)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {camel(str(k)): to_wire(v) for k, v in value.items()}
    return value


def message_data(view: Mapping[str, Any]) -> Any:
    """A message's payload: the JSON value (JSON stations), the text, or bytes when the
    payload is not UTF-8 (the server then sends ``dataBase64``)."""
    if view.get("dataBase64") is not None:
        return base64.b64decode(view["dataBase64"])
    return view.get("data")


@dataclass(frozen=True)
class Retention:
    max_age_ms: int | None = None
    max_messages: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class RedrivePolicy:
    """``dls.redrive``: dead letters go back to their group by themselves, at most
    ``max_redrives`` times each, ``delay_ms * backoff**n`` (at most ``max_delay_ms``) later."""

    max_redrives: int
    delay_ms: int = 60_000
    backoff: float = 1
    max_delay_ms: int = 7 * 86_400_000


@dataclass(frozen=True)
class DeadLetterSettings:
    poison: bool = True
    forward_to: str | None = None
    retention_ms: int | None = None
    redrive: RedrivePolicy | None = None


@dataclass(frozen=True)
class ConsumerDefaults:
    max_ack_time_ms: int = 30_000
    max_msg_deliveries: int = 2


@dataclass(frozen=True)
class StationStats:
    messages: int = 0
    bytes: int = 0
    tail_offset: str = ""
    ids_in_window: int = 0
    groups: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class StationInfo:
    """A StationView: the config plus live stats. ``created`` is True when this very
    ``create_station`` call made the station (201), False when it already stood (200)."""

    name: str
    content_type: str
    idempotency_window_ms: int
    retention: Retention
    dls: DeadLetterSettings
    consumer_defaults: ConsumerDefaults
    stats: StationStats
    created_at: datetime | None
    closed: bool = False
    created: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_json(self) -> bool:
        return is_json_type(self.content_type)

    @classmethod
    def from_wire(cls, view: Mapping[str, Any], created: bool = False) -> StationInfo:
        retention = view.get("retention") or {}
        dls = view.get("dls") or {}
        defaults = view.get("consumerDefaults") or {}
        stats = view.get("stats") or {}
        return cls(
            name=view["name"],
            content_type=view.get("contentType", "application/json"),
            idempotency_window_ms=view.get("idempotencyWindowMs", 0),
            retention=Retention(
                retention.get("maxAgeMs"), retention.get("maxMessages"), retention.get("maxBytes")
            ),
            dls=DeadLetterSettings(
                dls.get("poison", True),
                dls.get("forwardTo"),
                dls.get("retentionMs"),
                _redrive(dls.get("redrive")),
            ),
            consumer_defaults=ConsumerDefaults(
                defaults.get("maxAckTimeMs", 30_000), defaults.get("maxMsgDeliveries", 2)
            ),
            stats=StationStats(
                stats.get("messages", 0),
                stats.get("bytes", 0),
                stats.get("tailOffset", ""),
                stats.get("idsInWindow", 0),
                stats.get("groups", 0),
                stats.get("deadLettered", 0),
            ),
            created_at=_time(view.get("createdAt")),
            closed=bool(view.get("closed", False)),
            created=created,
            raw=dict(view),
        )


@dataclass(frozen=True)
class Produced:
    """Where a produced message is: its offset, and whether it was a duplicate of an id in the
    station's idempotency window (then ``offset`` is the original message's)."""

    offset: str
    duplicate: bool


@dataclass(frozen=True)
class NewMessage:
    """A message for ``produce_many``: ``data`` is any JSON value for a JSON station, ``str``
    or ``bytes`` for others."""

    data: Any
    msg_id: str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class StoredMessage:
    offset: str
    msg_id: str | None
    headers: Mapping[str, str]
    data: Any
    time: datetime | None


@dataclass(frozen=True)
class MessagePage:
    messages: list[StoredMessage]
    next_offset: str
    up_to_date: bool


@dataclass(frozen=True)
class GroupInfo:
    name: str
    max_ack_time_ms: int
    max_msg_deliveries: int
    pending: int = 0
    in_flight: int = 0
    dead_lettered: int = 0
    lag: int = 0
    cursor: str | None = None
    created: bool = False

    @classmethod
    def from_wire(cls, view: Mapping[str, Any], created: bool = False) -> GroupInfo:
        return cls(
            name=view["name"],
            max_ack_time_ms=view.get("maxAckTimeMs", 0),
            max_msg_deliveries=view.get("maxMsgDeliveries", 0),
            pending=view.get("pending", 0),
            in_flight=view.get("inFlight", 0),
            dead_lettered=view.get("deadLettered", 0),
            lag=view.get("lag", 0),
            cursor=view.get("cursor"),
            created=created,
        )


@dataclass(frozen=True)
class DeadLetter:
    id: str
    group: str
    offset: str
    msg_id: str | None
    headers: Mapping[str, str]
    data: Any
    delivery_count: int
    reason: str
    error: str | None
    dead_lettered_at: datetime | None
    redrives: int = 0  # times the message was redriven before this entry
    redrive_at: datetime | None = None  # when the station's redrive policy moves it back

    @classmethod
    def from_wire(cls, view: Mapping[str, Any]) -> DeadLetter:
        return cls(
            id=str(view["id"]),
            group=view.get("group", ""),
            offset=view.get("offset", ""),
            msg_id=view.get("msgId"),
            headers=view.get("headers") or {},
            data=message_data(view),
            delivery_count=view.get("deliveryCount", 0),
            reason=view.get("reason", ""),
            error=view.get("error"),
            dead_lettered_at=_time(view.get("deadLetteredAt")),
            redrives=view.get("redrives", 0),
            redrive_at=_time(view.get("redriveAt")),
        )


@dataclass(frozen=True)
class DeadLetterPage:
    entries: list[DeadLetter]
    next: str | None


@dataclass(frozen=True)
class GroupPage:
    """A page of a station's groups (``Station.group_page``); ``next`` is the ``after`` of the
    next page, None on the last."""

    groups: list[GroupInfo]
    next: str | None


@dataclass(frozen=True)
class CursorInfo:
    """A reader cursor (the API's CursorView): the position a reader that keeps its own progress
    committed under ``name`` (``offset``, ``"-1"``'s position being the start), ``lag`` the
    messages stored after it (those retention dropped not counted) and when it was last
    committed."""

    name: str
    offset: str
    lag: int = 0
    updated_at: datetime | None = None

    @classmethod
    def from_wire(cls, view: Mapping[str, Any]) -> CursorInfo:
        return cls(
            name=view["name"],
            offset=view.get("offset", ""),
            lag=view.get("lag", 0),
            updated_at=_time(view.get("updatedAt")),
        )


@dataclass(frozen=True)
class CursorPage:
    """A page of a station's reader cursors (``Station.cursor_page``); ``next`` is the ``after``
    of the next page, None on the last."""

    cursors: list[CursorInfo]
    next: str | None


def _redrive(view: Any) -> RedrivePolicy | None:
    if not isinstance(view, Mapping):
        return None
    return RedrivePolicy(
        view["maxRedrives"],
        view.get("delayMs", 60_000),
        view.get("backoff", 1),
        view.get("maxDelayMs", 7 * 86_400_000),
    )


def is_json_type(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"
