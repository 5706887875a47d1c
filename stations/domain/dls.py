"""The dead-letter store (DLS): messages a group gave up on, kept with their delivery count,
reason and last error until replayed or dropped (or ``dls.retentionMs`` passes).

An entry is written in the same transaction that takes the message out of the group's queue,
and so is its copy forwarded to ``dls.forwardTo``: both stations live in one database, so the
forward happens exactly once even across a crash. A replay puts the entry back into its group's
queue durably — it waits there for the next fetch even when no consumer is online.

This module imports nothing of ``stations.domain.groups`` (groups call in here when they give a
message up); its rows are read and written by ``stations.store.dls``.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from stations.domain.errors import BadRequest, StationsError
from stations.domain.idwindow import IdWindow
from stations.domain.log import AppendRequest, append, live_stream
from stations.domain.messages import iso, to_view
from stations.domain.reads import Message, messages_at
from stations.domain.streams import StreamState, load
from stations.store import dls as store
from stations.store import groups as group_store
from stations.store.dls import Connection, Selection
from stations.store.writer import Batch

logger = logging.getLogger("stations.domain.dls")
_NO_IDS = IdWindow(cache_size=1)  # forwarded copies carry no Msg-Id
_ENTRY_ID = re.compile(r"[0-9]{1,20}")
MAX_ENTRY_ID = 2**31 - 1  # ``dls.id`` is a 32-bit integer on PostgreSQL


def parse_entry_id(value: object) -> int | None:
    """A DLS entry id from JSON or a query string (a decimal string or a non-negative integer);
    ``None`` if it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and _ENTRY_ID.fullmatch(value):
        return int(value)
    return None


def add(
    batch: Batch,
    state: StreamState,
    group_id: int,
    group_name: str,
    seq: int,
    count: int,
    reason: str,
    error: str | None,
    *,
    always: bool = False,
) -> None:
    """Take ``seq`` out of the group's queue; keep it in the DLS unless poison-keeping is off."""
    conn = batch.conn
    group_store.take(conn, group_id, seq)
    batch.changed.add(state.name)
    settings = state.config.get("dls") or {}
    if not (always or settings.get("poison", True)):
        return
    found = messages_at(conn, state, [seq])
    if not found:
        return  # dropped by retention in the meantime: nothing to keep
    msg_id, headers, data = found[0].msg_id, found[0].headers, found[0].data
    store.add(
        conn,
        {
            "stream_id": state.id,
            "group_id": group_id,
            "group_name": group_name,
            "seq": seq,
            "msg_id": msg_id,
            "headers": headers,
            "data": data,
            "delivery_count": count,
            "reason": reason,
            "error": error,
            "dead_lettered_at": batch.now,
        },
    )
    target = settings.get("forwardTo")
    if target:
        _forward(batch, state, group_name, reason, target, headers, data)


def _forward(
    batch: Batch,
    state: StreamState,
    group: str,
    reason: str,
    target: str,
    headers: str | None,
    data: bytes,
) -> None:
    merged = json.loads(headers) if headers else {}
    merged.update({"dls-source": state.name, "dls-group": group, "dls-reason": reason})
    req = AppendRequest(
        name=target,
        content_type=state.content_type,
        messages=[data],
        headers=[json.dumps(merged, separators=(",", ":"))],
    )
    try:
        append(batch, _NO_IDS, req)
    except StationsError as exc:
        # The entry stays in this station's DLS; the forward target is misconfigured.
        logger.warning("cannot forward DLS entry of %s to %s: %s", state.name, target, exc)


def drop_group(batch: Batch, group_id: int) -> None:
    store.drop_group(batch.conn, group_id)


def count_group(conn: Connection, group_id: int) -> int:
    return store.count_group(conn, group_id)


