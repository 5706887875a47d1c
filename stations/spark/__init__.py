"""PySpark connector: the ``stations`` data source (PySpark's Python Data Source API, 4.2+).

Register it once per session, then read and write stations like any other format::

    import stations.spark
    stations.spark.register(spark)        # or spark.dataSource.register(StationsDataSource)

    df = (spark.read.format("stations").option("url", "http://127.0.0.1:4437")
          .option("station", "orders").option("startingOffset", "-1")
          .option("endingOffset", "latest").load())
    df.write.format("stations").mode("append").option("station", "copy") \\
        .option("msgIdColumn", "offset").save()

Exactly-once, in each direction:

- **Reads** are planned on offset ranges. A batch read splits ``[startingOffset, endingOffset)``
  into ``numPartitions`` ranges read in parallel; a streaming read checkpoints the end offset of
  every micro-batch in Spark's checkpoint, so a query restarted from it resumes right after the
  last committed batch.
- **Batch writes** give each message the id taken from ``msgIdColumn``; the station drops an id it
  has seen within its ``idempotencyWindowMs``, so a re-run job or a retried task stores nothing
  twice. Spark cannot derive a stable id from arbitrary input, so without ``msgIdColumn`` the write
  is refused unless ``allowDuplicates`` is ``true``.
- **Streaming writes** make each (query, partition) an idempotent producer (Durable Streams
  §5.2.1): ``Producer-Id`` from the query id and partition, ``Producer-Epoch`` from the batch id,
  ``Producer-Seq`` one per request. A batch replayed after a failure is answered as duplicates; a
  zombie task of an older batch is fenced (403). On a JSON station the epoch also records the
  ``chunkSize`` the batch was first sent with, and a replay under another one sends those chunks.

Options (all strings): ``url`` (default ``$STATIONS_URL`` or http://127.0.0.1:4437), ``station``
(or the load/save path), ``token``; reads: ``startingOffset`` (``-1``, ``latest`` or an offset;
default ``-1``), ``endingOffset`` (batch, exclusive; default ``latest``), ``numPartitions``
(default 4), ``pageSize`` (≤ 1000), ``maxMessagesPerTrigger``, ``failOnDataLoss`` (default
true), ``dls`` + ``group`` (read the dead-letter store, batch only), ``cursor`` (streaming:
store the query's progress on the server under this name, e.g. the query's name, so its lag
shows in ``/api/stations/{name}/cursors``, the console and ``/metrics``); writes: ``msgIdColumn``,
``allowDuplicates``, ``dataColumn`` (default ``data``), ``headersColumn`` (default
``headers``), ``chunkSize`` (messages per request, default 1000), ``reportPath`` (batch: a JSON
summary written by the driver's commit: rows, stored, duplicates, counting what task attempts
Spark retried had stored as stored, see ``write``), ``producerIdPrefix`` (streaming, default
``spark``). A row holding a NaN or an Infinity float where it becomes JSON (or the id) fails
the write naming the column: JSON has neither, and null would change the data.
An option the operation would ignore is refused, naming it: write options on a read, read options
on a write, ``group`` without ``dls=true``, the offset options with ``dls=true``, ``cursor`` and
``maxMessagesPerTrigger`` on a batch read, ``producerIdPrefix`` on a batch write,
``allowDuplicates`` and ``reportPath`` on a streaming write, ``chunkSize`` on a streaming write
into a text or binary station (it sends one row per request).

Modules: ``options`` (the options), ``offsets`` (offset tokens and ranges), ``rows`` (rows to
messages and back), ``read`` / ``stream_read`` (batch and streaming reads), ``write`` /
``stream_write`` (batch and streaming writes), ``source`` (the data source), ``pipeline``,
``launch`` and ``progress`` (``stations pipeline``).

The connector speaks only HTTP through the SDK's client core (its blocking transport: one
keep-alive ``http.client`` connection per task), so executors need the ``stations`` package,
``orjson`` and ``pyarrow`` (``stations.spark.EXECUTOR_REQUIREMENTS``), not the server nor aiohttp. Offsets are the server's
``<position>_<sub-position>`` tokens; the connector relies on positions being consecutive
message numbers to split ranges and to count messages for ``maxMessagesPerTrigger``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stations.client.errors import ProducerFenced, StationsError
from stations.client.lazy import lazy_getattr

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from stations.spark.source import DLS_SCHEMA, MESSAGES_SCHEMA, StationsDataSource

# The SDK's error for a fenced producer, under the name this connector always used.
StationsFencedError = ProducerFenced

# What an executor's Python needs besides PySpark itself (the driver checks them up front).
EXECUTOR_REQUIREMENTS = ("stations", "orjson", "pyarrow")

__all__ = [
    "DLS_SCHEMA",
    "EXECUTOR_REQUIREMENTS",
    "MESSAGES_SCHEMA",
    "StationsDataSource",
    "StationsError",
    "StationsFencedError",
    "register",
]

# PySpark loads on first use, so ``stations pipeline --help`` (which imports
# ``stations.spark.pipeline``) stays fast.
_LAZY = {
    "DLS_SCHEMA": "stations.spark.source",
    "MESSAGES_SCHEMA": "stations.spark.source",
    "StationsDataSource": "stations.spark.source",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


def register(spark: SparkSession, *, filter_pushdown: bool = False) -> None:
    """Register the ``stations`` format with ``spark``.

    ``filter_pushdown=True``: batch reads push filters on ``offset`` and ``timestamp`` down to
    the server, reading only the matching part of a station (this sets
    ``spark.sql.python.filterPushdown.enabled``, which PySpark requires for that). Off by
    default: PySpark (4.2, 4.3) keeps the reader a filtered query narrowed and plans a later
    query on the same DataFrame that has no filter to push with it, so ``df.count()`` after
    ``df.filter(...).count()`` counted, and a write of ``df`` wrote, only the filtered rows.
    With it on, give each unfiltered query a DataFrame of its own (``load()`` again)."""
    from stations.spark.source import FilteringStationsDataSource, StationsDataSource

    if filter_pushdown:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
        spark.dataSource.register(FilteringStationsDataSource)
    else:
        spark.dataSource.register(StationsDataSource)
