"""The dead-letter store (DLS): messages a group gave up on, kept with their delivery count,
reason and last error until replayed or dropped (or ``dls.retentionMs`` passes).

An entry is written in the same transaction that takes the message out of the group's queue,
and so is its copy forwarded to ``dls.forwardTo``: both stations live in one database, so the
forward happens exactly once even across a crash. A replay puts the entry back into its group's
queue durably — it waits there for the next fetch even when no consumer is online.

**Redrive.** A replay may wait ``delayMs`` before its message is due again. A station's
``dls.redrive`` policy moves entries back by itself: an entry dead-lettered for the n-th time
after n - 1 redrives is due ``delayMs * backoff**(n-1)`` (at most ``maxDelayMs``) later, and goes
back to its group's queue with its redrive count; once the count reaches ``maxRedrives`` the next
entry stays in the DLS with reason ``max_redrives``. Each redrive moves the entry and writes the
delivery in one transaction, so a crash in between neither loses nor duplicates it. The lease
timer's tick redrives what is due, in chunks, and arms itself for the next due entry.

This module imports nothing of ``stations.domain.groups`` (groups call in here when they give a
message up); its rows are read and written by ``stations.store.dls``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stations.domain import retention, text
from stations.domain.fields import body_of
from stations.domain.idwindow import IdWindow
from stations.domain.instants import format_ms as iso
from stations.domain.log import AppendRequest, append, in_use, live_stream, unpack
from stations.domain.messages import to_view
from stations.domain.reads import SEP, Message, Piece, dropped_through
from stations.domain.streams import same_content_type
from stations.errors import BadRequest, Forbidden, StationsError
from stations.records import StreamState
from stations.store import dls as store
from stations.store import groups as group_store
from stations.store import messages as stored
from stations.store.dls import Connection, Selection
from stations.store.streams import load, segments
from stations.store.writer import Batch

logger = logging.getLogger("stations.domain.dls")
REDRIVE_CHUNK = 1000  # entries per tick; more due → the next tick runs at once
_NO_IDS = IdWindow(cache_size=1)  # forwarded copies carry no Msg-Id
_ENTRY_ID = re.compile(r"[0-9]{1,20}")
MAX_ENTRY_ID = 2**31 - 1  # ``dls.id`` is a 32-bit integer on PostgreSQL
MAX_DELAY_MS = 7 * 86_400_000


def parse_entry_id(value: object) -> int | None:
    """A DLS entry id from JSON or a query string (a decimal string or a non-negative integer);
    ``None`` if it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and _ENTRY_ID.fullmatch(value):
        return int(value)
    return None


# Messages are read, and their entries written, a chunk of rows of about this much data at a
# time: a dead letter of thousands of large messages must not hold them all in memory.
CHUNK_BYTES = 8 << 20


def add(
    batch: Batch,
    state: StreamState,
    group_id: int,
    group_name: str,
    counts: list[tuple[int, int]],
    reason: str,
    error: str | None,
    *,
    always: bool = False,
) -> None:
    """Take the messages of ``counts``, (seq, delivery count), out of the group's queue; keep
    them in the DLS unless poison-keeping is off. A fixed number of statements however many:
    2,500 at a statement or five each held the writer (every append) for seconds."""
    if not counts:
        return
    conn = batch.conn
    redrives = group_store.take(conn, group_id, [seq for seq, _ in counts])
    batch.changed.add(state.name)
    settings = state.config.get("dls") or {}
    if not (always or settings.get("poison", True)):
        return
    count_of = dict(counts)
    policy = settings.get("redrive")
    target = settings.get("forwardTo")
    # Retention may have dropped some in the meantime: nothing to keep of those.
    for pieces in _pieces(conn, state, sorted(count_of)):
        rows: list[dict[str, Any]] = []
        forwards: list[tuple[str, str | None, bytes]] = []
        for seq, data, msg_id, headers, _ in pieces:
            n = redrives.get(seq, 0)
            entry_reason, entry_error, redrive_at = reason, error, None
            if policy:
                if n < policy["maxRedrives"]:
                    redrive_at = batch.now + redrive_delay(policy, n)
                else:
                    # Capped: it stays; the error still says why it died this last time.
                    entry_error = f"{reason}: {error}" if error else reason
                    entry_reason = "max_redrives"
            rows.append(
                {
                    "stream_id": state.id,
                    "group_id": group_id,
                    "group_name": group_name,
                    "seq": seq,
                    "msg_id": msg_id,
                    "headers": headers,
                    "data": data,
                    "delivery_count": count_of[seq],
                    "reason": entry_reason,
                    "error": entry_error,
                    "dead_lettered_at": batch.now,
                    "redrives": n,
                    "redrive_at": redrive_at,
                }
            )
            forwards.append((entry_reason, headers, data))
        store.add(conn, rows)
        if rows:
            retention.look_by(batch, state, retention.dls_retention_ms(state))
        if target:
            _forward(batch, state, group_name, target, forwards)


