"""Offsets: opaque, fixed-width, lexicographically sortable position tokens.

A stream's messages are numbered 1, 2, 3, ...; the offset *of* message ``n`` is the position just
before it, ``n - 1``, and the tail offset is the number of the last message. A token is
``<position>_<sub-position>``, both zero-padded to 16 digits so that string order equals numeric
order. The sub-position addresses a point inside a message (Durable Streams sub-offsets); every
offset the server mints is on a message boundary, so it is always zero. The shape matches the
reference server's, whose zero offset clients and the conformance suite write literally.
"""

from __future__ import annotations

import re

WIDTH = 16
BEGINNING = "-1"
NOW = "now"
_VALID = re.compile(rf"^([0-9]{{{WIDTH}}})_([0-9]{{{WIDTH}}})$")
_ZERO_SUB = "0" * WIDTH


class BadOffset(ValueError):
    """An offset token that this server did not mint."""


def encode(position: int) -> str:
    return f"{position:0{WIDTH}d}_{_ZERO_SUB}"


def encode_template() -> str:
    """``encode`` as a %-format of one position, for writers of many offsets at once."""
    return f"%0{WIDTH}d_{_ZERO_SUB}"


def decode(token: str) -> int:
    """Turn a token this server minted back into a position (``-1`` means the start)."""
    if token == BEGINNING:
        return 0
    match = _VALID.fullmatch(token)
    if match is None or match.group(2) != _ZERO_SUB:
        raise BadOffset(token)
    return int(match.group(1))
