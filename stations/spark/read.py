"""Batch reads: ``[startingOffset, endingOffset)`` split into offset ranges read in parallel,
one server page at a time into Arrow batches; or the dead-letter store with ``dls=true``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from stations.client.blocking import BlockingHttp
from stations.client.errors import Gone, StationsError
from stations.client.models import is_json_type
from stations.spark.offsets import OffsetRange, position, split, token, token_parts
from stations.spark.options import Config, check_read, station_view
from stations.spark.rows import _loads, data_text, parse_time

if TYPE_CHECKING:
    import pyarrow as pa


class DlsPartition(InputPartition):
    def __init__(self, is_json: bool) -> None:
        super().__init__(0)
        self.is_json = is_json


def _page(http: BlockingHttp, cfg: Config, offset: str, limit: int) -> dict[str, Any]:
    reply = http.call(
        "GET",
        cfg.api_path + "/messages",
        params={"offset": offset, "limit": str(limit)},
        what=f"read {cfg.station}",
    )
    page: dict[str, Any] = _loads(reply.body)
    return page


def read_pages(cfg: Config, part: OffsetRange) -> Iterator[list[dict[str, Any]]]:
    """The messages of ``part``, one server page at a time."""
    with cfg.http() as http:
        cur = part.start
        while cur < part.end:
            limit = min(cfg.page_size, part.end - cur)
            # Always the range's own offsets: a read "from the start" was resolved to the
            # earliest kept position when it was planned. Asked as ``-1`` instead, a range
            # read again after retention dropped more got other rows than its first attempt,
            # which a streaming write's producer sequence took for the same (rows lost).
            try:
                page = _page(http, cfg, token(cur), limit)
            except Gone:
                if cfg.fail_on_data_loss:
                    raise Gone(
                        f"offset {token(cur)} of station {cfg.station!r} is before its earliest "
                        "retained message: retention dropped messages before they were read "
                        "(set failOnDataLoss=false to skip them)",
                        status=410,
                        code="data_loss",
                    ) from None
                if _read_before(part):
                    raise _replay_lost(cfg, part, cur) from None
                page = _page(http, cfg, "-1", limit)
            messages = page["messages"]
            if not messages:
                return
            kept = [m for m in messages if cur <= position(m["offset"]) < part.end]
            if kept:
                yield kept
            cur = max(cur + 1, position(page["nextOffset"]))


def _read_before(part: OffsetRange) -> bool:
    """Whether an earlier attempt may have read this streaming range and written some of it:
    the batch was planned by an earlier run (a restart replays it), or this task is a retry."""
    if not part.streaming:
        return False
    if part.replayed:
        return True
    from pyspark import TaskContext

    task = TaskContext.get()
    return task is not None and task.attemptNumber() > 0


def _replay_lost(cfg: Config, part: OffsetRange, at: int) -> Gone:
    """Retention dropped messages of a streaming range that an earlier attempt read. Skipped,
    the range gives the write fewer rows than that attempt did, at other places: a Stations
    streaming write deduplicates a replayed batch by the place of each request, so kept
    messages that attempt had not written were taken for written and lost (found by a
    review). failOnDataLoss=false skips dropped messages only; this stops instead."""
    return Gone(
        f"retention dropped offset {token(at)} of station {cfg.station!r} after this batch "
        f"first ran (its range {token(part.start)} to {token(part.end)}), and the batch is "
        "being run again (a restart or a retried task): without those messages it would give "
        "the sink other rows than its first attempt, which an exactly-once sink such as "
        "Stations' takes for the same ones (messages that attempt had not written would be "
        "lost). Keep messages longer than a batch may take to be retried; to go on, restart "
        "the query from a new checkpointLocation (rows this batch wrote before may then be "
        "written again)",
        status=410,
        code="data_loss",
    )


def _arrow_schema(schema: StructType) -> pa.Schema | None:
    try:
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow: pa.Schema = to_arrow_schema(schema, timezone="UTC")
        return arrow
    except Exception:  # pragma: no cover - a PySpark without it: fall back to tuples
        return None


def message_batches(
    cfg: Config, part: OffsetRange, schema: StructType
) -> Iterator[pa.RecordBatch | tuple[Any, ...]]:
    arrow = _arrow_schema(schema)
    if arrow is None:
        for page in read_pages(cfg, part):
            for m in page:
                yield (
                    m["offset"],
                    m.get("id"),
                    m.get("headers") or {},
                    data_text(m, part.is_json),
                    parse_time(m.get("time")),
                )
        return
    import pyarrow as pa

    for page in read_pages(cfg, part):
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([m["offset"] for m in page], pa.string()),
                pa.array([m.get("id") for m in page], pa.string()),
                pa.array(
                    [list((m.get("headers") or {}).items()) for m in page],
                    arrow.field("headers").type,
                ),
                pa.array([data_text(m, part.is_json) for m in page], pa.string()),
                pa.array([parse_time(m.get("time")) for m in page], arrow.field("timestamp").type),
            ],
            schema=arrow,
        )


def dls_rows(cfg: Config, part: DlsPartition) -> Iterator[tuple[Any, ...]]:
    with cfg.http() as http:
        after: str | None = None
        while True:
            query = {"limit": str(cfg.page_size)}
            if cfg.group:
                query["group"] = cfg.group
            if after:
                query["after"] = after
            reply = http.call("GET", cfg.api_path + "/dls", params=query, what="dead letters")
            page = _loads(reply.body)
            for e in page["entries"]:
                yield (
                    e["id"],
                    e["group"],
                    e["offset"],
                    e.get("msgId"),
                    e.get("headers") or {},
                    data_text(e, part.is_json),
                    e.get("deliveryCount"),
                    e.get("reason"),
                    e.get("error"),
                    parse_time(e.get("deadLetteredAt")),
                )
            after = page.get("next")
            if not after:
                return


def tail(cfg: Config) -> int:
    """The position after the station's last message (``Stream-Next-Offset``)."""
    with cfg.http() as http:
        reply = http.call("HEAD", cfg.stream_path, what=f"station {cfg.station}")
        next_offset = reply.header("Stream-Next-Offset")
        if next_offset is None:
            raise StationsError(f"HEAD {cfg.stream_path}: no Stream-Next-Offset in the answer")
        return position(next_offset)


