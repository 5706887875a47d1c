"""Streaming reads: micro-batches over offset ranges. Spark checkpoints the offsets
(``{"offset": token}``), so a query restarted from its checkpoint resumes right after the last
committed batch; with ``cursor`` set, each committed end offset is also stored on the server
under that name, so lag tools see how far the query got."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from stations.client.core import path_segment
from stations.client.errors import Gone, NotFound, StationsError
from stations.client.models import is_json_type
from stations.spark.offsets import (
    OffsetRange,
    batch_end,
    batch_parts,
    identity,
    offset_dict,
    position,
    same_station,
    split,
    token,
)
from stations.spark.options import Config, check_read, station_view
from stations.spark.read import first_position, message_batches, tail

logger = logging.getLogger("stations.spark")

# How soon an idle query asks the station again. Spark asks for the latest offset every
# spark.sql.streaming.pollingDelay (10 ms) while a trigger finds nothing new: an idle query
# on the default trigger sent some 60 station GETs a second, each on a new connection.
IDLE_POLL_SECONDS = 0.1


class StationsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Nothing is kept here but the ``availableNow`` target and the initial offset."""

    def __init__(self, cfg: Config, schema: StructType) -> None:
        if cfg.dls:
            raise ValueError("the DLS can be read in batch only (spark.read, not readStream)")
        if cfg.ending != "latest":  # ignored, the query would run unbounded
            raise ValueError(
                "option endingOffset is for batch reads (spark.read): a streaming read runs "
                "until it is stopped (trigger(availableNow=True) stops at the current end)"
            )
        check_read(cfg, streaming=True)
        self.cfg = cfg
        self.schema = schema
        view = station_view(cfg)
        self.is_json = is_json_type(view["contentType"])
        self.station = identity(cfg.station, view)
        self._target: int | None = None
        self._cursor_at: str | None = None
        self._initial: dict[str, str] | None = None
        # The offset the last trigger found nothing after, and until when that answer holds.
        self._idle: tuple[dict[str, str | int], float] | None = None
        # The end offsets this run planned: a batch ending elsewhere is a replay of one an
        # earlier run planned, whose ranges that run's tasks may have written in part.
        self._planned: set[str] = set()

    def initialOffset(self) -> dict[str, str]:
        # Spark asks again when it runs batch 0 (and when a restart replays it): "latest"
        # must answer what it answered when the batch was planned, or the messages appended
        # in between are never read. Kept here for this run; with ``cursor``, also on the
        # server, so a query restarted before batch 0 committed starts at the cursor.
        if self._initial is None:
            self._initial = offset_dict(self._initial_position(), self.station)
        return self._initial

    def _initial_position(self) -> int:
        if self.cfg.starting != "latest":
            return position(self.cfg.starting)
        if self.cfg.cursor is None:
            return tail(self.cfg)
        path = self._cursor_path()
        with self.cfg.http() as http:
            try:
                return position(http.call("GET", path, what="the cursor").json()["offset"])
            except NotFound:
                at = tail(self.cfg)
                http.call("PUT", path, {"offset": token(at)}, what="store the cursor")
                self._cursor_at = token(at)
                return at

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cfg.max_per_trigger is not None:
            return ReadMaxRows(self.cfg.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = tail(self.cfg)

    def latestOffset(self, start: dict[str, str | int], limit: ReadLimit) -> dict[str, str | int]:
        # Spark plans the next batch from ``start`` only after the batch ending there was
        # committed to the sink, so ``start`` is the query's progress. Spark's own commit(end)
        # for a batch comes only when the next batch starts, which leaves an idle query that
        # caught up one batch behind: the cursor moves here too.
        #
        # The station as it is now (one GET a trigger, its identity and tail together): one
        # deleted and created again while the query ran is no longer the station of
        # ``start``, though it may have grown past the query's position already. An idle
        # query asks at most every IDLE_POLL_SECONDS.
        if self._idle is not None and self._idle[0] == start and time.monotonic() < self._idle[1]:
            return dict(start)
        view = station_view(self.cfg)
        self._check_station(start, identity(self.cfg.station, view))
        self._commit_cursor(str(start["offset"]))
        lo = position(str(start["offset"]))
        end = position(view["stats"]["tailOffset"])
        if end < lo:
            self._behind_the_query(lo, end)
        if self._target is not None:
            end = min(end, self._target)
        # From the start (-1): whatever retention kept. From any other offset, positions it
        # dropped are data loss, which the read reports (or skips: failOnDataLoss=false).
        from_start = lo == 0 and self.cfg.starting in ("-1", "earliest")
        first = lo
        if end > lo and (from_start or isinstance(limit, ReadMaxRows)):
            # Skip positions retention dropped; all of them when it kept none (the batch then
            # reads nothing, as a batch read of the range does, rather than failing for
            # the dropped position 0 as data loss on every replay).
            first = max(lo, first_position(self.cfg, end))
        if isinstance(limit, ReadMaxRows) and end > lo:
            end = min(end, first + limit.max_rows)
        if end <= lo:
            self._idle = (dict(start), time.monotonic() + IDLE_POLL_SECONDS)
            return dict(start)  # the very offset Spark holds: no new data, no batch
        planned = batch_end(end, self.cfg.num_partitions, self.station)
        if from_start and first > lo:
            # Where "the start" was when the batch was planned: its ranges are read from
            # there, and so again by a replay, whatever retention dropped in between (each
            # range then reads the rows of its first attempt, or fails as data loss).
            planned["from"] = min(first, end)
        self._planned.add(str(planned["offset"]))
        return planned

    def _check_station(
        self, offset: dict[str, str | int], station: dict[str, str] | None = None
    ) -> None:
        """``offset`` (from the checkpoint) is of ``station`` (default: the one this reader
        started on; see ``identity``). Whatever failOnDataLoss says: the query could not be
        restarted from offsets of another station either."""
        station = station or self.station
        if not same_station(offset, station):
            raise Gone(
                f"this query's checkpoint holds offsets of station {offset.get('station')!r} "
                f"created at {offset.get('created')}, but station {self.cfg.station!r} now is "
                f"the one created at {station['created']} (deleted and created again?): "
                "reading on from the old position would skip its messages; give the query a "
                "new checkpointLocation (startingOffset then says where to begin)"
            )

    def _behind_the_query(self, lo: int, end: int) -> None:
        """The station ends before the query's offset: the user's startingOffset is past
        its end, or it was deleted and created again."""
        if self.cfg.starting not in ("-1", "earliest", "latest") and lo == position(
            self.cfg.starting
        ):
            raise ValueError(
                f"startingOffset {self.cfg.starting} is past the end of station "
                f"{self.cfg.station!r}, whose next message will have offset {token(end)}: "
                "give an offset it has, -1 (its earliest message) or latest"
            )
        message = (
            f"station {self.cfg.station!r} ends at {token(end)}, before this query's offset "
            f"{token(lo)}: was it deleted and created again? Its messages up to there would "
            "be skipped"
        )
        if self.cfg.fail_on_data_loss:
            raise Gone(message + " (set failOnDataLoss=false to skip them)")
        logger.warning("%s (failOnDataLoss=false)", message)

    def reportLatestOffset(self) -> dict[str, str]:
        return offset_dict(tail(self.cfg), self.station)

    def partitions(
        self, start: dict[str, str | int], end: dict[str, str | int]
    ) -> Sequence[InputPartition]:
        # The split the batch was planned with, not today's numPartitions (see batch_end),
        # from where it was planned to start (see latestOffset). A restart replays its last
        # planned batch without asking latestOffset: its station is checked here too.
        self._check_station(start)
        self._check_station(end)
        first = max(position(str(start["offset"])), int(end.get("from", 0)))
        last = position(str(end["offset"]))
        ranges = split(first, last, batch_parts(end, self.cfg.num_partitions), self.is_json)
        # A batch of positions retention dropped entirely (from the start) reads nothing.
        ranges = ranges or [OffsetRange(0, last, last, self.is_json)]
        for part in ranges:
            part.streaming = True
            part.replayed = str(end["offset"]) not in self._planned
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return message_batches(self.cfg, partition, self.schema)

    def commit(self, end: dict[str, str | int]) -> None:
        """With ``cursor``, store the committed end offset on the server (see latestOffset)."""
        # Batches up to ``end`` are done: none is run again in this run.
        self._planned = {o for o in self._planned if o > str(end["offset"])}
        self._commit_cursor(str(end["offset"]))

    def _cursor_path(self) -> str:
        return f"{self.cfg.api_path}/cursors/{path_segment(self.cfg.cursor or '', 'cursor')}"

    def _commit_cursor(self, offset: str) -> None:
        """Store ``offset`` under the ``cursor`` name, once per position.

        Spark's checkpoint stays what a restart resumes from; the cursor is what the service
        shows (lag in the API, the console and /metrics). A failed commit is logged, not fatal:
        the next batch carries the position again."""
        if self.cfg.cursor is None or offset == self._cursor_at:
            return
        path = self._cursor_path()
        try:
            with self.cfg.http() as http:
                http.call("PUT", path, {"offset": offset}, what="commit the cursor")
            self._cursor_at = offset
        except StationsError as exc:
            logger.warning(
                "cursor %s of %s not committed: %s", self.cfg.cursor, self.cfg.station, exc
            )
