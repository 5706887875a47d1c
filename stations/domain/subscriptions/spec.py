"""A subscription's definition as a request gives it: checked, normalized, and hashed, so that
a PUT of the same definition confirms the subscription and a different one is refused."""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from stations.domain import text
from stations.domain.station import validate_name
from stations.domain.subscriptions.errors import InvalidRequest
from stations.errors import BadRequest

DEFAULT_LEASE_MS = 30_000
MIN_LEASE_MS = 1_000
MAX_LEASE_MS = 600_000
MAX_ID = 256
MAX_PATH = 1024
# Stream paths one request may name: they are stored in one write transaction, which holds up
# every other write meanwhile (100,000 held appends back about 5 s).
MAX_STREAMS = 1000


def normalize_path(path: str) -> str:
    return path.strip("/")


def stream_path(value: Any, field_name: str) -> str:
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


def station_path(value: Any, field_name: str) -> str:
    """A stream path that names a station: a stream is a station, so a path no station may
    be named (``wk/./x``, a space, 600 characters) was accepted and then never woken, the
    only trace a warning in the server's log."""
    path = stream_path(value, field_name)
    try:
        return validate_name(path, field_name)
    except BadRequest as exc:
        raise InvalidRequest(exc.message, field_name) from None


def valid_id(sub_id: str) -> str:
    if not sub_id or len(sub_id) > MAX_ID or not visible(sub_id):
        raise InvalidRequest(f"the subscription id must be 1 to {MAX_ID} visible characters", "id")
    return sub_id


def visible(text: str) -> bool:
    """No control characters (C0 and C1), no spaces or line separators of any script, no
    invisible format characters (a zero-width space made two ids that look the same)."""
    return all(c.isprintable() and not c.isspace() for c in text)


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


_WILDCARDS = frozenset("*?[")


def literal_segments(pattern: str) -> list[str]:
    """The pattern's leading segments without a wildcard: every path it matches starts with
    them (``**`` may match no segment, so a path may also end there)."""
    out = []
    for segment in pattern.split("/"):
        if _WILDCARDS.intersection(segment):
            break
        out.append(segment)
    return out


def matching_paths(pattern: str, paths: list[str]) -> list[str]:
    """Those of ``paths`` (sorted by code point) that ``pattern`` matches: only the range
    under its literal prefix is tried. Each pattern tried on every stream name made a resync
    with thousands of each stall every write of the process for seconds."""
    prefix = "/".join(literal_segments(pattern))
    if not prefix:
        return [path for path in paths if glob_match(pattern, path)]
    # The prefix itself, then prefix + "/..." ("/" sorts before "0"; "-" and "." between
    # them are left out by the check below).
    lo, hi = bisect_left(paths, prefix), bisect_left(paths, prefix + "0")
    return [
        path
        for path in paths[lo:hi]
        if (len(path) == len(prefix) or path[len(prefix)] == "/") and glob_match(pattern, path)
    ]


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
        pattern = stream_path(pattern, "pattern")
    streams_raw = raw.get("streams", [])
    if streams_raw is None:
        streams_raw = []
    if not isinstance(streams_raw, list):
        raise InvalidRequest("streams must be a list of stream paths", "streams")
    too_many(streams_raw)
    streams = tuple(dict.fromkeys(station_path(s, "streams") for s in streams_raw))
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
        wake_stream = station_path(raw.get("wake_stream"), "wake_stream")
    if wake_stream is not None and wake_stream in streams:
        # Its own wake events would be pending work that wakes it again, for ever.
        raise InvalidRequest(
            "the wake stream cannot be one of the subscription's streams", "streams"
        )
    return Spec(kind, pattern, streams, webhook_url, wake_stream, lease, description)
