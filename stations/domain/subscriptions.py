"""Durable Streams subscriptions (PROTOCOL.md §6-7): definitions, cursors and wake decisions.

A subscription links streams (explicitly, or by a glob ``pattern``) and keeps one durable
cursor per stream. When a linked stream's tail passes its cursor and the subscription is idle,
a *wake* starts: a new ``generation`` and ``wake_id``. A webhook subscription's wake is POSTed
to its URL (retried with backoff until it is answered); a pull-wake subscription's wake is an
event appended to its wake stream, and a worker claims it. Callbacks, acks and releases carry a
token for one generation and wake; anything older is fenced.

Every function here that takes a ``Batch`` runs inside the writer's transaction, so the
decision and its rows commit together. They return the moments at which the delivery engine
(stations/domain/subscriptions_engine.py) must look at a subscription again.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import random
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import quote, urlsplit

from stations.domain import text
from stations.domain.errors import BadRequest, Conflict, NotFound, StationsError
from stations.domain.idwindow import IdWindow
from stations.domain.log import AppendRequest, append
from stations.domain.offsets import BEGINNING, BadOffset, decode, encode
from stations.domain.streams import is_json_type
from stations.domain.subscriptions_keys import Signer, TokenError, kid_of, new_private_pem
from stations.store import subscriptions as store
from stations.store.writer import Batch

log = logging.getLogger("stations.subscriptions")

DEFAULT_LEASE_MS = 30_000
MIN_LEASE_MS = 1_000
MAX_LEASE_MS = 600_000
MAX_ID = 256
MAX_PATH = 1024
# Stream paths one request may name: they are stored in one write transaction, which holds up
# every other write meanwhile (100,000 held appends back about 5 s).
MAX_STREAMS = 1000
# Streams one subscription may name, over all its requests: each change of it re-reads all its
# links and each wake carries their tails. (Streams a pattern matches are not counted.)
MAX_SUBSCRIPTION_STREAMS = 10_000
RETRY_BASE_MS = 1_000
RETRY_MAX_MS = 60_000
RETRY_JITTER = 0.2
# A delivery attempt owns the wake for this long: if its process dies mid-attempt, another
# process (or the restarted one) tries again once it has passed.
ATTEMPT_GUARD_MS = 20_000
INDEX_KEY = "__ds/index/"  # notifier keys: a subscription's definition changed
WAKE_KEY = "__ds/wake/"  # notifier keys: a subscription's wake state changed

# -- errors (each carries the protocol's code; the HTTP layer maps the class to a status) ------


class SubscriptionError(StationsError):
    status = 400


class InvalidRequest(SubscriptionError, BadRequest):
    code = "INVALID_REQUEST"


class UrlRejected(SubscriptionError, BadRequest):
    code = "WEBHOOK_URL_REJECTED"


class SubscriptionNotFound(SubscriptionError, NotFound):
    code = "SUBSCRIPTION_NOT_FOUND"
    status = 404


class AlreadyExists(SubscriptionError, Conflict):
    code = "SUBSCRIPTION_ALREADY_EXISTS"
    status = 409


class Fenced(SubscriptionError, Conflict):
    code = "FENCED"
    status = 409


class AlreadyClaimed(SubscriptionError, Conflict):
    code = "ALREADY_CLAIMED"
    status = 409


class NoPendingWork(SubscriptionError, Conflict):
    code = "NO_PENDING_WORK"
    status = 409


class InvalidOffset(SubscriptionError, Conflict):
    code = "INVALID_OFFSET"
    status = 409


class TokenRefused(SubscriptionError):
    status = 401

    def __init__(self, code: str) -> None:
        super().__init__("the token is expired" if code == "TOKEN_EXPIRED" else "invalid token")
        self.code = code


# -- definitions ----------------------------------------------------------------------------


def normalize_path(path: str) -> str:
    return path.strip("/")


def _path(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not normalize_path(value):
        raise InvalidRequest(f"{field_name} must be a non-empty stream path", field_name)
    path = normalize_path(value)
    if len(path) > MAX_PATH or any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise InvalidRequest(
            f"{field_name} must be 1 to {MAX_PATH} printable characters", field_name
        )
    if path == "__ds" or path.startswith("__ds/"):
        raise InvalidRequest(f"{field_name}: paths under __ds are reserved", field_name)
    return path


def valid_id(sub_id: str) -> str:
    if not sub_id or len(sub_id) > MAX_ID or not _visible(sub_id):
        raise InvalidRequest(f"the subscription id must be 1 to {MAX_ID} visible characters", "id")
    return sub_id


def _visible(text: str) -> bool:
    """No control characters, no spaces."""
    return not any(ord(c) < 0x21 or c == "\x7f" for c in text)


def glob_match(pattern: str, path: str) -> bool:
    """``*`` (or any fnmatch wildcard inside a segment) matches within one segment, ``**``
    matches zero or more whole segments (PROTOCOL.md §6.2). By dynamic programming over
    (pattern segment, path segment): backtracking took exponential time on stacked ``**``
    (seconds per append for ``**/**/**/**/**/**/**/zz``, the event loop stalled)."""
    pats, segs = pattern.split("/"), path.split("/")
    # can[j]: the pattern's segments from i on match the path's from j on (i going down).
    can = [False] * len(segs) + [True]
    for head in reversed(pats):
        if head == "**":
            for j in range(len(segs) - 1, -1, -1):
                can[j] = can[j] or can[j + 1]
        else:
            can = [fnmatchcase(segs[j], head) and can[j + 1] for j in range(len(segs))] + [False]
    return can[0]


@dataclass(frozen=True)
class Spec:
    """A normalized subscription configuration; ``config_hash`` decides re-confirmation."""

    type: str
    pattern: str | None
    streams: tuple[str, ...]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None

    @property
    def config_hash(self) -> str:
        canonical = {
            "type": self.type,
            "pattern": self.pattern,
            "streams": sorted(set(self.streams)),
            "webhook": {"url": self.webhook_url} if self.webhook_url else None,
            "wake_stream": self.wake_stream,
            "lease_ttl_ms": self.lease_ttl_ms,
            "description": self.description,
        }
        return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def too_many(paths: list[Any]) -> None:
    if len(paths) > MAX_STREAMS:
        raise InvalidRequest(f"streams may list at most {MAX_STREAMS} paths per request", "streams")


def parse_spec(raw: Any) -> Spec:
    if not isinstance(raw, dict):
        raise InvalidRequest("the body must be a JSON object", "body")
    kind = raw.get("type")
    if kind not in ("webhook", "pull-wake"):
        raise InvalidRequest('type must be "webhook" or "pull-wake"', "type")
    pattern = raw.get("pattern")
    if pattern is not None:
        pattern = _path(pattern, "pattern")
    streams_raw = raw.get("streams", [])
    if streams_raw is None:
        streams_raw = []
    if not isinstance(streams_raw, list):
        raise InvalidRequest("streams must be a list of stream paths", "streams")
    too_many(streams_raw)
    streams = tuple(dict.fromkeys(_path(s, "streams") for s in streams_raw))
    if pattern is None and not streams:
        raise InvalidRequest("at least one of pattern or streams is required", "pattern")
    lease = raw.get("lease_ttl_ms", DEFAULT_LEASE_MS)
    if (
        not isinstance(lease, int)
        or isinstance(lease, bool)
        or not MIN_LEASE_MS <= lease <= MAX_LEASE_MS
    ):
        raise InvalidRequest(
            f"lease_ttl_ms must be an integer from {MIN_LEASE_MS} to {MAX_LEASE_MS}", "lease_ttl_ms"
        )
    description = raw.get("description")
    if description is not None and (
        not isinstance(description, str) or len(description) > text.LONG or "\x00" in description
    ):
        raise InvalidRequest(
            f"description must be a string of at most {text.LONG} characters, without NUL",
            "description",
        )
    webhook_url = wake_stream = None
    if kind == "webhook":
        hook = raw.get("webhook")
        url = hook.get("url") if isinstance(hook, dict) else None
        if not isinstance(url, str) or not url:
            raise InvalidRequest("webhook subscriptions need webhook.url", "webhook.url")
        if len(url) > text.LONG or "\x00" in url:
            raise InvalidRequest(
                f"webhook.url must be at most {text.LONG} characters, without NUL", "webhook.url"
            )
        webhook_url = url
    else:
        if raw.get("wake_stream") is None:
            raise InvalidRequest("pull-wake subscriptions need wake_stream", "wake_stream")
        wake_stream = _path(raw.get("wake_stream"), "wake_stream")
    if wake_stream is not None and wake_stream in streams:
        # Its own wake events would be pending work that wakes it again, for ever.
        raise InvalidRequest(
            "the wake stream cannot be one of the subscription's streams", "streams"
        )
    return Spec(kind, pattern, streams, webhook_url, wake_stream, lease, description)


# -- webhook URL safety (PROTOCOL.md §12.8) ---------------------------------------------------


def address_refusal(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool
) -> str | None:
    """Why a webhook must not reach ``address``, or None. Only globally routable unicast
    addresses pass (loopback too, with ``allow_loopback``); an IPv6 address that embeds an IPv4
    one (mapped, NAT64, 6to4) is judged by the IPv4 address inside."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped
        if embedded is None and address in ipaddress.IPv6Network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is None and address.sixtofour is not None:
            embedded = address.sixtofour
        if embedded is not None:
            return address_refusal(embedded, allow_loopback)
    if address.is_loopback:
        return None if allow_loopback else "loopback addresses are refused"
    if address.is_link_local:
        return "link-local addresses are refused"
    if address.is_private or address.is_multicast or address.is_unspecified or address.is_reserved:
        return "private and local network addresses are refused"
    if not address.is_global:
        return "only globally routable addresses are accepted"
    return None


