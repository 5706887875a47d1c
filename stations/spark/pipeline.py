"""``stations pipeline``: the common Spark jobs over the ``stations`` data source.

- ``stations pipeline ingest --from PATH --format parquet|json|csv --station NAME
  --msg-id-column COL``: every row becomes a message whose id is ``COL``; running it again (or a
  retried task) stores nothing twice within the station's idempotency window.
- ``stations pipeline export --station NAME --to PATH [--format parquet] [--dls]``: the station's
  messages (or its dead-letter store) as files, for analysis.

Both run on ``local[*]`` unless ``--master`` names another Spark master, show a progress bar on a
terminal and close with a summary. Spark's own output goes to a temporary log file
(``--verbose``: to stderr), so a failure is one ``stations pipeline: error:`` line. PySpark is
the optional extra ``stations-streams[spark]``; this module imports it only when a job runs,
so ``stations --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from stations.client.core import DEFAULT_URL
from stations.client.errors import (
    ConnectionFailed,
    Forbidden,
    StationNotFound,
    StationsError,
    Unauthorized,
)
from stations.commands import token_of
from stations.commands.base import EXIT_NOT_FOUND
from stations.spark.launch import (
    PipelineError,
    failure,
    run_spark,
    spark_failures,
    spark_session,
)
from stations.spark.progress import progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession

    from stations.spark.options import Config

FORMATS = ("parquet", "json", "csv")
# The server's largest idempotencyWindowMs (24 h): how long a station remembers message ids.
MAX_WINDOW_MS = 86_400_000
_runs = iter(range(1, 1 << 62))
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``pipeline`` with its ``ingest`` and ``export`` commands on ``sub``."""
    p = sub.add_parser(
        "pipeline",
        help="Spark jobs: ingest files into a station, export a station or its DLS",
        description="Spark jobs over the stations data source: ingest files into a station "
        "(each row stored once by its id) and export a station's messages or its dead-letter "
        "store to files. Runs on local[*] unless --master says otherwise.",
    )
    jobs = p.add_subparsers(dest="job", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--url",
            default=os.environ.get("STATIONS_URL", DEFAULT_URL),
            help="Stations server (default: $STATIONS_URL or %(default)s)",
        )
        token = q.add_mutually_exclusive_group()
        token.add_argument("--token", default=os.environ.get("STATIONS_TOKEN"), help="bearer token")
        token.add_argument(
            "--token-file",
            metavar="PATH",
            help="read the bearer token from the first line of this file",
        )
        q.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
        q.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra Spark configuration (repeatable)",
        )
        q.add_argument(
            "--partitions", type=int, default=None, help="Spark tasks (default: 2 per core)"
        )
        q.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="progress bar (default: when stderr is a terminal)",
        )
        q.add_argument(
            "--verbose",
            action="store_true",
            help="Spark's own log on stderr (its warnings, and errors with their Java and "
            "Python traces) and a failure's traceback; by default Spark logs to a temporary "
            "file, named in the error line of a failure whose cause is not known",
        )

    ingest = jobs.add_parser("ingest", help="write the rows of files into a station, once each")
    ingest.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="PATH",
        help="file, directory or glob to read (a path every executor can reach)",
    )
    ingest.add_argument("--format", choices=FORMATS, help="default: from the file extension")
    ingest.add_argument("--station", required=True, help="the station to write into")
    ids = ingest.add_mutually_exclusive_group(required=True)
    ids.add_argument("--msg-id-column", metavar="COL", help="the column holding each row's id")
    ids.add_argument(
        "--allow-duplicates",
        action="store_true",
        help="write without message ids: a re-run stores every row again",
    )
    ingest.add_argument(
        "--chunk-size", type=int, default=1000, help="messages per request (default %(default)s)"
    )
    ingest.add_argument(
        "--no-create", action="store_true", help="fail when the station does not exist"
    )
    ingest.add_argument(
        "--window",
        type=_window,
        default=MAX_WINDOW_MS,
        metavar="DURATION",
        help="idempotency window of a station the job creates, e.g. 90m or 24h: a re-run "
        "within it stores nothing twice (default and maximum: 24h); an existing station "
        "with a shorter window gets a warning",
    )
    common(ingest)

    export = jobs.add_parser("export", help="write a station's messages (or its DLS) to files")
    export.add_argument("--station", required=True, help="the station to read")
    export.add_argument(
        "--to", dest="target", required=True, metavar="PATH", help="directory to write the files to"
    )
    export.add_argument(
        "--format", choices=FORMATS, default="parquet", help="file format (default %(default)s)"
    )
    export.add_argument("--dls", action="store_true", help="export the dead-letter store")
    export.add_argument("--group", help="with --dls: only this consumer group's entries")
    # None when not given: a DLS export reads the whole store and refuses a range.
    export.add_argument("--from-offset", help="first offset (default: the start; not with --dls)")
    export.add_argument(
        "--to-offset", help="end offset, exclusive (default: the end; not with --dls)"
    )
    export.add_argument("--overwrite", action="store_true", help="replace PATH if it exists")
    common(export)


