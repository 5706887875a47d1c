"""Creating, forking, expiring and deleting streams (= stations).

Ops here run in the writer's transaction like appends. A stream with live forks is only
soft-deleted: its URL answers 410, its data stays for the forks, and it is removed when the last
fork goes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stations.domain import framing, idwindow
from stations.domain.idwindow import IdWindow
from stations.domain.instants import format_ms as iso
from stations.domain.station import first_difference
from stations.domain.streams import same_content_type, upkeep_columns
from stations.errors import BadRequest, Conflict, Gone, NotFound
from stations.records import StreamState, is_json_type
from stations.store import cursors as reader_cursors
from stations.store import streams as rows
from stations.store.db import Tx
from stations.store.streams import load, load_by_id
from stations.store.writer import Batch


@dataclass
class CreateRequest:
    name: str
    content_type: str
    config: dict[str, Any]
    ttl_seconds: int | None = None
    expires_at: int | None = None
    closed: bool = False
    initial: Sequence[bytes] = field(default_factory=list)
    fork_from: str | None = None
    fork_offset: int | None = None
    fork_sub_offset: int = 0
    # Station API creates compare the whole config; Durable Streams PUTs compare the stream part.
    compare_config: bool = False
    content_type_given: bool = True
    # A fork's initial body sent without a Content-Type: framed as the source's type, which
    # only the writer's transaction knows (a JSON source's fork took it as one raw message).
    # ``initial_cap``: the most messages it may hold.
    initial_body: bytes | None = None
    initial_cap: int = 0


@dataclass
class CreateResult:
    state: StreamState
    created: bool


def _spec(req: CreateRequest) -> str:
    return json.dumps(
        {
            "ttl": req.ttl_seconds,
            "expiresAt": req.expires_at,
            "forkFrom": req.fork_from,
            "forkOffset": req.fork_offset,
            "forkSubOffset": req.fork_sub_offset,
        },
        sort_keys=True,
    )


def framed(body: bytes, content_type: str, cap: int) -> Sequence[bytes]:
    """An initial body as the messages a stream of ``content_type`` stores: a JSON array's
    elements (PROTOCOL.md §9.1.2), else the body as one message."""
    if is_json_type(content_type):
        return framing.split_json(body, allow_empty=True, max_messages=cap)
    return [body] if body else []


def _matches(existing: StreamState, req: CreateRequest, spec: str) -> bool:
    if req.content_type_given and not same_content_type(existing.content_type, req.content_type):
        return False
    if existing.closed != req.closed:
        return False
    if req.compare_config:
        return existing.config == req.config
    if existing.create_spec is None:
        # Made through the station API: a plain PUT of the same type and state ensures it.
        return req.ttl_seconds is None and req.expires_at is None and req.fork_from is None
    stored, asked = json.loads(existing.create_spec), json.loads(spec)
    if req.fork_from is not None and stored["forkFrom"] == req.fork_from:
        # A fork resolved what its request left out: the offset (the source's tail) and, with
        # neither TTL nor expiry, the source's. A retry matches (PROTOCOL.md §4.2) whether it
        # leaves them out again or names what they resolved to. With a sub-offset the stored
        # offset is not the one asked for: only the request's own value compares.
        if req.fork_offset is None or (
            req.fork_sub_offset == 0 and req.fork_offset == existing.fork_offset
        ):
            asked["forkOffset"] = stored["forkOffset"]
        if (req.ttl_seconds, req.expires_at) == (existing.ttl_seconds, existing.expires_at):
            asked["ttl"], asked["expiresAt"] = stored["ttl"], stored["expiresAt"]
    return bool(stored == asked)


def create(batch: Batch, window: IdWindow, req: CreateRequest) -> CreateResult:
    batch.flush()
    batch.forget()
    tx, now = batch.conn, batch.now
    spec = _spec(req)
    # Another process may be creating the same stream right now: its INSERT would make ours
    # fail on the unique name. Creates of one name wait for each other instead (the lock
    # lasts until the commit), so the later one finds the stream and compares.
    rows.lock_name(tx, req.name)
    existing = load(tx, req.name, lock=True)
    if existing is not None and not existing.deleted and existing.expired(now):
        purge(batch, window, existing)
        # Still there when forks read it (soft-deleted): answered below as such.
        existing = load(tx, req.name, lock=True)
    if existing is not None:
        if existing.deleted:
            raise Conflict(f"stream {req.name} was deleted and still has forks", "name")
        if _matches(existing, req, spec):
            return CreateResult(existing, False)
        if req.compare_config and existing.config != req.config:
            # Say which setting differs, so the caller knows what to align.
            found = first_difference(existing.config, req.config)
            if found is not None:
                path, has, asked = found
                raise Conflict(
                    f"station {req.name} already exists with {path} = {json.dumps(has)}, "
                    f"not {json.dumps(asked)}",
                    path,
                )
        raise Conflict(f"stream {req.name} already exists with another configuration", "name")

    values: dict[str, Any] = {
        "name": req.name,
        "content_type": req.content_type,
        "created_at": now,
        "ttl_seconds": req.ttl_seconds,
        "expires_at": req.expires_at,
        "accessed_at": now,
        "closed": False,
        "tail": 0,
        "head": 0,
        "deleted": False,
        "msg_count": 0,
        "byte_count": 0,
        "config": json.dumps(req.config, separators=(",", ":")),
        "create_spec": None if req.compare_config else spec,
    }
    copied: list[bytes] = []
    initial = req.initial
    if req.fork_from is not None:
        source = load(tx, req.fork_from, lock=True)
        if source is None or (source.expired(now) and not source.deleted):
            raise NotFound(f"fork source {req.fork_from} not found", "Stream-Forked-From")
        if source.deleted:
            raise Conflict(f"fork source {req.fork_from} was deleted", "Stream-Forked-From")
        if req.content_type_given and not same_content_type(req.content_type, source.content_type):
            raise Conflict("a fork keeps its source's Content-Type", "Content-Type")
        offset = source.tail if req.fork_offset is None else req.fork_offset
        if offset > source.tail:
            raise BadRequest("Stream-Fork-Offset is beyond the source's tail", "Stream-Fork-Offset")
        if offset < source.head:
            raise BadRequest("Stream-Fork-Offset was dropped by retention", "Stream-Fork-Offset")
        if req.fork_sub_offset:
            offset, copied = _sub_offset(tx, source, offset, req.fork_sub_offset)
        if req.initial_body is not None:
            initial = framed(req.initial_body, source.content_type, req.initial_cap)
        values.update(
            content_type=source.content_type,
            fork_of=source.id,
            fork_offset=offset,
            tail=offset,
            head=0,
        )
        config = json.loads(values["config"])
        config["contentType"] = source.content_type
        values["config"] = json.dumps(config, separators=(",", ":"))
        if req.ttl_seconds is None and req.expires_at is None:
            values["ttl_seconds"], values["expires_at"] = source.ttl_seconds, source.expires_at
    values.update(upkeep_columns(json.loads(values["config"]), now))
    stream_id = rows.insert_row(tx, values)
    state = load_by_id(tx, stream_id)
    assert state is not None
    for data in [*copied, *initial]:
        state.tail += 1
        state.msg_count += 1
        state.byte_count += len(data)
        batch.rows.append((state.id, state.tail, data, None, None, now, 1))
    state.closed = req.closed
    batch.streams[state.name] = state
    batch.touch(state)
    return CreateResult(state, True)


def _sub_offset(tx: Tx, source: StreamState, offset: int, sub: int) -> tuple[int, list[bytes]]:
    """Resolve (offset, sub-offset) on the source: whole messages for JSON, bytes otherwise."""
    from stations.domain.reads import scan

    if is_json_type(source.content_type):
        if offset + sub > source.tail:
            raise BadRequest(
                "Stream-Fork-Sub-Offset is past the source's data", "Stream-Fork-Sub-Offset"
            )
        return offset + sub, []
    nxt = next(iter(scan(tx, source, offset)), None)
    if nxt is None or sub > len(nxt.data):
        raise BadRequest(
            "Stream-Fork-Sub-Offset is past the next data boundary", "Stream-Fork-Sub-Offset"
        )
    if sub == len(nxt.data):
        return nxt.seq, []
    # The fork keeps a copy of the part of the source message it inherits.
    return offset, [nxt.data[:sub]]


def remove(batch: Batch, window: IdWindow, name: str, created_at: int | None = None) -> None:
    """DELETE: gone for good, or soft-deleted while forks still read it. ``created_at`` (ms,
    optional): only the stream created then; another of the same name (the one known was
    deleted and created again since) is a Conflict naming ``createdAt``, and nothing is
    deleted. Decided here, on the row locked in the writer's transaction, so no create by
    another request or process can come between the check and the delete."""
    batch.flush()
    batch.forget()
    state = load(batch.conn, name, lock=True)
    if state is None or (state.expired(batch.now) and not state.deleted):
        raise NotFound(f"stream {name} not found")
    if state.deleted:
        raise Gone(f"stream {name} was deleted")
    created_as_known(state, name, created_at, "nothing was deleted")
    purge(batch, window, state)


def created_as_known(state: StreamState, name: str, created_at: int | None, undone: str) -> None:
    """A request naming the ``createdAt`` (ms) of the stream it acts on is for that stream
    only: another of the same name (the one known was deleted and created again since) is a
    Conflict naming ``createdAt``. Called on the row the request's own transaction changes,
    so no create by another request or process comes between the check and the change."""
    if created_at is not None and state.created_at != created_at:
        raise Conflict(
            f"stream {name} was created at {iso(state.created_at)}, not at the createdAt "
            f"given (deleted and created again since?): {undone}",
            "createdAt",
        )


def purge(batch: Batch, window: IdWindow, state: StreamState) -> None:
    tx = batch.conn
    batch.changed.add(state.name)
    if rows.fork_count(tx, state.id):
        rows.mark_deleted(tx, state.id)
        return
    rows.delete_data(tx, state.id)
    idwindow.purge(tx, state.id)
    # Reader cursors go with it (station ids are never handed out again, on either engine).
    reader_cursors.remove(tx, state.id)
    for hook in purge_hooks:
        hook(batch, state)
    rows.delete_row(tx, state.id)
    window.forget_station(batch, state.id)
    # Cascade: a soft-deleted source whose last fork just went goes too.
    if state.fork_of is not None:
        source = load_by_id(tx, state.fork_of)
        if source is not None and source.deleted and not rows.fork_count(tx, source.id):
            purge(batch, window, source)


# Other modules (groups, DLS) register what they keep per stream, to delete it with the stream.
purge_hooks: list[Any] = []


def touch(batch: Batch, name: str) -> None:
    """A read refreshes a TTL stream's idle countdown."""
    state = batch.stream(name)
    if state is not None and state.ttl_seconds is not None and not state.expired(batch.now):
        state.accessed_at = batch.now
        batch.dirty[state.id] = state


def expired_streams(batch: Batch, window: IdWindow) -> int:
    """Purge streams whose TTL or Expires-At has passed (the scheduler calls this)."""
    batch.flush()
    batch.forget()
    n = 0
    # In name order as Python sorts them, the order every transaction locks stations in (a
    # database's collation may sort otherwise).
    for name in sorted(rows.expiring(batch.conn, batch.now)):
        # Decided again on the row under its lock: another process may have renewed its TTL
        # (an append, a read) since the query above, which locks nothing; its append was
        # answered, then the stream deleted under it.
        state = batch.stream(name)
        if state is not None and not state.deleted and state.expired(batch.now):
            purge(batch, window, state)
            n += 1
    return n
