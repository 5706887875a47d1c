"""Checks of one item of a request body, shared by the domain's parsers: each error names the
item's field (e.g. ``ack.3.deliveryCount``), so a client sees which of thousands is wrong."""

from __future__ import annotations

from typing import Any

from stations.errors import BadRequest


def object_of(
    value: Any, field: str, allowed: frozenset[str], required: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``value`` as an object with only ``allowed`` keys and every ``required`` one."""
    if isinstance(value, dict) and value.keys() <= allowed and required <= value.keys():
        return value  # the common case: no set built, no message formatted
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be an object", field)
    unknown = set(value) - allowed
    if unknown:
        key = f"{field}.{sorted(unknown)[0]}"
        raise BadRequest(f"unknown field {key}", key)
    for key in sorted(required):
        if key not in value:
            raise BadRequest(f"{field}.{key} is required", f"{field}.{key}")
    return value


def integer(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"{field} must be an integer from {lo} to {hi}", field)
    return value
