"""A subscription's wake, from start to end: a new generation when a followed stream has
pending work; for a webhook, delivery with retries and backoff, then callbacks; for pull-wake,
an event on the wake stream, then a worker's claim, acks and release. Leases end a wake that
nobody finishes; tokens of an older generation or wake are fenced. Each op returns an
``Outcome``: its answer, and the deadlines at which the engine must look again."""

from __future__ import annotations

import json
import logging
import random
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from stations.domain.idwindow import IdWindow
from stations.domain.log import AppendRequest, append
from stations.domain.offsets import BEGINNING, BadOffset, decode
from stations.domain.subscriptions.errors import (
    AlreadyClaimed,
    Fenced,
    InvalidOffset,
    InvalidRequest,
    NoPendingWork,
    TokenRefused,
)
from stations.domain.subscriptions.keys import (
    Signer,
    TokenClaims,
    TokenError,
    kid_of,
    new_private_pem,
)
from stations.domain.subscriptions.links import (
    NO_WAKE,
    Link,
    link_stream,
    links_of,
    locked_row,
    mark_changed,
    pending_links,
    stream_infos,
    tails_of,
)
from stations.domain.subscriptions.spec import glob_match, matching_paths, normalize_path
from stations.errors import StationsError
from stations.records import is_json_type
from stations.store import subscriptions as store
from stations.store.writer import Batch

log = logging.getLogger("stations.subscriptions")

RETRY_BASE_MS = 1_000
RETRY_MAX_MS = 60_000
RETRY_JITTER = 0.2
# A delivery attempt owns the wake for this long: if its process dies mid-attempt, another
# process (or the restarted one) tries again once it has passed.
ATTEMPT_GUARD_MS = 20_000
# In a webhook wake's snapshot: the first attempt whose tails it still holds unchanged (each
# later claim found the same tails, and no stream of them was deleted between: a deletion
# takes the stream out of the snapshot). No stream path holds a "#".
SAME_SINCE = "#same_since"


@dataclass
class Outcome:
    """What an op decided: its answer, and the subscriptions whose deadlines changed."""

    value: Any = None
    deadlines: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Context:
    """What the ops need beyond the batch: the signer for tokens, the id window for appends."""

    signer: Signer
    ids: IdWindow
    # ``--public-url``: callback URLs are built on it when a wake is delivered, not on the
    # address the subscription was created through (which the row keeps for the rest).
    public_url: str | None = None


def _start_wake(
    batch: Batch, ctx: Context, row: dict[str, Any], pending: list[Link], claiming: bool = False
) -> Outcome:
    """A new generation. Webhooks: due for delivery now. Pull-wake: an event on the wake stream;
    where none can be written (the stream missing, closed or not JSON), no wake either, unless
    a worker is claiming it: one nobody hears of held back every later append's event."""
    sub_id = row["id"]
    values: dict[str, Any] = {
        "generation": row["generation"] + 1,
        "wake_id": "w_" + secrets.token_hex(12),
        "holder": None,
        "lease_expires_at": None,
        "snapshot": None,
        "attempts": 0,
    }
    out = Outcome()
    if row["type"] == "webhook":
        values["next_attempt_at"] = batch.now
        out.deadlines.append((sub_id, batch.now))
    else:
        values["next_attempt_at"] = None
        path = pending[0].path if pending else ""
        if not _wake_event(batch, ctx, row, path, values["generation"]) and not claiming:
            return out  # the next append (or a sweep) tries again
    store.update_subscription(batch.conn, sub_id, values)
    row.update(values)
    mark_changed(batch, sub_id)
    return out


def _wake_event(
    batch: Batch, ctx: Context, row: dict[str, Any], path: str, generation: int
) -> bool:
    """Append the wake's event; whether it could be."""
    name = row["wake_stream"]
    state = batch.stream(name)
    if state is None or state.deleted or state.closed or not is_json_type(state.content_type):
        # The application creates the wake stream (§7.2); claims still work without events.
        log.warning(
            "subscription %s: wake stream %s is missing, closed or not JSON", row["id"], name
        )
        return False
    event = {
        "type": "wake",
        "subscription_id": row["id"],
        "stream": path,
        "generation": generation,
        "ts": batch.now,
    }
    message = json.dumps(event, separators=(",", ":")).encode()
    try:
        # An append decides before it writes, so a refused one leaves nothing behind.
        append(batch, ctx.ids, AppendRequest(name, state.content_type, [message]))
    except StationsError as exc:
        log.warning("subscription %s: wake event not written to %s: %s", row["id"], name, exc)
        return False
    return True