def entries(
    conn: Connection, station: str, now: int, group: str | None, limit: int, after: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    state = live_stream(load(conn, station), station, now)
    rows = store.page(conn, state.id, group, after, limit + 1)
    more = len(rows) > limit
    out = []
    for row in rows[:limit]:
        view = to_view(state, Message(row.seq, row.data, row.msg_id, row.headers, 0))
        out.append(
            {
                "id": str(row.id),
                "group": row.group_name,
                "offset": view["offset"],
                "msgId": row.msg_id,
                "headers": view["headers"],
                "data": view.get("data"),
                **({"dataBase64": view["dataBase64"]} if "dataBase64" in view else {}),
                "deliveryCount": row.delivery_count,
                "reason": row.reason,
                "error": row.error,
                "deadLetteredAt": iso(row.dead_lettered_at),
            }
        )
    return out, (out[-1]["id"] if more else None)


def _selection(state: StreamState, raw: Any, *, allow_group: bool) -> Selection:
    if not isinstance(raw, dict):
        raise BadRequest('the body must be {"ids": [...]} or {"all": true}', None)
    allowed = {"ids", "all", "group"} if allow_group else {"ids", "all"}
    unknown = set(raw) - allowed
    if unknown:
        field = sorted(unknown)[0]
        raise BadRequest(f"unknown field {field}", field)
    group = raw.get("group")
    if group is not None and not isinstance(group, str):
        raise BadRequest("group must be a string", "group")
    # With ids too, a group narrows the choice to that group's entries.
    if raw.get("all") is True:
        if "ids" in raw:
            raise BadRequest("give ids or all, not both", "ids")
        return Selection(state.id, None, group)
    if "all" in raw and raw["all"] is not False:
        raise BadRequest("all must be true", "all")
    ids = raw.get("ids")
    if not isinstance(ids, list) or not ids or len(ids) > 10_000:
        raise BadRequest("ids must be a non-empty array (or send all: true)", "ids")
    numbers = []
    for i, value in enumerate(ids):
        number = parse_entry_id(value)
        if number is None:
            raise BadRequest(f"ids.{i} is not a DLS entry id", f"ids.{i}")
        if number <= MAX_ENTRY_ID:  # a larger one names no entry
            numbers.append(number)
    return Selection(state.id, numbers, group)


def replay(batch: Batch, station: str, raw: Any) -> int:
    state = live_stream(batch.stream(station), station, batch.now)
    rows = store.lock_selected(batch.conn, _selection(state, raw, allow_group=True))
    live_groups = group_store.ids_of_stream(batch.conn, state.id)
    replayed = 0
    gone: set[int] = set()
    for entry_id, group_id, seq in rows:
        if seq <= state.head:
            # Retention dropped the original: there is nothing to put back in the queue, so
            # the entry (which keeps its own copy) stays where the user can still read it.
            gone.add(entry_id)
            continue
        if group_id in live_groups:
            group_store.requeue(batch.conn, group_id, seq, batch.now)
            replayed += 1
    store.drop_ids(batch.conn, [entry_id for entry_id, _, _ in rows if entry_id not in gone])
    if replayed:
        batch.changed.add(state.name)
    return replayed


def drop(batch: Batch, station: str, raw: Any) -> int:
    state = live_stream(batch.stream(station), station, batch.now)
    return store.drop(batch.conn, _selection(state, raw, allow_group=False))


def expire(batch: Batch) -> int:
    """Drop entries older than their station's ``dls.retentionMs`` (scheduler)."""
    total = 0
    for stream_id, config in store.live_configs(batch.conn):
        keep = (json.loads(config).get("dls") or {}).get("retentionMs")
        if keep is not None:
            total += store.expire(batch.conn, stream_id, batch.now - keep)
    return total


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, dict[str, int]]:
    return {sid: {"deadLettered": n} for sid, n in store.stats(conn, stream_ids).items()}


def purge_stream(batch: Batch, state: StreamState) -> None:
    store.purge_stream(batch.conn, state.id)
