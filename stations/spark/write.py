"""Batch writes: rows become messages with the id taken from ``msgIdColumn``, ``chunkSize``
per ``POST /api/stations/{name}/messages``; the station drops an id it has seen within its
idempotency window, so a re-run job or a retried task stores nothing twice."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from stations.client.blocking import BlockingHttp
from stations.client.errors import BadRequest, PayloadTooLarge
from stations.client.models import is_json_type
from stations.spark.options import Config, check_write, station_view
from stations.spark.rows import RowShape, _loads, chunks, dumpb, rows_of

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: rows seen, messages stored, duplicates the station dropped."""

    rows: int = 0
    stored: int = 0
    duplicates: int = 0
    partition: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, rows: int, stored: int) -> None:
        self.rows += rows
        self.stored += stored
        self.duplicates += rows - stored


def partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


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
        self.shape = RowShape.of(cfg, schema, is_json_type(station_view(cfg)["contentType"]))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:  # type: ignore[override]
        report = WriteReport(partition=partition_id())
        path = self.cfg.api_path + "/messages"
        headers = {"Content-Type": "application/json"}
        with self.cfg.http() as http:
            encoded = (dumpb(self.shape.message(r)) for r in rows_of(iterator))
            for chunk in chunks(encoded, self.cfg.chunk_size):
                self._send(http, path, headers, chunk, report)
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
        results = _loads(reply.body)["results"]
        report.add(len(chunk), sum(1 for r in results if not r["duplicate"]))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        write_summary(self.cfg, messages, committed=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        write_summary(self.cfg, messages, committed=False)


def write_summary(
    cfg: Config, messages: Sequence[WriterCommitMessage | None], *, committed: bool
) -> None:
    """Sum the task reports into ``reportPath`` (a JSON file on the driver), when asked."""
    if not cfg.report_path:
        return
    reports = [m for m in messages if isinstance(m, WriteReport)]
    summary = {
        "committed": committed,
        "tasks": len(reports),
        "rows": sum(r.rows for r in reports),
        "stored": sum(r.stored for r in reports),
        "duplicates": sum(r.duplicates for r in reports),
    }
    tmp = f"{cfg.report_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, cfg.report_path)