# -- the jobs --------------------------------------------------------------------------------


@dataclass
class Summary:
    job: str
    station: str
    rows_read: int
    stored: int
    duplicates: int
    seconds: float
    target: str | None = None
    retried: int = 0  # tasks Spark ran again after a failure
    by_failed: int = 0  # of ``stored``: messages the failed attempts stored
    no_ids: bool = False  # written without message ids (--allow-duplicates)
    grew: int | None = None  # without ids, after a retry: what the station gained

    def lines(self) -> list[str]:
        rate = self.rows_read / self.seconds if self.seconds > 0 else 0.0
        if self.job == "ingest":
            out = [
                f"ingest into {self.station}: {self.rows_read:,} rows read, "
                f"{self.stored:,} stored, {self.duplicates:,} duplicates "
                f"in {self.seconds:.1f} s ({rate:,.0f} rows/s)"
            ]
            if self.by_failed:
                out.append(
                    f"{self.by_failed:,} of the stored messages were stored by task attempts "
                    "that failed before Spark ran their tasks again: counted once each"
                )
            return out
        what = "DLS entries" if self.job == "export-dls" else "messages"
        return [
            f"export of {self.station}: {self.rows_read:,} {what} read, {self.stored:,} rows "
            f"written to {self.target} in {self.seconds:.1f} s ({rate:,.0f} rows/s)"
        ]

    def warnings(self) -> list[str]:
        """What the figures cannot say: without message ids, a retried task stored again what
        its failed attempt had stored."""
        if self.job != "ingest" or not self.retried or not self.no_ids:
            return []
        grew = ""
        if self.grew is not None:
            grew = (
                f" (the station grew by {self.grew:,} messages during the job, for "
                f"{self.rows_read:,} rows read; messages other writers sent meanwhile count too)"
            )
        return [
            # An attempt past the first is a retry after a failure or a speculative copy: either
            # may have stored what another attempt of the task stored.
            f"stations pipeline: warning: {_tasks(self.retried)} ran more than once (retried "
            "after a failure, or speculatively): without message ids, rows an earlier attempt "
            f"stored may have been stored again{grew}"
        ]


def _tasks(n: int) -> str:
    return "1 task" if n == 1 else f"{n:,} tasks"