def _pieces(conn: Connection, state: StreamState, positions: list[int]) -> Iterator[list[Piece]]:
    """The messages at ``positions`` that still exist, as ``reads.pieces_at`` finds them, in
    chunks of rows of about ``CHUNK_BYTES`` (at least one row each), by position. A fixed number
    of statements however many and however spread out (``pieces_at`` scans once per run of
    consecutive positions): one finds the rows holding them, in each stream a fork reads
    from, then one reads each chunk's rows."""
    # Retention dropped the rest (a fork's sources' too).
    head = dropped_through(conn, state)
    wanted = [p for p in positions if p > head]
    found: list[tuple[int, int, int]] = []  # (stream id, seq, bytes) of the rows to read
    # Each stream's own positions: a source's row may run past the fork offset, and the
    # positions there are the fork's messages, not the ones of that row.
    within: dict[int, list[int]] = {}
    for stream_id, lo, hi in segments(conn, state):
        inside = [p for p in wanted if p > lo and (hi is None or p <= hi)]
        within[stream_id] = inside
        found += [
            (stream_id, seq, size) for seq, _, size in stored.holding(conn, stream_id, inside)
        ]
    chunk: list[tuple[int, int, int]] = []
    size = 0
    for k, row in enumerate(found):
        chunk.append(row)
        size += row[2]
        if size >= CHUNK_BYTES or k == len(found) - 1:
            yield _pieces_of(conn, chunk, within)
            chunk, size = [], 0


def _pieces_of(
    conn: Connection, chunk: list[tuple[int, int, int]], within: dict[int, list[int]]
) -> list[Piece]:
    """The messages at the positions ``within`` each stream in the rows of ``chunk``."""
    out: list[Piece] = []
    for stream_id in dict.fromkeys(stream_id for stream_id, _, _ in chunk):
        seqs = [seq for of, seq, _ in chunk if of == stream_id]
        wanted = within[stream_id]
        for seq, span, data, msg_id, headers, stored_at in stored.rows_at(conn, stream_id, seqs):
            first = seq - span  # the position before the row's first message
            inside = wanted[bisect_right(wanted, first) : bisect_right(wanted, seq)]
            if span == 1:
                out.extend((p, data, msg_id, headers, stored_at) for p in inside)
            elif msg_id is None and headers is None:  # a Durable Streams batch append
                parts = data.split(SEP)
                out.extend((p, parts[p - first - 1], None, None, stored_at) for p in inside)
            else:  # a produce's messages, their ids and headers packed beside them
                parts, ids, heads = data.split(SEP), unpack(msg_id, span), unpack(headers, span)
                out.extend(
                    (p, parts[p - first - 1], ids[p - first - 1], heads[p - first - 1], stored_at)
                    for p in inside
                )
    return out


# Whether a request may write to a station (its token's scope); None: to any station.
Reach = Callable[[str], bool]


