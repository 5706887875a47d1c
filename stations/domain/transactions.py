"""Transactions across stations: settle leased deliveries of any groups and produce messages to
any stations, all in one database transaction (``POST /api/transactions``).

Every station lives in one database, so consume-transform-produce needs no two-phase protocol:
the acks and the produced messages commit together or not at all. A retry after a crash can
therefore never produce twice: either the first attempt committed (its leases are gone, so the
retry fails with 409 and produces nothing) or it did not (the leases still stand, or expired and
the messages come again).

The op decides everything before it writes anything (the writer's rule for ops that share a
batch): stations, groups, content types and leases are all checked first; then the messages are
appended, then the deliveries settled, neither of which can fail once the checks passed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stations.domain import dls, groups, messages, reads, text
from stations.domain.fields import body_of, integer, object_of
from stations.domain.idwindow import IdWindow
from stations.domain.log import AppendRequest, append, in_use
from stations.domain.offsets import encode
from stations.domain.station import validate_name as validate_station
from stations.domain.streams import same_content_type
from stations.errors import BadRequest, Conflict, Gone, NotFound
from stations.records import StreamState
from stations.store import groups as group_store
from stations.store.writer import Batch

MAX_ITEMS = 10_000  # settlements plus produced messages per transaction
MAX_DELAY_MS = 86_400_000
VERBS = ("ack", "nack", "deadLetter")


@dataclass
class Settle:
    verb: str  # ack, nack or deadLetter
    field: str  # e.g. "ack.3", to name it in errors
    station: str
    group: str
    seq: int
    delivery_count: int | None = None
    deadline: int | None = None  # the fetch's ackDeadline: tells this lease from later ones
    delay_ms: int = 0
    reason: str | None = None


@dataclass
class Produce:
    field: str  # e.g. "produce.2"
    station: str
    item: dict[str, Any]  # {"id", "headers", "data" | "dataBase64"}, checked per station
    content_type: str | None = None


@dataclass
class TxRequest:
    consumer: str | None = None
    settles: list[Settle] = field(default_factory=list)
    produces: list[Produce] = field(default_factory=list)

    def stations(self, kind: str) -> dict[str, str]:
        """station → the field of its first item, for ``"settle"`` or ``"produce"``."""
        items: list[Settle] | list[Produce] = self.settles if kind == "settle" else self.produces
        out: dict[str, str] = {}
        for item in items:
            out.setdefault(item.station, f"{item.field}.station")
        return out


@dataclass
class TxResult:
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    # (station, offset, duplicate) per produced message, in request order
    produced: list[tuple[str, int | None, bool]] = field(default_factory=list)
    nack_due: int | None = None  # the earliest nack redelivery, to arm the lease timer


# -- parsing --------------------------------------------------------------------------------------


# The fields of each item, built once: a set per item cost more than the rest of its checks.
_SETTLE = frozenset({"station", "group"}) | groups.LEASE_FIELDS
SETTLE_FIELDS = {
    "ack": _SETTLE,
    "nack": _SETTLE | {"delayMs"},
    "deadLetter": _SETTLE | {"reason"},
}
SETTLE_REQUIRED = frozenset({"station", "group", "offset"})
PRODUCE_FIELDS = frozenset({"station", "id", "headers", "data", "dataBase64", "contentType"})
PRODUCE_REQUIRED = frozenset({"station"})


def _list(raw: dict[str, Any], key: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise BadRequest(f"{key} must be an array", key)
    return value


def _station_name(value: Any, item: str, known: set[str]) -> str:
    """``item``'s station (``item``: e.g. "ack.3"), validated once per name."""
    if isinstance(value, str) and value in known:
        return value
    name = validate_station(value, f"{item}.station")
    known.add(name)
    return name


