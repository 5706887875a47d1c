"""The PySpark connector (``stations.spark``) and ``stations pipeline``, against a live server.

One ``local[2]`` SparkSession serves the module. PySpark is the optional extra ``stations[spark]``:
without it these tests skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.harness import IN_CI, ClockServer, Server

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from stations.spark import StationsDataSource, StationsFencedError
    from stations.spark.offsets import OffsetRange, token
    from stations.spark.options import Config
    from stations.spark.stream_write import StationsStreamWriter
    from stations.spark.stream_write import stream_producer as StreamProducer
except ImportError:
    if IN_CI:  # the CI installs the spark extra: a missing PySpark is a failure there
        raise
    pytest.skip(
        "PySpark / pyarrow not installed: pip install -e '.[spark]'", allow_module_level=True
    )

from stations.spark import pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    saved = {key: os.environ.get(key) for key in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Workers unpickle the test's own data source subclass: they must find this package.
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("stations-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(StationsDataSource)
    session.dataSource.register(FailingCommitSource)
    session.dataSource.register(FailingWriteSource)
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("spark")
    server = Server(f"sqlite:///{workdir / 'stations-data' / 'stations.db'}", workdir).start()
    yield server
    server.kill()


@pytest.fixture
def api(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def new_station(api: httpx.Client, **config: Any) -> str:
    name = f"sp-{uuid.uuid4().hex[:10]}"
    r = api.post("/api/stations", json={"name": name, **config})
    assert r.status_code == 201, r.text
    return name


def produce(api: httpx.Client, name: str, messages: list[dict[str, Any]]) -> list[str]:
    r = api.post(f"/api/stations/{quote(name, safe='')}/messages", json={"messages": messages})
    assert r.status_code == 200, r.text
    return [x["offset"] for x in r.json()["results"]]


def stats(api: httpx.Client, name: str) -> dict[str, Any]:
    r = api.get(f"/api/stations/{quote(name, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()["stats"]  # type: ignore[no-any-return]


def all_messages(api: httpx.Client, name: str) -> list[dict[str, Any]]:
    out, offset = [], "-1"
    while True:
        r = api.get(f"/api/stations/{quote(name, safe='')}/messages?offset={offset}&limit=1000")
        page = r.json()
        out += page["messages"]
        if page["upToDate"]:
            return out
        offset = page["nextOffset"]


def reader(spark: SparkSession, srv: Server, station: str) -> Any:
    return spark.read.format("stations").option("url", srv.url).option("station", station)


# -- a sink whose commit fails once, to make Spark replay a batch ------------------------------


class FailOnceCommitWriter(StationsStreamWriter):
    marker = ""

    def commit(self, messages: list[Any], batchId: int) -> None:
        if not os.path.exists(self.marker):
            Path(self.marker).write_text(str(batchId))
            raise RuntimeError(f"injected failure in commit of batch {batchId}")


class FailingCommitSource(StationsDataSource):
    @classmethod
    def name(cls) -> str:
        return "stations_fail_commit_once"

    def streamWriter(self, schema: StructType, overwrite: bool) -> FailOnceCommitWriter:
        writer = FailOnceCommitWriter(self.cfg, schema, overwrite)
        writer.marker = self.options["failMarker"]
        return writer


class FailWriteWriter(StationsStreamWriter):
    """While ``marker`` exists, every task fails after reading 50 rows (and sending the
    first chunks of them)."""

    marker = ""

    def write(self, iterator: Any) -> Any:
        if not os.path.exists(self.marker):
            return super().write(iterator)

        def rows() -> Iterator[Any]:
            n = 0
            for batch in iterator:
                for i in range(batch.num_rows):
                    if n == 50:
                        time.sleep(2)  # the other running task sends its first chunk meanwhile
                        raise RuntimeError("injected failure in a task")
                    n += 1
                    yield batch.slice(i, 1)

        return super().write(rows())


class FailingWriteSource(StationsDataSource):
    @classmethod
    def name(cls) -> str:
        return "stations_fail_write"

    def streamWriter(self, schema: StructType, overwrite: bool) -> FailWriteWriter:
        writer = FailWriteWriter(self.cfg, schema, overwrite)
        writer.marker = self.options["failMarker"]
        return writer


# -- tests ------------------------------------------------------------------------------------


def test_importing_stations_does_not_import_pyspark() -> None:
    code = "import sys, stations, stations.cli, stations.spark.pipeline; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_batch_read_of_a_range_in_parallel_partitions(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    name = new_station(api)
    sent = [
        {"id": f"m-{i}", "data": {"n": i, "s": "é"}, "headers": {"k": str(i % 3)}}
        for i in range(500)
    ]
    offsets = produce(api, name, sent)

    df = (
        reader(spark, srv, name)
        .option("startingOffset", offsets[100])
        .option("endingOffset", offsets[400])
        .option("numPartitions", "3")
        .option("pageSize", "70")
        .load()
    )
    assert df.columns == ["offset", "msgId", "headers", "data", "timestamp"]
    assert df.rdd.getNumPartitions() == 3
    rows = df.withColumn("part", F.spark_partition_id()).collect()
    assert [r.offset for r in rows] == offsets[100:400]  # the range, once, in order
    assert [r.msgId for r in rows] == [f"m-{i}" for i in range(100, 400)]
    assert [json.loads(r.data) for r in rows] == [m["data"] for m in sent[100:400]]
    assert [r.headers for r in rows] == [m["headers"] for m in sent[100:400]]
    assert all(r.timestamp is not None for r in rows)
    by_part: dict[int, list[str]] = {}
    for r in rows:
        by_part.setdefault(r.part, []).append(r.offset)
    assert sorted(len(v) for v in by_part.values()) == [100, 100, 100]  # split by offset range

    everything = reader(spark, srv, name).option("startingOffset", "-1").load()
    assert everything.count() == 500

    text = new_station(api, contentType="text/plain")
    produce(api, text, [{"data": "plain"}, {"data": "{not json"}])
    assert [r.data for r in reader(spark, srv, text).load().collect()] == ["plain", "{not json"]


def test_stream_read_resumes_from_its_checkpoint_exactly_once(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    name = new_station(api)
    produce(api, name, [{"id": f"a-{i}", "data": i} for i in range(250)])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run() -> list[tuple[int, int]]:
        query = (
            spark.readStream.format("stations")
            .option("url", srv.url)
            .option("station", name)
            .option("maxMessagesPerTrigger", "100")
            .option("numPartitions", "2")
            .load()
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive
        return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]

    first = run()
    assert first == [(0, 100), (1, 100), (2, 50)]  # admission control: at most 100 a batch
    produce(api, name, [{"id": f"b-{i}", "data": 250 + i} for i in range(150)])
    second = run()
    assert second == [(3, 100), (4, 50)]  # resumes right after batch 2: nothing repeated

    rows = spark.read.parquet(out).select("offset", "msgId", "data").collect()
    expected = [m["offset"] for m in all_messages(api, name)]
    assert sorted(r.offset for r in rows) == expected  # every message exactly once
    assert sorted(int(r.data) for r in rows) == list(range(400))


def test_batch_write_run_twice_stores_once(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    name = new_station(api)
    df = spark.range(0, 300, numPartitions=3).select(
        F.concat(F.lit("order-"), (F.col("id") % 250).cast("string")).alias("order"),
        (F.col("id") * 2).alias("total"),
        F.create_map(F.lit("src"), F.lit("spark")).alias("headers"),
    )
    report = tmp_path / "report.json"

    def write() -> dict[str, Any]:
        (
            df.write.format("stations")
            .mode("append")
            .option("url", srv.url)
            .option("station", name)
            .option("msgIdColumn", "order")
            .option("chunkSize", "64")
            .option("reportPath", str(report))
            .save()
        )
        return json.loads(report.read_text())  # type: ignore[no-any-return]

    first = write()
    assert (first["rows"], first["stored"], first["duplicates"]) == (300, 250, 50)
    second = write()
    assert (second["rows"], second["stored"], second["duplicates"]) == (300, 0, 300)
    assert stats(api, name)["messages"] == 250
    stored = all_messages(api, name)
    assert sorted(m["id"] for m in stored) == sorted(f"order-{i}" for i in range(250))
    one = next(m for m in stored if m["id"] == "order-7")
    assert one["data"] == {"order": "order-7", "total": 14} and one["headers"] == {"src": "spark"}

    with pytest.raises(Exception, match="msgIdColumn"):  # no ids: refused, not silently doubled
        df.write.format("stations").mode("append").option("url", srv.url).option(
            "station", name
        ).save()
    assert stats(api, name)["messages"] == 250


def test_stream_write_replayed_after_a_failed_commit_stores_once(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    source = new_station(api)
    produce(api, source, [{"data": {"n": i}} for i in range(300)])
    sink = new_station(api)
    marker, checkpoint = tmp_path / "failed-once", str(tmp_path / "checkpoint")

    def run() -> Any:
        return (
            spark.readStream.format("stations")
            .option("url", srv.url)
            .option("station", source)
            .option("numPartitions", "3")
            .load()
            .writeStream.format("stations_fail_commit_once")
            .option("url", srv.url)
            .option("station", sink)
            .option("chunkSize", "40")
            .option("failMarker", str(marker))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    query = run()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        query.awaitTermination(120)
    assert marker.read_text() == "0"
    assert stats(api, sink)["messages"] == 300  # the tasks wrote before the commit failed

    query = run()  # restart from the checkpoint: batch 0 runs again
    query.awaitTermination(120)
    assert [p["batchId"] for p in query.recentProgress] == [0]
    assert query.recentProgress[0]["numInputRows"] == 300
    assert stats(api, sink)["messages"] == 300  # the replay was answered as duplicates
    assert sorted(m["data"]["n"] for m in all_messages(api, sink)) == list(range(300))


def test_a_stream_write_failed_mid_batch_restarted_with_other_options_loses_no_row(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    """A batch whose tasks failed midway is replayed under the numPartitions and chunkSize of
    the restart. Replayed under another split (or in other chunks), a task's producer sent
    other rows under the sequence numbers its first attempt used, the server answered them as
    duplicates, and rows never stored were lost (found by a review: 40 of 300 rows for
    3 partitions then 2, 60 for chunks of 40 then 100). Once the split was kept, another
    chunkSize alone still duplicated rows (it was part of the producer id, so the replay's
    producer was a new one: 40 of 300 for chunks of 40 then 100); now the replay sends the
    first attempt's chunks again, larger or smaller."""
    cases = (((3, 40), (2, 40)), ((1, 40), (1, 100)), ((1, 40), (1, 15)))
    for (parts, chunk), (parts_again, chunk_again) in cases:
        source = new_station(api)
        produce(api, source, [{"data": {"n": i}} for i in range(300)])
        sink = new_station(api)
        marker = tmp_path / f"fail-{sink}"
        options = {
            "url": srv.url,
            "station": sink,
            "failMarker": str(marker),
            "checkpointLocation": str(tmp_path / f"checkpoint-{sink}"),
        }
        stream = reader_stream(spark, srv, source)

        marker.write_text("fail")
        query = mirror(stream, parts, chunk, options)
        with pytest.raises(StreamingQueryException, match="injected failure"):
            query.awaitTermination(120)
        assert 0 < stats(api, sink)["messages"] < 300  # a first chunk of 40 rows, or two
        marker.unlink()
        query = mirror(stream, parts_again, chunk_again, options)  # batch 0 again
        query.awaitTermination(120)
        assert query.exception() is None
        stored = sorted(m["data"]["n"] for m in all_messages(api, sink))
        # The replay keeps the first split and the first chunks: each row once.
        assert stored == list(range(300)), (parts, chunk)


