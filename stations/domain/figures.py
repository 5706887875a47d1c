"""Operational figures for monitoring, with no monitoring library in sight: counters the
service keeps as requests pass (duplicates answered, redeliveries, write batches) and the
gauges read at scrape time from the stations themselves (``snapshot``).

Counters are kept per station name, but only ever reported (and kept) for stations that exist
at scrape time, so neither many deleted stations nor random names can grow them without bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stations.domain import catalog, groups
from stations.store import groups as group_store
from stations.store import streams as stream_store

BatchObserver = Callable[[int, float], None]  # (ops in the transaction, seconds to commit)


@dataclass
class GroupFigures:
    name: str
    pending: int
    in_flight: int
    lag: int
    dead_lettered: int


@dataclass
class StationFigures:
    name: str
    messages: int
    bytes: int
    ids_in_window: int
    dead_lettered: int
    groups: list[GroupFigures] = field(default_factory=list)


@dataclass
class Snapshot:
    stations: list[StationFigures]
    live: set[str]  # every live station's name, also those beyond the series limit
    groups: int = 0  # every live station's groups
    groups_reported: int = 0  # those in ``stations[...].groups``


# Per-group series are bounded too: a station may have any number of groups.
MAX_GROUPS = 1000


def snapshot(conn: Any, now: int, limit: int, group_limit: int = MAX_GROUPS) -> Snapshot:
    """Every live station's stats (the same figures the API shows), and, for the first
    ``limit`` stations by name, their first ``group_limit`` groups by station and group name.
    A fixed number of statements however many stations and groups there are."""
    views = catalog.views(conn, now)
    shown = views[:limit]
    out = {
        view["name"]: StationFigures(
            view["name"],
            view["stats"]["messages"],
            view["stats"]["bytes"],
            view["stats"]["idsInWindow"],
            view["stats"]["deadLettered"],
        )
        for view in shown
    }
    reported = 0
    if group_limit > 0 and any(view["stats"]["groups"] for view in shown):
        # A station named in the range that expired but is not deleted yet (the scheduler
        # deletes it soon) is not shown: its groups are skipped, and may leave a few places
        # of ``group_limit`` unused meanwhile.
        rows = [
            row
            for row in group_store.first_groups(conn, shown[-1]["name"], group_limit)
            if row.station in out
        ]
        queues = group_store.queue_figures(conn, [row.id for row in rows])
        heads: dict[str, int] = {}  # a fork's, with its sources' retention (as the API's)
        for row in rows:
            if row.id not in queues:
                continue  # deleted since it was listed (one snapshot each: but never a 500)
            waiting, in_flight, dead = queues[row.id]
            head = row.head
            if row.fork_of is not None:
                if row.station not in heads:
                    state = stream_store.load(conn, row.station)
                    heads[row.station] = (
                        stream_store.inherited_head(conn, state) if state is not None else head
                    )
                head = heads[row.station]
            behind = groups.lag(row.tail, row.cursor, head)
            out[row.station].groups.append(
                GroupFigures(row.name, behind + waiting, in_flight, behind, dead)
            )
        reported = len(rows)
    return Snapshot(
        list(out.values()),
        {v["name"] for v in views},
        sum(v["stats"]["groups"] for v in views),
        reported,
    )


class Tally:
    """Counters of things that happen, kept in memory by the service (per process)."""

    def __init__(self) -> None:
        self.duplicates: Counter[str] = Counter()  # msg-id duplicates answered, not stored
        self.producer_duplicates: Counter[str] = Counter()  # idempotent-producer retries
        self.redeliveries: Counter[tuple[str, str]] = Counter()  # (station, group)
        self.batch_observers: list[BatchObserver] = []

    def appended(
        self, station: str, results: Iterable[tuple[Any, bool]], producer_dup: bool
    ) -> None:
        # An append of new messages only (log.Fresh) knows it has none, without a count.
        dups = getattr(results, "duplicates", None)
        if dups is None:
            dups = sum(1 for _, duplicate in results if duplicate)
        if dups:
            self.duplicates[station] += dups
        if producer_dup:
            self.producer_duplicates[station] += 1

    def delivered(self, station: str, group: str, counts: Iterable[int]) -> None:
        again = sum(1 for count in counts if count > 1)
        if again:
            self.redeliveries[(station, group)] += again

    def batch(self, ops: int, seconds: float) -> None:
        for observer in self.batch_observers:
            observer(ops, seconds)

    def forget(self, station: str, group: str | None = None) -> None:
        """Drop a deleted station's counts (or one deleted group's)."""
        if group is None:
            self.duplicates.pop(station, None)
            self.producer_duplicates.pop(station, None)
        for key in [k for k in self.redeliveries if k[0] == station and group in (None, k[1])]:
            del self.redeliveries[key]

    def forget_except(self, stations: set[str]) -> None:
        """Drop the counts of stations that no longer exist (deleted by another process, say),
        so the counters stay bounded by the live stations."""
        known = {*self.duplicates, *self.producer_duplicates, *(k[0] for k in self.redeliveries)}
        for name in known - stations:
            self.forget(name)
