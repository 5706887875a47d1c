"""Offsets as Spark sees them: the server's ``<position>_<sub-position>`` tokens, positions
being consecutive message numbers, and ranges of positions split into partitions."""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql.datasource import InputPartition

_WIDTH = 16
_OFFSET = re.compile(r"([0-9]{16})_([0-9]{16})")


def position(token: str) -> int:
    """The position of an offset token (``-1`` and ``earliest`` are the start, 0)."""
    if token in ("-1", "earliest"):
        return 0
    parts = token_parts(token)
    if parts is None:
        raise ValueError(
            f"not a Stations offset: {token!r} (expected e.g. 0000000000000042_0000000000000000)"
        )
    if parts[1] != 0:
        # The server issues none (it refuses one as malformed): read as its position, a
        # mistyped offset started the read at another message without a word.
        raise ValueError(
            f"not an offset the server issues: {token!r} (its second part is always "
            "0000000000000000)"
        )
    return parts[0]


def token_parts(value: str) -> tuple[int, int] | None:
    """The position and sub-position of an offset token, exactly as tokens are written (not
    ``-1`` nor ``earliest``, which name the start and are no message's offset), else None."""
    match = _OFFSET.fullmatch(value)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def token(pos: int) -> str:
    return f"{pos:0{_WIDTH}d}_{0:0{_WIDTH}d}"


def offset_dict(pos: int, station: dict[str, str] | None = None) -> dict[str, str]:
    """An offset of ``station`` (its ``identity``). Spark compares offsets as JSON text: a
    start, and "no new data", keep this one shape."""
    return {"offset": token(pos), **(station or {})}


def batch_end(pos: int, parts: int, station: dict[str, str] | None = None) -> dict[str, str | int]:
    """The end offset of a planned micro-batch, with the number of ranges it is split into:
    a replay after a failure must give each task the rows its first attempt had (a streaming
    write's producer sequence relies on it), whatever numPartitions the restart was given."""
    return {"offset": token(pos), "partitions": parts, **(station or {})}


def identity(name: str, view: dict[str, Any]) -> dict[str, str]:
    """Which station a checkpoint's offsets are positions of: its name and creation time. A
    checkpoint reused on a station deleted and created again (or on another station) read on
    from its old position and skipped every message before it."""
    return {"station": name, "created": str(view.get("createdAt", ""))}


def same_station(offset: dict[str, Any], station: dict[str, str]) -> bool:
    """Whether ``offset`` is of ``station`` (an offset written before identities were
    recorded is taken to be)."""
    if "created" not in offset:
        return True
    return (offset.get("station"), offset["created"]) == (station["station"], station["created"])


def batch_parts(end: dict[str, str | int], default: int) -> int:
    """The split recorded in a batch's end offset (``default`` for one written before it was
    recorded)."""
    return int(end.get("partitions", default))


class OffsetRange(InputPartition):
    """Messages whose offsets lie in ``[start, end)`` (positions), read by one task."""

    def __init__(self, index: int, start: int, end: int, is_json: bool) -> None:
        super().__init__(index)
        self.index = index
        self.start = start
        self.end = end
        self.is_json = is_json
        # A streaming batch's range, and whether the batch was planned by an earlier run of
        # the query (a restart replays it): see ``stations.spark.read.read_pages``.
        self.streaming = False
        self.replayed = False

    def __repr__(self) -> str:
        return f"OffsetRange({self.index}, {token(self.start)}, {token(self.end)})"


def split(start: int, end: int, parts: int, is_json: bool) -> list[OffsetRange]:
    """``[start, end)`` in at most ``parts`` ranges of nearly equal size."""
    count = end - start
    if count <= 0:
        return []
    k = max(1, min(parts, count))
    base, extra = divmod(count, k)
    out, lo = [], start
    for i in range(k):
        hi = lo + base + (1 if i < extra else 0)
        out.append(OffsetRange(i, lo, hi, is_json))
        lo = hi
    return out