def run(
    args: argparse.Namespace, spark: SparkSession | None = None, out: TextIO | None = None
) -> int:
    """Run the job in ``args``; with ``spark`` given, use that session and leave it running."""
    out = out or sys.stdout
    try:
        try:
            args.token = token_of(args)
        except ValueError as exc:
            raise PipelineError(f"--{exc}") from None
        preflight(args)
        with _session(args, spark) as session:
            summary = _ingest(session, args) if args.job == "ingest" else _export(session, args)
    except PipelineError as exc:
        print(f"stations pipeline: error: {exc}{_after_writing(args)}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # it was a Python traceback under Spark's own lines
        what = "rows stored so far stay; the same command again stores none of them twice"
        if args.job != "ingest":
            what = "the export is incomplete; run it again"
        elif getattr(args, "allow_duplicates", False):
            what = "rows stored so far stay; without message ids a re-run stores them again"
        print(f"stations pipeline: interrupted: {what}", file=sys.stderr)
        return 130
    for line in summary.warnings():
        print(line, file=sys.stderr)
    for line in summary.lines():
        print(line, file=out)
    return 0


def _after_writing(args: argparse.Namespace) -> str:
    """What a failed ingest left: its tasks may have stored part of the rows."""
    if not getattr(args, "writing", False):
        return ""
    said = "; rows stored before the failure stay, and "
    if getattr(args, "allow_duplicates", False):
        return said + "without message ids the same command stores them again"
    return said + "the same command stores none of them twice"


def execute(spark: SparkSession, args: argparse.Namespace) -> Summary:
    """Check and run the job in ``args`` on ``spark`` (with the ``stations`` format registered)."""
    preflight(args)
    return _ingest(spark, args) if args.job == "ingest" else _export(spark, args)


def preflight(args: argparse.Namespace) -> None:
    """The checks that need no Spark: arguments, paths, the server and the station."""
    _connector()
    if args.partitions is not None and args.partitions < 1:
        raise PipelineError("--partitions must be at least 1")
    if args.job == "ingest":
        args.format = args.format or _format_of(args.source)
        if "://" not in args.source and not Path(args.source).exists():
            raise PipelineError(f"--from {args.source}: no such file or directory")
        from stations.spark.options import MAX_MESSAGES_PER_POST  # (loads PySpark)

        if not 1 <= args.chunk_size <= MAX_MESSAGES_PER_POST:
            raise PipelineError(f"--chunk-size must be from 1 to {MAX_MESSAGES_PER_POST}")
        _check_station(args, create=not args.no_create)
    else:
        if args.group and not args.dls:
            raise PipelineError("--group goes with --dls")
        for flag, value in (("--from-offset", args.from_offset), ("--to-offset", args.to_offset)):
            if args.dls and value is not None:
                raise PipelineError(
                    f"{flag} goes without --dls: a dead-letter export writes the whole store"
                )
        args.from_offset = "-1" if args.from_offset is None else args.from_offset
        args.to_offset = "latest" if args.to_offset is None else args.to_offset
        if os.path.exists(args.target) and not args.overwrite:
            raise PipelineError(f"--to {args.target} exists (give --overwrite to replace it)")
        from stations.spark.options import Config

        try:
            Config.parse(
                {
                    "station": args.station,
                    "startingOffset": args.from_offset,
                    "endingOffset": args.to_offset,
                }
            )
        except ValueError as exc:
            # Named by the flag the user typed, not the data source option it becomes.
            words = str(exc).replace("option startingOffset", "--from-offset", 1)
            raise PipelineError(words.replace("option endingOffset", "--to-offset", 1)) from None
        _check_station(args, create=False)


def _window(text: str) -> int:
    """``--window``: milliseconds, or a number with ms, s, m, h or d (as every command takes)."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(ms|s|m|h|d)?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90m, 24h)")
    ms = int(match.group(1)) * _UNITS[match.group(2) or "ms"]
    if not 1000 <= ms <= MAX_WINDOW_MS:
        raise argparse.ArgumentTypeError(f"{text} is outside 1s..24h")
    return ms


def _duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the arguments that follow ``stations pipeline``."""
    parser = argparse.ArgumentParser(prog="stations")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["pipeline", *argv])


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """``stations pipeline ...`` on its own (for tests and ``python3 -m stations.spark.pipeline``)."""
    return run(parse_args(argv if argv is not None else sys.argv[1:]), spark)


def _connector() -> ModuleType:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401

        import stations.spark
        import stations.spark.source  # noqa: F401
    except ImportError as exc:
        raise PipelineError(
            f"stations pipeline needs PySpark and pyarrow ({exc.name} is missing): "
            "pip install 'pyspark>=4.2' 'pyarrow>=15' (this package's spark extra)"
        ) from None
    return stations.spark


@contextmanager
def _session(args: argparse.Namespace, spark: SparkSession | None) -> Iterator[SparkSession]:
    connector = _connector()
    verbose = getattr(args, "verbose", False)
    if spark is not None:
        connector.register(spark)
        with spark_failures(None, verbose):
            yield spark
        return
    app = f"stations pipeline {args.job}"
    with spark_session(app, args.master, args.conf, verbose=verbose) as session:
        connector.register(session)
        yield session


def _options(args: argparse.Namespace, station: str) -> dict[str, str]:
    options = {"url": args.url, "station": station}
    if args.token:
        options["token"] = args.token
    return options


def _partitions(spark: SparkSession, args: argparse.Namespace) -> int:
    return args.partitions or max(2, 2 * spark.sparkContext.defaultParallelism)