def check_reach(state: StreamState, reach: Reach | None, field: str = "dls.forwardTo") -> None:
    """Refuse a request that may dead-letter (and so copy into ``dls.forwardTo``) when it may
    not write to that station. Checked by the op itself, on the station it has locked: checked
    before, an admin's change of ``forwardTo`` in between let a scoped token's dead letters
    into a station its scope does not name."""
    if reach is None:
        return
    target = (state.config.get("dls") or {}).get("forwardTo")
    if isinstance(target, str) and not reach(target):
        raise Forbidden(
            f"this token does not cover station {target!r}, where {state.name} forwards dead "
            "letters",
            field,
        )


def stream_and_forward(batch: Batch, name: str) -> StreamState | None:
    """``batch.stream(name)``, after the station its dead letters are forwarded to when that
    name sorts first: a dead letter writes to both, and transactions lock their stations in
    name order, so a dead letter must too or two processes can deadlock."""
    if name not in batch.streams and batch.row_locks:
        target = forward_target(batch, name)
        if target is not None and target < name:
            batch.stream(target)
    return batch.stream(name)


def lock_in_order(batch: Batch, names: list[str]) -> None:
    """The writer's lock of a batch's stations up front: with the stations their dead letters
    are forwarded to, all in name order (``stream_and_forward`` takes a target first only when
    its station is not locked yet: a station locked up front had its target locked after it,
    out of order, and two processes deadlocked)."""
    for name in sorted(with_forward_targets(batch, names)):
        batch.stream(name)


def with_forward_targets(batch: Batch, names: Iterable[str]) -> set[str]:
    """``names`` and the stations their dead letters are forwarded to, which a path that may
    dead-letter must lock with them, in one name order."""
    wanted = set(names)
    for name in list(wanted):
        target = forward_target(batch, name)
        if target is not None:
            wanted.add(target)
    return wanted


def check_forward_target(batch: Batch, content_type: str, config: dict[str, Any]) -> None:
    """Refuse a ``dls.forwardTo`` naming a station of another content type: its dead letters
    could never be copied there (each append refused), which only a log line said while the
    create or PATCH was answered 200. (A station not there yet may be made later.)"""
    target = (config.get("dls") or {}).get("forwardTo")
    peek = batch.peek(target) if isinstance(target, str) else None
    if peek is None or peek.deleted or same_content_type(peek.content_type, content_type):
        return
    raise BadRequest(
        f"dls.forwardTo names {target}, whose content type {peek.content_type!r} is not this "
        f"station's {content_type!r}: its dead letters could not be copied there",
        "dls.forwardTo",
    )


def forward_target(batch: Batch, name: str) -> str | None:
    """Where a station's dead letters are copied (``dls.forwardTo``), read without a lock."""
    peek = batch.peek(name)
    target = (peek.config.get("dls") or {}).get("forwardTo") if peek is not None else None
    return target if isinstance(target, str) else None


def redrive_stations(batch: Batch) -> set[str]:
    """The stations of the entries ``redrive_due`` would move now, read without a lock."""
    rows = store.due_redrives(batch.conn, batch.now, REDRIVE_CHUNK, lock=False)
    return {station for _, station, _, _, _ in rows}


def redrive_delay(policy: dict[str, Any], redrives: int) -> int:
    try:
        delay = policy["delayMs"] * float(policy["backoff"]) ** redrives
    except OverflowError:  # a large backoff after hundreds of redrives: past any cap
        delay = math.inf
    return int(min(delay, policy["maxDelayMs"]))


