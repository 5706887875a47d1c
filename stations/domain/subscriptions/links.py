"""Which streams a subscription follows (explicit links and pattern matches), the cursor it
has acknowledged on each, and the subscription's view."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stations.domain.instants import format_ms
from stations.domain.offsets import encode
from stations.domain.subscriptions.errors import (
    AlreadyExists,
    InvalidRequest,
    SubscriptionNotFound,
)
from stations.domain.subscriptions.keys import Signer
from stations.domain.subscriptions.spec import Spec, glob_match, matching_paths
from stations.store import subscriptions as store
from stations.store.writer import Batch

# Streams one subscription may name, over all its requests: each change of it re-reads all its
# links and each wake carries their tails. (Streams a pattern matches are not counted.)
MAX_SUBSCRIPTION_STREAMS = 10_000
INDEX_KEY = "__ds/index/"  # notifier keys: a subscription's definition changed
WAKE_KEY = "__ds/wake/"  # notifier keys: a subscription's wake state changed


@dataclass
class Link:
    path: str
    explicit: bool
    glob: bool
    acked: int


def links_of(batch: Batch, sub_id: str, paths: list[str] | None = None) -> list[Link]:
    """The subscription's links; with ``paths``, only its links to those."""
    rows = (
        store.links(batch.conn, sub_id)
        if paths is None
        else store.links_at(batch.conn, sub_id, paths)
    )
    return [Link(r["path"], r["explicit"], r["glob"], r["acked"]) for r in rows]


def tails_of(batch: Batch, paths: list[str]) -> dict[str, int]:
    """Tails as this transaction sees them: appends earlier in the same batch are not flushed
    yet, so the batch's own stream states come first."""
    out: dict[str, int] = {}
    missing = []
    for path in paths:
        state = batch.streams.get(path)
        if state is not None:
            if not state.deleted:
                out[path] = state.tail
        elif path not in batch.streams:
            missing.append(path)
    out.update(store.tails(batch.conn, missing))
    return out


def stream_infos(links: list[Link], tails: dict[str, int]) -> list[dict[str, Any]]:
    infos = []
    for link in links:
        tail = tails.get(link.path, 0)
        infos.append(
            {
                "path": link.path,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": encode(link.acked),
                "tail_offset": encode(tail),
                "has_pending": tail > link.acked,
            }
        )
    return infos


def pending_links(links: list[Link], tails: dict[str, int]) -> list[Link]:
    return [link for link in links if tails.get(link.path, 0) > link.acked]


def locked_row(batch: Batch, sub_id: str) -> dict[str, Any]:
    row = store.get(batch.conn, sub_id, lock=True)
    if row is None:
        raise SubscriptionNotFound(f"subscription {sub_id} not found", "id")
    return row


def mark_changed(batch: Batch, sub_id: str, *, index: bool = False) -> None:
    batch.changed.add(WAKE_KEY + sub_id)
    if index:
        batch.changed.add(INDEX_KEY + sub_id)


def link_stream(
    batch: Batch, sub_id: str, path: str, *, explicit: bool, acked: int, existing: dict[str, Link]
) -> None:
    link = existing.get(path)
    if link is None:
        store.insert_link(batch.conn, sub_id, path, explicit=explicit, acked=acked)
        existing[path] = Link(path, explicit, not explicit, acked)
    elif explicit and not link.explicit:
        store.update_link(batch.conn, sub_id, path, {"explicit": True})
        link.explicit = True
    elif not explicit and not link.glob:
        store.update_link(batch.conn, sub_id, path, {"glob": True})
        link.glob = True


def create_or_confirm(
    batch: Batch, sub_id: str, spec: Spec, base_url: str
) -> tuple[dict[str, Any], bool]:
    """(view, created). Existing streams are linked at their tail: no historical replay."""
    row = store.get(batch.conn, sub_id, lock=True)
    if row is not None:
        return _confirmed(row, sub_id, spec), False
    row = {
        "id": sub_id,
        "type": spec.type,
        "pattern": spec.pattern,
        "webhook_url": spec.webhook_url,
        "wake_stream": spec.wake_stream,
        "lease_ttl_ms": spec.lease_ttl_ms,
        "description": spec.description,
        "config_hash": spec.config_hash,
        "base_url": base_url,
        "created_at": batch.now,
        "status": "active",
        "generation": 0,
        "wake_id": None,
        "snapshot": None,
        "holder": None,
        "lease_expires_at": None,
        "attempts": 0,
        "next_attempt_at": None,
    }
    while not store.insert_subscription(batch.conn, row):  # another process made it meanwhile
        made = store.get(batch.conn, sub_id, lock=True)
        if made is not None:  # (else it was deleted again since: insert after all)
            return _confirmed(made, sub_id, spec), False
    existing: dict[str, Link] = {}
    tails = tails_of(batch, list(spec.streams))
    for path in spec.streams:
        link_stream(batch, sub_id, path, explicit=True, acked=tails.get(path, 0), existing=existing)
    if spec.pattern is not None:
        names = [
            n
            for n in matching_paths(spec.pattern, sorted(store.stream_names(batch.conn)))
            if n != spec.wake_stream
        ]
        tails = tails_of(batch, names)
        for path in names:
            link_stream(
                batch, sub_id, path, explicit=False, acked=tails.get(path, 0), existing=existing
            )
    mark_changed(batch, sub_id, index=True)
    return row, True