def _maybe_wake(
    batch: Batch, ctx: Context, row: dict[str, Any], links: list[Link] | None = None
) -> Outcome:
    if row["wake_id"] is not None or row["holder"] is not None:
        return Outcome()
    links = links_of(batch, row["id"]) if links is None else links
    pending = pending_links(links, tails_of(batch, [link.path for link in links]))
    if not pending:
        return Outcome()
    return _start_wake(batch, ctx, row, pending)


def on_append(batch: Batch, ctx: Context, touched: dict[str, list[str]]) -> Outcome:
    """Streams in ``touched`` (path -> ids of subscriptions whose pattern or explicit links name
    it) have new data. A stream first seen through a pattern is linked from its beginning: it
    was created after the subscription, so all of it is new."""
    out = Outcome()
    by_sub: dict[str, list[str]] = {}
    for path, sub_ids in touched.items():
        for sub_id in sub_ids:
            by_sub.setdefault(sub_id, []).append(path)
    for sub_id in sorted(by_sub):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is None:
            continue
        paths = by_sub[sub_id]
        # Only the appended streams' links: all of a pattern's (thousands of streams) were
        # read on every append, its wake open or not (3,000 streams: 4 -> 40 ms an append,
        # and every other station's appends waited in the same transactions).
        existing = {link.path: link for link in links_of(batch, sub_id, paths)}
        for path in paths:
            if (
                path not in existing
                and row["pattern"]
                and path != row["wake_stream"]
                and glob_match(row["pattern"], path)
                and batch.stream(path) is not None
            ):
                link_stream(batch, sub_id, path, explicit=False, acked=0, existing=existing)
        out.deadlines += _maybe_wake(batch, ctx, row).deadlines
    return out


def sweep(batch: Batch, ctx: Context, sub_ids: list[str]) -> Outcome:
    """After a start (or when another process made a subscription): link pattern streams that
    appeared unseen, and wake whatever has pending work. Nothing is skipped across a crash
    between an append's commit and the wake decision that follows it."""
    out = Outcome()
    names: list[str] | None = None
    for sub_id in sorted(sub_ids):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is None:
            continue
        existing = {link.path: link for link in links_of(batch, sub_id)}
        if row["pattern"]:
            names = sorted(store.stream_names(batch.conn)) if names is None else names
            for path in matching_paths(row["pattern"], names):
                if path not in existing and path != row["wake_stream"]:
                    link_stream(batch, sub_id, path, explicit=False, acked=0, existing=existing)
        started = _maybe_wake(batch, ctx, row, list(existing.values())).deadlines
        out.deadlines += started
        if not started and row["wake_id"] is not None:
            due = [t for t in (row["next_attempt_at"], row["lease_expires_at"]) if t is not None]
            if due:
                out.deadlines.append((sub_id, min(due)))
    return out


def announce(batch: Batch, ctx: Context, sub_ids: list[str]) -> Outcome:
    """Their wake stream was created (again): a pull-wake with pending work and no wake open
    (the one its event announced ended with the stream deleted, or no stream was there to
    announce it on) starts one now, its event on the new stream, rather than at the next
    append to a stream it follows."""
    out = Outcome()
    for sub_id in sorted(sub_ids):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is not None and row["type"] == "pull-wake":
            out.deadlines += _maybe_wake(batch, ctx, row).deadlines
    return out


@dataclass
class Delivery:
    """One webhook POST to make: the exact body bytes are what gets signed. ``attempt`` is its
    number in the wake (the row's ``attempts`` when it was claimed): its outcome counts only
    while it is still the wake's current attempt."""

    sub_id: str
    wake_id: str
    url: str
    body: bytes
    attempt: int


def _end_wake(batch: Batch, ctx: Context, row: dict[str, Any], values: dict[str, Any]) -> Outcome:
    values.update(NO_WAKE)
    store.update_subscription(batch.conn, row["id"], values)
    row.update(values)
    mark_changed(batch, row["id"])
    return _maybe_wake(batch, ctx, row)