def redrive_due(batch: Batch) -> int | None:
    """Move the entries whose redrive is due back to their groups (the lease timer's tick);
    return when the next one is due (now, if this tick left some)."""
    rows = store.due_redrives(batch.conn, batch.now, REDRIVE_CHUNK)
    done: list[int] = []
    kept: list[int] = []
    back: dict[int, list[tuple[int, int]]] = defaultdict(list)
    heads: dict[str, int] = {}  # a fork's with its sources' (retention dropped up to it)
    for entry_id, station, group_id, seq, redrives in rows:
        state = batch.stream(station)
        if state is not None and station not in heads:
            heads[station] = dropped_through(batch.conn, state, share=True)
        if state is None or state.deleted or seq <= heads[station]:
            # Retention dropped the original: the entry keeps its own copy for the user.
            kept.append(entry_id)
            continue
        back[group_id].append((seq, redrives + 1))
        done.append(entry_id)
        batch.changed.add(station)
    for group_id, entries in back.items():
        group_store.requeue(batch.conn, group_id, entries, batch.now)
        _fence_leases(batch, group_id)
    store.drop_ids(batch.conn, done)
    store.never_redrive(batch.conn, kept)
    if len(rows) == REDRIVE_CHUNK:
        return batch.now
    return store.next_redrive(batch.conn)


def _forward(
    batch: Batch,
    state: StreamState,
    group: str,
    target: str,
    forwards: list[tuple[str, str | None, bytes]],
) -> None:
    """Copies of dead letters, (reason, headers, data), appended to ``target`` as one append
    (a message each, as one at a time did)."""
    if not forwards:
        return
    tagged = []
    for reason, headers, _ in forwards:
        merged = json.loads(headers) if headers else {}
        merged.update({"dls-source": state.name, "dls-group": group, "dls-reason": reason})
        tagged.append(json.dumps(merged, separators=(",", ":")))
    req = AppendRequest(
        name=target,
        content_type=state.content_type,
        messages=[data for _, _, data in forwards],
        headers=list(tagged),
    )
    try:
        append(batch, _NO_IDS, req)
    except StationsError as exc:
        # The entries stay in this station's DLS; the forward target is misconfigured.
        logger.warning("cannot forward DLS entries of %s to %s: %s", state.name, target, exc)


def drop_group(batch: Batch, group_id: int) -> None:
    store.drop_group(batch.conn, group_id)


# A page of entries carries at most this much message data (always at least one entry), as a
# fetch does: 1000 entries of a few MB each were read, and answered, all at once.
MAX_PAGE_BYTES = 8 << 20
PAGE_ROWS = 16  # rows read at a time, so the rows past the byte bound are never read


def entries(
    conn: Connection,
    station: str,
    now: int,
    group: str | None,
    limit: int,
    after: int | None,
    max_bytes: int = MAX_PAGE_BYTES,
) -> tuple[list[dict[str, Any]], str | None]:
    state = live_stream(load(conn, station), station, now)
    out: list[dict[str, Any]] = []
    size = 0
    while True:
        batch = min(limit - len(out), PAGE_ROWS)
        rows = store.page(conn, state.id, group, after, batch + 1)  # one more: is there more?
        for row in rows[:batch]:
            if out and size + len(row.data) > max_bytes:
                return out, out[-1]["id"]
            size += len(row.data)
            out.append(_entry(state, row))
            after = row.id
        if len(rows) <= batch:
            return out, None
        if len(out) == limit:
            return out, out[-1]["id"]


def _entry(state: StreamState, row: Any) -> dict[str, Any]:
    view = to_view(state, Message(row.seq, row.data, row.msg_id, row.headers, 0))
    return {
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
        "redrives": row.redrives,
        "redriveAt": None if row.redrive_at is None else iso(row.redrive_at),
    }


MAX_SELECTED_IDS = 10_000  # DLS entry ids a replay or drop names