def _unmapped(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_webhook_url(url: str, allow_loopback: bool) -> tuple[str, bool]:
    """Refuse what can be refused without DNS; returns (host, is_ip_literal). ``http`` is only
    for loopback targets, which need ``--webhooks-allow-loopback``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises on a malformed port
    except ValueError:
        raise UrlRejected("webhook.url is not a valid URL", "webhook.url") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UrlRejected("webhook.url must be an http(s) URL with a host", "webhook.url")
    if not _visible(host):
        raise UrlRejected(
            "webhook.url: the host name holds control characters or spaces", "webhook.url"
        )
    if parts.username or parts.password:
        raise UrlRejected("webhook.url must not carry credentials", "webhook.url")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        reason = address_refusal(address, allow_loopback)
        if reason:
            raise UrlRejected(f"webhook.url: {reason}", "webhook.url")
        loopback = _unmapped(address).is_loopback
    else:
        loopback = host.lower().rstrip(".") == "localhost"
        if loopback and not allow_loopback:
            raise UrlRejected("webhook.url: loopback addresses are refused", "webhook.url")
    if parts.scheme == "http" and not loopback:
        raise UrlRejected("webhook.url must use https", "webhook.url")
    return host, address is not None


# -- state ----------------------------------------------------------------------------------


@dataclass
class Link:
    path: str
    explicit: bool
    glob: bool
    acked: int


@dataclass
class Outcome:
    """What an op decided: its answer, and the subscriptions whose deadlines changed."""

    value: Any = None
    deadlines: list[tuple[str, int]] = field(default_factory=list)


def _links(batch: Batch, sub_id: str) -> list[Link]:
    return [
        Link(r["path"], r["explicit"], r["glob"], r["acked"])
        for r in store.links(batch.conn, sub_id)
    ]


def _tails(batch: Batch, paths: list[str]) -> dict[str, int]:
    """Tails as this transaction sees them: appends earlier in the same batch are not flushed
    yet, so the batch's own stream states come first."""
    out: dict[str, int] = {}
    missing = []
    for path in paths:
        state = batch.streams.get(path)
        if state is not None:
            if not state.deleted:
                out[path] = state.tail
        elif path not in batch.streams:
            missing.append(path)
    out.update(store.tails(batch.conn, missing))
    return out


def _stream_infos(links: list[Link], tails: dict[str, int]) -> list[dict[str, Any]]:
    infos = []
    for link in links:
        tail = tails.get(link.path, 0)
        infos.append(
            {
                "path": link.path,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": encode(link.acked),
                "tail_offset": encode(tail),
                "has_pending": tail > link.acked,
            }
        )
    return infos


def _pending(links: list[Link], tails: dict[str, int]) -> list[Link]:
    return [link for link in links if tails.get(link.path, 0) > link.acked]


def _get(batch: Batch, sub_id: str) -> dict[str, Any]:
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None:
        raise SubscriptionNotFound(f"subscription {sub_id} not found", "id")
    return row


def _changed(batch: Batch, sub_id: str, *, index: bool = False) -> None:
    batch.changed.add(WAKE_KEY + sub_id)
    if index:
        batch.changed.add(INDEX_KEY + sub_id)


def _link(
    batch: Batch, sub_id: str, path: str, *, explicit: bool, acked: int, existing: dict[str, Link]
) -> None:
    link = existing.get(path)
    if link is None:
        store.insert_link(batch.conn, sub_id, path, explicit=explicit, acked=acked)
        existing[path] = Link(path, explicit, not explicit, acked)
    elif explicit and not link.explicit:
        store.update_link(batch.conn, sub_id, path, {"explicit": True})
        link.explicit = True
    elif not explicit and not link.glob:
        store.update_link(batch.conn, sub_id, path, {"glob": True})
        link.glob = True


def create_or_confirm(
    batch: Batch, sub_id: str, spec: Spec, base_url: str
) -> tuple[dict[str, Any], bool]:
    """(view, created). Existing streams are linked at their tail: no historical replay."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is not None:
        if row["config_hash"] != spec.config_hash:
            raise AlreadyExists(
                f"subscription {sub_id} exists with a different configuration", "id"
            )
        return row, False
    row = {
        "id": sub_id,
        "type": spec.type,
        "pattern": spec.pattern,
        "webhook_url": spec.webhook_url,
        "wake_stream": spec.wake_stream,
        "lease_ttl_ms": spec.lease_ttl_ms,
        "description": spec.description,
        "config_hash": spec.config_hash,
        "base_url": base_url,
        "created_at": batch.now,
        "status": "active",
        "generation": 0,
        "wake_id": None,
        "snapshot": None,
        "holder": None,
        "lease_expires_at": None,
        "attempts": 0,
        "next_attempt_at": None,
    }
    store.insert_subscription(batch.conn, row)
    existing: dict[str, Link] = {}
    tails = _tails(batch, list(spec.streams))
    for path in spec.streams:
        _link(batch, sub_id, path, explicit=True, acked=tails.get(path, 0), existing=existing)
    if spec.pattern is not None:
        names = [
            n
            for n in store.stream_names(batch.conn)
            if glob_match(spec.pattern, n) and n != spec.wake_stream
        ]
        tails = _tails(batch, names)
        for path in names:
            _link(batch, sub_id, path, explicit=False, acked=tails.get(path, 0), existing=existing)
    _changed(batch, sub_id, index=True)
    return row, True


def delete(batch: Batch, sub_id: str) -> None:
    """Deleting ends its wake: callbacks, acks and releases then find nothing (404)."""
    if store.delete_subscription(batch.conn, sub_id):
        _changed(batch, sub_id, index=True)


def add_streams(batch: Batch, sub_id: str, paths: list[str]) -> None:
    row = _get(batch, sub_id)
    if row["wake_stream"] in paths:
        raise InvalidRequest(
            "the wake stream cannot be one of the subscription's streams", "streams"
        )
    existing = {link.path: link for link in _links(batch, sub_id)}
    named = sum(link.explicit for link in existing.values())
    # The subscription's row is locked (``_get``): no other request adds meanwhile.
    adding = {p for p in paths if (link := existing.get(p)) is None or not link.explicit}
    if named + len(adding) > MAX_SUBSCRIPTION_STREAMS:
        raise InvalidRequest(
            f"a subscription may name at most {MAX_SUBSCRIPTION_STREAMS} streams "
            f"(it names {named}; this request adds {len(adding)})",
            "streams",
        )
    tails = _tails(batch, paths)
    for path in paths:
        _link(batch, sub_id, path, explicit=True, acked=tails.get(path, 0), existing=existing)
    _changed(batch, sub_id, index=True)


def remove_stream(batch: Batch, sub_id: str, path: str) -> None:
    """Removes the explicit link only; a stream the pattern still matches stays linked."""
    row = _get(batch, sub_id)
    link = next((x for x in _links(batch, sub_id) if x.path == path), None)
    if link is None or not link.explicit:
        return
    if link.glob or (row["pattern"] and glob_match(row["pattern"], path)):
        store.update_link(batch.conn, sub_id, path, {"explicit": False, "glob": True})
    else:
        store.delete_link(batch.conn, sub_id, path)
    _changed(batch, sub_id, index=True)


def view(row: dict[str, Any], links: list[Link], signer: Signer | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "subscription_id": row["id"],
        "type": row["type"],
        "pattern": row["pattern"],
        "streams": [
            {
                "path": link.path,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": encode(link.acked),
            }
            for link in links
        ],
        "webhook": None,
        "wake_stream": row["wake_stream"],
        "lease_ttl_ms": row["lease_ttl_ms"],
        "created_at": _iso(row["created_at"]),
        "status": row["status"],
        "description": row["description"],
        "generation": row["generation"],
    }
    if row["type"] == "webhook":
        out["webhook"] = {"url": row["webhook_url"]}
        if signer is not None:
            out["webhook"]["signing"] = {
                "alg": "ed25519",
                "kid": signer.kid,
                "jwks_url": row["base_url"] + "/v1/stream/__ds/jwks.json",
            }
    return out


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_view(conn: Any, sub_id: str) -> tuple[dict[str, Any], list[Link]]:
    """For a read transaction (GET)."""
    row = store.get(conn, sub_id)
    if row is None:
        raise SubscriptionNotFound(f"subscription {sub_id} not found", "id")
    links = [
        Link(r["path"], r["explicit"], r["glob"], r["acked"]) for r in store.links(conn, sub_id)
    ]
    return row, links


# -- waking ---------------------------------------------------------------------------------


@dataclass
class Context:
    """What the ops need beyond the batch: the signer for tokens, the id window for appends."""

    signer: Signer
    ids: IdWindow


def _start_wake(batch: Batch, ctx: Context, row: dict[str, Any], pending: list[Link]) -> Outcome:
    """A new generation. Webhooks: due for delivery now. Pull-wake: an event on the wake stream."""
    sub_id = row["id"]
    values: dict[str, Any] = {
        "generation": row["generation"] + 1,
        "wake_id": "w_" + secrets.token_hex(12),
        "holder": None,
        "lease_expires_at": None,
        "snapshot": None,
        "attempts": 0,
    }
    out = Outcome()
    if row["type"] == "webhook":
        values["next_attempt_at"] = batch.now
        out.deadlines.append((sub_id, batch.now))
    else:
        values["next_attempt_at"] = None
        _wake_event(batch, ctx, row, pending[0].path if pending else "", values["generation"])
    store.update_subscription(batch.conn, sub_id, values)
    row.update(values)
    _changed(batch, sub_id)
    return out


def _wake_event(
    batch: Batch, ctx: Context, row: dict[str, Any], path: str, generation: int
) -> None:
    name = row["wake_stream"]
    state = batch.stream(name)
    if state is None or state.deleted or state.closed or not is_json_type(state.content_type):
        # The application creates the wake stream (§7.2); claims still work without events.
        log.warning(
            "subscription %s: wake stream %s is missing, closed or not JSON", row["id"], name
        )
        return
    event = {
        "type": "wake",
        "subscription_id": row["id"],
        "stream": path,
        "generation": generation,
        "ts": batch.now,
    }
    message = json.dumps(event, separators=(",", ":")).encode()
    try:
        # An append decides before it writes, so a refused one leaves nothing behind.
        append(batch, ctx.ids, AppendRequest(name, state.content_type, [message]))
    except StationsError as exc:
        log.warning("subscription %s: wake event not written to %s: %s", row["id"], name, exc)


def _maybe_wake(
    batch: Batch, ctx: Context, row: dict[str, Any], links: list[Link] | None = None
) -> Outcome:
    if row["wake_id"] is not None or row["holder"] is not None:
        return Outcome()
    links = _links(batch, row["id"]) if links is None else links
    pending = _pending(links, _tails(batch, [link.path for link in links]))
    if not pending:
        return Outcome()
    return _start_wake(batch, ctx, row, pending)


def on_append(batch: Batch, ctx: Context, touched: dict[str, list[str]]) -> Outcome:
    """Streams in ``touched`` (path -> ids of subscriptions whose pattern or explicit links name
    it) have new data. A stream first seen through a pattern is linked from its beginning: it
    was created after the subscription, so all of it is new."""
    out = Outcome()
    by_sub: dict[str, list[str]] = {}
    for path, sub_ids in touched.items():
        for sub_id in sub_ids:
            by_sub.setdefault(sub_id, []).append(path)
    for sub_id in sorted(by_sub):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is None:
            continue
        links = _links(batch, sub_id)
        existing = {link.path: link for link in links}
        for path in by_sub[sub_id]:
            if (
                path not in existing
                and row["pattern"]
                and path != row["wake_stream"]
                and glob_match(row["pattern"], path)
                and batch.stream(path) is not None
            ):
                _link(batch, sub_id, path, explicit=False, acked=0, existing=existing)
        out.deadlines += _maybe_wake(batch, ctx, row, list(existing.values())).deadlines
    return out


def sweep(batch: Batch, ctx: Context, sub_ids: list[str]) -> Outcome:
    """After a start (or when another process made a subscription): link pattern streams that
    appeared unseen, and wake whatever has pending work. Nothing is skipped across a crash
    between an append's commit and the wake decision that follows it."""
    out = Outcome()
    names: list[str] | None = None
    for sub_id in sorted(sub_ids):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is None:
            continue
        existing = {link.path: link for link in _links(batch, sub_id)}
        if row["pattern"]:
            names = store.stream_names(batch.conn) if names is None else names
            for path in names:
                if (
                    path not in existing
                    and path != row["wake_stream"]
                    and glob_match(row["pattern"], path)
                ):
                    _link(batch, sub_id, path, explicit=False, acked=0, existing=existing)
        out.deadlines += _maybe_wake(batch, ctx, row, list(existing.values())).deadlines
        if row["wake_id"] is not None:
            due = [t for t in (row["next_attempt_at"], row["lease_expires_at"]) if t is not None]
            if due:
                out.deadlines.append((sub_id, min(due)))
    return out


@dataclass
class Delivery:
    """One webhook POST to make: the exact body bytes are what gets signed."""

    sub_id: str
    wake_id: str
    url: str
    body: bytes


def _clear_wake(values: dict[str, Any]) -> None:
    values.update(
        wake_id=None,
        holder=None,
        lease_expires_at=None,
        snapshot=None,
        next_attempt_at=None,
        attempts=0,
    )


def _end_wake(batch: Batch, ctx: Context, row: dict[str, Any], values: dict[str, Any]) -> Outcome:
    _clear_wake(values)
    store.update_subscription(batch.conn, row["id"], values)
    row.update(values)
    _changed(batch, row["id"])
    return _maybe_wake(batch, ctx, row)


def due(batch: Batch, ctx: Context, sub_id: str) -> Outcome:
    """A timer fired: deliver (webhook, retry due), or end an expired lease. ``value`` is a
    Delivery to make, or None."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None or row["wake_id"] is None:
        return Outcome()
    now = batch.now
    lease = row["lease_expires_at"]
    if lease is not None and lease <= now:
        return _end_wake(batch, ctx, row, {})
    attempt = row["next_attempt_at"]
    if row["type"] == "webhook" and attempt is not None and attempt <= now:
        links = _links(batch, sub_id)
        tails = _tails(batch, [link.path for link in links])
        infos = _stream_infos(links, tails)
        snapshot = {link.path: tails.get(link.path, 0) for link in links}
        values = {"next_attempt_at": now + ATTEMPT_GUARD_MS, "snapshot": json.dumps(snapshot)}
        store.update_subscription(batch.conn, sub_id, values)
        _changed(batch, sub_id)
        base = row["base_url"] + "/v1/stream/__ds/subscriptions/"
        body = {
            "subscription_id": sub_id,
            "wake_id": row["wake_id"],
            "generation": row["generation"],
            "streams": infos,
            "callback_url": base + _quote(sub_id) + "/callback",
            "callback_token": ctx.signer.token(sub_id, row["generation"], row["wake_id"]),
        }
        delivery = Delivery(sub_id, row["wake_id"], row["webhook_url"], json.dumps(body).encode())
        return Outcome(delivery, [(sub_id, now + ATTEMPT_GUARD_MS)])
    pending = [t for t in (attempt, lease) if t is not None]
    return Outcome(None, [(sub_id, min(pending))] if pending else [])


def _quote(sub_id: str) -> str:
    return quote(sub_id, safe="")


def retry_delay_ms(attempts: int) -> int:
    """Exponential from 1 s to 60 s, with 20% jitter either way (§7.1)."""
    base: int = min(RETRY_BASE_MS << max(0, min(attempts - 1, 16)), RETRY_MAX_MS)
    return max(0, round(base * (1 + RETRY_JITTER * (2 * random.random() - 1))))


def delivered(
    batch: Batch, ctx: Context, sub_id: str, wake_id: str, ok: bool, done: bool
) -> Outcome:
    """The webhook answered (``ok``; ``done`` if it said ``{"done": true}``) or failed."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None or row["wake_id"] != wake_id:
        return Outcome()  # a callback already finished this wake, or it was deleted
    now = batch.now
    if not ok:
        attempts = row["attempts"] + 1
        at = now + retry_delay_ms(attempts)
        values = {"attempts": attempts, "status": "failed", "next_attempt_at": at}
        store.update_subscription(batch.conn, sub_id, values)
        _changed(batch, sub_id)
        return Outcome(None, [(sub_id, at)])
    values = {"status": "active", "attempts": 0, "next_attempt_at": None}
    if done:
        _ack_snapshot(batch, row)
        return _end_wake(batch, ctx, row, values)
    values["lease_expires_at"] = now + row["lease_ttl_ms"]
    store.update_subscription(batch.conn, sub_id, values)
    _changed(batch, sub_id)
    return Outcome(None, [(sub_id, values["lease_expires_at"])])


def _ack_snapshot(batch: Batch, row: dict[str, Any]) -> None:
    snapshot = json.loads(row["snapshot"] or "{}")
    links = {link.path: link for link in _links(batch, row["id"])}
    for path, tail in snapshot.items():
        link = links.get(path)
        if link is not None and tail > link.acked:
            store.update_link(batch.conn, row["id"], path, {"acked": tail})


def _fence(ctx: Context, row: dict[str, Any], token: str, body: Any) -> dict[str, Any]:
    try:
        claims = ctx.signer.verify(token, row["id"])
    except TokenError as exc:
        raise TokenRefused(exc.code) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", "body")
    if (
        claims.generation != row["generation"]
        or claims.wake_id != row["wake_id"]
        or body.get("generation") != row["generation"]
        or body.get("wake_id") != row["wake_id"]
        or row["wake_id"] is None
    ):
        raise Fenced("the wake generation is stale", "generation", generation=row["generation"])
    return body


def _apply_acks(batch: Batch, row: dict[str, Any], body: dict[str, Any]) -> None:
    acks = body.get("acks", [])
    if acks is None:
        return
    if not isinstance(acks, list):
        raise InvalidRequest("acks must be a list", "acks")
    links = {link.path: link for link in _links(batch, row["id"])}
    tails = _tails(batch, list(links))
    planned: dict[str, int] = {}
    for i, ack in enumerate(acks):
        if not isinstance(ack, dict):
            raise InvalidRequest("each ack is {stream, offset}", f"acks[{i}]")
        raw_path = ack.get("stream", ack.get("path"))
        path = normalize_path(raw_path) if isinstance(raw_path, str) else ""
        link = links.get(path)
        if link is None:
            raise InvalidOffset(
                f"acks[{i}].stream is not a stream of this subscription", f"acks[{i}].stream"
            )
        offset = ack.get("offset")
        if not isinstance(offset, str) or offset == BEGINNING:
            raise InvalidOffset(f"acks[{i}].offset must be an offset", f"acks[{i}].offset")
        try:
            position = decode(offset)
        except BadOffset:
            raise InvalidOffset(f"acks[{i}].offset is malformed", f"acks[{i}].offset") from None
        if position < link.acked:
            raise InvalidOffset(
                f"acks[{i}].offset is behind the acknowledged cursor", f"acks[{i}].offset"
            )
        if position > tails.get(path, 0):
            raise InvalidOffset(
                f"acks[{i}].offset is beyond the stream's tail", f"acks[{i}].offset"
            )
        planned[path] = max(planned.get(path, 0), position)
    for path, position in planned.items():
        store.update_link(batch.conn, row["id"], path, {"acked": position})


def _done_flag(body: dict[str, Any]) -> bool:
    done = body.get("done", False)
    if not isinstance(done, bool):
        raise InvalidRequest("done must be true or false", "done")
    return done


def settle(batch: Batch, ctx: Context, sub_id: str, token: str, body: Any, kind: str) -> Outcome:
    """A webhook callback (``kind`` callback) or a pull-wake ack: apply acks; without ``done``
    extend the lease (a heartbeat), with it end the wake. ``value`` is the answer body."""
    row = _get(batch, sub_id)
    if (kind == "callback") != (row["type"] == "webhook"):
        raise InvalidRequest(f"this is a {row['type']} subscription", "type")
    body = _fence(ctx, row, token, body)
    done = _done_flag(body)
    _apply_acks(batch, row, body)
    if done:
        out = _end_wake(batch, ctx, row, {"status": "active"})
        return Outcome({"ok": True, "next_wake": row["wake_id"] is not None}, out.deadlines)
    at = batch.now + row["lease_ttl_ms"]
    values: dict[str, Any] = {"lease_expires_at": at}
    if row["type"] == "webhook":
        values.update(next_attempt_at=None, attempts=0, status="active")  # it was delivered
    store.update_subscription(batch.conn, sub_id, values)
    _changed(batch, sub_id)
    return Outcome({"ok": True, "next_wake": False}, [(sub_id, at)])


def claim(batch: Batch, ctx: Context, sub_id: str, worker: str) -> Outcome:
    row = _get(batch, sub_id)
    if row["type"] != "pull-wake":
        raise InvalidRequest("only pull-wake subscriptions are claimed", "type")
    if row["holder"] is not None:
        raise AlreadyClaimed(
            f"worker {row['holder']} holds the lease",
            "worker",
            current_holder=row["holder"],
            generation=row["generation"],
        )
    links = _links(batch, sub_id)
    tails = _tails(batch, [link.path for link in links])
    pending = _pending(links, tails)
    if not pending:
        raise NoPendingWork("the subscription has no pending work")
    if row["wake_id"] is None:
        _start_wake(batch, ctx, row, pending)
    at = batch.now + row["lease_ttl_ms"]
    values = {
        "holder": worker,
        "lease_expires_at": at,
        "snapshot": json.dumps({link.path: tails.get(link.path, 0) for link in links}),
    }
    store.update_subscription(batch.conn, sub_id, values)
    _changed(batch, sub_id)
    answer = {
        "wake_id": row["wake_id"],
        "generation": row["generation"],
        "token": ctx.signer.token(sub_id, row["generation"], row["wake_id"]),
        "streams": _stream_infos(links, tails),
        "lease_ttl_ms": row["lease_ttl_ms"],
    }
    return Outcome(answer, [(sub_id, at)])


def release(batch: Batch, ctx: Context, sub_id: str, token: str, body: Any) -> Outcome:
    row = _get(batch, sub_id)
    if row["type"] != "pull-wake":
        raise InvalidRequest("only pull-wake subscriptions are released", "type")
    _fence(ctx, row, token, body)
    return _end_wake(batch, ctx, row, {})


def purge_stream(batch: Batch, state: Any) -> None:
    """lifecycle purge hook: a deleted stream's cursors go with it."""
    store.forget_stream(batch.conn, state.name)


def load_signer(batch: Batch) -> Signer:
    """The signing keys, made on first start (and kept: they are in the database)."""
    if not store.signing_keys(batch.conn):
        pem = new_private_pem()
        store.add_signing_key(batch.conn, kid_of(pem), pem, batch.now)
    return Signer([(r["kid"], r["private_pem"]) for r in store.signing_keys(batch.conn)])
