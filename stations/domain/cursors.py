"""Reader cursors: a named, committed read position on a station, for readers that keep their
own progress (a Spark streaming query commits each micro-batch's end offset under its name).

Unlike a consumer group a cursor leases nothing: the reader says where it is, the server keeps
it and reports the lag (messages after it), so lag tools and the console see every reader."""

from __future__ import annotations

import re
from typing import Any

from stations.domain.fields import body_of
from stations.domain.instants import format_ms as iso
from stations.domain.log import in_use, live_stream
from stations.domain.offsets import EARLIEST, BadOffset, decode_start, encode
from stations.domain.pages import Page, collect
from stations.errors import BadRequest, NotFound
from stations.records import StreamState
from stations.store import cursors as store
from stations.store.db import Tx
from stations.store.streams import load
from stations.store.writer import Batch

_NAME = re.compile(r"^[A-Za-z0-9._:@-]{1,256}$")


def validate_name(name: str) -> str:
    # fullmatch: ``$`` also matches before a final newline. "." and ".." are path segments
    # URL clients resolve away: such a cursor could be made by a raw request, never reached.
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise BadRequest(
            "a cursor name is 1 to 256 letters, digits or . _ : @ - characters, not . or ..",
            "cursor",
        )
    return name


def _position(raw: Any, state: StreamState) -> int:
    offset = body_of(raw, {"offset"}).get("offset")
    if not isinstance(offset, str):
        raise BadRequest("offset must be an offset string", "offset")
    try:
        start = decode_start(offset)
    except BadOffset:
        raise BadRequest("offset is not an offset of this server", "offset") from None
    # ``-1``: a reader that has read nothing yet (lag counts from the earliest retained).
    position = 0 if start is EARLIEST else start
    if position > state.tail:
        raise BadRequest("offset is beyond the station's tail", "offset")
    return position


def view(state: StreamState, name: str, position: int, updated_at: int) -> dict[str, Any]:
    return {
        "name": name,
        "offset": encode(position),
        # Positions are consecutive message numbers; what retention dropped is not lag.
        "lag": max(0, state.tail - max(position, state.head)),
        "updatedAt": iso(updated_at),
    }


def commit(batch: Batch, station: str, name: str, raw: Any) -> dict[str, Any]:
    """Store the reader's position (it may move back: a query restarted from an older
    checkpoint reads again from there)."""
    state = in_use(batch.stream(station), station, batch)
    position = _position(raw, state)
    store.upsert(batch.conn, state.id, validate_name(name), position, batch.now)
    return view(state, name, position, batch.now)


def views(tx: Tx, station: str, now: int, page: Page | None = None) -> list[dict[str, Any]]:
    """The station's cursors by name, or a ``page`` of them (one more than its limit: the
    caller tells whether a next page exists)."""
    state = live_stream(load(tx, station), station, now)
    if page is None:
        found = store.rows(tx, state.id)
    else:

        def read(after: str | None, size: int) -> list[tuple[str, int, int]]:
            return store.page(tx, state.id, after, page.prefix, page.contains, size)

        found = collect(page, read, lambda row: row[0])
    return [view(state, *row) for row in found]


def one(tx: Tx, station: str, name: str, now: int) -> dict[str, Any]:
    state = live_stream(load(tx, station), station, now)
    found = store.rows(tx, state.id, validate_name(name))
    if not found:
        raise NotFound(f"cursor {name} not found on station {station}", "cursor")
    return view(state, *found[0])


def remove(batch: Batch, station: str, name: str) -> None:
    state = live_stream(batch.stream(station), station, batch.now)
    if not store.remove(batch.conn, state.id, validate_name(name)):
        raise NotFound(f"cursor {name} not found on station {station}", "cursor")


def lags(tx: Tx, limit: int) -> list[tuple[str, str, int]]:
    """(station, cursor, lag) of up to ``limit`` cursors, for /metrics."""
    return [
        (station, name, max(0, tail - max(position, head)))
        for station, name, position, tail, head in store.with_streams(tx, limit)
    ]


def offset_at(tx: Tx, station: str, time_ms: int, now: int) -> dict[str, Any]:
    """The offset of the first message stored at or after ``time_ms`` (the tail when none),
    by a binary search over positions: messages are stored in time order, one index probe per
    step. A fork's messages before its fork offset are not searched (they live in its source)."""
    state = live_stream(load(tx, station), station, now)
    lo, hi = max(state.head, state.fork_offset or 0), state.tail  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        row = store.row_after(tx, state.id, mid)
        if row is None:  # nothing stored after mid in this stream
            hi = mid
            continue
        seq, span, stored_at = row
        if stored_at >= time_ms:
            hi = min(mid, seq - span)  # this row's first message qualifies
        else:
            lo = max(mid + 1, seq)  # every message up to seq is older
    return {"offset": encode(lo), "time": iso(time_ms)}
