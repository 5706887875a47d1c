"""The Spark data source against the findings of review P (2, 3, 4, 4b, 4c and 7), with a
live server; the fixtures and one ``local[2]`` SparkSession come from ``tests.test_spark``.

Each test failed on the code the review read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.harness import IN_CI, Server

try:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, DecimalType, StringType, StructField, StructType

    from stations.spark.options import Config
    from stations.spark.rows import RowShape, dumps
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


# -- 4: filter pushdown -----------------------------------------------------------------------


def test_pushdown_narrows_only_on_offsets_and_sends_no_time_the_server_refuses(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    """``-1`` and ``earliest`` were taken for position 0 and a sub-position was ignored, so
    the read range dropped rows the filter (evaluated as text) matches; a time before 1970 or
    after 9999 was sent to ``/offsets?time=``, whose 400 failed the query."""
    import stations.spark

    stations.spark.register(spark)  # the source with filter pushdown
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