def _confirmed(row: dict[str, Any], sub_id: str, spec: Spec) -> dict[str, Any]:
    if row["config_hash"] != spec.config_hash:
        raise AlreadyExists(f"subscription {sub_id} exists with a different configuration", "id")
    return row


def delete(batch: Batch, sub_id: str) -> None:
    """Deleting ends its wake: callbacks, acks and releases then find nothing (404)."""
    if store.delete_subscription(batch.conn, sub_id):
        mark_changed(batch, sub_id, index=True)


def add_streams(batch: Batch, sub_id: str, paths: list[str]) -> None:
    row = locked_row(batch, sub_id)
    if row["wake_stream"] in paths:
        raise InvalidRequest(
            "the wake stream cannot be one of the subscription's streams", "streams"
        )
    existing = {link.path: link for link in links_of(batch, sub_id)}
    named = sum(link.explicit for link in existing.values())
    # The subscription's row is locked (``_get``): no other request adds meanwhile.
    adding = {p for p in paths if (link := existing.get(p)) is None or not link.explicit}
    if named + len(adding) > MAX_SUBSCRIPTION_STREAMS:
        raise InvalidRequest(
            f"a subscription may name at most {MAX_SUBSCRIPTION_STREAMS} streams "
            f"(it names {named}; this request adds {len(adding)})",
            "streams",
        )
    tails = tails_of(batch, paths)
    for path in paths:
        link_stream(batch, sub_id, path, explicit=True, acked=tails.get(path, 0), existing=existing)
    mark_changed(batch, sub_id, index=True)


def remove_stream(batch: Batch, sub_id: str, path: str) -> None:
    """Removes the explicit link only; a stream the pattern still matches stays linked."""
    row = locked_row(batch, sub_id)
    link = next((x for x in links_of(batch, sub_id) if x.path == path), None)
    if link is None or not link.explicit:
        return
    if link.glob or (row["pattern"] and glob_match(row["pattern"], path)):
        store.update_link(batch.conn, sub_id, path, {"explicit": False, "glob": True})
    else:
        store.delete_link(batch.conn, sub_id, path)
    mark_changed(batch, sub_id, index=True)


def view(
    row: dict[str, Any], links: list[Link], signer: Signer | None, public_url: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "subscription_id": row["id"],
        "type": row["type"],
        "pattern": row["pattern"],
        "streams": [
            {
                "path": link.path,
                "link_type": "explicit" if link.explicit else "glob",
                "acked_offset": encode(link.acked),
            }
            for link in links
        ],
        "webhook": None,
        "wake_stream": row["wake_stream"],
        "lease_ttl_ms": row["lease_ttl_ms"],
        "created_at": format_ms(row["created_at"]),
        "status": row["status"],
        "description": row["description"],
        "generation": row["generation"],
    }
    if row["type"] == "webhook":
        out["webhook"] = {"url": row["webhook_url"]}
        if signer is not None:
            out["webhook"]["signing"] = {
                "alg": "ed25519",
                "kid": signer.kid,
                "jwks_url": (public_url or row["base_url"]) + "/v1/stream/__ds/jwks.json",
            }
    return out


def read_view(conn: Any, sub_id: str) -> tuple[dict[str, Any], list[Link]]:
    """For a read transaction (GET)."""
    row = store.get(conn, sub_id)
    if row is None:
        raise SubscriptionNotFound(f"subscription {sub_id} not found", "id")
    links = [
        Link(r["path"], r["explicit"], r["glob"], r["acked"]) for r in store.links(conn, sub_id)
    ]
    return row, links


# A subscription's row with no wake open (ended, or never started).
NO_WAKE: dict[str, Any] = {
    "wake_id": None,
    "holder": None,
    "lease_expires_at": None,
    "snapshot": None,
    "next_attempt_at": None,
    "attempts": 0,
}


def purge_stream(batch: Batch, state: Any) -> None:
    """lifecycle purge hook: a deleted stream's cursors go with it (a link the subscription
    names explicitly stays, at the stream's start: a stream created again under the name is
    followed from its first message, as one a pattern links again), and so does its tail in
    the snapshots of wakes in flight: a later ``done`` acked a stream created again under the
    name up to the old one's tail, and its first messages were never delivered."""
    store.forget_stream(batch.conn, state.name)
    for sub_id, raw in store.snapshots(batch.conn):
        snapshot = json.loads(raw)
        if snapshot.pop(state.name, None) is not None:
            store.update_subscription(batch.conn, sub_id, {"snapshot": json.dumps(snapshot)})
    _end_unheard_wakes(batch, state.name)


def _end_unheard_wakes(batch: Batch, wake_stream: str) -> None:
    """A pull-wake's open wake that nobody claimed was announced by one event on its wake
    stream: deleted (or expired) with the stream, nobody would ever hear of the wake, and no
    later append announced anything while it stayed open. It ends (no token was handed out
    for it: only a claim gives one), so the next append, or a claim, starts a new one."""
    for sub_id in store.unclaimed_wakes_on(batch.conn, wake_stream):
        row = store.get(batch.conn, sub_id, lock=True)
        if row is None or row["wake_id"] is None or row["holder"] is not None:
            continue
        store.update_subscription(batch.conn, sub_id, dict(NO_WAKE))
        mark_changed(batch, sub_id)