def due(batch: Batch, ctx: Context, sub_id: str) -> Outcome:
    """A timer fired: deliver (webhook, retry due), or end an expired lease. ``value`` is a
    Delivery to make, or None."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None or row["wake_id"] is None:
        return Outcome()
    now = batch.now
    lease = row["lease_expires_at"]
    if lease is not None and lease <= now:
        return _end_wake(batch, ctx, row, {})
    attempt = row["next_attempt_at"]
    if row["type"] == "webhook" and attempt is not None and attempt <= now:
        links = links_of(batch, sub_id)
        tails = tails_of(batch, [link.path for link in links])
        infos = stream_infos(links, tails)
        snapshot: dict[str, int] = {link.path: tails.get(link.path, 0) for link in links}
        # Each claim is a new attempt with its own number. One whose guard ran out before its
        # outcome was recorded is claimed again (another process, or this one after a stall)
        # and the snapshot is overwritten: the late outcome applies to this one only where
        # both announced the same (``SAME_SINCE``).
        number = row["attempts"] + 1
        before = json.loads(row["snapshot"]) if row["snapshot"] is not None else None
        since = number
        if before is not None:
            first = before.pop(SAME_SINCE, row["attempts"])
            if before == snapshot:
                since = first
        values = {
            "next_attempt_at": now + ATTEMPT_GUARD_MS,
            "snapshot": json.dumps({**snapshot, SAME_SINCE: since}),
            "attempts": number,
        }
        store.update_subscription(batch.conn, sub_id, values)
        mark_changed(batch, sub_id)
        base = (ctx.public_url or row["base_url"]) + "/v1/stream/__ds/subscriptions/"
        body = {
            "subscription_id": sub_id,
            "wake_id": row["wake_id"],
            "generation": row["generation"],
            "streams": infos,
            "callback_url": base + _quote(sub_id) + "/callback",
            "callback_token": ctx.signer.token(sub_id, row["generation"], row["wake_id"]),
        }
        delivery = Delivery(
            sub_id, row["wake_id"], row["webhook_url"], json.dumps(body).encode(), number
        )
        return Outcome(delivery, [(sub_id, now + ATTEMPT_GUARD_MS)])
    pending = [t for t in (attempt, lease) if t is not None]
    return Outcome(None, [(sub_id, min(pending))] if pending else [])


def _quote(sub_id: str) -> str:
    return quote(sub_id, safe="")


def retry_delay_ms(attempts: int) -> int:
    """Exponential from 1 s to 60 s, with 20% jitter either way (§7.1)."""
    base: int = min(RETRY_BASE_MS << max(0, min(attempts - 1, 16)), RETRY_MAX_MS)
    return max(0, round(base * (1 + RETRY_JITTER * (2 * random.random() - 1))))


def delivered(
    batch: Batch, ctx: Context, sub_id: str, wake_id: str, attempt: int, ok: bool, done: bool
) -> Outcome:
    """The webhook answered attempt ``attempt`` of wake ``wake_id`` (``ok``; ``done`` if it
    said ``{"done": true}``) or failed. ``done`` acks what that attempt announced: the row's
    snapshot is that attempt's only while the attempt is the wake's current one."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None or row["wake_id"] != wake_id:
        return Outcome()  # a callback already finished this wake, or it was deleted
    if row["attempts"] != attempt:
        # A later attempt claimed the wake (this one's outcome came after its guard): the
        # snapshot is the later one's, whose receiver has confirmed nothing yet; acking it
        # lost what only the later POST announced. That attempt's outcome decides, unless
        # this one's done covers it: every attempt since this one announced the same tails
        # of the same streams, and no receiver holds the wake since (a lease: its callback
        # decides). Acking them then is what the later attempt's done would do.
        since = json.loads(row["snapshot"] or "{}").get(SAME_SINCE)
        if ok and done and since is not None and since <= attempt and not row["lease_expires_at"]:
            log.info(
                "subscription %s: webhook attempt %d answered done after its guard ran out;"
                " attempt %d announced the same, and the wake ends",
                sub_id,
                attempt,
                row["attempts"],
            )
            _ack_snapshot(batch, row)
            return _end_wake(batch, ctx, row, {"status": "active"})
        log.warning(
            "subscription %s: webhook attempt %d answered after its guard ran out; attempt"
            " %d is under way and decides",
            sub_id,
            attempt,
            row["attempts"],
        )
        return Outcome()
    now = batch.now
    if not ok and row["lease_expires_at"] is not None:
        # The receiver called back meanwhile (a heartbeat): it has the wake, and its lease
        # decides; retrying the POST sent the same generation again every second.
        return Outcome()
    if not ok:
        at = now + retry_delay_ms(attempt)
        store.update_subscription(batch.conn, sub_id, {"status": "failed", "next_attempt_at": at})
        mark_changed(batch, sub_id)
        return Outcome(None, [(sub_id, at)])
    # ``attempts`` stays: it names the attempt whose snapshot the row holds.
    values: dict[str, Any] = {"status": "active", "next_attempt_at": None}
    if done:
        _ack_snapshot(batch, row)
        return _end_wake(batch, ctx, row, values)
    lease: int = now + row["lease_ttl_ms"]
    values["lease_expires_at"] = lease
    store.update_subscription(batch.conn, sub_id, values)
    mark_changed(batch, sub_id)
    return Outcome(None, [(sub_id, lease)])