def reader_stream(spark: SparkSession, srv: Server, station: str) -> Any:
    return spark.readStream.format("stations").option("url", srv.url).option("station", station)


def mirror(stream: Any, parts: int, chunk: int, options: dict[str, str]) -> Any:
    """Start ``stream`` (read in ``parts`` ranges) into the failing sink, ``chunk`` rows a request."""
    return (
        stream.option("numPartitions", str(parts))
        .load()
        .writeStream.format("stations_fail_write")
        .options(**options)
        .option("chunkSize", str(chunk))
        .trigger(availableNow=True)
        .start()
    )


def test_a_zombie_producer_of_an_older_batch_is_fenced(srv: Server, api: httpx.Client) -> None:
    name = new_station(api)
    cfg = Config.parse({"url": srv.url, "station": name})

    def producer(epoch: int) -> StreamProducer:
        return StreamProducer(cfg, producer_id="q:0", epoch=epoch, content_type="application/json")

    new = producer(5)
    assert new.append(b"[1,2]") is True
    replay = producer(5)
    assert replay.append(b"[1,2]") is False  # same (epoch, seq): a duplicate
    zombie = producer(4)
    with pytest.raises(StationsFencedError, match="fenced by epoch 5"):
        zombie.append(b"[3]")
    for p in (new, replay, zombie):
        p.close()
    assert stats(api, name)["messages"] == 2


