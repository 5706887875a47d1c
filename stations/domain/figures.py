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


def snapshot(conn: Any, now: int, limit: int) -> Snapshot:
    """Every live station's stats (the same figures the API shows), and its groups', for the
    first ``limit`` stations by name."""
    views = catalog.views(conn, now)
    out = []
    for view in views[:limit]:
        stats = view["stats"]
        figures = StationFigures(
            view["name"],
            stats["messages"],
            stats["bytes"],
            stats["idsInWindow"],
            stats["deadLettered"],
        )
        if stats["groups"]:
            figures.groups = [
                GroupFigures(g["name"], g["pending"], g["inFlight"], g["lag"], g["deadLettered"])
                for g in groups.views(conn, view["name"], now)
            ]
        out.append(figures)
    return Snapshot(out, {v["name"] for v in views})


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