def first_position(cfg: Config, default: int) -> int:
    """The offset of the earliest retained message (``default`` when there is none)."""
    with cfg.http() as http:
        page = _page(http, cfg, "-1", 1)
    return position(page["messages"][0]["offset"]) if page["messages"] else default


class StationsReader(DataSourceReader):
    """Batch read of ``[startingOffset, endingOffset)``, or of the DLS with ``dls=true``."""

    def __init__(self, cfg: Config, schema: StructType) -> None:
        check_read(cfg, streaming=False)
        self.cfg = cfg
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        view = station_view(self.cfg)
        is_json = is_json_type(view["contentType"])
        if self.cfg.dls:
            return [DlsPartition(is_json)]
        end_of_station = position(view["stats"]["tailOffset"])
        start = end_of_station if self.cfg.starting == "latest" else position(self.cfg.starting)
        end = (
            end_of_station
            if self.cfg.ending == "latest"
            else min(position(self.cfg.ending), end_of_station)
        )
        start, end = self.narrow(start, end)
        if self.cfg.starting in ("-1", "earliest") and end > start:
            # The earliest retained message on (a filter may start later still); an explicit
            # zero offset is read as asked: a 410, data loss, once retention dropped any.
            start = max(start, first_position(self.cfg, end))
        ranges = split(start, end, self.cfg.num_partitions, is_json)
        return ranges or [OffsetRange(0, start, start, is_json)]

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        """The range left by pushed-down filters (none here; see FilteringReader)."""
        return start, end

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, DlsPartition):
            return dls_rows(self.cfg, partition)
        assert isinstance(partition, OffsetRange)
        return message_batches(self.cfg, partition, self.schema)