def _check_station(args: argparse.Namespace, *, create: bool) -> None:
    """Fail early, in one line, when the server is unreachable or the station is missing;
    with ``create``, a missing station is made once the source proved readable
    (``_create_station``); warn when an existing station's window is shorter than asked."""
    args.create_station = False
    try:
        cfg = _config(args)
        with cfg.http() as http:
            try:
                view = http.call("GET", cfg.api_path, what=f"station {args.station}")
            except StationNotFound:
                if not create:
                    raise PipelineError(
                        f"station {args.station} does not exist at {args.url}", EXIT_NOT_FOUND
                    ) from None
                args.create_station = True
                return
    except ConnectionFailed as exc:
        raise failure(f"cannot reach {args.url}: {exc}", exc) from None
    except (Unauthorized, Forbidden) as exc:
        given = "the --token given" if args.token else "no --token (nor STATIONS_TOKEN) given"
        raise failure(f"station {args.station} at {args.url}: {exc} ({given})", exc) from None
    except StationsError as exc:
        raise failure(str(exc), exc) from None
    window = view.json().get("idempotencyWindowMs")
    if args.job == "ingest" and isinstance(window, int) and window < args.window:
        print(
            f"stations pipeline: warning: station {args.station} remembers message ids for "
            f"{_duration(window)} (idempotencyWindowMs={window}): a re-run more than "
            f"{_duration(window)} after this one stores its rows again; raise it with "
            f"PATCH /api/stations/{args.station} (up to 24 h)",
            file=sys.stderr,
        )


def _config(args: argparse.Namespace) -> Config:
    from stations.spark.options import Config

    try:
        return Config.parse(_options(args, args.station))
    except ValueError as exc:
        raise PipelineError(str(exc).replace("option ", "--", 1)) from None


def _create_station(args: argparse.Namespace) -> None:
    """The station ``ingest`` makes when it is missing, with a window that covers re-runs
    (``--window``)."""
    body = {"name": args.station, "idempotencyWindowMs": args.window}
    try:
        with _config(args).http() as http:
            http.call("POST", "/api/stations", body, what=f"create station {args.station}")
    except ConnectionFailed as exc:
        raise failure(f"cannot reach {args.url}: {exc}", exc) from None
    except StationsError as exc:
        raise failure(str(exc), exc) from None
    print(
        f"created station {args.station} (ids remembered for {_duration(args.window)})",
        file=sys.stderr,
    )


def _ingest(spark: SparkSession, args: argparse.Namespace) -> Summary:
    reader = spark.read.format(args.format)
    if args.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    df = _load(reader, args.source)
    if args.msg_id_column and args.msg_id_column not in df.columns:
        raise PipelineError(
            f"--msg-id-column {args.msg_id_column} is not a column of {args.source} "
            f"(columns: {', '.join(df.columns)})"
        )
    if args.msg_id_column and args.format in ("csv", "json"):
        df = _ids_as_text(reader, df, args)
    if getattr(args, "create_station", False):
        _create_station(args)
    parts = _partitions(spark, args)
    with _conf(spark, "spark.sql.files.minPartitionNum", str(parts)):
        # Split the files themselves (no shuffle, file order kept within a task); a file that
        # cannot be split (one Parquet row group, gzip) is spread by a shuffle instead.
        if df.rdd.getNumPartitions() < parts:
            df = df.repartition(parts)
        return _ingest_job(spark, args, df)


def _load(reader: DataFrameReader, source: str) -> DataFrame:
    try:
        return reader.load(source)
    except Exception as exc:  # AnalysisException: nothing to read, no schema to infer, ...
        if type(exc).__name__ != "AnalysisException":
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"--from {source}: Spark cannot read it: {first}") from None


def _ids_as_text(reader: DataFrameReader, df: DataFrame, args: argparse.Namespace) -> DataFrame:
    """The id column read as the text it is in the files. Inferred, its type follows every
    file of the run: ``001`` read as the number 1 in one run and as the text ``001`` in the
    next (a file with ``A04`` came), and ids stored once would be new ids again."""
    from pyspark.sql.types import StringType, StructField, StructType

    schema = df.schema
    if isinstance(schema[args.msg_id_column].dataType, StringType):
        return df
    fields = [
        StructField(f.name, StringType(), f.nullable) if f.name == args.msg_id_column else f
        for f in schema.fields
    ]
    return _load(reader.schema(StructType(fields)), args.source)


# Columns of their own for a row whose file has a ``data`` or ``headers`` column (no file's).
_ROW = "__stations_row"
_NO_HEADERS = "__stations_no_headers"


