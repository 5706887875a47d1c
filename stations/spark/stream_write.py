"""Streaming writes: each (query, partition) is an idempotent producer of the client core
(Durable Streams §5.2.1): ``Producer-Id`` from the query id and partition, ``Producer-Epoch``
the batch id, ``Producer-Seq`` one per request. A batch replayed after a failure is answered as
duplicates; a zombie task of an older batch is fenced (403)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from stations.client.blocking import BlockingProducer
from stations.client.models import is_json_type
from stations.client.session import ProducerSession
from stations.spark.options import CONNECTOR_RETRY, DEFAULT_CHUNK, Config, station_view
from stations.spark.rows import RowShape, chunks, dumpb, rows_of
from stations.spark.write import WriteReport

if TYPE_CHECKING:
    import pyarrow as pa


def stream_producer(
    cfg: Config, *, producer_id: str, epoch: int, content_type: str
) -> BlockingProducer:
    """The client core's blocking producer on ``cfg``'s station."""
    session = ProducerSession(producer_id, epoch=epoch, content_type=content_type)
    return BlockingProducer(cfg.http(), cfg.stream_path, session, CONNECTOR_RETRY)


def producer_id(cfg: Config, query_id: str, partition: int, is_json: bool) -> str:
    """The producer of one (query, partition). A JSON station takes ``chunkSize`` rows per
    sequence number, so a chunkSize other than the default is part of the id: a batch replayed
    under another chunkSize must not have its new chunks taken for duplicates of the old ones
    (its rows are stored again instead). The default keeps the id that queries always had."""
    base = f"{cfg.producer_prefix}:{query_id}:{partition}"
    return base if not is_json or cfg.chunk_size == DEFAULT_CHUNK else f"{base}:c{cfg.chunk_size}"


class StationsStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("stations")``: exactly once per (query, partition, batch).

    JSON stations take ``chunkSize`` rows per request (a JSON array); other stations one row per
    request. Message ids and headers are not sent: the producer sequence is what deduplicates.
    The station must exist: checked when the query starts, not in its first task.
    """

    def __init__(self, cfg: Config, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("a station is append-only: use outputMode('append')")
        if cfg.msg_id_column is not None:
            raise ValueError(
                "msgIdColumn is for batch writes: a streaming write deduplicates replayed batches "
                "by its producer sequence and sends no message ids"
            )
        self.cfg = cfg
        self.content_type: str = station_view(cfg)["contentType"]
        self.shape = RowShape.of(cfg, schema, is_json_type(self.content_type))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:  # type: ignore[override]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("StationsStreamWriter.write runs inside a Spark task")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        if batch_id is None or query_id is None:
            raise RuntimeError("no streaming batch id / query id in the task context")
        producer = stream_producer(
            self.cfg,
            producer_id=producer_id(self.cfg, query_id, ctx.partitionId(), self.shape.is_json),
            epoch=int(batch_id),
            content_type=self.content_type,
        )
        report = WriteReport(partition=ctx.partitionId())
        try:
            send_rows(producer, rows_of(iterator), self.shape, self.cfg.chunk_size, report)
        finally:
            producer.close()
        return report

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every request was acknowledged durably by the server."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what was stored stays; a replay of the batch is deduplicated."""


def send_rows(
    producer: BlockingProducer,
    rows: Iterator[dict[str, object]],
    shape: RowShape,
    chunk_size: int,
    report: WriteReport,
) -> None:
    if shape.is_json:
        for chunk in chunks(rows, chunk_size):
            stored = producer.append(dumpb([shape.payload(r) for r in chunk]))
            report.add(len(chunk), len(chunk) if stored else 0)
        return
    for row in rows:
        value = shape.payload(row)
        body = value if isinstance(value, bytes) else ("" if value is None else str(value)).encode()
        report.add(1, 1 if producer.append(body) else 0)
