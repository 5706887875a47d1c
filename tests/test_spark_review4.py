"""The Spark data source against the findings of review P (2, 3, 4, 4b, 4c and 7), with a
live server; the fixtures and one ``local[2]`` SparkSession come from ``tests.test_spark``.

Each test failed on the code the review read."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.harness import IN_CI, Server

try:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.datasource import ReadMaxRows
    from pyspark.sql.types import BinaryType, DecimalType, StringType, StructField, StructType

    from stations.client.errors import Gone
    from stations.spark.offsets import OffsetRange, token
    from stations.spark.options import Config
    from stations.spark.read import read_pages
    from stations.spark.rows import RowShape, dumps
    from stations.spark.stream_read import IDLE_POLL_SECONDS, StationsStreamReader
    from tests import test_spark as base
except ImportError:
    if IN_CI:  # the CI installs the spark extra: a missing PySpark is a failure there
        raise
    pytest.skip(
        "PySpark / pyarrow not installed: pip install -e '.[spark]'", allow_module_level=True
    )

# The fixtures of tests/test_spark.py: one SparkSession and one server for the module.
spark = base.spark
srv = base.srv
api = base.api
all_messages = base.all_messages
new_station = base.new_station
produce = base.produce
reader = base.reader


# -- s: reading a stream at the reader level ---------------------------------------------------


def _stream(cfg: Config) -> StationsStreamReader:
    return StationsStreamReader(cfg, StructType())


def _read(cfg: Config, stream: StationsStreamReader, start: Any, end: Any) -> list[Any]:
    parts = [p for p in stream.partitions(start, end) if isinstance(p, OffsetRange)]
    return [m["data"] for p in parts for page in read_pages(cfg, p) for m in page]


# -- 2: a running query on a station deleted and created again ---------------------------------


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_running_query_fails_when_its_station_is_deleted_and_created_again(
    srv: Server, api: httpx.Client, fail_on_data_loss: str
) -> None:
    """The station's identity was read once, when the query started: a station deleted and
    created again that grew past the query's position before the next trigger was read on
    from there, its first messages skipped without a word. Each trigger reads it again and
    fails as a restarted query does (whatever failOnDataLoss: the checkpoint's offsets name
    the old station, so the query could never be restarted from them)."""
    name = new_station(api)
    produce(api, name, [{"data": {"old": k}} for k in range(3)])
    cfg = Config.parse({"url": srv.url, "station": name, "failOnDataLoss": fail_on_data_loss})
    stream = _stream(cfg)
    limit = stream.getDefaultReadLimit()
    start = stream.initialOffset()
    end = stream.latestOffset(start, limit)
    assert end["offset"] == token(3)
    assert _read(cfg, stream, start, end) == [{"old": k} for k in range(3)]
    stream.commit(end)
    assert stream.latestOffset(end, limit) == end  # nothing new: no batch

    assert api.delete(f"/api/stations/{quote(name, safe='')}").status_code == 204
    assert api.post("/api/stations", json={"name": name}).status_code == 201
    produce(api, name, [{"data": {"new": k}} for k in range(5)])
    time.sleep(IDLE_POLL_SECONDS)  # an idle query asks the station again after this long
    with pytest.raises(Gone, match="new checkpointLocation"):
        stream.latestOffset(end, limit)


# -- 3: numbers the server stores exactly -----------------------------------------------------


def test_integers_beyond_64_bits_and_decimals_keep_every_digit(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    """Pages were parsed with orjson, which turns an integer beyond 64 bits into a float, and
    a Decimal was written as a float: both lost digits the server keeps."""
    big = "123456789012345678901234567890"
    name = new_station(api)
    body = (
        '{"messages":[{"data":{"id":BIG}},{"data":{"u":18446744073709551616}},'
        '{"data":{"n":-9223372036854775809,"f":0.5,"s":"12345678901234567890123"}}]}'
    ).replace("BIG", big)
    r = api.post(
        f"/api/stations/{quote(name, safe='')}/messages",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    texts = [row.data for row in reader(spark, srv, name).load().orderBy("offset").collect()]
    assert texts == [
        '{"id":' + big + "}",
        '{"u":18446744073709551616}',
        '{"n":-9223372036854775809,"f":0.5,"s":"12345678901234567890123"}',
    ]

    # Written back: a JSON text data column keeps them too (a station-to-station copy), and
    # a Decimal column is sent as the number it is.
    copy = new_station(api)
    # (one partition: one request, as the server reads a body of a 19-digit negative
    # integer alone inexactly, a fault of its own)
    df = reader(spark, srv, name).option("numPartitions", "1").load()
    df.write.format("stations").mode("append").option("url", srv.url).option(
        "station", copy
    ).option("msgIdColumn", "offset").save()
    assert sorted(json.dumps(m["data"]) for m in all_messages(api, copy)) == [
        '{"id": ' + big + "}",
        '{"n": -9223372036854775809, "f": 0.5, "s": "12345678901234567890123"}',
        '{"u": 18446744073709551616}',
    ]

    amounts = new_station(api)
    schema = StructType([StructField("k", StringType()), StructField("amount", DecimalType(38, 0))])
    rows = [("a", Decimal("12345678901234567890123456789")), ("b", Decimal(-7))]
    spark.createDataFrame(rows, schema).write.format("stations").mode("append").option(
        "url", srv.url
    ).option("station", amounts).option("msgIdColumn", "k").save()
    assert sorted((m["data"] for m in all_messages(api, amounts)), key=str) == [
        {"k": "a", "amount": 12345678901234567890123456789},
        {"k": "b", "amount": -7},
    ]


def test_decimals_are_written_as_their_exact_text() -> None:
    assert dumps({"a": Decimal("12345678901234567.89")}) == '{"a":12345678901234567.89}'
    assert dumps([Decimal("1E+2"), Decimal("-0.10")]) == "[1E+2,-0.10]"
    # as NaN floats: null (JSON has no NaN)
    assert dumps([Decimal("NaN"), Decimal("Infinity"), float("nan")]) == "[null,null,null]"


def test_a_page_of_numbers_orjson_reads_exactly_stays_on_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nanosecond timestamps and snowflake ids (19 digits) are read exactly by orjson: only a
    number it may read inexactly sends the page to the standard library (3x slower)."""
    from stations.spark import rows

    def slow(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the standard library parsed a page orjson reads exactly")

    page = b'[{"ts":1764316800123456789,"id":"x1234567890123456789"},1234567890123456789]'
    monkeypatch.setattr(rows.json, "loads", slow)
    assert rows._loads(page)[0]["ts"] == 1764316800123456789
    monkeypatch.undo()
    for inexact in (b"[-9223372036854775809]", b"[123456789012345678901]"):
        assert rows.dumpb(rows._loads(inexact)) == inexact  # its digits, as sent


# -- 4: filter pushdown -----------------------------------------------------------------------


def test_an_unfiltered_query_after_a_filtered_one_on_the_same_dataframe_reads_everything(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    """``register()`` turned filter pushdown on, and PySpark plans a query that pushes no
    filter with the reader an earlier filtered query on the same DataFrame narrowed: after
    ``df.filter(offset >= 5th).count()``, ``df.count()`` said 5 of 10 and a write of ``df``
    copied 5 (a review's "count first, then save"). Pushdown is now asked for explicitly."""
    import stations.spark

    stations.spark.register(spark)
    name = new_station(api)
    offsets = produce(api, name, [{"data": k} for k in range(10)])
    df = reader(spark, srv, name).load()
    assert df.where(F.col("offset") >= offsets[5]).count() == 5
    assert df.count() == 10
    copy = new_station(api)
    df.write.format("stations").option("url", srv.url).option("station", copy).option(
        "msgIdColumn", "offset"
    ).mode("append").save()
    assert len(all_messages(api, copy)) == 10


def test_pushdown_narrows_only_on_offsets_and_sends_no_time_the_server_refuses(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    """``-1`` and ``earliest`` were taken for position 0 and a sub-position was ignored, so
    the read range dropped rows the filter (evaluated as text) matches; a time before 1970 or
    after 9999 was sent to ``/offsets?time=``, whose 400 failed the query."""
    import stations.spark

    stations.spark.register(spark, filter_pushdown=True)
    name = new_station(api)
    offsets = produce(api, name, [{"data": k} for k in range(10)])
    df = reader(spark, srv, name).option("numPartitions", "2").load()
    rows = df.collect()
    sub = "0000000000000005_0000000000000001"
    utc = UTC
    conditions = [
        F.col("offset") > "-1",
        F.col("offset") >= "-1",
        F.col("offset") < "earliest",
        F.col("offset") <= "earliest",
        F.col("offset") < sub,
        F.col("offset") <= sub,
        F.col("offset") > sub,
        F.col("offset") >= sub,
        F.col("offset") == sub,
        F.col("offset") > offsets[5],
        F.col("offset") <= offsets[5],
        F.col("offset") == offsets[5],
        F.col("offset") < offsets[5] + "\n",
        F.col("timestamp") >= datetime(1969, 1, 1, tzinfo=utc),
        F.col("timestamp") > datetime(1900, 1, 1, tzinfo=utc),
        F.col("timestamp") < datetime(1960, 1, 1, tzinfo=utc),
        F.col("timestamp") <= datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        F.col("timestamp") == datetime(1969, 1, 1, tzinfo=utc),
    ]
    expected = [
        10,
        10,
        10,
        10,
        6,
        6,
        4,
        4,
        0,
        4,
        6,
        1,
        6,
        10,
        10,
        0,
        10,
        0,
    ]
    # What Spark alone answers, on every row:
    assert sum(1 for r in rows if r.offset > "-1") == 10
    assert sum(1 for r in rows if r.offset < sub) == 6
    assert [df.where(c).count() for c in conditions] == expected


# -- 4b: a stream from the start of a station retention emptied -------------------------------


def test_a_stream_from_the_start_of_a_station_retention_emptied_reads_nothing(
    srv: Server, api: httpx.Client
) -> None:
    """Batch 0 was planned from position 0, which retention dropped: a data-loss failure the
    query replayed on every restart, where a batch read answers no rows."""
    name = new_station(api, retention={"maxAgeMs": 200})
    produce(api, name, [{"data": k} for k in range(3)])
    deadline = time.monotonic() + 30
    while all_messages(api, name):
        assert time.monotonic() < deadline, "retention did not drop the messages"
        time.sleep(0.1)
    for options in ({}, {"startingOffset": "earliest", "numPartitions": "3"}):
        cfg = Config.parse({"url": srv.url, "station": name, **options})
        for limit in (None, ReadMaxRows(2)):
            stream = _stream(cfg)
            start = stream.initialOffset()
            end = stream.latestOffset(start, limit or stream.getDefaultReadLimit())
            assert end["offset"] == token(3)
            assert _read(cfg, stream, start, end) == []  # nothing to read, no data loss
            assert stream.latestOffset(end, limit or stream.getDefaultReadLimit()) == end


# -- 4c: a binary data column into a JSON station ---------------------------------------------


def test_a_binary_data_column_into_a_json_station_stores_its_json_in_both_writes(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    """A batch write stored the JSON the bytes hold; a streaming write stored a JSON string of
    their base64 (e.g. a Kafka ``value`` column mirrored with writeStream)."""
    source, batch, streamed = new_station(api), new_station(api), new_station(api)
    produce(api, source, [{"data": {"a": 1}}, {"data": [1, "x"]}])
    as_bytes = F.col("data").cast("binary").alias("data")
    reader(spark, srv, source).load().select("offset", as_bytes).write.format("stations").mode(
        "append"
    ).option("url", srv.url).option("station", batch).option("msgIdColumn", "offset").save()
    query = (
        spark.readStream.format("stations")
        .option("url", srv.url)
        .option("station", source)
        .load()
        .select(as_bytes)
        .writeStream.format("stations")
        .option("url", srv.url)
        .option("station", streamed)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    for name in (batch, streamed):
        stored = sorted(json.dumps(m["data"]) for m in all_messages(api, name))
        assert stored == ['[1, "x"]', '{"a": 1}'], name

    # Bytes that are not UTF-8 JSON fail the write naming the column, in both writes.
    schema = StructType([StructField("body", BinaryType())])
    cfg = Config.parse({"url": srv.url, "station": batch, "dataColumn": "body"})
    shape = RowShape.of(cfg, schema, is_json=True)
    assert shape.payload({"body": b'{"b":2}'}) == {"b": 2}
    for bad in (b"\xff\xfe", b"not json"):
        with pytest.raises(ValueError, match="column 'body' must hold UTF-8 JSON"):
            shape.payload({"body": bad})
        with pytest.raises(ValueError, match="column 'body' must hold UTF-8 JSON"):
            shape.message({"body": bad})
    with pytest.raises(StreamingQueryException, match="column 'body' must hold UTF-8 JSON"):
        q = (
            spark.readStream.format("stations")
            .option("url", srv.url)
            .option("station", source)
            .load()
            .select(F.lit(b"\xff").cast("binary").alias("body"))
            .writeStream.format("stations")
            .option("url", srv.url)
            .option("station", streamed)
            .option("dataColumn", "body")
            .option("checkpointLocation", str(tmp_path / "ckpt-bad"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
    assert len(all_messages(api, streamed)) == 2


# -- 7: a streaming startingOffset past the end -----------------------------------------------


def test_a_stream_starting_past_the_end_names_the_option(srv: Server, api: httpx.Client) -> None:
    """It failed with "was it deleted and created again? ... set failOnDataLoss=false", which
    blames a deletion and a data loss that did not happen."""
    name = new_station(api)
    produce(api, name, [{"data": k} for k in range(3)])
    for fail_on_data_loss in ("true", "false"):
        cfg = Config.parse(
            {
                "url": srv.url,
                "station": name,
                "startingOffset": token(10),
                "failOnDataLoss": fail_on_data_loss,
            }
        )
        stream = _stream(cfg)
        with pytest.raises(ValueError, match=r"startingOffset 0+10_0+ is past the end") as failed:
            stream.latestOffset(stream.initialOffset(), stream.getDefaultReadLimit())
        assert "deleted" not in str(failed.value)
    # At the end exactly: nothing to read yet, no error.
    cfg = Config.parse({"url": srv.url, "station": name, "startingOffset": token(3)})
    stream = _stream(cfg)
    start = stream.initialOffset()
    assert stream.latestOffset(start, stream.getDefaultReadLimit()) == start