def parse(raw: Any, max_produce: int = MAX_ITEMS) -> TxRequest:
    """``max_produce``: the server's ``--max-append-messages``; produced messages are messages
    appended like any produce's, so the cap on one append bounds them too (all stations'
    together: the transaction writes them in one database transaction)."""
    body = body_of(raw, {"consumer", "produce", *VERBS}, '{"ack": [...], "produce": [...], ...}')
    req = TxRequest()
    consumer = body.get("consumer")
    if consumer is not None:
        text.check(consumer, "consumer", text.NAME)
    req.consumer = consumer
    lists = {key: _list(body, key) for key in (*VERBS, "produce")}
    total = sum(map(len, lists.values()))
    if total == 0:
        raise BadRequest("a transaction needs at least one ack, nack, deadLetter or produce", None)
    if total > MAX_ITEMS:
        longest = max(lists, key=lambda k: len(lists[k]))
        raise BadRequest(f"at most {MAX_ITEMS} items per transaction (got {total})", longest)
    limit = min(MAX_ITEMS, max_produce)
    if len(lists["produce"]) > limit:
        raise BadRequest(
            f"at most {limit} produced messages per transaction (got {len(lists['produce'])})",
            "produce",
        )
    seen: dict[tuple[str, str, int], str] = {}
    names: set[str] = set()
    group_names: set[str] = set()
    for verb in VERBS:
        allowed = SETTLE_FIELDS[verb]
        for i, value in enumerate(lists[verb]):
            name = f"{verb}.{i}"
            item = object_of(value, name, allowed, SETTLE_REQUIRED)
            station = _station_name(item["station"], name, names)
            group = item["group"]
            if not isinstance(group, str):
                raise BadRequest(f"{name}.group must be a group name", f"{name}.group")
            if group not in group_names:
                try:
                    groups.validate_name(group)
                except BadRequest as exc:
                    raise BadRequest(exc.message, f"{name}.group") from None
                group_names.add(group)
            seq = groups.parse_offset(item["offset"], f"{name}.offset")
            settle = Settle(verb, name, station, group, seq)
            settle.delivery_count, settle.deadline = groups.lease_name(item, name)
            if verb == "nack":
                settle.delay_ms = integer(
                    item.get("delayMs", 0), f"{name}.delayMs", 0, MAX_DELAY_MS
                )
            if verb == "deadLetter":
                reason = item.get("reason")
                if reason is not None:
                    text.check(reason, f"{name}.reason", text.LONG, least=0)
                settle.reason = reason
            key = (station, group, seq)
            if key in seen:
                raise BadRequest(
                    f"{name} settles the same delivery as {seen[key]}", f"{name}.offset"
                )
            seen[key] = name
            req.settles.append(settle)
    for i, value in enumerate(lists["produce"]):
        name = f"produce.{i}"
        item = object_of(value, name, PRODUCE_FIELDS, PRODUCE_REQUIRED)
        station = _station_name(item["station"], name, names)
        content_type = item.get("contentType")
        if content_type is not None and not isinstance(content_type, str):
            raise BadRequest(f"{name}.contentType must be a string", f"{name}.contentType")
        message = dict(item)
        del message["station"]
        message.pop("contentType", None)
        req.produces.append(Produce(name, station, message, content_type))
    return req


# -- the op ----------------------------------------------------------------------------------------


def _station(batch: Batch, name: str, field: str) -> StreamState:
    state = batch.stream(name)
    if state is None or (state.expired(batch.now) and not state.deleted):
        raise NotFound(f"station {name} not found", field)
    if state.deleted:
        raise Gone(f"station {name} was deleted", field)
    return state


def _stale(s: Settle, why: str) -> Conflict:
    return Conflict(
        f"the lease on offset {encode(s.seq - 1)} of group {s.group} on station {s.station} "
        f"{why}; nothing was committed",
        f"{s.field}.offset",
        station=s.station,
        group=s.group,
        offset=encode(s.seq - 1),
    )


def _check_leases(
    batch: Batch, req: TxRequest, states: dict[str, StreamState]
) -> dict[tuple[str, str], int]:
    """Every lease must be held; returns the group ids by (station, group)."""
    ids: dict[tuple[str, str], int] = {}
    by_group: dict[tuple[str, str], list[Settle]] = defaultdict(list)
    for s in req.settles:
        by_group[(s.station, s.group)].append(s)
    for (station, name), items in sorted(by_group.items()):
        state = states[station]
        # A nack or dead-letter of a message retention dropped while it was leased settles
        # nothing (the group answers it unknown): it passed this check and then failed the
        # assertion in _settle, a 500.
        dropped = reads.dropped_through(batch.conn, state)
        row = group_store.load(batch.conn, state.id, name, lock=True)
        if row is None:
            raise NotFound(
                f"group {name} not found on station {station}", f"{items[0].field}.group"
            )
        ids[(station, name)] = row["id"]
        held = group_store.leases(batch.conn, row["id"], [s.seq for s in items])
        for s in items:
            lease = held.get(s.seq)
            if lease is None or lease[0] <= 0:
                raise _stale(s, "is not held: it was settled, or never delivered")
            count, consumer, due, named = lease
            if consumer is None or due <= batch.now:
                raise _stale(s, "has expired")
            if s.delivery_count is not None and s.delivery_count != count:
                raise _stale(s, f"moved on: it is now delivery {count}")
            if s.verb != "ack" and s.seq <= dropped:
                raise _stale(s, "has lost its message to the station's retention")
            # A seek or a DLS replay delivers a message again from count 1: the deadline its
            # fetch answered (an extension moves the lease's, not that) is what tells that
            # lease from the one the request was given.
            if s.deadline is not None and s.deadline != named:
                raise _stale(s, "is another delivery of this message (a seek or replay)")
            if req.consumer is not None and consumer != req.consumer:
                raise _stale(s, f"is held by consumer {consumer}, not by {req.consumer}")
    return ids