def offset_at(cfg: Config, time_ms: int) -> int:
    """The position of the first message stored at or after ``time_ms`` (server-side lookup)."""
    with cfg.http() as http:
        reply = http.call(
            "GET", cfg.api_path + "/offsets", params={"time": str(time_ms)}, what="offset at time"
        )
    return position(_loads(reply.body)["offset"])


# The times the server's ``/offsets?time=`` takes: 1970 to the end of 9999 (it refuses others).
_MAX_TIME_MS = 253_402_300_799_999


def _ms(value: Any) -> float | None:
    if not isinstance(value, datetime):
        return None
    try:
        return value.timestamp() * 1000
    except (OverflowError, OSError, ValueError):  # a local time out of the platform's range
        return None


_Comparison = EqualTo | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual
_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


class FilteringReader(StationsReader):
    """A batch read that narrows its offset range by the query's filters on ``offset`` and
    ``timestamp``: offsets bound the range directly, times through the server's
    ``/offsets?time=`` lookup, so only the matching part of the station is read.

    The narrowing is conservative (whole milliseconds around a time), so every filter is also
    handed back to Spark, which evaluates it exactly on what was read. PySpark calls this only
    with ``spark.sql.python.filterPushdown.enabled``; ``stations.spark.register`` sets it."""

    def __init__(self, cfg: Config, schema: StructType) -> None:
        super().__init__(cfg, schema)
        self.lo = 0  # positions [lo, hi)
        self.hi: int | None = None
        self.since_ms: int | None = None  # stored at or after
        self.until_ms: int | None = None  # stored before

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if isinstance(f, _COMPARISONS):
                if f.attribute == ("offset",) and isinstance(f.value, str):
                    self._offset_bound(f)
                elif f.attribute == ("timestamp",):
                    self._time_bound(f)
            yield f

    def _offset_bound(self, f: _Comparison) -> None:
        # Spark compares offsets as text. Only a token as the server writes them orders as its
        # position does: "-1" sorts before every offset and "earliest" after (they name the
        # start; no message has them), and other text says nothing about positions.
        parts = token_parts(f.value)
        if parts is None:
            return
        p, sub = parts
        if sub == 0:
            lower = {GreaterThan: p + 1, GreaterThanOrEqual: p, EqualTo: p}.get(type(f))
            upper = {LessThan: p, LessThanOrEqual: p + 1, EqualTo: p + 1}.get(type(f))
        else:
            # Between the offsets of positions p and p + 1 (every message's sub-position is 0):
            # what comes after it starts at p + 1, what comes before ends with p, equal is none.
            lower = p + 1 if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo) else None
            upper = p + 1 if isinstance(f, LessThan | LessThanOrEqual | EqualTo) else None
        if lower is not None:
            self.lo = max(self.lo, lower)
        if upper is not None:
            self.hi = upper if self.hi is None else min(self.hi, upper)

    def _time_bound(self, f: _Comparison) -> None:
        ms = _ms(f.value)
        if ms is None:
            return
        if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
            since = math.floor(ms)
            self.since_ms = since if self.since_ms is None else max(self.since_ms, since)
        if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
            until = math.floor(ms) + 1
            self.until_ms = until if self.until_ms is None else min(self.until_ms, until)

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        start = max(start, self.lo)
        if self.hi is not None:
            end = min(end, self.hi)
        # No message is stored before 1970 or after 9999, the times the server looks up: a
        # bound outside them is no bound, or leaves nothing, without asking (it refuses them).
        since, until = self.since_ms, self.until_ms
        if (since is not None and since > _MAX_TIME_MS) or (until is not None and until <= 0):
            return start, start
        if since is not None and since > 0 and start < end:
            start = max(start, offset_at(self.cfg, since))
        if until is not None and until <= _MAX_TIME_MS and start < end:
            end = min(end, offset_at(self.cfg, until))
        return start, max(start, end)
