"""The dead-letter store (DLS): messages a group gave up on, kept with their delivery count,
reason and last error until replayed or dropped (or ``dls.retentionMs`` passes).

An entry is written in the same transaction that takes the message out of the group's queue,
and so is its copy forwarded to ``dls.forwardTo``: both stations live in one database, so the
forward happens exactly once even across a crash. A replay puts the entry back into its group's
queue durably — it waits there for the next fetch even when no consumer is online.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, delete, func, insert, select

from stations.domain.errors import BadRequest, StationsError
from stations.domain.idwindow import IdWindow
from stations.domain.log import AppendRequest, append, live_stream
from stations.domain.messages import iso, to_view
from stations.domain.streams import StreamState, load
from stations.store.schema import deliveries, dls, groups
from stations.store.writer import Batch

if TYPE_CHECKING:
    from stations.domain.groups import Group

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


def _delete(batch: Batch, cond: ColumnElement[bool]) -> int:
    """Delete entries. Ids are never reused (an AUTOINCREMENT key on SQLite, a sequence on
    PostgreSQL): clients replay and drop by id and page with ``after``."""
    return batch.conn.execute(delete(dls).where(cond)).rowcount or 0


def add(
    batch: Batch,
    state: StreamState,
    group: Group,
    seq: int,
    count: int,
    reason: str,
    error: str | None,
    *,
    always: bool = False,
) -> None:
    """Take ``seq`` out of the group's queue; keep it in the DLS unless poison-keeping is off."""
    from stations.domain.groups import _messages_at

    conn = batch.conn
    conn.execute(
        delete(deliveries).where(deliveries.c.group_id == group.id, deliveries.c.seq == seq)
    )
    batch.changed.add(state.name)
    settings = state.config.get("dls") or {}
    if not (always or settings.get("poison", True)):
        return
    found = _messages_at(conn, state, [seq])
    if not found:
        return  # dropped by retention in the meantime: nothing to keep
    _, msg_id, headers, data = found[0]
    conn.execute(
        insert(dls).values(
            stream_id=state.id,
            group_id=group.id,
            group_name=group.name,
            seq=seq,
            msg_id=msg_id,
            headers=headers,
            data=data,
            delivery_count=count,
            reason=reason,
            error=error,
            dead_lettered_at=batch.now,
        )
    )
    target = settings.get("forwardTo")
    if target:
        _forward(batch, state, group.name, reason, target, headers, data)


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
    _delete(batch, dls.c.group_id == group_id)


def count_group(conn: Connection, group_id: int) -> int:
    return conn.execute(
        select(func.count()).select_from(dls).where(dls.c.group_id == group_id)
    ).scalar_one()


def entries(
    conn: Connection, station: str, now: int, group: str | None, limit: int, after: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    state = live_stream(load(conn, station), station, now)
    query = select(dls).where(dls.c.stream_id == state.id)
    if group is not None:
        query = query.where(dls.c.group_name == group)
    if after is not None:
        query = query.where(dls.c.id > after)
    rows = conn.execute(query.order_by(dls.c.id).limit(limit + 1)).all()
    more = len(rows) > limit
    out = []
    for row in rows[:limit]:
        from stations.domain.reads import Message

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


def _selection(state: StreamState, raw: Any, *, allow_group: bool) -> Any:
    if not isinstance(raw, dict):
        raise BadRequest('the body must be {"ids": [...]} or {"all": true}', None)
    allowed = {"ids", "all", "group"} if allow_group else {"ids", "all"}
    unknown = set(raw) - allowed
    if unknown:
        field = sorted(unknown)[0]
        raise BadRequest(f"unknown field {field}", field)
    cond = dls.c.stream_id == state.id
    group = raw.get("group")
    if group is not None:
        if not isinstance(group, str):
            raise BadRequest("group must be a string", "group")
        cond = cond & (dls.c.group_name == group)  # with ids too: only that group's entries
    if raw.get("all") is True:
        if "ids" in raw:
            raise BadRequest("give ids or all, not both", "ids")
        return cond
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
    return cond & dls.c.id.in_(numbers)


def replay(batch: Batch, station: str, raw: Any) -> int:
    state = live_stream(batch.stream(station), station, batch.now)
    cond = _selection(state, raw, allow_group=True)
    rows = batch.conn.execute(
        select(dls.c.id, dls.c.group_id, dls.c.seq).where(cond).with_for_update()
    ).all()
    live_groups = set(
        batch.conn.execute(select(groups.c.id).where(groups.c.stream_id == state.id)).scalars()
    )
    replayed = 0
    gone: set[int] = set()
    for entry_id, group_id, seq in rows:
        if seq <= state.head:
            # Retention dropped the original: there is nothing to put back in the queue, so
            # the entry (which keeps its own copy) stays where the user can still read it.
            gone.add(entry_id)
            continue
        if group_id in live_groups:
            batch.conn.execute(
                delete(deliveries).where(deliveries.c.group_id == group_id, deliveries.c.seq == seq)
            )
            batch.conn.execute(
                insert(deliveries).values(
                    group_id=group_id, seq=seq, delivery_count=0, consumer=None, due=batch.now
                )
            )
            replayed += 1
    done = [entry_id for entry_id, _, _ in rows if entry_id not in gone]
    if done:
        _delete(batch, dls.c.id.in_(done))
    if replayed:
        batch.changed.add(state.name)
    return replayed


def drop(batch: Batch, station: str, raw: Any) -> int:
    state = live_stream(batch.stream(station), station, batch.now)
    cond = _selection(state, raw, allow_group=False)
    return _delete(batch, cond)


def expire(batch: Batch) -> int:
    """Drop entries older than their station's ``dls.retentionMs`` (scheduler)."""
    from stations.store.schema import streams

    total = 0
    for row in batch.conn.execute(select(streams).where(streams.c.deleted.is_(False))).all():
        state = StreamState.from_row(row)
        keep = (state.config.get("dls") or {}).get("retentionMs")
        if keep is not None:
            total += _delete(
                batch,
                (dls.c.stream_id == state.id) & (dls.c.dead_lettered_at <= batch.now - keep),
            )
    return total


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, dict[str, int]]:
    rows = conn.execute(
        select(dls.c.stream_id, func.count())
        .where(dls.c.stream_id.in_(stream_ids))
        .group_by(dls.c.stream_id)
    ).all()
    return {sid: {"deadLettered": n} for sid, n in rows}


def purge_stream(batch: Batch, state: StreamState) -> None:
    _delete(batch, dls.c.stream_id == state.id)
