"""Streaming writes: each (query, partition) is an idempotent producer of the client core
(Durable Streams §5.2.1): ``Producer-Id`` from the query id and partition, ``Producer-Epoch``
from the batch id, ``Producer-Seq`` one per request. A batch replayed after a failure is
answered as duplicates; a zombie task of an older batch is fenced (403).

On a JSON station a request carries ``chunkSize`` rows, so which rows a seq covers depends on
an option a restart may change. The batch's epoch therefore records the chunk size its first
attempt sent with (see ``send_json``), and a replay sends the same chunks under the same seqs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from stations.client.blocking import BlockingProducer
from stations.client.errors import ProducerFenced
from stations.client.models import is_json_type
from stations.client.session import ProducerSession
from stations.spark.options import (
    CONNECTOR_RETRY,
    MAX_MESSAGES_PER_POST,
    Config,
    check_write,
    refuse,
    station_view,
)
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


def producer_id(cfg: Config, query_id: str, partition: int) -> str:
    """The producer of one (query, partition)."""
    return f"{cfg.producer_prefix}:{query_id}:{partition}"


# Each batch owns this many epochs: the first for its first row alone, then one per chunk size.
EPOCHS_PER_BATCH = MAX_MESSAGES_PER_POST + 1


def batch_epoch(batch_id: int, chunk_size: int = 0) -> int:
    """The epoch of batch ``batch_id`` sent in chunks of ``chunk_size`` (0: its first row)."""
    return batch_id * EPOCHS_PER_BATCH + chunk_size


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
        check_write(cfg, streaming=True)
        self.cfg = cfg
        self.content_type: str = station_view(cfg)["contentType"]
        if not is_json_type(self.content_type):
            refuse(
                cfg,
                ("chunkSize",),
                f"for JSON stations: a streaming write into a {self.content_type} station "
                "sends one row per request",
            )
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
        report = WriteReport(partition=ctx.partitionId())
        pid = producer_id(self.cfg, query_id, ctx.partitionId())
        if self.shape.is_json:
            send_json(
                self.cfg,
                pid,
                int(batch_id),
                self.content_type,
                rows_of(iterator, self.shape),
                self.shape,
                report,
            )
            return report
        producer = stream_producer(
            self.cfg, producer_id=pid, epoch=int(batch_id), content_type=self.content_type
        )
        try:
            send_texts(producer, rows_of(iterator, self.shape), self.shape, report)
        finally:
            producer.close()
        return report

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every request was acknowledged durably by the server."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what was stored stays; a replay of the batch is deduplicated."""


def send_json(
    cfg: Config,
    pid: str,
    batch_id: int,
    content_type: str,
    rows: Iterator[dict[str, object]],
    shape: RowShape,
    report: WriteReport,
) -> None:
    """A batch's rows into a JSON station: the first row alone under ``batch_epoch(batch)``,
    then the rest in chunks under ``batch_epoch(batch, chunk)``.

    A first attempt that got past its first row left its session at the epoch of its chunk
    size, so a replay's first row is fenced by that epoch: the replay takes the chunk size from
    it and sends the same chunks under the same seqs (duplicates, then the rows not stored).
    Otherwise the replay's own ``chunkSize`` is safe: nothing was stored in chunks yet."""
    first = next(rows, None)
    if first is None:
        return
    chunk_size = cfg.chunk_size
    producer = stream_producer(
        cfg, producer_id=pid, epoch=batch_epoch(batch_id), content_type=content_type
    )
    try:
        report.add(1, 1 if producer.append(dumpb([shape.payload(first)])) else 0)
    except ProducerFenced as exc:
        if not batch_epoch(batch_id) < exc.current_epoch < batch_epoch(batch_id + 1):
            raise  # a newer batch took over: this task is a zombie
        chunk_size = exc.current_epoch - batch_epoch(batch_id)
        report.add(1, 0)  # the first attempt stored the first row before its chunks
    finally:
        producer.close()
    producer = stream_producer(
        cfg, producer_id=pid, epoch=batch_epoch(batch_id, chunk_size), content_type=content_type
    )
    try:
        encoded = (dumpb(shape.payload(r)) for r in rows)
        for chunk in chunks(encoded, chunk_size):
            stored = producer.append(b"[" + b",".join(chunk) + b"]")
            report.add(len(chunk), len(chunk) if stored else 0)
    finally:
        producer.close()


def send_texts(
    producer: BlockingProducer,
    rows: Iterator[dict[str, object]],
    shape: RowShape,
    report: WriteReport,
) -> None:
    """A batch's rows into a text or binary station, one row per request (one seq each)."""
    for row in rows:
        value = shape.payload(row)
        body = value if isinstance(value, bytes) else ("" if value is None else str(value)).encode()
        if not body:  # refused by the server on every replay: the query could never go on
            raise shape.empty_row()
        report.add(1, 1 if producer.append(body) else 0)