def test_pipeline_ingest_of_parquet_with_repeated_ids(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    unique = 1800
    ids = [f"user-{i}" for i in range(unique)] + [f"user-{i * 9}" for i in range(200)]  # 10 %
    path = tmp_path / "events.parquet"
    pq.write_table(
        pa.table({"event_id": ids, "amount": [float(i) for i in range(2000)]}),
        path,
        row_group_size=500,
    )
    name = f"ingest-{uuid.uuid4().hex[:8]}"  # the pipeline creates the station
    args = ["ingest", "--from", str(path), "--format", "parquet", "--station", name]
    args += ["--msg-id-column", "event_id", "--url", srv.url, "--partitions", "3", "--progress"]

    out = io.StringIO()
    with redirect_stdout(out):
        assert pipeline.main(args, spark=spark) == 0
    assert "2,000 rows read, 1,800 stored, 200 duplicates" in out.getvalue()
    assert stats(api, name)["messages"] == unique
    assert sorted(m["id"] for m in all_messages(api, name)) == sorted(set(ids))

    out = io.StringIO()
    with redirect_stdout(out):  # running the job again stores nothing
        assert pipeline.main(args, spark=spark) == 0
    assert "2,000 rows read, 0 stored, 2,000 duplicates" in out.getvalue()
    assert stats(api, name)["messages"] == unique


def test_pipeline_ingest_reads_ids_as_the_text_they_are(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    """Re-running an ingest over a directory that grew stores only the new rows: with the id
    column's type inferred, CSV ids 001-003 were read as numbers (1-3) in the first run and as
    text once a file with A04 came, JSON ids 1 and 2 as 1.0 and 2.0 once 2.5 came, and every
    old row was stored again (found by a review)."""
    for fmt, first, more, second in (
        ("csv", "order_id,total\n001,10\n002,20\n003,30\n", "order_id,total\nA04,40\n", 4),
        ("json", '{"order_id": 1, "t": 1}\n{"order_id": 2, "t": 2}\n', '{"order_id": 2.5}\n', 3),
    ):
        folder = tmp_path / fmt
        folder.mkdir()
        (folder / f"a.{fmt}").write_text(first)
        name = f"ingest-{uuid.uuid4().hex[:8]}"
        args = ["ingest", "--from", str(folder), "--format", fmt, "--station", name]
        args += ["--msg-id-column", "order_id", "--url", srv.url]
        with redirect_stdout(io.StringIO()):
            assert pipeline.main(args, spark=spark) == 0
        (folder / f"b.{fmt}").write_text(more)
        out = io.StringIO()
        with redirect_stdout(out):
            assert pipeline.main(args, spark=spark) == 0
        assert f"{second} rows read, 1 stored, {second - 1} duplicates" in out.getvalue()
        ids = sorted(m["id"] for m in all_messages(api, name))
        assert ids == (["001", "002", "003", "A04"] if fmt == "csv" else ["1", "2", "2.5"])


def test_pipeline_ingest_keeps_whole_rows_with_data_or_headers_columns(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    """A file whose rows have a ``data`` or ``headers`` column: the data source takes those
    by default as the payload (the other columns were dropped, the summary said "stored") or
    as the headers (a string column failed the job with an option the command does not
    have). Each row is one message with all its columns (a review of 2026-11-29)."""
    struct = tmp_path / "struct.jsonl"
    struct.write_text(
        "".join(
            json.dumps({"order_id": f"o{i}", "customer": "c", "data": {"k": i}}) + "\n"
            for i in range(5)
        )
    )
    flat = tmp_path / "flat.csv"
    flat.write_text("id,data,headers\n" + "".join(f"r{i},d{i},h{i}\n" for i in range(4)))
    for path, fmt, id_column, first in (
        (struct, "json", "order_id", {"order_id": "o0", "customer": "c", "data": {"k": 0}}),
        (flat, "csv", "id", {"id": "r0", "data": "d0", "headers": "h0"}),
    ):
        name = f"ingest-{uuid.uuid4().hex[:8]}"
        args = ["ingest", "--from", str(path), "--format", fmt, "--station", name]
        args += ["--msg-id-column", id_column, "--url", srv.url]
        with redirect_stdout(io.StringIO()):
            assert pipeline.main(args, spark=spark) == 0
        stored = {m["id"]: m["data"] for m in all_messages(api, name)}
        assert stored[first[id_column]] == first, stored
        assert len(stored) == (5 if fmt == "json" else 4)


def test_pipeline_ingest_of_nothing_readable_is_one_line(
    spark: SparkSession, srv: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    args = ["ingest", "--from", str(tmp_path / "empty"), "--format", "parquet"]
    args += ["--station", f"ingest-{uuid.uuid4().hex[:8]}", "--url", srv.url, "--allow-duplicates"]
    assert pipeline.main(args, spark=spark) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Spark cannot read it" in err[0], err


def test_pipeline_export_of_the_dls(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    name = new_station(api)
    produce(api, name, [{"id": f"p-{i}", "data": {"n": i}} for i in range(25)])
    q = quote(name, safe="")
    r = api.put(f"/api/stations/{q}/groups/g", json={"maxMsgDeliveries": 1})
    assert r.status_code == 201, r.text
    fetched = api.post(f"/api/stations/{q}/groups/g/fetch", json={"max": 25, "waitMs": 1000})
    offsets = [m["offset"] for m in fetched.json()["messages"]]
    assert len(offsets) == 25
    r = api.post(f"/api/stations/{q}/groups/g/nack", json={"offsets": offsets})
    assert r.json()["nacked"] == 25
    assert stats(api, name)["deadLettered"] == 25

    target = tmp_path / "dls"
    args = ["export", "--station", name, "--to", str(target), "--dls", "--url", srv.url]
    out = io.StringIO()
    with redirect_stdout(out):
        assert pipeline.main(args, spark=spark) == 0
    assert "25 DLS entries read, 25 rows written" in out.getvalue()
    table = pq.read_table(target).to_pylist()
    assert sorted(e["msgId"] for e in table) == sorted(f"p-{i}" for i in range(25))
    assert {(e["group"], e["reason"], e["deliveryCount"]) for e in table} == {
        ("g", "max_deliveries", 1)
    }
    assert sorted(json.loads(e["data"])["n"] for e in table) == list(range(25))

    paged = reader(spark, srv, name).option("dls", "true").option("pageSize", "7").load()
    assert paged.count() == 25  # four pages, followed through `next`


def test_pipeline_rerun_after_the_default_window_stores_nothing_twice(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = tmp_path / "clock"
    clock.write_text("0")
    server = ClockServer(f"sqlite:///{tmp_path / 'stations.db'}", tmp_path, clock=clock).start()
    try:
        path = tmp_path / "orders.parquet"
        pq.write_table(pa.table({"order_id": [f"o-{i}" for i in range(300)]}), path)
        with httpx.Client(base_url=server.url, timeout=30) as api:
            # A station made by hand keeps the default 2-minute window: the control.
            assert api.post("/api/stations", json={"name": "short"}).status_code == 201

            def ingest(station: str) -> str:
                argv = ["ingest", "--from", str(path), "--station", station]
                argv += ["--msg-id-column", "order_id", "--url", server.url, "--partitions", "2"]
                out = io.StringIO()
                with redirect_stdout(out):
                    assert pipeline.main(argv, spark=spark) == 0
                return out.getvalue()

            assert "300 stored" in ingest("orders")  # the pipeline creates this station
            assert "created station orders (ids remembered for 24 h)" in capsys.readouterr().err
            assert "300 stored" in ingest("short")
            warning = capsys.readouterr().err
            assert "station short remembers message ids for 2 m (idempotencyWindowMs=120000)" in (
                warning
            )

            clock.write_text(str(3 * 60))  # three minutes later: the default window is over
            assert "300 stored, 0 duplicates" in ingest("short")  # the trap, on the control
            assert "300 rows read, 0 stored, 300 duplicates" in ingest("orders")
            assert stats(api, "orders")["messages"] == 300
            assert stats(api, "short")["messages"] == 600
    finally:
        server.kill()


def test_a_streaming_query_commits_its_cursor_and_its_lag_goes_to_zero(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    from tests.browser import chromium, missing, require_browser

    name = new_station(api)
    produce(api, name, [{"data": i} for i in range(120)])
    checkpoint = str(tmp_path / "checkpoint")
    cursor_path = f"/api/stations/{quote(name, safe='')}/cursors/mirror-q"

    def run() -> None:
        query = (
            spark.readStream.format("stations")
            .option("url", srv.url)
            .option("station", name)
            .option("cursor", "mirror-q")
            .option("maxMessagesPerTrigger", "50")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None

    def lag_metric() -> float | None:
        text = api.get("/metrics").text
        line = f'stations_cursor_lag{{cursor="mirror-q",station="{name}"}} '
        found = [ln for ln in text.splitlines() if ln.startswith(line)]
        return float(found[0].split()[-1]) if found else None

    assert api.get(cursor_path).status_code == 404
    run()
    view = api.get(cursor_path).json()
    assert view["offset"] == stats(api, name)["tailOffset"] and view["lag"] == 0
    produce(api, name, [{"data": i} for i in range(40)])  # the query is behind by 40 now
    assert api.get(cursor_path).json()["lag"] == 40
    listed = api.get(f"/api/stations/{quote(name, safe='')}/cursors").json()["cursors"]
    assert [(c["name"], c["lag"]) for c in listed] == [("mirror-q", 40)]
    assert lag_metric() == 40

    require_browser()
    assert missing() is None
    from playwright.sync_api import expect

    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{srv.url}/ui/#/s/{quote(name, safe='')}/groups")
        row = page.locator("table.cursors tbody tr", has_text="mirror-q")
        expect(row.locator("td").nth(1)).to_have_text("40", timeout=10_000)
        run()  # resumed from its checkpoint: it catches up
        expect(row.locator("td").nth(1)).to_have_text("0", timeout=10_000)
        page.close()
    assert api.get(cursor_path).json()["lag"] == 0
    assert lag_metric() == 0


def test_batch_reads_push_offset_and_time_filters_to_the_server(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    import time

    import stations.spark

    stations.spark.register(spark, filter_pushdown=True)
    name = new_station(api)
    offsets: list[str] = []
    for part in range(3):
        offsets += produce(api, name, [{"data": {"part": part, "n": i}} for i in range(100)])
        time.sleep(0.01)  # the parts get distinct store times (milliseconds)
    stored = all_messages(api, name)
    since = datetime.fromisoformat(stored[100]["time"].replace("Z", "+00:00"))
    assert stored[99]["time"] < stored[100]["time"]

    def page_requests() -> float:
        line = 'stations_http_requests_total{method="GET",route="/api/stations/{name}/messages",'
        text = api.get("/metrics").text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(line))

    df = reader(spark, srv, name).option("pageSize", "10").option("numPartitions", "1").load()

    before = page_requests()
    rows = df.where(F.col("offset") >= offsets[250]).select("offset").collect()
    assert sorted(r.offset for r in rows) == offsets[250:]
    assert page_requests() - before <= 8  # 5 pages of 10, not the 30 of a full scan

    before = page_requests()
    rows = df.where(F.col("timestamp") >= since).select("data").collect()
    assert sorted((d["part"], d["n"]) for d in (json.loads(r.data) for r in rows)) == [
        (p, n) for p in (1, 2) for n in range(100)
    ]
    assert page_requests() - before <= 24  # 20 pages of 10 (+ probes), not 30

    early = df.where(F.col("timestamp") < since).where(F.col("offset") >= offsets[50]).count()
    assert early == 50
    assert (
        api.get(
            f"/api/stations/{quote(name, safe='')}/offsets", params={"time": stored[100]["time"]}
        ).json()["offset"]
        == offsets[100]
    )


def test_a_streaming_write_to_a_missing_station_fails_when_it_starts(
    spark: SparkSession, srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    source = new_station(api)
    produce(api, source, [{"data": 1}])
    with pytest.raises(Exception, match="station 'no-such-station' does not exist") as failed:
        query = (
            spark.readStream.format("stations")
            .option("url", srv.url)
            .option("station", source)
            .load()
            .select("data")
            .writeStream.format("stations")
            .option("url", srv.url)
            .option("station", "no-such-station")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        raise AssertionError(f"the query ran: {query.exception()}")
    assert "no-such-station" in str(failed.value)


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("StationsError", 6),  # a proxy's 502 page: no status of ours, as the commands say
        ("ConnectionFailed", 6),
        ("GroupNotFound", 3),
        ("Gone", 3),
        ("SequenceGap", 4),
        ("Unauthorized", 5),
        ("BadRequest", 1),
    ],
)
def test_a_failed_spark_task_exits_with_the_commands_code_for_its_error(
    name: str, code: int
) -> None:
    """The pipeline's exit codes for an SDK error in a Spark task came from a hand-written
    table that missed most classes (a proxy's 502 exited 2, "usage error", where the
    management commands say 6)."""
    from stations.spark.launch import PipelineError, run_spark

    text = (
        "pyspark.errors.exceptions.captured.PythonException:\nTraceback (most recent call "
        f"last):\n  ...\nstations.client.errors.{name}: GET /api/stations/o: HTTP 502\n"
    )

    def job() -> None:
        raise RuntimeError(text)

    with pytest.raises(PipelineError) as failed:
        run_spark(job, "http://127.0.0.1:4437")
    assert failed.value.code == code


def test_spark_failures_become_one_line_with_the_fix() -> None:
    from stations.spark.launch import one_line

    worker = (
        "pyspark.errors.exceptions.captured.PythonException:\n"
        "  An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
        '  File "/x/worker.py", line 9, in main\nModuleNotFoundError: No module named '
        "'pyarrow.lib'\n\tat org.apache.spark.api.python.BasePythonRunner(...)\n"
    )
    line = one_line(worker, "http://10.0.0.5:4437")
    assert line is not None and "cannot import 'pyarrow'" in line
    assert "pip install '/path/to/stations[spark]'" in line and "\n" not in line
    refused = (
        "Traceback (most recent call last):\n  ...\nstations.client.errors.ConnectionFailed: "
        "GET http://127.0.0.1:4437/api/stations/o/messages: ConnectionRefusedError: [Errno 111]\n"
        "\tat org.apache.spark.api.python.PythonRunner(...)\n"
    )
    line = one_line(refused, "http://127.0.0.1:4437")
    assert line is not None and line.startswith("Spark executors cannot reach")
    assert "not 127.0.0.1 when executors run elsewhere" in line and "\n" not in line


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"timeout": "abc"}, "option timeout"),
        ({"timeout": "-5"}, "option timeout"),
        ({"url": "http://127.0.0.1:99999"}, "option url"),
        ({"url": "notaurl"}, "option url"),
        ({"token": "a\nb"}, "option token"),
        ({"producerIdPrefix": "p" * 300}, "option producerIdPrefix"),
        ({"numPartitions": "x"}, "option numPartitions must be an integer"),
        ({"failOnDataLoss": "maybe"}, "option failOnDataLoss must be true or false"),
        ({"startingOffsets": "-1"}, "option startingOffsets is not an option .* startingOffset"),
        ({"maxOffsetsPerTrigger": "5"}, "did you mean maxMessagesPerTrigger"),
        ({"maxMessagesPerTriger": "5"}, "did you mean maxMessagesPerTrigger"),
        (
            {"startingOffset": "0000000000000009_0000000000000000", "endingOffset": "-1"},
            "option startingOffset 0000000000000009_0000000000000000 is after option endingOffset",
        ),
    ],
)
def test_connection_options_are_checked_and_named(options: dict[str, str], named: str) -> None:
    """Found by a review: these failed deep inside (a float() or the transport), or only at the
    server on the first write, without naming the option. A later review: the names came
    lowercased (numpartitions), and a near miss of an option (Kafka's startingOffsets, a typo)
    was ignored, so the job silently read the whole station."""
    with pytest.raises(ValueError, match=named):
        Config.parse({"station": "s", **options})
    others = {"checkpointLocation": "/cp", "queryName": "q", "failMarker": "m"}
    assert Config.parse({"station": "s", **others}).station == "s"  # other layers' options


def test_a_stream_refuses_an_ending_offset() -> None:
    """Found by a review: a streaming read ignored endingOffset and ran unbounded."""
    from stations.spark.stream_read import StationsStreamReader

    cfg = Config.parse({"station": "s", "endingOffset": "0000000000000009_0000000000000000"})
    with pytest.raises(ValueError, match="option endingOffset is for batch reads"):
        StationsStreamReader(cfg, StructType())


@pytest.mark.parametrize(
    ("kind", "options", "named"),
    [
        ("read", {"group": "billing"}, "option group is for dead-letter reads .*dls=true"),
        ("read", {"dls": "false", "group": "g"}, "option group is for dead-letter reads"),
        ("read", {"cursor": "q"}, "option cursor is for streaming reads"),
        ("read", {"maxMessagesPerTrigger": "5"}, "option maxMessagesPerTrigger is for streaming"),
        ("read", {"msgIdColumn": "id"}, "option msgIdColumn is for writes"),
        ("read", {"dls": "true", "startingOffset": "-1"}, "option startingOffset is for reads of"),
        ("read", {"dls": "true", "numPartitions": "4"}, "option numPartitions is for reads of"),
        ("stream_read", {"group": "g"}, "option group is for dead-letter reads"),
        ("stream_read", {"chunkSize": "10"}, "option chunkSize is for writes"),
        ("write", {"msgIdColumn": "id", "startingOffset": "-1"}, "option startingOffset is for r"),
        ("write", {"msgIdColumn": "id", "cursor": "q"}, "option cursor is for reads"),
        ("write", {"msgIdColumn": "id", "producerIdPrefix": "p"}, "option producerIdPrefix is for"),
        ("stream_write", {"reportPath": "/tmp/r.json"}, "option reportPath is for batch writes"),
        ("stream_write", {"allowDuplicates": "true"}, "option allowDuplicates is for batch writes"),
        ("stream_write", {"numPartitions": "2"}, "option numPartitions is for reads"),
    ],
)
def test_options_the_operation_would_ignore_are_refused_by_name(
    kind: str, options: dict[str, str], named: str
) -> None:
    """Found by a review: these were silently ignored, so the job did something else than
    asked (``group`` without ``dls=true`` read the messages, not a group's dead letters;
    ``cursor`` on a batch read stored no progress anywhere)."""
    from stations.spark.read import StationsReader
    from stations.spark.stream_read import StationsStreamReader
    from stations.spark.write import StationsWriter

    cfg = Config.parse({"station": "s", **options})
    with pytest.raises(ValueError, match=named):
        if kind == "read":
            StationsReader(cfg, StructType())
        elif kind == "stream_read":
            StationsStreamReader(cfg, StructType())
        elif kind == "write":
            StationsWriter(cfg, StructType(), False)
        else:
            StationsStreamWriter(cfg, StructType(), False)


def test_options_refused_reach_the_user_and_own_options_pass(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    from stations.spark.read import StationsReader
    from stations.spark.stream_read import StationsStreamReader
    from stations.spark.write import StationsWriter

    name = new_station(api)
    produce(api, name, [{"data": {"n": 1}}])
    with pytest.raises(Exception, match="option group is for dead-letter reads"):
        reader(spark, srv, name).option("group", "g").load().collect()
    assert reader(spark, srv, name).option("dls", "true").option("group", "g").load().count() == 0

    def cfg(**options: str) -> Config:
        return Config.parse({"url": srv.url, "station": name, **options})

    StationsReader(
        cfg(startingOffset="-1", numPartitions="2", failOnDataLoss="false"), StructType()
    )
    StationsStreamReader(cfg(cursor="q", maxMessagesPerTrigger="5"), StructType())
    rows = StructType().add("id", "string").add("data", "string")
    StationsWriter(cfg(msgIdColumn="id", chunkSize="5", reportPath="/tmp/r"), rows, False)
    StationsStreamWriter(cfg(producerIdPrefix="p", chunkSize="5"), StructType(), False)
    text = new_station(api, contentType="text/plain")
    with pytest.raises(ValueError, match="option chunkSize is for JSON stations"):
        StationsStreamWriter(
            Config.parse({"url": srv.url, "station": text, "chunkSize": "5"}), StructType(), False
        )


def test_pipeline_errors_name_the_flag_and_the_token_with_the_cli_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: a bad --from-offset was reported as "option startingOffset", and a
    401 or 403 named neither the station nor whether a token was given."""
    monkeypatch.delenv("STATIONS_TOKEN", raising=False)
    tokens = tmp_path / "tokens.json"
    admin, scoped = "admin-secret-0123456789", "shop-secret-0123456789"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": admin, "role": "admin"},
                    {"token": scoped, "role": "consumer", "stations": ["shop-*"]},
                ]
            }
        )
    )
    server = Server(f"sqlite:///{tmp_path / 'stations.db'}", tmp_path, ["--tokens", str(tokens)])
    server.start()
    try:
        headers = {"Authorization": f"Bearer {admin}"}
        r = httpx.post(f"{server.url}/api/stations", json={"name": "orders"}, headers=headers)
        assert r.status_code == 201, r.text
        export = ["export", "--station", "orders", "--to", str(tmp_path / "out")]
        export += ["--url", server.url]
        # The exit codes are the management commands' (``stations --help``): every failure
        # was 2, "usage error", so a job retried on 6 never retried an outage.
        missing = ["export", "--station", "nosuch", "--to", str(tmp_path / "out2")]
        missing += ["--url", server.url, "--token", admin]
        scoped_file = tmp_path / "scoped-token"
        scoped_file.write_text(scoped + "\n")
        closed = socket.socket()  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
        for args, expected, code in (
            ([*export, "--token", admin, "--from-offset", "abc"], "--from-offset: not a", 2),
            ([*export, "--token", admin, "--to-offset", "7"], "--to-offset: not a Stations", 2),
            (export, f"station orders at {server.url}: a valid bearer token is required", 5),
            (
                [*export, "--token", scoped],
                "does not cover station 'orders' (the --token given)",
                5,
            ),
            (missing, f"station nosuch does not exist at {server.url}", 3),
            ([*export, "--token-file", str(scoped_file)], "does not cover station 'orders'", 5),
            ([*export, "--token-file", str(tmp_path / "none")], "--token-file", 2),
            ([*export[:-1], nobody], f"cannot reach {nobody}", 6),
        ):
            assert pipeline.main(args) == code, args
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and expected in err[0], err
        closed.close()
    finally:
        server.kill()


def test_pipeline_export_of_the_dls_refuses_an_offset_range(
    srv: Server, api: httpx.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a review: export --dls took --from-offset / --to-offset and ignored them (the
    DLS read reads the whole store), so the files held more than the range asked for."""
    name = new_station(api)
    export = ["export", "--station", name, "--to", str(tmp_path / "out"), "--url", srv.url, "--dls"]
    for flag in ("--from-offset", "--to-offset"):
        assert pipeline.main([*export, flag, "0000000000000001_0000000000000000"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag} goes without --dls" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_latest_start_is_the_same_each_time_spark_asks(srv: Server, api: httpx.Client) -> None:
    """Spark asks for the initial offset when it plans batch 0 and again when it runs it (and
    when a restart replays it). "latest" answered the tail of each moment, so messages
    appended in between were never read (found by a review). With ``cursor`` the answer is
    kept on the server and a new reader of the same query starts there too."""
    from pyspark.sql.types import StructType

    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api)
    produce(api, name, [{"data": k} for k in range(3)])
    for options in ({}, {"cursor": "q1"}):
        cfg = Config.parse({"url": srv.url, "station": name, "startingOffset": "latest", **options})
        reader = StationsStreamReader(cfg, StructType())
        first = reader.initialOffset()
        produce(api, name, [{"data": k} for k in range(5)])
        assert reader.initialOffset() == first
        restarted = StationsStreamReader(cfg, StructType())
        if options:
            assert restarted.initialOffset() == first
        else:  # a reader without a cursor has nothing that outlives it
            assert restarted.initialOffset() != first


def test_a_stream_from_the_start_reads_what_retention_kept(srv: Server, api: httpx.Client) -> None:
    """A streaming read from ``-1`` plans its first batch from position 0. Once retention
    dropped the first messages, the zero offset is 410 on the server: the batch is planned from
    the earliest kept position, so it reads what is kept, no data-loss error."""
    import time

    from pyspark.sql.types import StructType

    from stations.spark.read import read_pages
    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api, retention={"maxMessages": 2})
    produce(api, name, [{"data": k} for k in range(5)])
    deadline = time.monotonic() + 10
    while [m["data"] for m in all_messages(api, name)] != [3, 4]:
        assert time.monotonic() < deadline, "retention did not drop the oldest messages"
        time.sleep(0.1)
    cfg = Config.parse({"url": srv.url, "station": name, "numPartitions": "1"})
    stream = StationsStreamReader(cfg, StructType())
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    [part] = stream.partitions(start, end)
    read = [m["data"] for page in read_pages(cfg, part) for m in page]  # type: ignore[arg-type]
    assert read == [3, 4]


def _wait_kept(api: httpx.Client, name: str, kept: list[int]) -> None:
    import time

    deadline = time.monotonic() + 10
    while [m["data"] for m in all_messages(api, name)] != kept:
        assert time.monotonic() < deadline, "retention did not drop the oldest messages"
        time.sleep(0.1)


def test_a_stream_from_the_start_in_partitions_reads_what_was_kept_and_replays_it(
    srv: Server, api: httpx.Client
) -> None:
    """From -1 once retention dropped the first messages, batch 0 was split from position 0:
    every range but the first asked for dropped offsets (410, a false data loss), and the first
    was read as "-1", so a replay after retention dropped more read other rows than its first
    attempt, which a streaming write then took for the same (rows lost). The batch records
    where the kept messages began: its ranges read from there, again on a replay, or fail as
    data loss."""
    from pyspark.sql.types import StructType

    from stations.client.errors import Gone
    from stations.spark.read import read_pages
    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api, retention={"maxMessages": 5})
    produce(api, name, [{"data": k} for k in range(20)])
    _wait_kept(api, name, list(range(15, 20)))
    cfg = Config.parse({"url": srv.url, "station": name, "numPartitions": "4"})
    stream = StationsStreamReader(cfg, StructType())
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    parts = [p for p in stream.partitions(start, end) if isinstance(p, OffsetRange)]
    assert [(p.start, p.end) for p in parts] == [(15, 17), (17, 18), (18, 19), (19, 20)]
    read = [m["data"] for p in parts for page in read_pages(cfg, p) for m in page]
    assert read == list(range(15, 20))

    produce(api, name, [{"data": k} for k in range(20, 23)])
    _wait_kept(api, name, list(range(18, 23)))
    replay = StationsStreamReader(cfg, StructType()).partitions(start, end)
    again = [p for p in replay if isinstance(p, OffsetRange)]
    assert [(p.start, p.end) for p in again] == [(p.start, p.end) for p in parts]
    with pytest.raises(Gone, match="failOnDataLoss"):
        list(read_pages(cfg, again[0]))
    assert [m["data"] for page in read_pages(cfg, again[2]) for m in page] == [18]


def test_a_replayed_stream_range_that_lost_messages_fails_with_fail_on_data_loss_false(
    srv: Server, api: httpx.Client
) -> None:
    """With failOnDataLoss=false a range whose messages retention dropped after its batch
    first ran was read from what was kept: a restart's replay gave the sink fewer rows, at
    other places, than the first attempt, and the streaming write (deduplicating by the place
    of each request) took kept messages the first attempt had not written for written: a
    review's mirror lost 196 of them. Skipping is kept for a batch's first attempt; a replay
    fails, saying why."""
    from pyspark.sql.types import StructType

    from stations.client.errors import Gone
    from stations.spark.read import read_pages
    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api, retention={"maxMessages": 10})
    produce(api, name, [{"data": k} for k in range(10)])
    options = {"url": srv.url, "station": name, "numPartitions": "2", "failOnDataLoss": "false"}
    cfg = Config.parse(options)
    stream = StationsStreamReader(cfg, StructType())
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    parts = [p for p in stream.partitions(start, end) if isinstance(p, OffsetRange)]
    assert [(p.start, p.end) for p in parts] == [(0, 5), (5, 10)]
    produce(api, name, [{"data": k} for k in range(10, 13)])
    _wait_kept(api, name, list(range(3, 13)))
    # Planned by this run: its first attempt skips what was dropped, as asked.
    assert [m["data"] for page in read_pages(cfg, parts[0]) for m in page] == [3, 4]
    replay = StationsStreamReader(cfg, StructType()).partitions(start, end)
    again = [p for p in replay if isinstance(p, OffsetRange)]
    with pytest.raises(Gone, match="first ran"):
        list(read_pages(cfg, again[0]))
    assert [m["data"] for page in read_pages(cfg, again[1]) for m in page] == [5, 6, 7, 8, 9]


def test_a_stream_resumed_past_the_end_of_a_recreated_station_fails(
    srv: Server, api: httpx.Client
) -> None:
    """The station was deleted and created again: its tail is before the checkpoint, and the
    query skipped the new station's first messages without a word."""
    from pyspark.sql.types import StructType

    from stations.client.errors import Gone
    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api)
    produce(api, name, [{"data": k} for k in range(3)])
    cfg = Config.parse({"url": srv.url, "station": name})
    stream = StationsStreamReader(cfg, StructType())
    with pytest.raises(Gone, match="deleted and created again"):
        stream.latestOffset({"offset": token(5)}, stream.getDefaultReadLimit())


def test_a_checkpoint_of_another_station_is_refused(srv: Server, api: httpx.Client) -> None:
    """Offsets recorded only a position: a checkpoint reused on a station deleted and created
    again with more messages (or on another station) read on from there, skipping the new
    station's first messages without a word (found by a review). They name their station."""
    from pyspark.sql.types import StructType

    from stations.client.errors import Gone
    from stations.spark.stream_read import StationsStreamReader

    name, other = new_station(api), new_station(api)
    produce(api, name, [{"data": k} for k in range(3)])
    produce(api, other, [{"data": k} for k in range(9)])
    cfg = Config.parse({"url": srv.url, "station": name, "startingOffset": "earliest"})
    first = StationsStreamReader(cfg, StructType())
    end = first.latestOffset(first.initialOffset(), first.getDefaultReadLimit())
    assert end["offset"] == token(3) and end["station"] == name
    assert api.delete(f"/api/stations/{name}").status_code == 204
    assert api.post("/api/stations", json={"name": name}).status_code == 201
    produce(api, name, [{"data": k} for k in range(9)])
    again = StationsStreamReader(cfg, StructType())  # the query restarted
    with pytest.raises(Gone, match="new checkpointLocation"):
        again.latestOffset(end, again.getDefaultReadLimit())
    with pytest.raises(Gone, match="new checkpointLocation"):  # its last batch replayed
        again.partitions(first.initialOffset(), end)
    elsewhere = StationsStreamReader(Config.parse({"url": srv.url, "station": other}), StructType())
    with pytest.raises(Gone, match="new checkpointLocation"):
        elsewhere.latestOffset(end, elsewhere.getDefaultReadLimit())
    # A checkpoint written before offsets named their station goes on as it did.
    planned = again.latestOffset({"offset": token(3)}, again.getDefaultReadLimit())
    assert planned["offset"] == token(9)


def test_batch_reads_from_the_start_with_a_filter_and_from_the_zero_offset(
    spark: SparkSession, srv: Server, api: httpx.Client
) -> None:
    """A read from -1 narrowed by an offset filter to a dropped position failed as data loss
    (the earliest kept position was looked up only when the range still began at 0); an
    explicit zero offset was read as -1, no data loss though retention had dropped it."""
    import stations.spark

    stations.spark.register(spark, filter_pushdown=True)
    name = new_station(api, retention={"maxMessages": 3})
    produce(api, name, [{"data": k} for k in range(10)])
    _wait_kept(api, name, [7, 8, 9])
    df = reader(spark, srv, name).option("numPartitions", "2").load()
    rows = df.where(F.col("offset") >= token(3)).select("data").collect()
    assert sorted(int(r.data) for r in rows) == [7, 8, 9]
    explicit = reader(spark, srv, name).option("startingOffset", token(0)).load()
    with pytest.raises(Exception, match="failOnDataLoss"):
        explicit.collect()


def test_a_checkpoint_behind_retention_fails_unless_data_loss_is_allowed(
    srv: Server, api: httpx.Client
) -> None:
    """A query resumed from a checkpoint at a position retention dropped since: the read fails
    naming failOnDataLoss (the server's 410), or with failOnDataLoss=false reads what is kept.
    Passed on the code of this review; kept as the check of that promise."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

    from stations.client.errors import Gone
    from stations.spark.offsets import OffsetRange, token
    from stations.spark.read import read_pages
    from stations.spark.stream_read import StationsStreamReader

    name = new_station(api, retention={"maxMessages": 3})
    produce(api, name, [{"data": k} for k in range(10)])
    deadline = time.monotonic() + 10
    while [m["data"] for m in all_messages(api, name)] != [7, 8, 9]:
        assert time.monotonic() < deadline, "retention did not drop the oldest messages"
        time.sleep(0.1)
    checkpoint: dict[str, str | int] = {"offset": token(2)}

    def read(cfg: Config, limit: ReadLimit) -> list[Any]:
        stream = StationsStreamReader(cfg, StructType())
        end = stream.latestOffset(checkpoint, limit)
        parts = [p for p in stream.partitions(checkpoint, end) if isinstance(p, OffsetRange)]
        return [m["data"] for p in parts for page in read_pages(cfg, p) for m in page]

    for allowed in ("true", "false"):
        cfg = Config.parse({"url": srv.url, "station": name, "failOnDataLoss": allowed})
        for limit, kept in ((ReadAllAvailable(), [7, 8, 9]), (ReadMaxRows(2), [7, 8])):
            if allowed == "false":
                assert read(cfg, limit) == kept
            else:
                with pytest.raises(Gone, match="set failOnDataLoss=false to skip them"):
                    read(cfg, limit)


def test_pipeline_window_takes_the_duration_units_of_every_other_command() -> None:
    """Found by a review: the README says durations take ms, s, m, h or d, and every management
    command does, but ``pipeline ingest --window 1d`` was refused."""
    base = ["ingest", "--from", "x.parquet", "--station", "s", "--msg-id-column", "id"]
    for text, ms in (("1d", 86_400_000), ("24h", 86_400_000), ("90m", 5_400_000), ("1500", 1500)):
        assert pipeline.parse_args([*base, "--window", text]).window == ms, text
    for text in ("2d", "500ms", "soon"):
        with pytest.raises(SystemExit):
            pipeline.parse_args([*base, "--window", text])


# -- writes: limits and columns, checked where they can be named ------------------------------


def test_chunks_keep_under_a_byte_cap_and_cut_the_same_way_again() -> None:
    """A streaming write's chunks were cut by count alone: rows of 34 MB in chunks of two made
    a 68 MB request, refused on every replay (the chunk size is pinned by the batch's epoch)."""
    from stations.spark.rows import chunks

    items = [b"x" * n for n in (10, 30, 5, 5, 40, 1, 1, 1)]
    cut = list(chunks(items, 3, max_bytes=45))
    assert [[len(i) for i in c] for c in cut] == [[10, 30], [5, 5], [40, 1, 1], [1]]
    assert cut == list(chunks(items, 3, max_bytes=45))
    assert [len(c) for c in chunks(items, 3)] == [3, 3, 2]
    assert [len(c) for c in chunks([b"y" * 100], 3, max_bytes=10)] == [1]  # never empty


def test_write_columns_are_checked_on_the_driver_by_option_name() -> None:
    from pyspark.sql.types import BinaryType, LongType, MapType, StringType, StructField

    from stations.spark.rows import RowShape

    def shape(options: dict[str, str], *fields: StructField) -> RowShape:
        cfg = Config.parse({"url": "http://127.0.0.1:9", "station": "s", **options})
        return RowShape.of(cfg, StructType(list(fields)), True)

    body = StructField("payload", StringType())
    with pytest.raises(ValueError, match="dataColumn 'paylod' is not a column"):
        shape({"dataColumn": "paylod"}, body)
    with pytest.raises(ValueError, match="headersColumn 'h' is a string column"):
        shape({"headersColumn": "h"}, body, StructField("h", StringType()))
    with pytest.raises(ValueError, match="msgIdColumn 'k' is a binary column"):
        shape({"msgIdColumn": "k"}, body, StructField("k", BinaryType()))
    heads = StructField("headers", MapType(StringType(), StringType()))
    ok = shape({"msgIdColumn": "k"}, body, StructField("k", LongType()), heads)
    message = ok.message({"payload": "p", "k": 7, "headers": {"a": "1", "b": None}})
    assert message["id"] == "7" and message["headers"] == {"a": "1"}  # a null was "None"


def test_a_batch_write_halves_what_a_server_with_lower_limits_refuses(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A server taking at most 100 messages a request: the default chunk of 1,000 was refused
    (400) and nothing was stored, on every retry. A refused request stores nothing: its halves
    are sent instead."""
    server = Server(
        f"sqlite:///{tmp_path / 'stations.db'}", tmp_path, ["--max-append-messages", "100"]
    ).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as api:
            name = new_station(api)
            df = spark.createDataFrame([(f"k{i}", i) for i in range(250)], ["k", "v"])
            (
                df.coalesce(1)
                .write.format("stations")
                .option("url", server.url)
                .option("station", name)
                .option("msgIdColumn", "k")
                .mode("append")
                .save()
            )
            assert sorted(m["data"]["v"] for m in all_messages(api, name)) == list(range(250))
    finally:
        server.kill()


def test_a_stream_write_of_an_empty_text_row_names_the_column(
    srv: Server, api: httpx.Client
) -> None:
    """A null or empty row into a text station was refused by the server ("an append needs a
    body") on every replay, the query stuck for good with no word of the column."""
    from stations.spark.rows import RowShape
    from stations.spark.stream_write import send_texts
    from stations.spark.write import WriteReport

    name = new_station(api, contentType="text/plain")
    cfg = Config.parse({"url": srv.url, "station": name, "dataColumn": "line"})
    shape = RowShape.of(cfg, StructType().add("line", "string"), False)
    producer = StreamProducer(cfg, producer_id="empty-rows", epoch=0, content_type="text/plain")
    try:
        rows = iter([{"line": "a"}, {"line": None}])
        with pytest.raises(ValueError, match="line is null or empty"):
            send_texts(producer, rows, shape, WriteReport())
    finally:
        producer.close()
    assert [m["data"] for m in all_messages(api, name)] == ["a"]


def test_a_message_id_the_server_would_refuse_names_the_column_and_the_value() -> None:
    """An id with a space (or beyond ASCII, or longer than 256) went to the server, whose 400
    said "messages.5.id must be 1 to 256 printable ASCII characters": a place in one request,
    neither the column nor the value (and `stations pipeline` exited 1, not 2, found by a
    review). The row is refused before it is sent, as a null id is."""
    from stations.spark.rows import RowShape

    cfg = Config.parse({"station": "s", "msgIdColumn": "id"})
    shape = RowShape.of(cfg, StructType().add("id", "string").add("data", "string"), True)
    assert shape.message({"id": "o-7", "data": "1"})["id"] == "o-7"
    for bad in ("o 7", "z\u00fcrich", "x" * 257):
        with pytest.raises(ValueError, match=r"msgIdColumn 'id' holds .* printable ASCII"):
            shape.message({"id": bad, "data": "1"})


def test_pipeline_checks_chunk_size_first_and_counts_csv_rows_with_line_ends(
    spark: SparkSession,
    srv: Server,
    api: httpx.Client,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--chunk-size 20000 created the station, then failed naming the data source's option;
    a CSV export of two messages holding line ends reported four rows written."""
    source = tmp_path / "in.json"
    source.write_text('{"k": "a"}\n')
    name = f"never-{uuid.uuid4().hex[:8]}"
    ingest = ["ingest", "--from", str(source), "--station", name, "--url", srv.url]
    ingest += ["--msg-id-column", "k"]
    assert pipeline.main([*ingest, "--chunk-size", "20000"], spark=spark) == 2
    assert "--chunk-size must be from 1 to 10000" in capsys.readouterr().err
    assert api.get(f"/api/stations/{name}").status_code == 404  # checked before creating it

    texts = new_station(api, contentType="text/plain")
    produce(api, texts, [{"data": "one\ntwo"}, {"data": "three\r\nfour"}])
    target = tmp_path / "csv"
    out = io.StringIO()
    with redirect_stdout(out):
        export = ["export", "--station", texts, "--to", str(target), "--format", "csv"]
        assert pipeline.main([*export, "--url", srv.url], spark=spark) == 0
    assert "2 messages read, 2 rows written" in out.getvalue(), out.getvalue()


def test_a_batch_write_of_an_empty_text_or_binary_row_names_the_column() -> None:
    """A batch write stored a null or empty row of a text station as an empty message, which
    Durable Streams readers never see, where a streaming write refused it (found by a
    review). Both refuse it now, naming the column; JSON null stays a message."""
    from stations.spark.rows import RowShape

    text = RowShape(False, "data", True, False, None, "id")
    binary = RowShape(False, "data", False, True, None, "id")
    for shape, empty in ((text, None), (text, ""), (binary, b""), (binary, None)):
        with pytest.raises(ValueError, match="data is null or empty"):
            shape.message({"id": "a", "data": empty})
    assert text.message({"id": "a", "data": "x"}) == {"id": "a", "data": "x"}
    json_shape = RowShape(True, "data", False, False, None, "id")
    assert json_shape.message({"id": "a", "data": None}) == {"id": "a", "data": None}


def test_spark_start_failures_and_a_server_gone_mid_job_point_at_the_right_fix(
    srv: Server, api: httpx.Client, tmp_path: Path
) -> None:
    """A bad --master was reported as "it needs Java 17 or newer" with Java installed, and a
    server that stopped during a job as "give a --url every executor can reach" (found by a
    review). Run as the command, in a process of its own (a Spark session already running
    in this one would be reused whatever the master)."""
    from stations.spark.launch import one_line

    name = new_station(api)
    command = [sys.executable, "-m", "stations", "pipeline", "export", "--station", name]
    command += ["--to", str(tmp_path / "out"), "--url", srv.url, "--master", "bogus://x"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "check --master" in lines[0] and "Java 17" not in lines[0], lines[0]
    # Spark's own words on it are in its log, which the line names (kept for it).
    log = Path(lines[0].rsplit("(Spark's log: ", 1)[1].split(")")[0])
    assert "Master must either be yarn or start with spark" in lines[0]
    shutil.rmtree(log.parent)
    text = (
        "stations.client.errors.ConnectionFailed: POST http://127.0.0.1:1/api/stations/s/"
        "messages: Connection refused"
    )
    line = one_line(text, "http://127.0.0.1:1")
    assert line is not None and "run the job again once it is back" in line
