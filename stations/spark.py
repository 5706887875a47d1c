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
  §5.2.1): ``Producer-Id`` from the query id and partition, ``Producer-Epoch`` the batch id,
  ``Producer-Seq`` one per request. A batch replayed after a failure is answered as duplicates; a
  zombie task of an older batch is fenced (403).

Options (all strings): ``url`` (default ``$STATIONS_URL`` or http://127.0.0.1:4437), ``station``
(or the load/save path), ``token``; reads: ``startingOffset`` (``-1``, ``latest`` or an offset;
default ``-1``), ``endingOffset`` (batch, exclusive; default ``latest``), ``numPartitions``
(default 4), ``pageSize`` (≤ 1000), ``maxMessagesPerTrigger``, ``failOnDataLoss`` (default
true), ``dls`` + ``group`` (read the dead-letter store, batch only); writes: ``msgIdColumn``,
``allowDuplicates``, ``dataColumn`` (default ``data``), ``headersColumn`` (default
``headers``), ``chunkSize`` (messages per request, default 1000), ``reportPath`` (batch: a JSON
summary written by the driver's commit), ``producerIdPrefix`` (streaming, default ``spark``).

The connector speaks only HTTP (``http.client``, one keep-alive connection per task), so
executors need this module and ``pyarrow``, not the server. Offsets are the server's
``<position>_<sub-position>`` tokens; the connector relies on positions being consecutive
message numbers to split ranges and to count messages for ``maxMessagesPerTrigger``.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _dumpb(value: Any) -> bytes:
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


_loads = orjson.loads


__all__ = [
    "DLS_SCHEMA",
    "MESSAGES_SCHEMA",
    "StationsDataSource",
    "StationsError",
    "StationsFencedError",
    "register",
]

NAME = "stations"
DEFAULT_URL = "http://127.0.0.1:4437"
MESSAGES_SCHEMA = (
    "offset string, msgId string, headers map<string,string>, data string, timestamp timestamp"
)
DLS_SCHEMA = (
    "id string, group string, offset string, msgId string, headers map<string,string>, "
    "data string, deliveryCount int, reason string, error string, deadLetteredAt timestamp"
)
MAX_PAGE = 1000  # the server's limit for one browse / DLS page
MAX_MESSAGES_PER_POST = 10_000  # the server's limit for one produce request
_WIDTH = 16
_OFFSET = re.compile(r"^([0-9]{16})_([0-9]{16})$")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _messages_struct() -> StructType:
    return StructType(
        [
            StructField("offset", StringType()),
            StructField("msgId", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("data", StringType()),
            StructField("timestamp", TimestampType()),
        ]
    )


def _dls_struct() -> StructType:
    return StructType(
        [
            StructField("id", StringType()),
            StructField("group", StringType()),
            StructField("offset", StringType()),
            StructField("msgId", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("data", StringType()),
            StructField("deliveryCount", IntegerType()),
            StructField("reason", StringType()),
            StructField("error", StringType()),
            StructField("deadLetteredAt", TimestampType()),
        ]
    )


def register(spark: SparkSession) -> None:
    """Register the ``stations`` format with ``spark`` (``spark.dataSource.register``)."""
    spark.dataSource.register(StationsDataSource)


# -- errors, offsets, options ----------------------------------------------------------------


class StationsError(RuntimeError):
    """The server refused a request (``status`` and the error ``code`` of its JSON body)."""

    def __init__(self, message: str, status: int = 0, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class StationsFencedError(StationsError):
    """A stream-write task of an older batch was fenced by a newer epoch (HTTP 403)."""


def _position(token: str) -> int:
    """The position of an offset token (``-1`` and ``earliest`` are the start, 0)."""
    if token in ("-1", "earliest"):
        return 0
    match = _OFFSET.match(token)
    if match is None:
        raise ValueError(
            f"not a Stations offset: {token!r} (expected e.g. 0000000000000042_0000000000000000)"
        )
    return int(match.group(1))


def _token(position: int) -> str:
    return f"{position:0{_WIDTH}d}_{0:0{_WIDTH}d}"


def _offset_dict(position: int) -> dict[str, str]:
    # One key: Spark compares offsets as JSON text, so the shape must never vary.
    return {"offset": _token(position)}


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"option {name} must be true or false (got {raw!r})")


def _int(options: dict[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer (got {raw!r})") from None
    if not lo <= value <= hi:
        raise ValueError(f"option {name} must be between {lo} and {hi} (got {value})")
    return value


@dataclass(frozen=True)
class _Config:
    """The options, parsed once on the driver; picklable, so it travels to the executors."""

    url: str
    station: str
    token: str | None = None
    timeout: float = 60.0
    starting: str = "-1"
    ending: str = "latest"
    num_partitions: int = 4
    page_size: int = MAX_PAGE
    max_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    dls: bool = False
    group: str | None = None
    msg_id_column: str | None = None
    allow_duplicates: bool = False
    data_column: str = "data"
    headers_column: str = "headers"
    chunk_size: int = 1000
    producer_prefix: str = "spark"
    report_path: str | None = None

    @classmethod
    def parse(cls, options: Any) -> _Config:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        station = opts.get("station") or opts.get("path")
        if not station:
            raise ValueError('the stations data source needs option("station", NAME)')
        starting = opts.get("startingoffset", "-1")
        ending = opts.get("endingoffset", "latest")
        for name, value in (("startingOffset", starting), ("endingOffset", ending)):
            if value not in ("latest",):
                try:
                    _position(value)
                except ValueError as exc:
                    raise ValueError(f"option {name}: {exc}") from None
        return cls(
            url=(opts.get("url") or os.environ.get("STATIONS_URL") or DEFAULT_URL).rstrip("/"),
            station=station,
            token=opts.get("token") or os.environ.get("STATIONS_TOKEN") or None,
            timeout=float(opts.get("timeout", "60")),
            starting=starting,
            ending=ending,
            num_partitions=_int(opts, "numpartitions", 4, 1, 100_000) or 4,
            page_size=_int(opts, "pagesize", MAX_PAGE, 1, MAX_PAGE) or MAX_PAGE,
            max_per_trigger=_int(opts, "maxmessagespertrigger", None, 1, 2**53),
            fail_on_data_loss=_flag(opts, "failondataloss", True),
            dls=_flag(opts, "dls", False),
            group=opts.get("group") or None,
            msg_id_column=opts.get("msgidcolumn") or None,
            allow_duplicates=_flag(opts, "allowduplicates", False),
            data_column=opts.get("datacolumn", "data"),
            headers_column=opts.get("headerscolumn", "headers"),
            chunk_size=_int(opts, "chunksize", 1000, 1, MAX_MESSAGES_PER_POST) or 1000,
            producer_prefix=opts.get("produceridprefix", "spark"),
            report_path=opts.get("reportpath") or None,
        )

    @property
    def quoted(self) -> str:
        return urllib.parse.quote(self.station, safe="")

    def client(self) -> _Http:
        return _Http(self.url, self.token, self.timeout)


# -- HTTP ------------------------------------------------------------------------------------


class _Http:
    """A small synchronous client: one keep-alive connection, retries on transport errors and
    503s. Every request the connector sends is safe to repeat (reads, writes with message ids,
    producer-sequenced appends; ``allowDuplicates`` writes accept the risk)."""

    RETRIES = 5

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"option url must be http(s)://host[:port] (got {url!r})")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        all_headers = {**self._headers, **(headers or {})}
        for attempt in range(self.RETRIES + 1):
            try:
                conn = self._connection()
                conn.request(method, self._prefix + path, body=body, headers=all_headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == self.RETRIES:
                    raise
            else:
                if resp.status not in (502, 503, 504) or attempt == self.RETRIES:
                    return resp.status, resp.headers, data
            time.sleep(min(0.1 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else _dumpb(payload)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        status, _, data = self.request(method, path, body, headers)
        if status >= 300:
            raise _error(method, path, status, data)
        return _loads(data) if data else None


def _error(method: str, path: str, status: int, data: bytes) -> StationsError:
    code = None
    message = data.decode(errors="replace")[:500]
    try:
        err = _loads(data)["error"]
        code, message = err.get("code"), err.get("message", message)
    except Exception:
        pass
    return StationsError(f"{method} {path}: HTTP {status}: {message}", status, code)


def _station_view(cfg: _Config) -> dict[str, Any]:
    http = cfg.client()
    try:
        return http.json("GET", f"/api/stations/{cfg.quoted}")  # type: ignore[no-any-return]
    except StationsError as exc:
        if exc.status == 404:
            raise StationsError(
                f"station {cfg.station!r} does not exist at {cfg.url}", 404
            ) from None
        raise
    finally:
        http.close()


def _is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"


# -- reading ---------------------------------------------------------------------------------


class OffsetRange(InputPartition):
    """Messages whose offsets lie in ``[start, end)`` (positions), read by one task."""

    def __init__(self, index: int, start: int, end: int, is_json: bool) -> None:
        super().__init__(index)
        self.index = index
        self.start = start
        self.end = end
        self.is_json = is_json

    def __repr__(self) -> str:
        return f"OffsetRange({self.index}, {_token(self.start)}, {_token(self.end)})"


class _DlsPartition(InputPartition):
    def __init__(self, is_json: bool) -> None:
        super().__init__(0)
        self.is_json = is_json


def _split(start: int, end: int, parts: int, is_json: bool) -> list[OffsetRange]:
    count = end - start
    if count <= 0:
        return []
    k = max(1, min(parts, count))
    base, extra = divmod(count, k)
    out, lo = [], start
    for i in range(k):
        hi = lo + base + (1 if i < extra else 0)
        out.append(OffsetRange(i, lo, hi, is_json))
        lo = hi
    return out


def _data_text(msg: dict[str, Any], is_json: bool) -> str | None:
    if is_json:
        return _dumps(msg.get("data"))
    if msg.get("dataBase64") is not None:  # not UTF-8: its base64 text
        return str(msg["dataBase64"])
    data = msg.get("data")
    return None if data is None else str(data)


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _read_pages(cfg: _Config, part: OffsetRange) -> Iterator[list[dict[str, Any]]]:
    """The messages of ``part``, one server page at a time."""
    http = cfg.client()
    try:
        cur = part.start
        while cur < part.end:
            limit = min(cfg.page_size, part.end - cur)
            path = f"/api/stations/{cfg.quoted}/messages?offset={_token(cur)}&limit={limit}"
            try:
                page = http.json("GET", path)
            except StationsError as exc:
                if exc.status != 410:
                    raise
                if cfg.fail_on_data_loss:
                    raise StationsError(
                        f"offset {_token(cur)} of station {cfg.station!r} is before its earliest "
                        "retained message: retention dropped messages before they were read "
                        "(set failOnDataLoss=false to skip them)",
                        410,
                        "data_loss",
                    ) from None
                page = http.json(
                    "GET", f"/api/stations/{cfg.quoted}/messages?offset=-1&limit={limit}"
                )
            messages = page["messages"]
            if not messages:
                return
            kept = [m for m in messages if cur <= _position(m["offset"]) < part.end]
            if kept:
                yield kept
            cur = max(cur + 1, _position(page["nextOffset"]))
    finally:
        http.close()


def _arrow_schema(schema: StructType) -> pa.Schema | None:
    try:
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(schema, timezone="UTC")
    except Exception:  # pragma: no cover - a PySpark without it: fall back to tuples
        return None


def _message_batches(
    cfg: _Config, part: OffsetRange, schema: StructType
) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    arrow = _arrow_schema(schema)
    if arrow is None:
        for page in _read_pages(cfg, part):
            for m in page:
                yield (
                    m["offset"],
                    m.get("id"),
                    m.get("headers") or {},
                    _data_text(m, part.is_json),
                    _time(m.get("time")),
                )
        return
    import pyarrow as pa

    for page in _read_pages(cfg, part):
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([m["offset"] for m in page], pa.string()),
                pa.array([m.get("id") for m in page], pa.string()),
                pa.array(
                    [list((m.get("headers") or {}).items()) for m in page],
                    arrow.field("headers").type,
                ),
                pa.array([_data_text(m, part.is_json) for m in page], pa.string()),
                pa.array([_time(m.get("time")) for m in page], arrow.field("timestamp").type),
            ],
            schema=arrow,
        )


def _dls_rows(cfg: _Config, part: _DlsPartition) -> Iterator[tuple[Any, ...]]:
    http = cfg.client()
    try:
        after: str | None = None
        while True:
            query = {"limit": str(cfg.page_size)}
            if cfg.group:
                query["group"] = cfg.group
            if after:
                query["after"] = after
            page = http.json(
                "GET", f"/api/stations/{cfg.quoted}/dls?{urllib.parse.urlencode(query)}"
            )
            for e in page["entries"]:
                yield (
                    e["id"],
                    e["group"],
                    e["offset"],
                    e.get("msgId"),
                    e.get("headers") or {},
                    _data_text(e, part.is_json),
                    e.get("deliveryCount"),
                    e.get("reason"),
                    e.get("error"),
                    _time(e.get("deadLetteredAt")),
                )
            after = page.get("next")
            if not after:
                return
    finally:
        http.close()


class StationsReader(DataSourceReader):
    """Batch read of ``[startingOffset, endingOffset)``, or of the DLS with ``dls=true``."""

    def __init__(self, cfg: _Config, schema: StructType) -> None:
        self.cfg = cfg
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        view = _station_view(self.cfg)
        is_json = _is_json(view["contentType"])
        if self.cfg.dls:
            return [_DlsPartition(is_json)]
        tail = _position(view["stats"]["tailOffset"])
        start = tail if self.cfg.starting == "latest" else _position(self.cfg.starting)
        end = tail if self.cfg.ending == "latest" else min(_position(self.cfg.ending), tail)
        if start == 0 and end > 0:  # -1 reads from the earliest retained message
            start = _first_position(self.cfg, end)
        ranges = _split(start, end, self.cfg.num_partitions, is_json)
        return ranges or [OffsetRange(0, start, start, is_json)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, _DlsPartition):
            return _dls_rows(self.cfg, partition)
        assert isinstance(partition, OffsetRange)
        return _message_batches(self.cfg, partition, self.schema)


def _tail(cfg: _Config) -> int:
    http = cfg.client()
    try:
        path = "/v1/stream/" + urllib.parse.quote(cfg.station, safe="/")
        status, headers, data = http.request("HEAD", path)
        if status != 200:
            raise _error("HEAD", path, status, data)
        return _position(headers["Stream-Next-Offset"])
    finally:
        http.close()


def _first_position(cfg: _Config, default: int) -> int:
    """The offset of the earliest retained message (``default`` when there is none)."""
    http = cfg.client()
    try:
        page = http.json("GET", f"/api/stations/{cfg.quoted}/messages?offset=-1&limit=1")
    finally:
        http.close()
    return _position(page["messages"][0]["offset"]) if page["messages"] else default


class StationsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offset ranges. Offsets are ``{"offset": token}``; Spark checkpoints
    them, so nothing is kept here but the ``availableNow`` target."""

    def __init__(self, cfg: _Config, schema: StructType) -> None:
        if cfg.dls:
            raise ValueError("the DLS can be read in batch only (spark.read, not readStream)")
        self.cfg = cfg
        self.schema = schema
        self.is_json = _is_json(_station_view(cfg)["contentType"])
        self._target: int | None = None

    def initialOffset(self) -> dict[str, str]:
        if self.cfg.starting == "latest":
            return _offset_dict(_tail(self.cfg))
        return _offset_dict(_position(self.cfg.starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cfg.max_per_trigger is not None:
            return ReadMaxRows(self.cfg.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _tail(self.cfg)

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        lo = _position(start["offset"])
        end = _tail(self.cfg)
        if self._target is not None:
            end = min(end, self._target)
        if isinstance(limit, ReadMaxRows) and end > lo:
            first = _first_position(self.cfg, lo)  # skip positions retention dropped
            end = min(end, max(lo, first) + limit.max_rows)
        return _offset_dict(max(lo, end))

    def reportLatestOffset(self) -> dict[str, str]:
        return _offset_dict(_tail(self.cfg))

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        return _split(
            _position(start["offset"]),
            _position(end["offset"]),
            self.cfg.num_partitions,
            self.is_json,
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return _message_batches(self.cfg, partition, self.schema)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to do: the position lives in Spark's checkpoint, not in the station."""


# -- writing ---------------------------------------------------------------------------------


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: rows seen, messages stored, duplicates the station dropped."""

    rows: int = 0
    stored: int = 0
    duplicates: int = 0
    partition: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot turn {type(value).__name__} into JSON")


@dataclass(frozen=True)
class _RowShape:
    """How a row of the input DataFrame becomes a message."""

    is_json: bool
    data_column: str | None  # None: the whole row (without the headers column) is the payload
    data_is_text: bool
    data_is_binary: bool
    headers_column: str | None
    id_column: str | None

    @classmethod
    def of(cls, cfg: _Config, schema: StructType, is_json: bool) -> _RowShape:
        names = {f.name: f for f in schema.fields}
        if cfg.msg_id_column is not None and cfg.msg_id_column not in names:
            raise ValueError(
                f"msgIdColumn {cfg.msg_id_column!r} is not a column of the DataFrame ({', '.join(names)})"
            )
        data = names.get(cfg.data_column)
        return cls(
            is_json=is_json,
            data_column=data.name if data else None,
            data_is_text=data is not None and isinstance(data.dataType, StringType),
            data_is_binary=data is not None and isinstance(data.dataType, BinaryType),
            headers_column=cfg.headers_column if cfg.headers_column in names else None,
            id_column=cfg.msg_id_column,
        )

    def payload(self, row: dict[str, Any]) -> Any:
        """The JSON value (JSON station) or the text / bytes (other stations) of ``row``."""
        if self.data_column is None:
            value: Any = {k: v for k, v in row.items() if k != self.headers_column}
            return value if self.is_json else _dumps(value)
        value = row[self.data_column]
        if self.is_json:
            if self.data_is_text and value is not None:
                try:
                    return _loads(value)
                except ValueError:
                    raise ValueError(
                        f"column {self.data_column!r} must hold JSON text for a JSON station "
                        f"(got {value[:60]!r}); use to_json() or write a struct column"
                    ) from None
            return value
        if self.data_is_text or self.data_is_binary or value is None:
            return value
        return _dumps(value)

    def message(self, row: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {}
        if self.id_column is not None:
            ident = row[self.id_column]
            if ident is None or ident == "":
                raise ValueError(
                    f"msgIdColumn {self.id_column!r} is null or empty in a row: every message needs an id"
                )
            msg["id"] = str(ident)
        value = self.payload(row)
        if isinstance(value, (bytes, bytearray)):
            msg["dataBase64"] = base64.b64encode(bytes(value)).decode()
        elif self.is_json:
            msg["data"] = value
        else:
            msg["data"] = "" if value is None else value
        if self.headers_column is not None and row[self.headers_column]:
            msg["headers"] = {str(k): str(v) for k, v in dict(row[self.headers_column]).items()}
        return msg


def _rows(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist(maps_as_pydicts="lossy")


def _chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


class StationsWriter(DataSourceArrowWriter):
    """Batch write: rows become messages, ``chunkSize`` per POST /api/stations/{name}/messages."""

    def __init__(self, cfg: _Config, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("a station is append-only: write with mode('append')")
        if cfg.msg_id_column is None and not cfg.allow_duplicates:
            raise ValueError(
                "writing to a station needs option('msgIdColumn', COLUMN): the message id is what "
                "makes a re-run job or a retried task store nothing twice, and Spark cannot derive "
                "a stable id from arbitrary input. Give option('allowDuplicates', 'true') to write "
                "without ids (at-least-once)."
            )
        self.cfg = cfg
        self.shape = _RowShape.of(cfg, schema, _is_json(_station_view(cfg)["contentType"]))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        report = WriteReport(partition=_partition_id())
        http = self.cfg.client()
        path = f"/api/stations/{self.cfg.quoted}/messages"
        try:
            for chunk in _chunks(_rows(iterator), self.cfg.chunk_size):
                body = http.json("POST", path, {"messages": [self.shape.message(r) for r in chunk]})
                dups = sum(1 for r in body["results"] if r["duplicate"])
                report.rows += len(chunk)
                report.duplicates += dups
                report.stored += len(chunk) - dups
        finally:
            http.close()
        return report

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(self.cfg, messages, committed=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(self.cfg, messages, committed=False)


def _report(
    cfg: _Config, messages: Sequence[WriterCommitMessage | None], *, committed: bool
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


class StationsStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: each (query, partition) is an idempotent producer whose epoch is the
    batch id, so a replayed batch stores nothing twice and a zombie of an older batch is fenced.

    JSON stations take ``chunkSize`` rows per request (a JSON array); other stations one row per
    request. Message ids and headers are not sent: the producer sequence is what deduplicates.
    """

    def __init__(self, cfg: _Config, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("a station is append-only: use outputMode('append')")
        if cfg.msg_id_column is not None:
            raise ValueError(
                "msgIdColumn is for batch writes: a streaming write deduplicates replayed batches "
                "by its producer sequence and sends no message ids"
            )
        view = _station_view(cfg)
        self.cfg = cfg
        self.content_type = view["contentType"]
        self.shape = _RowShape.of(cfg, schema, _is_json(self.content_type))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("StationsStreamWriter.write runs inside a Spark task")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        if batch_id is None or query_id is None:
            raise RuntimeError("no streaming batch id / query id in the task context")
        producer = StreamProducer(
            self.cfg,
            producer_id=f"{self.cfg.producer_prefix}:{query_id}:{ctx.partitionId()}",
            epoch=int(batch_id),
            content_type=self.content_type,
        )
        report = WriteReport(partition=ctx.partitionId())
        try:
            producer.send_rows(_rows(iterator), self.shape, report)
        finally:
            producer.close()
        return report

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every request was acknowledged durably by the server."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what was stored stays; a replay of the batch is deduplicated."""


class StreamProducer:
    """One idempotent producer session (``Producer-Id``, ``Producer-Epoch``, ``Producer-Seq``)
    appending to ``/v1/stream/{station}``."""

    def __init__(self, cfg: _Config, *, producer_id: str, epoch: int, content_type: str) -> None:
        self.cfg = cfg
        self.producer_id = producer_id
        self.epoch = epoch
        self.seq = 0
        self.content_type = content_type
        self.is_json = _is_json(content_type)
        self.path = "/v1/stream/" + urllib.parse.quote(cfg.station, safe="/")
        self.http = cfg.client()

    def close(self) -> None:
        self.http.close()

    def append(self, body: bytes) -> bool:
        """Send one request; True when stored, False when the server had it already."""
        headers = {
            "Content-Type": self.content_type,
            "Producer-Id": self.producer_id,
            "Producer-Epoch": str(self.epoch),
            "Producer-Seq": str(self.seq),
        }
        status, resp, data = self.http.request("POST", self.path, body, headers)
        if status == 403 and resp.get("Producer-Epoch") is not None:
            raise StationsFencedError(
                f"producer {self.producer_id} epoch {self.epoch} was fenced by epoch "
                f"{resp['Producer-Epoch']}: a newer batch took over this partition",
                403,
                "fenced",
            )
        if status not in (200, 204):
            raise _error("POST", self.path, status, data)
        self.seq += 1
        return status == 200

    def send_rows(
        self, rows: Iterator[dict[str, Any]], shape: _RowShape, report: WriteReport
    ) -> None:
        if self.is_json:
            for chunk in _chunks(rows, self.cfg.chunk_size):
                stored = self.append(_dumpb([shape.payload(r) for r in chunk]))
                report.rows += len(chunk)
                report.stored += len(chunk) if stored else 0
                report.duplicates += 0 if stored else len(chunk)
            return
        for row in rows:
            value = shape.payload(row)
            body = (
                value
                if isinstance(value, bytes)
                else ("" if value is None else str(value)).encode()
            )
            stored = self.append(body)
            report.rows += 1
            report.stored += 1 if stored else 0
            report.duplicates += 0 if stored else 1


# -- the data source -------------------------------------------------------------------------


class StationsDataSource(DataSource):
    """``format("stations")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.cfg = _Config.parse(options)

    def schema(self) -> str:
        return DLS_SCHEMA if self.cfg.dls else MESSAGES_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return StationsReader(self.cfg, self._fixed(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StationsStreamReader(self.cfg, self._fixed(schema))

    def _fixed(self, schema: StructType) -> StructType:
        expected = _dls_struct() if self.cfg.dls else _messages_struct()
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise ValueError(
                f"the stations format has a fixed schema ({self.schema()}); "
                "select or cast columns after load() instead of passing a schema"
            )
        return schema

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return StationsWriter(self.cfg, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return StationsStreamWriter(self.cfg, schema, overwrite)
