"""The subscription engine: wakes subscriptions on appends and runs their timers.

Nothing here polls. The notifier hands the engine the names of the streams each commit
changed (this process's writer, or PostgreSQL LISTEN/NOTIFY for other processes); an
in-memory index of patterns and explicit links says which subscriptions care, and one write
decides their wakes. What must happen later (a webhook retry, a lease running out) is one
``loop.call_at`` timer per subscription at its persisted deadline, so a restart re-arms the
same schedule from the database.

The engine sends nothing itself: the HTTP layer gives it ``send``, which POSTs a signed body
and says whether the webhook took it and whether it answered ``{"done": true}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from stations.domain.subscriptions import wakes
from stations.domain.subscriptions.keys import Signer
from stations.domain.subscriptions.links import INDEX_KEY, WAKE_KEY
from stations.domain.subscriptions.outbound import Outbound, Slot
from stations.domain.subscriptions.spec import glob_match, literal_segments
from stations.domain.subscriptions.urls import endpoint_of
from stations.domain.subscriptions.wakes import Context, Delivery, Outcome
from stations.errors import Unavailable
from stations.repeats import Repeats, first_line
from stations.store import subscriptions as store
from stations.store.clock import now_ms

log = logging.getLogger("stations.subscriptions")

RETRY_AFTER_FAILURE_S = 1.0
# (url, body, headers) -> (accepted, done)
Send = Callable[[str, bytes, dict[str, str]], Awaitable[tuple[bool, bool]]]


class Index:
    """Which subscriptions a stream name concerns: explicit links, and patterns."""

    def __init__(self) -> None:
        self._defs: dict[str, dict[str, Any]] = {}
        self._explicit: dict[str, set[str]] = {}
        # Patterns by their first segment ("" when it holds a wildcard): a change is matched
        # against the patterns that can match it, not all of them (3,000 tenants' patterns,
        # one each, cut every append of the server tenfold).
        self._patterns: dict[str, dict[str, set[str]]] = {}
        self._wake_streams: dict[str, set[str]] = {}  # pull-wakes by their wake stream

    def __len__(self) -> int:
        return len(self._defs)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._defs

    def put(self, sub_id: str, row: dict[str, Any] | None) -> None:
        old = self._defs.pop(sub_id, None)
        if old is not None:
            for path in old["explicit"]:
                self._discard(self._explicit, path, sub_id)
            if old["pattern"]:
                bucket = self._patterns.get(_first(old["pattern"]), {})
                self._discard(bucket, old["pattern"], sub_id)
                if not bucket:
                    self._patterns.pop(_first(old["pattern"]), None)
            if old["wake_stream"]:
                self._discard(self._wake_streams, old["wake_stream"], sub_id)
        if row is None:
            return
        self._defs[sub_id] = row
        for path in row["explicit"]:
            self._explicit.setdefault(path, set()).add(sub_id)
        if row["pattern"]:
            bucket = self._patterns.setdefault(_first(row["pattern"]), {})
            bucket.setdefault(row["pattern"], set()).add(sub_id)
        if row["wake_stream"]:
            self._wake_streams.setdefault(row["wake_stream"], set()).add(sub_id)

    @staticmethod
    def _discard(table: dict[str, set[str]], key: str, sub_id: str) -> None:
        ids = table.get(key)
        if ids is not None:
            ids.discard(sub_id)
            if not ids:
                del table[key]

    def sends(self, sub_id: str) -> bool:
        """Whether its timers may send a webhook POST: not a pull-wake's (one unknown here,
        made by another process a moment ago, may)."""
        row = self._defs.get(sub_id)
        return row is None or row["wake_stream"] is None

    def announced_on(self, path: str) -> set[str]:
        """The pull-wakes whose wake stream is ``path``."""
        return set(self._wake_streams.get(path, ()))

    def is_wake_stream(self, path: str) -> bool:
        return path in self._wake_streams

    def endpoint(self, sub_id: str) -> str:
        """The endpoint its webhook POSTs go to ("" when not known here yet)."""
        row = self._defs.get(sub_id)
        return endpoint_of(row.get("webhook_url")) if row is not None else ""

    def match(self, path: str) -> set[str]:
        out = set(self._explicit.get(path, ()))
        for first in {path.split("/", 1)[0], ""}:
            for pattern, ids in self._patterns.get(first, {}).items():
                if glob_match(pattern, path):
                    out |= ids
        # A pull-wake subscription's own wake events must not wake it again.
        return {i for i in out if self._defs[i]["wake_stream"] != path}


def _first(pattern: str) -> str:
    """The bucket of a pattern: its first segment, or "" when that holds a wildcard."""
    literal = literal_segments(pattern)
    return literal[0] if literal else ""


TIMER_RETRY_MS = round(RETRY_AFTER_FAILURE_S * 1000)  # after a timer's database work failed
TIMER_RETRY_MAX_MS = 60_000


class SubscriptionEngine:
    def __init__(
        self, service: Any, send: Send, *, concurrency: int = 32, public_url: str | None = None
    ) -> None:
        self._service = service
        self._public_url = public_url
        self._send = send
        # Webhook POSTs in flight at most, shared fairly between endpoints (``outbound``).
        self._outbound = Outbound(concurrency)
        self._queued: set[str] = set()  # subscriptions waiting for a slot
        self.index = Index()
        # (when, handle): uvloop gives a plain Handle, without ``when()``, for a moment due.
        self._timers: dict[str, tuple[float, asyncio.Handle]] = {}
        self._timer_failures: dict[str, int] = {}  # timers whose work failed, how often
        self._failing = Repeats(log, "subscription timers")
        # Per subscription whose webhook fails: a line when it starts, then one a minute.
        self._undelivered: dict[str, Repeats] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._touched: dict[str, set[str]] = {}
        self._index_dirty: set[str] = set()
        self._wake_dirty: set[str] = set()
        # Wake streams that changed, and what each was when last seen ((id, created_at), None
        # when missing): one created again announces the wakes its deletion ended.
        self._wake_streams_fired: set[str] = set()
        self._incarnations: dict[str, tuple[int, int] | None] = {}
        self._resync = False  # other processes' changes may have gone unannounced
        self._drainer: asyncio.Task[None] | None = None
        self._stopped = False
        self.ctx: Context | None = None

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        service = self._service
        signer = await service.write(wakes.load_signer)
        self.ctx = Context(signer, service.ids, self._public_url)
        # Only a database shared by several processes (PostgreSQL) has other processes whose
        # changes arrive as notifications.
        self._shared = not service.db.embedded
        for row in await service.read_db(store.definitions):
            self.index.put(row["id"], row)
        service.notifier.listeners.append(self._on_fire)
        service.notifier.resync.append(self._on_resync)
        ids = list(self.index._defs)
        if ids:
            self._arm_all(await service.write(wakes.sweep, self.ctx, ids))

    async def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(ValueError):
            self._service.notifier.listeners.remove(self._on_fire)
        with contextlib.suppress(ValueError):
            self._service.notifier.resync.remove(self._on_resync)
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        tasks = list(self._tasks) + ([self._drainer] if self._drainer else [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def signer(self) -> Signer:
        assert self.ctx is not None
        return self.ctx.signer

    # -- ops through the writer -----------------------------------------------------------

    async def run(self, fn: Callable[..., Outcome], *args: Any) -> Any:
        """Run a subscription op in the writer's transaction; arm what it scheduled."""
        out: Outcome = await self._service.write(fn, self.ctx, *args)
        self._arm_all(out)
        return out.value

    async def refresh(self, sub_ids: set[str]) -> None:
        """Bring the index up to date for ``sub_ids`` (after this or another process changed
        them), then sweep them: an append committed between the change and this refresh was
        announced while the index did not know the subscription (or its new streams) yet, and
        its wake was lost until the next append."""
        rows = {r["id"]: r for r in await self._service.read_db(store.definitions, sub_ids)}
        for sub_id in sub_ids:
            self.index.put(sub_id, rows.get(sub_id))
            if sub_id not in rows:
                self._disarm(sub_id)
        self._forget_wake_streams()
        if rows:
            self._arm_all(await self._service.write(wakes.sweep, self.ctx, sorted(rows)))

    async def changed(self, sub_id: str) -> None:
        """``refresh`` after a change a request committed. If it fails the change stands, so
        the drainer takes it up again: else the index went on without it (SQLite has no
        notification to bring it back), and appends to the streams it named woke nothing
        until a restart."""
        try:
            await self.refresh({sub_id})
        except Exception:
            self._index_dirty.add(sub_id)
            if self._drainer is None and not self._stopped:
                self._drainer = asyncio.get_running_loop().create_task(self._drain())
            raise

    async def resync(self) -> None:
        """Take up every subscription afresh, as at start: other processes' changes (and
        appends) were not announced while this process's LISTEN connection was down."""
        rows = {r["id"]: r for r in await self._service.read_db(store.definitions)}
        for sub_id in set(self.index._defs) | set(rows):
            self.index.put(sub_id, rows.get(sub_id))
            if sub_id not in rows:
                self._disarm(sub_id)
        self._forget_wake_streams()
        if rows:
            self._arm_all(await self._service.write(wakes.sweep, self.ctx, list(rows)))

    # -- wake-ups -------------------------------------------------------------------------

    def _on_resync(self) -> None:
        if self._stopped or self.ctx is None or not self._shared:
            return
        self._resync = True
        if self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    def _on_fire(self, keys: set[str]) -> None:
        if self._stopped or self.ctx is None:
            return
        for key in keys:
            if key.startswith("__ds/"):
                if not self._shared:
                    continue  # this process made the change and has acted on it already
                if key.startswith(WAKE_KEY):
                    self._wake_dirty.add(key[len(WAKE_KEY) :])
                elif key.startswith(INDEX_KEY):
                    self._index_dirty.add(key[len(INDEX_KEY) :])
            elif len(self.index):
                ids = self.index.match(key)
                if ids:
                    self._touched.setdefault(key, set()).update(ids)
                if self.index.is_wake_stream(key):
                    self._wake_streams_fired.add(key)
        if (
            self._touched or self._index_dirty or self._wake_dirty or self._wake_streams_fired
        ) and self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while (
                self._resync
                or self._touched
                or self._index_dirty
                or self._wake_dirty
                or self._wake_streams_fired
            ):
                try:
                    if self._resync:
                        self._resync = False
                        try:
                            await self.resync()
                        except Exception:
                            self._resync = True  # not done: again after a moment
                            await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                            raise
                    if self._index_dirty:
                        ids, self._index_dirty = self._index_dirty, set()
                        try:
                            await self.refresh(ids)
                        except Exception:
                            self._index_dirty |= ids  # as the appends below: not forgotten
                            await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                            raise
                    if self._touched:
                        touched, self._touched = self._touched, {}
                        try:
                            await self.run(
                                wakes.on_append, {p: sorted(ids) for p, ids in touched.items()}
                            )
                        except Exception:
                            # Not decided: keep the streams for the next round, so no append
                            # is forgotten; wait a moment before asking the database again.
                            for path, ids in touched.items():
                                self._touched.setdefault(path, set()).update(ids)
                            await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                            raise
                    if self._wake_dirty:
                        ids, self._wake_dirty = self._wake_dirty, set()
                        try:
                            deadlines = await self._service.read_db(store.deadlines, ids)
                        except Exception:
                            self._wake_dirty |= ids
                            await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                            raise
                        for sub_id, at in deadlines:
                            self._arm(sub_id, at)
                    if self._wake_streams_fired:
                        names, self._wake_streams_fired = self._wake_streams_fired, set()
                        try:
                            await self._wake_streams_changed(names)
                        except Exception:
                            self._wake_streams_fired |= names
                            await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                            raise
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # The next append or timer tries again; nothing was acknowledged.
                    log.exception("subscription wake-up failed")
        finally:
            self._drainer = None

    def _delivery_failed(self, delivery: Delivery, exc: BaseException) -> None:
        """Logged without the webhook's URL beyond its ``scheme://host:port``: its path and
        query may be its secret (an incoming-webhook address), which the line gave in full,
        with the request's signature header, on every retry (each second, then each minute)."""
        repeats = self._undelivered.get(delivery.sub_id)
        if repeats is None:
            what = f"subscription {delivery.sub_id}: webhook delivery to {_origin(delivery.url)}"
            repeats = self._undelivered[delivery.sub_id] = Repeats(log, what, level=logging.WARNING)
        said = _URLS.sub(lambda m: _origin(m.group(0)), first_line(exc))
        repeats.failed(exc, traceback=False, said=said)

    def _forget_wake_streams(self) -> None:
        """What was seen of wake streams no subscription announces on any more."""
        for name in [n for n in self._incarnations if not self.index.is_wake_stream(n)]:
            del self._incarnations[name]

    async def _wake_streams_changed(self, names: set[str]) -> None:
        """Each wake event fires its wake stream too: one small read tells an append from a
        stream created (again), whose pull-wakes' pending wakes are announced then (the wake
        its deletion ended, or one that found no stream to announce on), not at the next
        append. A stream this process has not seen yet counts as created: a sweep too many,
        once per wake stream, rather than a wake missed."""
        seen = await self._service.read_db(store.incarnations, sorted(names))
        created: set[str] = set()
        for name in names:
            now = seen.get(name)
            before = self._incarnations.get(name, False)
            if now is not None and now != before:
                created |= self.index.announced_on(name)
            if self.index.is_wake_stream(name):
                self._incarnations[name] = now
            else:
                self._incarnations.pop(name, None)
        if created:
            await self.run(wakes.announce, sorted(created))

    # -- timers ---------------------------------------------------------------------------

    def _arm_all(self, out: Outcome) -> None:
        for sub_id, at in out.deadlines:
            self._arm(sub_id, at)

    def _arm(self, sub_id: str, at_ms: int) -> None:
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0, at_ms - now_ms()) / 1000
        armed = self._timers.get(sub_id)
        if armed is not None:
            if armed[0] <= when:
                return  # an earlier timer will look and re-arm for the later moment
            armed[1].cancel()
        self._timers[sub_id] = (when, loop.call_at(when, self._fire_timer, sub_id))

    def _disarm(self, sub_id: str) -> None:
        self._timer_failures.pop(sub_id, None)
        self._undelivered.pop(sub_id, None)
        armed = self._timers.pop(sub_id, None)
        if armed is not None:
            armed[1].cancel()

    def _fire_timer(self, sub_id: str) -> None:
        self._timers.pop(sub_id, None)
        self._spawn(self._due(sub_id))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _due(self, sub_id: str) -> None:
        try:
            if not self.index.sends(sub_id):
                # A pull-wake's timers (its lease's end) send nothing: they take no slot, or
                # 32 hung webhook endpoints held every pull-wake's lease 10 s past its end.
                delivery = await self.run(wakes.due, sub_id)
                if delivery is not None:  # made again as a webhook by another process
                    slot = await self._outbound.acquire(endpoint_of(delivery.url))
                    try:
                        await self._deliver(delivery, slot)
                    finally:
                        self._outbound.release(slot)
            elif sub_id not in self._queued:
                # (One already waiting reads what is due when its turn comes.) The slot is
                # taken before the attempt is claimed in the database: an attempt that waited
                # for a slot longer than its claim would be claimed again.
                self._queued.add(sub_id)
                try:
                    slot = await self._outbound.acquire(self.index.endpoint(sub_id))
                finally:
                    self._queued.discard(sub_id)
                try:
                    delivery = await self.run(wakes.due, sub_id)
                    if delivery is not None:
                        await self._deliver(delivery, slot)
                finally:
                    self._outbound.release(slot)
            self._timer_failures.pop(sub_id, None)
            self._failing.succeeded()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Nothing else would arm it again before the next append or a restart: the
            # database still holds what is due, and the next try reads it afresh, 1 s later,
            # then 2, 4 ... up to a minute while it keeps failing (an outage: every
            # subscription with a timer fails alike, logged once).
            failures = self._timer_failures.get(sub_id, 0)
            self._timer_failures[sub_id] = failures + 1
            self._failing.failed(exc, traceback=not isinstance(exc, Unavailable))
            delay = min(TIMER_RETRY_MS << min(failures, 6), TIMER_RETRY_MAX_MS)
            self._arm(sub_id, now_ms() + delay)

    async def _deliver(self, delivery: Delivery, slot: Slot | None = None) -> None:
        """POST it (in ``slot``, which it gives back when the POST ends), then record the
        outcome of its own attempt."""
        headers = {
            "Content-Type": "application/json",
            "Webhook-Signature": self.signer.signature_header(delivery.body),
        }
        call = self._send(delivery.url, delivery.body, headers)
        try:
            answer = await (call if slot is None else self._outbound.post(slot, call))
        except Exception as exc:
            self._delivery_failed(delivery, exc)
            answer = False, False
        else:
            if answer is not None and answer[0]:
                told = self._undelivered.pop(delivery.sub_id, None)
                if told is not None:
                    told.succeeded()
        if answer is None:
            log.warning(
                "subscription %s: webhook POST cut short: its endpoint is slow and others wait",
                delivery.sub_id,
            )
            answer = False, False
        ok, done = answer
        await self.run(
            wakes.delivered, delivery.sub_id, delivery.wake_id, delivery.attempt, ok, done
        )


_URLS = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)]+")


def _origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, or "the endpoint" when it has no readable host."""
    try:
        readable = bool(urlsplit(url).hostname)
        urlsplit(url).port  # noqa: B018 - raises for a port out of range
    except ValueError:
        readable = False
    return endpoint_of(url) if readable else "the endpoint"
