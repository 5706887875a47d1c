"""Batch writes: rows become messages with the id taken from ``msgIdColumn``, ``chunkSize``
per ``POST /api/stations/{name}/messages``; the station drops an id it has seen within its
idempotency window, so a re-run job or a retried task stores nothing twice.

What a write stored is counted by position. The driver notes the station's tail when the write
starts; each task reports the positions it stored and those of the duplicates whose original
is at or past that tail (stored during this write). A task Spark retried after a failure finds
what its failed attempt stored as such duplicates: counted by the successful attempts alone,
those messages were reported as duplicates, as if an earlier run had stored them, and the
write as storing fewer messages than the station gained."""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from stations.client.blocking import BlockingHttp
from stations.client.errors import BadRequest, PayloadTooLarge
from stations.client.models import is_json_type
from stations.spark.offsets import position
from stations.spark.options import Config, check_write, station_view
from stations.spark.rows import RowShape, _loads, chunks, dumpb, rows_of

if TYPE_CHECKING:
    import pyarrow as pa


Ranges = list[tuple[int, int]]  # [lo, hi) ranges of positions, ascending, disjoint


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: rows seen, messages stored, duplicates the station dropped."""

    rows: int = 0
    stored: int = 0
    duplicates: int = 0
    partition: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0  # Spark's attempt number of the task: above 0 after a retry
    # Batch writes: the positions this attempt stored, and those of duplicates of messages
    # stored since the write began but not by this attempt (see the module docstring).
    stored_at: Ranges = field(default_factory=list)
    repeats: Ranges = field(default_factory=list)
    _repeated: list[int] = field(default_factory=list, repr=False)

    def add(self, rows: int, stored: int) -> None:
        self.rows += rows
        self.stored += stored
        self.duplicates += rows - stored

    def add_results(self, results: Sequence[dict[str, Any]], since: int) -> None:
        """A produce answer's ``results``: duplicates whose original is at or past ``since``
        (the station's tail when the write began) are noted by position."""
        if results and not any(r["duplicate"] for r in results):
            first, last = position(results[0]["offset"]), position(results[-1]["offset"])
            if last - first + 1 == len(results):  # as the server stores them: consecutive
                self._stored_range(first, last + 1)
                self.add(len(results), len(results))
                return
        rows = stored = 0
        for result in results:
            rows += 1
            offset = result["offset"]
            if not result["duplicate"]:
                stored += 1
                at = position(offset)
                self._stored_range(at, at + 1)
            elif offset is not None and position(offset) >= since:
                self._repeated.append(position(offset))
        self.add(rows, stored)

    def _stored_range(self, lo: int, hi: int) -> None:
        if self.stored_at and self.stored_at[-1][1] == lo:
            self.stored_at[-1] = (self.stored_at[-1][0], hi)
        else:
            self.stored_at.append((lo, hi))

    def close(self) -> None:
        """Keep the repeats this attempt did not store itself (rows repeated within the task
        are duplicates), as ranges: they travel to the driver."""
        theirs = (p for p in sorted(set(self._repeated)) if not covers(self.stored_at, p))
        self.repeats = to_ranges(theirs)
        self._repeated = []


def covers(ranges: Ranges, at: int) -> bool:
    i = bisect.bisect_right(ranges, (at, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= at < ranges[i][1]


def to_ranges(positions: Iterable[int]) -> Ranges:
    """Ascending ``positions`` as ranges."""
    out: Ranges = []
    for at in positions:
        if out and out[-1][1] == at:
            out[-1] = (out[-1][0], at + 1)
        else:
            out.append((at, at + 1))
    return out


def merged(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def outside(ranges: Ranges, others: Ranges) -> int:
    """How many positions of ``ranges`` no range of ``others`` holds (both merged)."""
    count, j = 0, 0
    for lo, hi in ranges:
        count += hi - lo
        while j < len(others) and others[j][1] <= lo:
            j += 1
        k = j
        while k < len(others) and others[k][0] < hi:
            count -= min(hi, others[k][1]) - max(lo, others[k][0])
            k += 1
    return count


def partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def attempt_number() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


class StationsWriter(DataSourceArrowWriter):
    """``df.write.format("stations")``: at most once per message id."""

    def __init__(self, cfg: Config, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("a station is append-only: write with mode('append')")
        check_write(cfg, streaming=False)
        if cfg.msg_id_column is None and not cfg.allow_duplicates:
            raise ValueError(
                "writing to a station needs option('msgIdColumn', COLUMN): the message id is what "
                "makes a re-run job or a retried task store nothing twice, and Spark cannot derive "
                "a stable id from arbitrary input. Give option('allowDuplicates', 'true') to write "
                "without ids (at-least-once)."
            )
        self.cfg = cfg
        view = station_view(cfg)
        self.shape = RowShape.of(cfg, schema, is_json_type(view["contentType"]))
        # Every message this write stores gets a position from here on.
        self.since = position(view["stats"]["tailOffset"])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:  # type: ignore[override]
        report = WriteReport(partition=partition_id(), attempt=attempt_number())
        path = self.cfg.api_path + "/messages"
        headers = {"Content-Type": "application/json"}
        with self.cfg.http() as http:
            encoded = (dumpb(self.shape.message(r)) for r in rows_of(iterator, self.shape))
            for chunk in chunks(encoded, self.cfg.chunk_size):
                self._send(http, path, headers, chunk, report)
        report.close()
        return report

    def _send(
        self,
        http: BlockingHttp,
        path: str,
        headers: dict[str, str],
        chunk: list[bytes],
        report: WriteReport,
    ) -> None:
        """One produce request, or, refused as too large (a server with lower limits than
        the defaults: the body, or --max-append-messages), its halves: a refused request
        stored nothing, so sending its messages again stores each once."""
        body = b'{"messages":[' + b",".join(chunk) + b"]}"
        try:
            reply = http.call("POST", path, data=body, headers=headers, what="produce")
        except (PayloadTooLarge, BadRequest) as exc:
            # 413, or 400 on "messages" for more than the server takes in one request.
            too_many = isinstance(exc, PayloadTooLarge) or exc.field == "messages"
            if len(chunk) == 1 or not too_many:
                raise
            half = len(chunk) // 2
            self._send(http, path, headers, chunk[:half], report)
            self._send(http, path, headers, chunk[half:], report)
            return
        report.add_results(_loads(reply.body)["results"], self.since)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        write_summary(self.cfg, messages, committed=True, since=self.since)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        write_summary(self.cfg, messages, committed=False, since=self.since)


def write_summary(
    cfg: Config,
    messages: Sequence[WriterCommitMessage | None],
    *,
    committed: bool,
    since: int | None = None,
) -> None:
    """Sum the task reports into ``reportPath`` (a JSON file on the driver), when asked.

    ``stored`` is what the write put into the station: the successful attempts' messages and
    those of failed attempts Spark retried (``storedByFailedAttempts``: duplicates of messages
    stored during the write that no successful attempt stored; another writer storing the same
    ids meanwhile counts there too). ``duplicates`` are the other rows: ids stored before the
    write, or repeated in its input. Without message ids nothing
    tells a retried task's rows from new ones: after a retry (``retriedTasks``) the station
    may hold some twice, and ``stationGrew`` says by how much it grew during the write."""
    if not cfg.report_path:
        return
    reports = [m for m in messages if isinstance(m, WriteReport)]
    rows = sum(r.rows for r in reports)
    # A message a failed attempt stored is found by the retry as a duplicate of it.
    by_failed = outside(
        merged(p for r in reports for p in r.repeats),
        merged(p for r in reports for p in r.stored_at),
    )
    stored = sum(r.stored for r in reports) + by_failed
    retried = sum(1 for r in reports if r.attempt > 0)
    summary: dict[str, Any] = {
        "committed": committed,
        "tasks": len(reports),
        "rows": rows,
        "stored": stored,
        "duplicates": rows - stored,
        "storedByFailedAttempts": by_failed,
        "retriedTasks": retried,
    }
    if retried and cfg.allow_duplicates and cfg.msg_id_column is None and since is not None:
        summary["stationGrew"] = _grown(cfg, since)
    tmp = f"{cfg.report_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, cfg.report_path)


def _grown(cfg: Config, since: int) -> int | None:
    """How many messages the station gained since ``since`` (None if it cannot be asked: the
    write itself is done, and a summary must not fail it)."""
    try:
        return position(station_view(cfg)["stats"]["tailOffset"]) - since
    except Exception:
        return None