def _ack_snapshot(batch: Batch, row: dict[str, Any]) -> None:
    snapshot = json.loads(row["snapshot"] or "{}")
    snapshot.pop(SAME_SINCE, None)
    links = {link.path: link for link in links_of(batch, row["id"])}
    for path, tail in snapshot.items():
        link = links.get(path)
        if link is not None and tail > link.acked:
            store.update_link(batch.conn, row["id"], path, {"acked": tail})


def verify_token(ctx: Context, sub_id: str, token: str) -> TokenClaims:
    """The wake token's claims, once its signature, expiry and subscription hold: checked
    before anything looks at the subscription, so a request without a token the server signed
    for this id learns nothing (whether the id exists, its type) and costs no writer work."""
    try:
        return ctx.signer.verify(token, sub_id)
    except TokenError as exc:
        raise TokenRefused(exc.code) from None


def _fence(row: dict[str, Any], claims: TokenClaims, body: Any) -> dict[str, Any]:
    if claims.subscription != row["id"]:
        raise TokenRefused("TOKEN_INVALID")
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", "body")
    generation = body.get("generation")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise InvalidRequest("generation must be an integer", "generation")
    if (
        claims.generation != row["generation"]
        or claims.wake_id != row["wake_id"]
        or body.get("generation") != row["generation"]
        or body.get("wake_id") != row["wake_id"]
        or row["wake_id"] is None
    ):
        raise Fenced("the wake generation is stale", "generation", generation=row["generation"])
    return body


def _apply_acks(batch: Batch, row: dict[str, Any], body: dict[str, Any]) -> None:
    acks = body.get("acks", [])
    if acks is None:
        return
    if not isinstance(acks, list):
        raise InvalidRequest("acks must be a list", "acks")
    links = {link.path: link for link in links_of(batch, row["id"])}
    tails = tails_of(batch, list(links))
    # The streams this wake's attempt (or claim) announced, as they were then: a stream deleted
    # since is gone from it (``links.purge_stream``), also when one was created again under
    # the name, which an offset read from the old one must not ack (its first messages were
    # skipped unseen).
    announced = json.loads(row["snapshot"] or "{}")
    planned: dict[str, int] = {}
    for i, ack in enumerate(acks):
        if not isinstance(ack, dict):
            raise InvalidRequest("each ack is {stream, offset}", f"acks[{i}]")
        raw_path = ack.get("stream", ack.get("path"))
        if not isinstance(raw_path, str):
            raise InvalidRequest(f"acks[{i}].stream must be a string", f"acks[{i}].stream")
        path = normalize_path(raw_path)
        link = links.get(path)
        if link is None:
            raise InvalidOffset(
                f"acks[{i}].stream is not a stream of this subscription", f"acks[{i}].stream"
            )
        offset = ack.get("offset")
        if not isinstance(offset, str):
            raise InvalidRequest(f"acks[{i}].offset must be a string", f"acks[{i}].offset")
        if offset == BEGINNING:
            raise InvalidOffset(f"acks[{i}].offset must be an offset", f"acks[{i}].offset")
        try:
            position = decode(offset)
        except BadOffset:
            raise InvalidOffset(f"acks[{i}].offset is malformed", f"acks[{i}].offset") from None
        if path not in announced:
            continue
        if position < link.acked:
            raise InvalidOffset(
                f"acks[{i}].offset is behind the acknowledged cursor", f"acks[{i}].offset"
            )
        if position > tails.get(path, 0):
            raise InvalidOffset(
                f"acks[{i}].offset is beyond the stream's tail", f"acks[{i}].offset"
            )
        planned[path] = max(planned.get(path, 0), position)
    for path, position in planned.items():
        store.update_link(batch.conn, row["id"], path, {"acked": position})


