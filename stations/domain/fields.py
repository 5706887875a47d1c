"""Checks of one item of a request body, shared by the domain's parsers: each error names the
item's field (e.g. ``ack.3.deliveryCount``), so a client sees which of thousands is wrong."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from stations.errors import BadRequest


def object_of(
    value: Any,
    field: str | None,
    allowed: Set[str],
    required: Set[str] = frozenset(),
    *,
    shape: str = "an object",
) -> dict[str, Any]:
    """``value`` as an object with only ``allowed`` keys and every ``required`` one; ``field``
    None is the request's body itself, whose keys are named alone. ``shape`` says what was
    expected where ``value`` is not an object."""
    if isinstance(value, dict) and value.keys() <= allowed and required <= value.keys():
        return value  # the common case: no set built, no message formatted
    if not isinstance(value, dict):
        raise BadRequest(f"{field or 'the body'} must be {shape}", field)
    unknown = set(value) - allowed
    for key in [*sorted(unknown), *sorted(required - value.keys())]:
        path = key if field is None else f"{field}.{key}"
        said = f"unknown field {path}" if key in unknown else f"{path} is required"
        raise BadRequest(said, path)
    return value


def body_of(value: Any, allowed: Set[str], shape: str = "a JSON object") -> dict[str, Any]:
    """A request's body as an object with only ``allowed`` keys."""
    return object_of(value, None, allowed, shape=shape)


def integer(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"{field} must be an integer from {lo} to {hi}", field)
    return value