def _appends(
    req: TxRequest, states: dict[str, StreamState]
) -> list[tuple[AppendRequest, list[int]]]:
    """One append per station (ids repeated inside it are duplicates of the first, as in one
    produce request), with the request indexes of its messages."""
    by_station: dict[str, list[tuple[int, Produce]]] = defaultdict(list)
    for i, p in enumerate(req.produces):
        by_station[p.station].append((i, p))
    out = []
    for station, items in by_station.items():
        state = states[station]
        for _, p in items:
            if p.content_type is not None and not same_content_type(
                p.content_type, state.content_type
            ):
                raise Conflict(
                    f"{p.field}.contentType {p.content_type!r} does not match station "
                    f"{station}'s {state.content_type!r}",
                    f"{p.field}.contentType",
                )
        if state.closed:
            raise Conflict(f"station {station} is closed", f"{items[0][1].field}.station")
        try:
            append_req = messages.parse_batch(state, {"messages": [p.item for _, p in items]})
        except BadRequest as exc:
            raise _renamed(exc, items) from None
        out.append((append_req, [i for i, _ in items]))
    return out


def _renamed(exc: BadRequest, items: list[tuple[int, Produce]]) -> BadRequest:
    """``messages.<k>...`` of the per-station batch as ``produce.<i>...`` of the request."""
    path = exc.field or ""
    parts = path.split(".")
    if len(parts) >= 2 and parts[0] == "messages" and parts[1].isdigit():
        field = ".".join([items[int(parts[1])][1].field, *parts[2:]])
        return BadRequest(
            exc.message.replace(".".join(parts[:2]), items[int(parts[1])][1].field), field
        )
    return BadRequest(exc.message, "produce")


def run(batch: Batch, window: IdWindow, req: TxRequest, reach: dls.Reach | None = None) -> TxResult:
    """The transaction's op; ``reach``: the stations the request may write to, which must
    include where its nacks and dead letters may be forwarded."""
    # Lock every station in one order (by name), so two transactions crossing the same
    # stations in opposite directions cannot deadlock on PostgreSQL.
    named = req.stations("settle") | req.stations("produce")
    # ... the stations dead letters are forwarded to included: a nack or a dead letter writes
    # there too. (station -> the field of its first such item, to name it in a refusal)
    may_dead_letter: dict[str, str] = {}
    for s in req.settles:
        if s.verb != "ack":
            may_dead_letter.setdefault(s.station, f"{s.field}.station")
    forwards: set[str] = set()
    if batch.row_locks:
        forwards = dls.with_forward_targets(batch, may_dead_letter) - named.keys()
    states: dict[str, StreamState] = {}
    for name in sorted(named.keys() | forwards):
        if name in named:
            states[name] = _station(batch, name, named[name])
        else:
            batch.stream(name)
    if reach is not None:
        for name, field_name in sorted(may_dead_letter.items()):
            dls.check_reach(states[name], reach, field_name)
    group_ids = _check_leases(batch, req, states)
    appends = _appends(req, states)
    # Decided: from here on nothing fails.
    result = TxResult(produced=[("", None, False)] * len(req.produces))
    for append_req, indexes in appends:
        done = append(batch, window, append_req)
        for index, (offset, duplicate) in zip(indexes, done.results, strict=True):
            result.produced[index] = (append_req.name, offset, duplicate)
    _settle(batch, req, result, group_ids, states)
    return result


def _settle(
    batch: Batch,
    req: TxRequest,
    result: TxResult,
    group_ids: dict[tuple[str, str], int],
    states: dict[str, StreamState],
) -> None:
    batches: dict[tuple[str, str, str, int, str | None], list[int]] = defaultdict(list)
    for s in req.settles:
        batches[(s.verb, s.station, s.group, s.delay_ms, s.reason)].append(s.seq)
    for (verb, station, group, delay_ms, reason), seqs in batches.items():
        if verb == "ack":
            # The leases were checked under the group's lock: an ack only deletes them.
            group_store.forget(batch.conn, group_ids[(station, group)], seqs)
            # As the plain ack does (nacks and dead-letters renew it in groups): a TTL station
            # settled only through transactions expired under its consumers' leases.
            in_use(states[station], station, batch)
            result.acked += len(seqs)
            groups.settled_some(batch, states[station])
            continue
        if verb == "nack":
            n, unknown = groups.nack(batch, station, group, seqs, delay_ms)
            result.nacked += n
            due = batch.now + delay_ms
            result.nack_due = due if result.nack_due is None else min(result.nack_due, due)
        else:
            n, unknown = groups.dead_letter(batch, station, group, seqs, reason)
            result.dead_lettered += n
        # Checked above under the same locks, so every delivery is still there.
        assert not unknown, f"lease check and settlement disagree on {unknown}"