def _selection(state: StreamState, raw: Any, *, allow_group: bool) -> Selection:
    allowed = {"ids", "all", "group"} if allow_group else {"ids", "all"}
    raw = body_of(raw, allowed, '{"ids": [...]} or {"all": true}')
    group = raw.get("group")
    if group is not None:
        text.check(group, "group", text.NAME)  # a NUL was a 500 on PostgreSQL
    # With ids too, a group narrows the choice to that group's entries.
    if raw.get("all") is True:
        if "ids" in raw:
            raise BadRequest("give ids or all, not both", "ids")
        return Selection(state.id, None, group)
    if "all" in raw and raw["all"] is not False:
        raise BadRequest("all must be true", "all")
    ids = raw.get("ids")
    if not isinstance(ids, list) or not ids:
        raise BadRequest("ids must be a non-empty array (or send all: true)", "ids")
    if len(ids) > MAX_SELECTED_IDS:
        raise BadRequest(f"ids holds at most {MAX_SELECTED_IDS} entry ids a request", "ids")
    numbers = []
    for i, value in enumerate(ids):
        number = parse_entry_id(value)
        if number is None:
            raise BadRequest(f"ids.{i} is not a DLS entry id", f"ids.{i}")
        if number <= MAX_ENTRY_ID:  # a larger one names no entry
            numbers.append(number)
    return Selection(state.id, numbers, group)


def _fence_leases(batch: Batch, group_id: int) -> None:
    """Messages back from the DLS are delivered again from count 1: their new leases must not
    take the deadline of the lease that dead-lettered them (the same clock reading), or that
    lease's late transaction settles them. As a seek does, lift the group's lease floor (see
    ``groups.fetch``), in the row and in the batch's copy of it."""
    floor = group_store.raise_lease_floor(batch.conn, group_id, batch.now)
    if floor is None:
        return
    for key, group in batch.locked.items():
        if key[0] == "group" and group.id == group_id:
            group.lease_floor = floor


def replay(batch: Batch, station: str, raw: Any) -> int:
    """Entries back to their groups, due after ``delayMs`` (0: at once). A replay keeps the
    entry's redrive count (it is not a redrive, but a capped message replayed by hand and dead
    again stays capped)."""
    state = in_use(batch.stream(station), station, batch)
    delay = 0
    if isinstance(raw, dict) and "delayMs" in raw:
        raw = dict(raw)
        delay = raw.pop("delayMs")
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= MAX_DELAY_MS:
            raise BadRequest(f"delayMs must be an integer from 0 to {MAX_DELAY_MS}", "delayMs")
    rows = store.lock_selected(batch.conn, _selection(state, raw, allow_group=True))
    live_groups = group_store.ids_of_stream(batch.conn, state.id)
    # Messages, not entries: one that died again after a seek back has two entries.
    replayed: set[tuple[int, int]] = set()
    gone: set[int] = set()
    back: dict[int, list[tuple[int, int]]] = defaultdict(list)
    # A fork's head counts its sources' retention: by its own, an entry whose message a
    # source dropped was put back in the queue and deleted, and the message never came.
    # The sources' rows held shared until the commit: another process's retention committing
    # after this read (its head read stale) let the replay delete entries whose message
    # that retention dropped, their only copy.
    head = dropped_through(batch.conn, state, share=True)
    for entry_id, group_id, seq, redrives in rows:
        if seq <= head:
            # Retention dropped the original: there is nothing to put back in the queue, so
            # the entry (which keeps its own copy) stays where the user can still read it.
            gone.add(entry_id)
            continue
        if group_id in live_groups:
            back[group_id].append((seq, redrives))
            replayed.add((group_id, seq))
    for group_id, entries in back.items():
        group_store.requeue(batch.conn, group_id, entries, batch.now + delay)
        _fence_leases(batch, group_id)
    store.drop_ids(batch.conn, [row[0] for row in rows if row[0] not in gone])
    if replayed:
        batch.changed.add(state.name)
    return len(replayed)


def drop(batch: Batch, station: str, raw: Any) -> int:
    state = live_stream(batch.stream(station), station, batch.now)
    return store.drop(batch.conn, _selection(state, raw, allow_group=False))


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, dict[str, int]]:
    return {sid: {"deadLettered": n} for sid, n in store.stats(conn, stream_ids).items()}


def purge_stream(batch: Batch, state: StreamState) -> None:
    store.purge_stream(batch.conn, state.id)
