"""Consumer groups: a cursor over a station's log plus per-message leases.

``fetch`` hands out, in offset order, first the group's waiting messages that are due (nacked
with a delay that has passed, leases that expired, DLS replays), then new messages from the log.
Each handed-out message is leased to one consumer until its ack deadline. A lease that expires or
a nack sends the message round again until it has been delivered ``maxMsgDeliveries`` times; then
it leaves the queue for the dead-letter store. Every step is a writer op, so it is durable and,
on PostgreSQL, serialized per group by a row lock across processes.

A ``deliveries`` row is leased (``consumer`` set, until ``due``) or waiting (``consumer`` null,
due at ``due``). The sign of ``delivery_count`` tells waiting rows apart: positive for a lease
that expired (its delivery is still open: ack, nack and dead-letter accept it), negative for a
nacked delivery (settled: they answer unknown until it is delivered again), zero for a DLS
replay (not delivered yet). Its magnitude is the number of deliveries so far.

The rows are read and written by ``stations.store.groups``; this module decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

from stations.domain import dls, instants, isolate, reads
from stations.domain.fields import body_of, integer, object_of
from stations.domain.log import in_use, live_stream
from stations.domain.offsets import BEGINNING, BadOffset, decode, encode
from stations.domain.pages import BY_LAG, Page, collect
from stations.domain.reads import dropped_through
from stations.domain.station import MAX_ACK_MS, MAX_DELIVERIES, MIN_ACK_MS
from stations.errors import BadRequest, NotFound, PreconditionFailed
from stations.records import StreamState
from stations.store import groups as store
from stations.store.groups import Connection
from stations.store.streams import load, segments
from stations.store.writer import Batch

_NAME = re.compile(r"^[A-Za-z0-9._~\-]{1,256}$")
MAX_FETCH = 1000
# A fetch's answer carries at most about this much message data (a browse page's size), so
# large messages cannot make one answer of a thousand of them.
MAX_FETCH_BYTES = 8 * 1024 * 1024


@dataclass
class Group:
    id: int
    stream_id: int
    name: str
    max_ack_time_ms: int
    max_msg_deliveries: int
    cursor: int
    created_at: int
    lease_floor: int = 0
    names_bound: int = 0


@dataclass(slots=True)
class Delivered:
    seq: int
    msg_id: str | None
    headers: str | None
    data: bytes
    delivery_count: int
    ack_deadline: int


@dataclass
class Fetched:
    """What one fetch leased, with how the station stores data (JSON or bytes), so the
    answer is written without another read of the station."""

    is_json: bool
    messages: list[Delivered]
    # An empty fetch on PostgreSQL: when the group's next lease expires or waiting delivery
    # falls due, for the lease timer of the process where the consumer now waits.
    next_due: int | None = None
    # An empty fetch of a closed station whose group has delivered and settled everything:
    # nothing more can come (but a DLS replay), so it is answered at once, not after waitMs.
    closed: bool = False


def validate_name(name: str) -> str:
    # "." and ".." are path segments every URL client resolves away: such a group could be
    # created by a raw request and never be reached again.
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise BadRequest(
            "a group name is 1 to 256 letters, digits, '.', '_', '~' or '-', not . or ..",
            "group",
        )
    return name


def _int(raw: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = raw.get(key)
    return None if value is None else integer(value, key, lo, hi)


def _load(batch_or_conn: Batch | Connection, state: StreamState, name: str, lock: bool) -> Group:
    """The group's row. In a writer batch it is read (and locked) once: the batch's other ops
    on the group (concurrent consumers' fetches and acks share a commit) use the same object,
    which every change of the row in this module updates too."""
    key = ("group", state.id, name)
    if isinstance(batch_or_conn, Batch):
        cached = batch_or_conn.locked.get(key)
        if cached is not None:
            return cast(Group, cached)
        conn = batch_or_conn.conn
    else:
        conn = batch_or_conn
    row = store.load(conn, state.id, name, lock=lock)
    if row is None:
        raise NotFound(f"group {name} not found on station {state.name}", "group")
    group = Group(**row)
    if isinstance(batch_or_conn, Batch) and lock:
        batch_or_conn.locked[key] = group
    return group


def _in_reach(
    batch: Batch, state: StreamState | None, station: str, reach: dls.Reach | None
) -> StreamState:
    """``in_use`` for an op that may dead-letter, once ``reach`` is checked: a refused request
    writes nothing, not even a TTL station's renewed countdown."""
    dls.check_reach(live_stream(state, station, batch.now), reach)
    return in_use(state, station, batch)


def ensure(
    batch: Batch,
    station: str,
    name: str,
    raw: Any,
    exists: bool | None = None,
    *,
    reach: dls.Reach | None = None,
) -> tuple[Group, bool]:
    """PUT a group: create it, or update the limits of a standing one. ``exists`` True: only
    update one (``If-Match: *``); False: only create one (``If-None-Match: *``). ``reach``:
    the stations the request may write to (its limits decide when the lease timer
    dead-letters, and so forwards, a message)."""
    validate_name(name)
    # A JSON null is refused too: no body at all is the API's {}.
    raw = body_of(raw, {"maxAckTimeMs", "maxMsgDeliveries", "startFrom"})
    ack_ms = _int(raw, "maxAckTimeMs", MIN_ACK_MS, MAX_ACK_MS)
    max_deliveries = _int(raw, "maxMsgDeliveries", 1, MAX_DELIVERIES)
    start = raw.get("startFrom", "earliest")
    # A lower maxMsgDeliveries may dead-letter (below): lock as a dead letter does.
    state = _in_reach(batch, dls.stream_and_forward(batch, station), station, reach)
    if start in ("earliest", BEGINNING):  # "-1": the Durable Streams word for the start
        cursor = dropped_through(batch.conn, state)
    elif start == "latest":
        cursor = state.tail
    elif isinstance(start, str):
        try:
            cursor = decode(start)
        except BadOffset:
            raise BadRequest(
                "startFrom must be earliest, latest or an offset", "startFrom"
            ) from None
        if cursor > state.tail:
            raise BadRequest("startFrom is beyond the station's tail", "startFrom")
    else:
        raise BadRequest("startFrom must be earliest, latest or an offset", "startFrom")
    defaults = state.config.get("consumerDefaults", {})
    try:
        group = _load(batch, state, name, lock=True)
    except NotFound:
        if exists:
            raise PreconditionFailed(
                f"group {name} not found on station {station} (If-Match: *)", "If-Match"
            ) from None
        # Checked for a new group only: a standing one PUT again with the settings it was made
        # with (as the SDK does on every start) is "200 same", whatever retention did since.
        named = start not in ("earliest", BEGINNING, "latest")  # an offset (checked above)
        if named and cursor < dropped_through(batch.conn, state):
            raise BadRequest(
                "startFrom is before the earliest retained message", "startFrom"
            ) from None
        values: dict[str, Any] = {
            "stream_id": state.id,
            "name": name,
            "max_ack_time_ms": ack_ms or defaults.get("maxAckTimeMs", 30_000),
            "max_msg_deliveries": max_deliveries or defaults.get("maxMsgDeliveries", 2),
            "cursor": cursor,
            "created_at": batch.now,
        }
        return Group(id=store.create(batch.conn, values), **values), True
    if exists is False:
        raise PreconditionFailed(
            f"group {name} already exists on station {station} (If-None-Match: *)",
            "If-None-Match",
        )
    changes = {}
    if ack_ms is not None and ack_ms != group.max_ack_time_ms:
        if ack_ms < group.max_ack_time_ms:
            # Names handed out so far may reach now plus the old ack time, beyond what a fence
            # would reckon from the new one (a replayed message took a revoked lease's name).
            bound = max(group.names_bound, batch.now + group.max_ack_time_ms)
            changes["names_bound"] = group.names_bound = bound
        changes["max_ack_time_ms"] = group.max_ack_time_ms = ack_ms
    lowered = max_deliveries is not None and max_deliveries < group.max_msg_deliveries
    if max_deliveries is not None and max_deliveries != group.max_msg_deliveries:
        changes["max_msg_deliveries"] = group.max_msg_deliveries = max_deliveries
    if changes:
        store.change(batch.conn, group.id, **changes)
    if lowered:
        # Messages waiting to be delivered again (nacked, or their lease expired) that have
        # had as many deliveries as the new limit allows: their last one is behind them, so
        # they leave the queue now, as at the end of a last delivery (they were handed out a
        # fourth time under a limit of two).
        done = store.waiting_delivered(batch.conn, group.id, group.max_msg_deliveries)
        reason = f"maxMsgDeliveries lowered to {group.max_msg_deliveries}"
        dls.add(batch, state, group.id, group.name, done, "max_deliveries", reason)
    return group, False


def remove(batch: Batch, station: str, name: str) -> None:
    state = live_stream(batch.stream(station), station, batch.now)
    group = _load(batch, state, name, lock=True)
    dls.drop_group(batch, group.id)
    store.remove(batch.conn, group.id)
    batch.locked.pop(("group", state.id, name), None)
    batch.changed.add(state.name)  # a fetch waiting on the group hears it is gone (404)


def lag(tail: int, cursor: int, head: int) -> int:
    """Messages after a group's cursor that retention has not dropped."""
    return max(0, tail - max(cursor, head))


def views(
    conn: Connection, station: str, now: int, page: Page | None = None
) -> list[dict[str, Any]]:
    """The station's groups with their figures, by name; or a ``page`` of them, or ordered by
    lag the ``limit`` furthest behind. A page by name has one more, holding its name only: the
    caller tells from it that a next page exists. The figures are counted for the page's
    groups only, in one statement."""
    state = live_stream(load(conn, station), station, now)
    head = dropped_through(conn, state)
    if page is None:
        found = store.of_stream(conn, state.id)
    elif page.order == BY_LAG:
        found = store.furthest_behind(
            conn, state.id, head, state.tail, page.prefix, page.contains, page.limit
        )
    else:

        def read(after: str | None, size: int) -> list[dict[str, Any]]:
            return store.page(conn, state.id, after, page.prefix, page.contains, size)

        found = collect(page, read, lambda row: str(row["name"]))
    lookahead = found[page.limit :] if page is not None else []
    rows = [Group(**row) for row in found[: len(found) - len(lookahead)]]
    return _views_of(conn, state, head, rows) + [{"name": row["name"]} for row in lookahead]


def view(conn: Connection, station: str, now: int, name: str) -> dict[str, Any]:
    """One group with its figures, as ``views`` has it (creating a group answered with it
    read every group of the station: 70-220 ms each with 3,000 groups)."""
    state = live_stream(load(conn, station), station, now)
    (out,) = _views_of(conn, state, dropped_through(conn, state), [_load(conn, state, name, False)])
    return out


def written_view(group: Group) -> dict[str, Any]:
    """A group's view from what its PUT wrote, when the group is gone by the time the answer
    is read (another process deleted it): its settings, and no figures left to count."""
    return {
        "name": group.name,
        "maxAckTimeMs": group.max_ack_time_ms,
        "maxMsgDeliveries": group.max_msg_deliveries,
        "pending": 0,
        "inFlight": 0,
        "deadLettered": 0,
        "lag": 0,
        "cursor": encode(group.cursor),
    }


def _views_of(
    conn: Connection, state: StreamState, head: int, rows: list[Group]
) -> list[dict[str, Any]]:
    queues = store.queue_figures(conn, [group.id for group in rows])  # one statement for all
    out: list[dict[str, Any]] = []
    for group in rows:
        waiting, in_flight, dead = queues[group.id]
        behind = lag(state.tail, group.cursor, head)
        out.append(
            {
                "name": group.name,
                "maxAckTimeMs": group.max_ack_time_ms,
                "maxMsgDeliveries": group.max_msg_deliveries,
                "pending": behind + waiting,
                "inFlight": in_flight,
                "deadLettered": dead,
                "lag": behind,
                "cursor": encode(group.cursor),
            }
        )
    return out


# -- delivery ---------------------------------------------------------------------------------


def _settle_expired(
    batch: Batch, state: StreamState, group: Group, expired: list[tuple[int, int]] | None = None
) -> list[int]:
    """Leases past their deadline: the message goes round again, or to the DLS if that was
    its last delivery. Returns the positions that wait again (due at once)."""
    if expired is None:
        expired = store.expired_leases(batch.conn, group.id, batch.now)
    if not expired:
        return []
    again = [seq for seq, count in expired if count < group.max_msg_deliveries]
    if again:
        store.release(batch.conn, group.id, again)
    if not batch.durable or _forward_out_of_order(batch, state):
        # A commit that may not reach the disk writes leases only: a DLS entry (and what
        # dls.forwardTo appends) must not vanish after readers saw it. The lease timer's
        # tick, a transaction that waits for the disk and locks in name order, moves these
        # at their deadline.
        batch.changed.add(state.name)
        return again
    last = [(seq, count) for seq, count in expired if count >= group.max_msg_deliveries]
    dls.add(batch, state, group.id, group.name, last, "max_deliveries", "ack deadline passed")
    batch.changed.add(state.name)
    return again


def _forward_out_of_order(batch: Batch, state: StreamState) -> bool:
    """Whether a dead letter of ``state`` would lock the station it is forwarded to after
    ``state``, against the name order every process locks stations in (a fetch locks only
    its own station: looking the target up first would cost every fetch a query)."""
    if not batch.row_locks:
        return False
    target = (state.config.get("dls") or {}).get("forwardTo")
    return isinstance(target, str) and target < state.name and target not in batch.streams


def fetch(
    batch: Batch,
    station: str,
    name: str,
    max_count: int,
    consumer: str,
    max_bytes: int = MAX_FETCH_BYTES,
    *,
    reach: dls.Reach | None = None,
) -> Fetched:
    """Lease up to ``max_count`` due messages. Expired leases are settled first, which may
    dead-letter (and forward) them: ``reach`` is where the request may write."""
    batch.flush()  # appends earlier in this batch must be readable
    state = _in_reach(batch, batch.stream(station), station, reach)
    group = _load(batch, state, name, lock=True)
    due, expired = store.due_and_expired(batch.conn, group.id, batch.now, max_count)
    # Expired leases wait again, due at once: they join the due ones, in offset order.
    released = _settle_expired(batch, state, group, expired)
    if released:
        counts_of = dict(expired)
        due = sorted(due + [(seq, counts_of[seq]) for seq in released])[:max_count]
    picked: dict[int, int] = {seq: abs(count) for seq, count in due}
    # Retention dropped these while they waited: nothing to deliver, room for others. A
    # fork's head counts its sources' retention: by its own, a group on it was handed
    # messages its reads answered 410 for (the rest of a source's row retention cut through).
    head = dropped_through(batch.conn, state)
    dropped = [seq for seq in picked if seq <= head]
    if dropped:
        store.forget(batch.conn, group.id, dropped)
        for seq in dropped:
            del picked[seq]
    start = max(group.cursor, head)
    last = min(state.tail, start + max_count - len(picked))
    wanted = sorted([*picked, *range(start + 1, last + 1)])
    # The answer holds at most ``max_bytes`` of data (always one message): what does not fit
    # is not leased, and waits for the next fetch.
    pieces = reads.pieces_at(batch.conn, state, wanted, max_bytes, head=head)
    size = 0
    for k, piece in enumerate(pieces):
        size += len(piece[1])
        if size > max_bytes:  # where pieces_at stopped reading, by the same measure
            # Only what is delivered is leased and passed by the cursor: a position the read
            # did not reach waits for the next fetch (below, a missing one is forgotten).
            del pieces[max(k, 1) :]
            wanted = [seq for seq in wanted if seq <= pieces[-1][0]]
            break
    last = wanted[-1] if wanted and wanted[-1] > start else start
    new = range(start + 1, last + 1)
    deadline = max(batch.now + group.max_ack_time_ms, group.lease_floor + 1)
    if new:
        store.lease_new(batch.conn, group.id, start + 1, last, consumer, deadline)
        group.cursor = last
    again = [seq for seq in wanted if seq in picked]
    if again:
        store.lease_again(batch.conn, group.id, again, consumer, deadline)
    counts = {seq: picked[seq] + 1 for seq in again} | dict.fromkeys(new, 1)
    out = [
        Delivered(seq, msg_id, headers, data, counts[seq], deadline)
        for seq, data, msg_id, headers, _ in pieces
    ]
    if len(out) < len(counts):  # the read went past them: gone, nothing left to deliver
        found = {d.seq for d in out}
        store.forget(batch.conn, group.id, [s for s in counts if s not in found])
    next_due = None
    if not out and batch.row_locks:
        # Another process may hold the group's leases (or have nacked with a delay), and only
        # its own timer knows their deadlines: if it dies, a consumer parked here would wait
        # for this process's re-arm from the database (every 5 s) instead of the deadline.
        next_due = store.group_next_due(batch.conn, group.id, batch.now)
    closed = (
        not out
        and state.closed
        and group.cursor >= state.tail
        and not store.has_deliveries(batch.conn, group.id)
    )
    return Fetched(state.is_json, out, next_due, closed)


def fence(group: Group, now: int) -> int:
    """The lease floor above every lease name the group has handed out: a fetch names a lease
    ``max(now + ack time, floor + 1)``, and names from before a lowered ack time are at most
    ``names_bound``. (``store.raise_lease_floor`` is the same rule in SQL.)"""
    return max(group.lease_floor + 1, now + group.max_ack_time_ms, group.names_bound)


def _settleable(batch: Batch, group: Group, seqs: list[int]) -> dict[int, int]:
    """Delivered and not yet settled (leased, or its lease expired): seq → delivery count."""
    return store.open_deliveries(batch.conn, group.id, seqs)


def parse_offset(token: Any, field: str) -> int:
    """One offset as a position."""
    try:
        return decode(token) + 1
    except BadOffset:
        raise BadRequest(f"{field} is not an offset", field) from None


def parse_offsets(raw: Any, field: str | None = None) -> list[int]:
    """Offsets as positions; ``field``: the name of a lone offset's field, else ``offsets``."""
    if not isinstance(raw, list) or not raw or len(raw) > 10_000:
        raise BadRequest("offsets must be a non-empty array of at most 10000 offsets", "offsets")
    return [parse_offset(token, field or f"offsets.{i}") for i, token in enumerate(raw)]


# A lease as a fetch answered it: the message's offset, its delivery count and ackDeadline,
# which together name one delivery (a later delivery of the message has another deadline).
LEASE_FIELDS = frozenset({"offset", "deliveryCount", "ackDeadline"})
MAX_DELIVERY_COUNT = 1_000_000
# Deliveries named by their leases: seq → {(delivery count, the deadline it was fetched with)}.
Named = dict[int, set[tuple[int, int]]]


def lease_name(item: dict[str, Any], field: str) -> tuple[int | None, int | None]:
    """The delivery count and the ackDeadline (epoch ms) ``item`` names, each None if absent."""
    count = deadline = None
    if "deliveryCount" in item:
        count = integer(item["deliveryCount"], f"{field}.deliveryCount", 1, MAX_DELIVERY_COUNT)
    if "ackDeadline" in item:
        deadline = parse_deadline(item["ackDeadline"], f"{field}.ackDeadline")
    return count, deadline


def parse_leases(raw: Any) -> Named:
    """``leases`` as a fetch answered them, whole: position → {(delivery count, ackDeadline)}.
    Several deliveries of one message may be named (a stale one beside the live one)."""
    if not isinstance(raw, list) or not raw or len(raw) > 10_000:
        raise BadRequest("leases must be a non-empty array of at most 10000 leases", "leases")
    named: Named = {}
    for i, value in enumerate(raw):
        where = f"leases.{i}"
        item = object_of(value, where, LEASE_FIELDS, LEASE_FIELDS)
        seq = parse_offset(item["offset"], f"{where}.offset")
        count, deadline = lease_name(item, where)
        assert count is not None and deadline is not None  # required above
        named.setdefault(seq, set()).add((count, deadline))
    return named


def _split(seqs: list[int], known: dict[int, int]) -> list[str]:
    return [encode(s - 1) for s in seqs if s not in known]


def _without_dropped(
    batch: Batch, state: StreamState, group: Group, known: dict[int, int]
) -> dict[int, int]:
    """``known`` without the messages retention dropped while they were out: their leases are
    settled (nothing is left to deliver) and they answer ``unknown``, as the README says;
    they were answered as nacked or dead-lettered (no DLS entry written) and lingered in the
    group's figures."""
    head = dropped_through(batch.conn, state)
    dropped = [seq for seq in known if seq <= head]
    if not dropped:
        return known
    store.settle(batch.conn, group.id, dropped)
    return {seq: count for seq, count in known.items() if seq > head}


def ack(
    batch: Batch, station: str, name: str, seqs: list[int], named: Named | None = None
) -> tuple[int, list[str]]:
    """Settle the deliveries of ``seqs`` for good; with ``named`` (as ``extend``), only the
    deliveries it names, not a later one of the same message."""
    state = in_use(batch.stream(station), station, batch)
    group = _load(batch, state, name, lock=True)
    wanted = _named_only(batch, group, seqs, named) if named is not None else seqs
    settled = set(store.settle(batch.conn, group.id, wanted))
    head = dropped_through(batch.conn, state)
    settled = {seq for seq in settled if seq > head}  # retention dropped the rest: unknown
    if settled:
        settled_some(batch, state)
    return len(settled), [encode(s - 1) for s in seqs if s not in settled]


def settled_some(batch: Batch, state: StreamState) -> None:
    """Deliveries of the station were acked or dead-lettered: on a closed station perhaps its
    group's last, which the group's waiting fetches must hear (they answer ``closed``)."""
    if state.closed:
        batch.changed.add(state.name)


def extend(
    batch: Batch,
    station: str,
    name: str,
    seqs: list[int],
    lease_ms: int | None,
    consumer: str | None,
    named: Named | None = None,
) -> tuple[int, int, list[str]]:
    """A consumer still working on messages keeps their leases: each held lease (not expired;
    ``consumer``'s if given; with ``named``, seq → {(delivery count, the ackDeadline its fetch
    answered)}, only those deliveries) runs until ``lease_ms`` (default the group's
    ``maxAckTimeMs``) from now. The lease keeps its name: a transaction still gives the
    deadline its fetch answered. An expired lease is not taken back (its message may be on
    its way to another consumer), nor one whose message retention dropped. Returns (how many,
    the new deadline, unknown offsets)."""
    state = in_use(batch.stream(station), station, batch)
    group = _load(batch, state, name, lock=True)
    deadline = batch.now + (lease_ms if lease_ms is not None else group.max_ack_time_ms)
    head = dropped_through(batch.conn, state)
    live = [seq for seq in seqs if seq > head]  # the rest lost their message: unknown
    if named is not None and live:
        live = _named_only(batch, group, live, named)
    extended = set(store.extend(batch.conn, group.id, live, deadline, batch.now, consumer))
    return len(extended), deadline, [encode(s - 1) for s in seqs if s not in extended]


def parse_deadline(value: Any, field: str) -> int:
    """An ``ackDeadline`` as a fetch answers it: epoch ms."""
    return instants.parse(value, field).ms


def _named_only(batch: Batch, group: Group, seqs: list[int], named: Named) -> list[int]:
    """Of ``seqs``, those whose delivery now is one ``named`` names: a consumer extending or
    giving back its leases leaves alone a later delivery of the message, which another
    consumer may be processing (by offset alone, that was taken away)."""
    held = store.leases(batch.conn, group.id, seqs)
    return [
        seq for seq in seqs if seq in held and (held[seq][0], held[seq][3]) in named.get(seq, ())
    ]


def _named_open(
    batch: Batch, group: Group, known: dict[int, int], named: Named | None
) -> dict[int, int]:
    """The open deliveries ``known`` (seq → count) that ``named`` names (None: all)."""
    if named is None or not known:
        return known
    kept = set(_named_only(batch, group, list(known), named))
    return {seq: count for seq, count in known.items() if seq in kept}


def nack(
    batch: Batch,
    station: str,
    name: str,
    seqs: list[int],
    delay_ms: int,
    named: Named | None = None,
    *,
    reach: dls.Reach | None = None,
) -> tuple[int, list[str]]:
    state = _in_reach(batch, dls.stream_and_forward(batch, station), station, reach)
    group = _load(batch, state, name, lock=True)
    known = _without_dropped(batch, state, group, _settleable(batch, group, seqs))
    known = _named_open(batch, group, known, named)
    again = [s for s, count in known.items() if count < group.max_msg_deliveries]
    if again:
        store.postpone(batch.conn, group.id, again, batch.now + delay_ms)
    last = sorted((s, count) for s, count in known.items() if count >= group.max_msg_deliveries)
    dls.add(batch, state, group.id, group.name, last, "max_deliveries", "nacked")
    batch.changed.add(state.name)
    return len(known), _split(seqs, known)


def dead_letter(
    batch: Batch,
    station: str,
    name: str,
    seqs: list[int],
    reason: str | None,
    named: Named | None = None,
    *,
    reach: dls.Reach | None = None,
) -> tuple[int, list[str]]:
    state = _in_reach(batch, dls.stream_and_forward(batch, station), station, reach)
    group = _load(batch, state, name, lock=True)
    known = _without_dropped(batch, state, group, _settleable(batch, group, seqs))
    known = _named_open(batch, group, known, named)
    dls.add(
        batch,
        state,
        group.id,
        group.name,
        sorted(known.items()),
        "dead_letter",
        reason,
        always=True,
    )
    if known:
        settled_some(batch, state)
    return len(known), _split(seqs, known)


def expire_all(batch: Batch, since: int) -> int | None:
    """The scheduler's tick: settle expired leases of every group, redrive DLS entries that are
    due, wake fetchers of stations whose waiting messages fell due since ``since``; returns
    when the next thing falls due."""
    expiring = store.groups_with_expired(batch.conn, batch.now)
    if batch.row_locks:
        _lock_for_tick(batch, {station for station, _ in expiring})
    for station, name in expiring:
        state = dls.stream_and_forward(batch, station)  # expiry may dead-letter
        if state is None:
            continue
        # One group's failure must not stop the others' expiry (nor the DLS redrives).
        with isolate.per_station(batch, "lease expiry", f"{station} (group {name})"):
            try:
                group = _load(batch, state, name, lock=True)
            except NotFound:  # deleted by another process since the query above
                continue
            _settle_expired(batch, state, group)
    batch.changed |= store.due_stations(batch.conn, since, batch.now)
    due = [t for t in (store.next_due(batch.conn, batch.now), dls.redrive_due(batch)) if t]
    return min(due) if due else None


def _lock_for_tick(batch: Batch, expiring: set[str]) -> None:
    """Lock up front, in name order as every other path does, each station the tick may
    write: those with expired leases, those their dead letters are forwarded to, and those
    with DLS entries to redrive (these were locked after the others). A redrive locks its
    entries after their station, as a replay does (the other way round, the two deadlock)."""
    for name in sorted(dls.with_forward_targets(batch, expiring) | dls.redrive_stations(batch)):
        batch.stream(name)


def stats(conn: Connection, stream_ids: list[int]) -> dict[int, dict[str, int]]:
    return {sid: {"groups": n} for sid, n in store.stats(conn, stream_ids).items()}


def purge_stream(batch: Batch, state: StreamState) -> None:
    store.purge_stream(batch.conn, state.id)


# -- seek -----------------------------------------------------------------------------------------


@dataclass
class SeekResult:
    cursor: int
    revoked: int  # leases in flight that no longer settle anything
    dropped: int  # waiting redeliveries (nacked, expired, replayed) that will not come


def parse_seek(raw: Any) -> tuple[str, Any]:
    """``{"to": "earliest" | "now" | <offset>}`` or ``{"time": <ISO 8601> | <epoch ms>}``."""
    raw = body_of(raw, {"to", "time"})
    if ("to" in raw) == ("time" in raw):
        raise BadRequest("give exactly one of to and time", "to")
    if "time" in raw:
        value = raw["time"]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= instants.MAX_MS:
            return "time", value
        if isinstance(value, str):
            return "time", instants.parse(value, "time").ms
        raise BadRequest(
            "time must be a date-time with its zone (2026-11-22T10:00:00Z) or epoch ms", "time"
        )
    to = raw["to"]
    if to in ("earliest", BEGINNING, "now", "latest"):
        return ("now" if to in ("now", "latest") else "earliest"), None
    try:
        return "offset", decode(to)
    except BadOffset:
        raise BadRequest("to must be earliest, now or an offset", "to") from None


def seek(batch: Batch, station: str, name: str, target: tuple[str, Any]) -> SeekResult:
    """Move the group's cursor. A seek is a clean cut: every lease in flight is revoked (its
    ack, nack or dead-letter answers unknown; a transaction settling it fails with 409), every
    waiting redelivery is dropped, and delivery goes on from the new position with fresh
    delivery counts. The DLS keeps its entries."""
    batch.flush()  # appends earlier in this batch count for "now" and for times
    state = in_use(batch.stream(station), station, batch)
    group = _load(batch, state, name, lock=True)
    kind, value = target
    head = dropped_through(batch.conn, state)
    if kind == "earliest":
        cursor = head
    elif kind == "now":
        cursor = state.tail
    elif kind == "offset":
        if value > state.tail:
            raise BadRequest("to is beyond the station's tail", "to")
        if value < head:
            raise BadRequest("to is before the earliest retained message", "to")
        cursor = value
    else:
        first = None
        for stream_id, lo, hi in segments(batch.conn, state):
            first = store.first_stored_at_or_after(batch.conn, stream_id, max(lo, head), hi, value)
            if first is not None:
                break
        cursor = state.tail if first is None else first - 1
    revoked, dropped, latest = store.clear(batch.conn, group.id)
    # The messages come round again from delivery count 1: their new leases must not take the
    # name (fetched deadline) of an earlier one, or its late transaction settles them.
    floor = max(fence(group, batch.now), latest)
    store.change(batch.conn, group.id, cursor=cursor, lease_floor=floor)
    group.cursor, group.lease_floor = cursor, floor
    batch.changed.add(state.name)  # waiting fetchers may have something new to take
    return SeekResult(cursor, revoked, dropped)