def _done_flag(body: dict[str, Any]) -> bool:
    done = body.get("done", False)
    if not isinstance(done, bool):
        raise InvalidRequest("done must be true or false", "done")
    return done


def settle(
    batch: Batch, ctx: Context, sub_id: str, claims: TokenClaims, body: Any, kind: str
) -> Outcome:
    """A webhook callback (``kind`` callback) or a pull-wake ack, with its token's claims
    (``verify_token``): apply acks; without ``done`` extend the lease (a heartbeat), with it
    end the wake. ``value`` is the answer body."""
    row = locked_row(batch, sub_id)
    if (kind == "callback") != (row["type"] == "webhook"):
        raise InvalidRequest(f"this is a {row['type']} subscription", "type")
    body = _fence(row, claims, body)
    done = _done_flag(body)
    _apply_acks(batch, row, body)
    if done:
        out = _end_wake(batch, ctx, row, {"status": "active"})
        return Outcome({"ok": True, "next_wake": row["wake_id"] is not None}, out.deadlines)
    at = batch.now + row["lease_ttl_ms"]
    values: dict[str, Any] = {"lease_expires_at": at}
    if row["type"] == "webhook":
        # It was delivered. ``attempts`` stays: the POST's own answer, still to come, is
        # that attempt's and may still say done (no attempt follows: nothing is due).
        values.update(next_attempt_at=None, status="active")
    store.update_subscription(batch.conn, sub_id, values)
    mark_changed(batch, sub_id)
    return Outcome({"ok": True, "next_wake": False}, [(sub_id, at)])


def claim(batch: Batch, ctx: Context, sub_id: str, worker: str) -> Outcome:
    row = locked_row(batch, sub_id)
    if row["type"] != "pull-wake":
        raise InvalidRequest("only pull-wake subscriptions are claimed", "type")
    if row["holder"] is not None:
        raise AlreadyClaimed(
            f"worker {row['holder']} holds the lease",
            "worker",
            current_holder=row["holder"],
            generation=row["generation"],
        )
    links = links_of(batch, sub_id)
    tails = tails_of(batch, [link.path for link in links])
    pending = pending_links(links, tails)
    if not pending:
        raise NoPendingWork("the subscription has no pending work")
    if row["wake_id"] is None:
        _start_wake(batch, ctx, row, pending, claiming=True)
    at = batch.now + row["lease_ttl_ms"]
    values = {
        "holder": worker,
        "lease_expires_at": at,
        "snapshot": json.dumps({link.path: tails.get(link.path, 0) for link in links}),
    }
    store.update_subscription(batch.conn, sub_id, values)
    mark_changed(batch, sub_id)
    answer = {
        "wake_id": row["wake_id"],
        "generation": row["generation"],
        "token": ctx.signer.token(sub_id, row["generation"], row["wake_id"]),
        "streams": stream_infos(links, tails),
        "lease_ttl_ms": row["lease_ttl_ms"],
    }
    return Outcome(answer, [(sub_id, at)])


def end_idle(batch: Batch, ctx: Context, sub_id: str) -> Outcome:
    """After a claim found no pending work: a pull-wake wake nobody holds, whose work went
    away (its stream removed or deleted), ends, so the next append announces a new one (the
    claim's refusal rolled its own transaction back)."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None or row["type"] != "pull-wake" or row["wake_id"] is None or row["holder"]:
        return Outcome()
    links = links_of(batch, sub_id)
    if pending_links(links, tails_of(batch, [link.path for link in links])):
        return Outcome()
    return _end_wake(batch, ctx, row, {})


def release(batch: Batch, ctx: Context, sub_id: str, claims: TokenClaims, body: Any) -> Outcome:
    """A pull-wake worker gives its claim back, with its token's claims (``verify_token``)."""
    row = locked_row(batch, sub_id)
    if row["type"] != "pull-wake":
        raise InvalidRequest("only pull-wake subscriptions are released", "type")
    _fence(row, claims, body)
    return _end_wake(batch, ctx, row, {})


def load_signer(batch: Batch) -> Signer:
    """The signing keys, made on first start (and kept: they are in the database)."""
    if not store.signing_keys(batch.conn):
        pem = new_private_pem()
        store.add_signing_key(batch.conn, kid_of(pem), pem, batch.now)
    return Signer([(r["kid"], r["private_pem"]) for r in store.signing_keys(batch.conn)])