def _whole_rows(df: DataFrame, id_column: str | None) -> tuple[DataFrame, dict[str, str]]:
    """Each row becomes one message, all its columns (the README's promise), also when the
    file has a ``data`` or ``headers`` column: the data source takes those by default as the
    payload (the other columns were dropped, "20 stored") or as the headers (a string column
    failed the job, with an option the command does not have). Then the row goes as one
    struct and the headers as an empty map."""
    if not {"data", "headers"} & set(df.columns):
        return df, {}
    from pyspark.sql import functions as F

    def col(name: str) -> Any:
        return F.col("`" + name.replace("`", "``") + "`")

    kept = [F.struct(*[col(c) for c in df.columns]).alias(_ROW)]
    if id_column is not None:
        kept.append(col(id_column))
    kept.append(F.create_map().cast("map<string,string>").alias(_NO_HEADERS))
    return df.select(*kept), {"dataColumn": _ROW, "headersColumn": _NO_HEADERS}


def _ingest_job(spark: SparkSession, args: argparse.Namespace, df: DataFrame) -> Summary:
    tmp = tempfile.mkdtemp(prefix="stations-pipeline-")
    report = os.path.join(tmp, "report.json")
    df, shape = _whole_rows(df, args.msg_id_column)
    writer = df.write.format("stations").mode("append").options(**_options(args, args.station))
    writer = writer.option("chunkSize", str(args.chunk_size)).option("reportPath", report)
    writer = writer.options(**shape)
    if args.msg_id_column:
        writer = writer.option("msgIdColumn", args.msg_id_column)
    else:
        writer = writer.option("allowDuplicates", "true")
    started = time.monotonic()
    group = f"stations-pipeline-{next(_runs)}"
    args.writing = True  # a failure from here on may leave part of the rows stored
    try:
        with progress(spark, args.progress, group, f"ingest → {args.station}"):
            try:
                _run_job(spark, group, writer.save, args.url)
            except PipelineError as exc:  # named by the flag the user typed
                from stations.spark.rows import NANVL_HINT

                said = str(exc).replace("msgIdColumn ", "--msg-id-column ")
                said = said.replace(NANVL_HINT, "(an empty field in CSV, null in JSON or Parquet)")
                raise PipelineError(said, exc.code, exc.log) from None
        with open(report) as f:
            totals = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.writing = False
    return Summary(
        "ingest",
        args.station,
        totals["rows"],
        totals["stored"],
        totals["duplicates"],
        time.monotonic() - started,
        retried=totals["retriedTasks"],
        by_failed=totals["storedByFailedAttempts"],
        no_ids=not args.msg_id_column,
        grew=totals.get("stationGrew"),
    )


def _export(spark: SparkSession, args: argparse.Namespace) -> Summary:
    from pyspark.sql import functions as F

    reader = spark.read.format("stations").options(**_options(args, args.station))
    if args.dls:
        reader = reader.option("dls", "true")
        if args.group:
            reader = reader.option("group", args.group)
    else:
        reader = reader.option("startingOffset", args.from_offset)
        reader = reader.option("endingOffset", args.to_offset)
        reader = reader.option("numPartitions", str(_partitions(spark, args)))
    df: DataFrame = run_spark(reader.load, args.url)
    if args.format == "csv":  # CSV has no map type
        df = df.withColumn("headers", F.to_json("headers"))
    started = time.monotonic()
    group = f"stations-pipeline-{next(_runs)}"
    with progress(spark, args.progress, group, f"export {args.station} → {args.target}"):
        writer = df.write.mode("overwrite").format(args.format)
        if args.format == "csv":
            writer = writer.option("header", "true")
        _run_job(spark, group, lambda: writer.save(args.target), args.url)
    seconds = time.monotonic() - started
    written_df = spark.read.format(args.format)
    if args.format == "csv":  # a message's text may hold line ends: one row, quoted
        written_df = written_df.option("header", "true").option("multiLine", "true")
    written = written_df.load(args.target).count()
    return Summary(
        "export-dls" if args.dls else "export",
        args.station,
        written,
        written,
        0,
        seconds,
        target=f"{args.target} ({args.format})",
    )


@contextmanager
def _conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _format_of(path: str) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in ("jsonl", "ndjson"):
        return "json"
    if suffix in FORMATS:
        return suffix
    raise PipelineError(f"cannot tell the format of {path}: give --format {'|'.join(FORMATS)}")


def _run_job(spark: SparkSession, group: str, job: Callable[[], object], url: str) -> None:
    """Run ``job`` under the job group ``group``; known failures become one line."""
    spark.sparkContext.setJobGroup(group, "stations pipeline")
    try:
        run_spark(job, url)
    finally:
        spark.sparkContext.setJobGroup("", "")


if __name__ == "__main__":
    sys.exit(main())
