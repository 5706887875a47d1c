"""Stations as resources: create through the management API, list, view with live stats, patch.

The same row is the Durable Streams stream, so a station made here is readable at
``/v1/stream/{name}`` and a stream made by PUT is listed here with default settings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from stations.domain import dls, idwindow
from stations.domain import station as config_rules
from stations.domain.idwindow import IdWindow
from stations.domain.instants import format_ms as iso
from stations.domain.lifecycle import CreateRequest, CreateResult, create, created_as_known
from stations.domain.log import live_stream
from stations.domain.offsets import encode
from stations.domain.pages import Page, collect
from stations.domain.streams import upkeep_columns
from stations.errors import NotFound
from stations.records import StreamState
from stations.store import streams as rows
from stations.store import upkeep
from stations.store.db import Tx
from stations.store.writer import Batch

# Modules with per-station state (consumer groups, the DLS) add their counts to the stats.
StatsProvider = Callable[[Any, list[int]], dict[int, dict[str, int]]]
stats_providers: list[StatsProvider] = []

# Told (on the event loop, after the commit) of every idempotency window a station was given,
# so the id sweeper can shorten its period at once (see ``scheduler``).
WindowListener = Callable[[int], None]
window_listeners: list[WindowListener] = []


def _announce_window(batch: Batch, window_ms: int) -> None:
    for listener in list(window_listeners):
        batch.after_commit.append(functools.partial(listener, window_ms))


def create_station(batch: Batch, window: IdWindow, raw: Any) -> CreateResult:
    config = config_rules.parse_config(raw)
    req = CreateRequest(
        name=config["name"],
        content_type=config["contentType"],
        config=config,
        compare_config=True,
    )
    dls.check_forward_target(batch, req.content_type, config)
    result = create(batch, window, req)
    if result.created:
        _announce_window(batch, result.state.window_ms)
    return result


def patch_station(
    batch: Batch, window: IdWindow, name: str, raw: Any, created_at: int | None = None
) -> StreamState:
    """PATCH: the settings ``raw`` names change; with ``created_at`` (ms) only on the stream
    created then (``lifecycle.created_as_known``)."""
    state = live_stream(batch.stream(name), name, batch.now)
    created_as_known(state, name, created_at, "nothing was changed")
    before = state.window_ms
    state.config = config_rules.apply_patch(state.config, raw)
    dls.check_forward_target(batch, state.content_type, state.config)
    if state.window_ms < before:
        window.forget_older(batch, state)
    elif state.window_ms > before:
        window.grown(batch, state, before)
    batch.touch(state)
    columns = upkeep_columns(state.config, batch.now)
    upkeep.set_rules(batch.conn, state.id, columns)
    # The cached row too: an append later in this transaction plans its look from it, and
    # would put off the look the new rules ask for now.
    for column, value in columns.items():
        setattr(state, column, value)
    _announce_window(batch, state.window_ms)
    return state


def views(
    tx: Tx, now: int, name: str | None = None, page: Page | None = None
) -> list[dict[str, Any]]:
    """StationViews: the config plus live stats, for one station, all, or a ``page`` of them
    in name order (one more than its limit: the caller tells whether a next page exists)."""
    if name is not None:
        states = [live_stream(rows.load(tx, name), name, now)]
    elif page is not None:
        states = _page(tx, now, page)
    else:
        states = [s for s in rows.every(tx) if not s.deleted and not s.expired(now)]
    if not states:
        return []
    ids = [s.id for s in states]
    # Each figure for all stations at once: a fixed number of statements, not some per station.
    # The whole list counts every station's ids at once; one station or a page only theirs.
    in_window = idwindow.counts(tx, now, None if name is None and page is None else ids)
    extra: dict[int, dict[str, int]] = {}
    for provider in stats_providers:
        for sid, values in provider(tx, ids).items():
            extra.setdefault(sid, {}).update(values)
    return [_view(s, in_window.get(s.id, 0), extra.get(s.id, {})) for s in states]


def _page(tx: Tx, now: int, page: Page) -> list[StreamState]:
    """The page's stations, one more than its limit if there are: read from the database a
    chunk at a time, as expired ones and those a token does not cover are left out."""
    shown = page.shown

    def keep(state: StreamState) -> bool:
        return not state.expired(now) and (shown is None or shown(state.name))

    def read(after: str | None, size: int) -> list[StreamState]:
        return rows.page(tx, after, page.prefix, page.contains, size)

    return collect(page, read, lambda state: state.name, keep)


def _view(state: StreamState, ids_in_window: int, extra: dict[str, int]) -> dict[str, Any]:
    view = {key: state.config.get(key) for key in ("name", *config_rules.DEFAULTS)}
    view["name"] = state.name
    view["contentType"] = state.content_type
    view["stats"] = {
        "messages": state.msg_count,
        "bytes": state.byte_count,
        "tailOffset": encode(state.tail),
        "idsInWindow": ids_in_window,
        "groups": extra.get("groups", 0),
        "deadLettered": extra.get("deadLettered", 0),
    }
    view["createdAt"] = iso(state.created_at)
    view["closed"] = state.closed
    return view


def view_of(tx: Tx, now: int, name: str) -> dict[str, Any]:
    found = views(tx, now, name)
    if not found:
        raise NotFound(f"station {name} not found")
    return found[0]
