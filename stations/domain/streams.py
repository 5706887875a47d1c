"""Decisions on a stream's row (``stations.records.StreamState``): what housekeeping keeps of
its config, and whether two content types are one."""

from __future__ import annotations

from typing import Any

from stations.records import media_type


def upkeep_columns(config: dict[str, Any], now: int) -> dict[str, int | None]:
    """What housekeeping needs of a station's config, as the stream row keeps it: its rules
    by count, and ``upkeep_at`` (now when a rule by time exists, to be looked at soon)."""
    retention = config.get("retention") or {}
    timed = retention.get("maxAgeMs") is not None or (
        (config.get("dls") or {}).get("retentionMs") is not None
    )
    return {
        "id_window_ms": int(config.get("idempotencyWindowMs", 120_000)),
        "max_messages": retention.get("maxMessages"),
        "max_bytes": retention.get("maxBytes"),
        "upkeep_at": now if timed else None,
    }


def same_content_type(a: str, b: str) -> bool:
    return media_type(a) == media_type(b)
