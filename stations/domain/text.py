"""Free text a client writes into stored rows (a consumer name, a dead-letter reason, a
subscription's description, worker or webhook URL): bounded, and without NUL, which
PostgreSQL's text columns refuse (the write failed as a 500 there and passed on SQLite)."""

from __future__ import annotations

from stations.errors import BadRequest

NAME = 256  # consumer and worker names
LONG = 4096  # a dead-letter reason (copied into every entry it names), a description, a URL


def check(value: object, field: str, most: int, *, least: int = 1) -> str:
    if not isinstance(value, str) or not least <= len(value) <= most or "\x00" in value:
        raise BadRequest(
            f"{field} must be a string of {least} to {most} characters, without NUL", field
        )
    return value
