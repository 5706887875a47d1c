"""Offsets: opaque, fixed-width, lexicographically sortable position tokens.

A stream's messages are numbered 1, 2, 3, ...; the offset *of* message ``n`` is the position just
before it, ``n - 1``, and the tail offset is the number of the last message. A token is
``<position>_<sub-position>``, both zero-padded to 16 digits so that string order equals numeric
order. The sub-position addresses a point inside a message (Durable Streams sub-offsets); every
offset the server mints is on a message boundary, so it is always zero. The shape matches the
reference server's, whose zero offset clients and the conformance suite write literally.
"""

from __future__ import annotations

import enum
from typing import Any, Final, TypeAlias

WIDTH = 16
BEGINNING = "-1"
NOW = "now"
_ZERO_SUB = "0" * WIDTH
_MINTED_LENGTH = 2 * WIDTH + 1
_MINTED_END = "_" + _ZERO_SUB


class BadOffset(ValueError):
    """An offset token that this server did not mint."""


class Earliest(enum.Enum):
    """``-1``: from the earliest retained message, wherever retention has moved it. Not a
    position: the zero offset names position 0 itself, which is gone once retention dropped
    the first message (410), while ``-1`` then starts at the earliest one kept."""

    EARLIEST = BEGINNING


EARLIEST: Final = Earliest.EARLIEST
Start: TypeAlias = int | Earliest  # where a read starts: a position the client named, or ``-1``


def encode(position: int) -> str:
    return f"{position:0{WIDTH}d}_{_ZERO_SUB}"


def encode_template() -> str:
    """``encode`` as a %-format of one position, for writers of many offsets at once."""
    return f"%0{WIDTH}d_{_ZERO_SUB}"


def decode(token: Any) -> int:
    """Turn a token this server minted back into a position: exactly what ``encode`` writes
    (``WIDTH`` ASCII digits and the zero sub-position, nothing around them), else BadOffset.
    ``-1`` is not one: where it is taken, ``decode_start`` says so. Without a regular
    expression: an ack or a transaction decodes each of up to 10,000 offsets."""
    if (
        isinstance(token, str)
        and len(token) == _MINTED_LENGTH
        and token.endswith(_MINTED_END)
        and token.isascii()
    ):
        digits = token[:WIDTH]
        if digits.isdigit():
            return int(digits)
    raise BadOffset(token)


def decode_start(token: str) -> Start:
    """Where a read starts: ``EARLIEST`` for ``-1``, else the position ``token`` names."""
    return EARLIEST if token == BEGINNING else decode(token)
