"""The data source's options: parsed once on the driver into a picklable ``Config`` that
travels to the executors, and the client-core transport each task opens from it."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stations.client.blocking import BlockingHttp
from stations.client.core import DEFAULT_URL, check_server, path_segment, stream_path
from stations.client.errors import ConnectionFailed, StationNotFound
from stations.client.retry import RetryPolicy
from stations.spark.offsets import position

NAME = "stations"
MAX_PAGE = 1000  # the server's limit for one browse / DLS page
MAX_MESSAGES_PER_POST = 10_000  # the server's limit for one produce request
DEFAULT_CHUNK = 1000  # chunkSize: messages per request
# A producer id is the prefix, the query and the partition: the server takes 256 characters.
MAX_PRODUCER_PREFIX = 128
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

# Every request the connector sends is safe to repeat (reads, writes with message ids,
# producer-sequenced appends; allowDuplicates writes accept the risk). A server that stays
# unreachable for this long fails the task with one clear line instead of hanging it.
CONNECTOR_RETRY = RetryPolicy(initial_delay=0.1, max_delay=2.0, give_up_after=10.0)


# Options only a read uses, and only a write: the other refuses them (see check_read).
READ_OPTIONS = (
    "startingOffset",
    "endingOffset",
    "numPartitions",
    "pageSize",
    "maxMessagesPerTrigger",
    "failOnDataLoss",
    "dls",
    "group",
    "cursor",
)
WRITE_OPTIONS = (
    "msgIdColumn",
    "allowDuplicates",
    "dataColumn",
    "headersColumn",
    "chunkSize",
    "producerIdPrefix",
    "reportPath",
)
# Every option, as documented: Spark hands them over in any case, errors name them so.
OPTIONS = ("url", "station", "path", "token", "timeout", *READ_OPTIONS, *WRITE_OPTIONS)
_NAMES = {name.lower(): name for name in OPTIONS}
# What a dead-letter read (dls=true) leaves unused: it reads the whole store, by pages.
_MESSAGE_READ_OPTIONS = ("startingOffset", "endingOffset", "numPartitions", "failOnDataLoss")
# The Kafka source's names for ours, which a data engineer is likely to type.
_KAFKA_NAMES = {
    "startingoffsets": "startingOffset",
    "endingoffsets": "endingOffset",
    "maxoffsetspertrigger": "maxMessagesPerTrigger",
    "minpartitions": "numPartitions",
}


def _check_names(keys: Iterable[str]) -> None:
    """Refuse an option that looks like one of ours but is not: ignored, it silently changed
    what the job does (``startingOffsets`` read the whole station). Others pass: Spark and
    users give options meant for other layers (``checkpointLocation``, ...)."""
    for key in keys:
        low = key.lower()
        if low in _NAMES:
            continue
        meant = _KAFKA_NAMES.get(low)
        if meant is None:
            close = difflib.get_close_matches(low, _NAMES, n=1, cutoff=0.8)
            meant = _NAMES[close[0]] if close else None
        if meant is not None:
            raise ValueError(
                f"option {key} is not an option of the stations format: did you mean {meant}?"
            )


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"option {_NAMES[name]} must be true or false (got {raw!r})")


def _int(options: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    value = _maybe_int(options, name, lo, hi)
    return default if value is None else value


def _maybe_int(options: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {_NAMES[name]} must be an integer (got {raw!r})") from None
    if not lo <= value <= hi:
        raise ValueError(f"option {_NAMES[name]} must be between {lo} and {hi} (got {value})")
    return value


@dataclass(frozen=True)
class Config:
    """The options (see ``stations.spark``), checked."""

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
    chunk_size: int = DEFAULT_CHUNK
    producer_prefix: str = "spark"
    report_path: str | None = None
    cursor: str | None = None
    given: frozenset[str] = frozenset()  # the options given, by their documented names

    @classmethod
    def parse(cls, options: Any) -> Config:
        given = {str(k): str(v) for k, v in dict(options).items()}
        _check_names(given)
        opts = {k.lower(): v for k, v in given.items()}
        station = opts.get("station") or opts.get("path")
        if not station:
            raise ValueError('the stations data source needs option("station", NAME)')
        starting = opts.get("startingoffset", "-1")
        ending = opts.get("endingoffset", "latest")
        for name, value in (("startingOffset", starting), ("endingOffset", ending)):
            if value != "latest":
                try:
                    position(value)
                except ValueError as exc:
                    raise ValueError(f"option {name}: {exc}") from None
        if "latest" not in (starting, ending) and position(starting) > position(ending):
            raise ValueError(
                f"option startingOffset {starting} is after option endingOffset {ending}: "
                "the range is empty"
            )
        url = (opts.get("url") or os.environ.get("STATIONS_URL") or DEFAULT_URL).rstrip("/")
        token = opts.get("token") or os.environ.get("STATIONS_TOKEN") or None
        try:
            timeout = float(opts.get("timeout", "60"))
        except ValueError:
            raise ValueError(f"option timeout must be a number (got {opts['timeout']!r})") from None
        try:
            check_server(url, token, timeout)
        except ValueError as exc:
            raise ValueError(f"option {exc}") from None
        prefix = opts.get("produceridprefix", "spark")
        if not 1 <= len(prefix) <= MAX_PRODUCER_PREFIX:
            raise ValueError(
                f"option producerIdPrefix must be 1 to {MAX_PRODUCER_PREFIX} characters"
            )
        return cls(
            url=url,
            station=station,
            token=token,
            timeout=timeout,
            starting=starting,
            ending=ending,
            num_partitions=_int(opts, "numpartitions", 4, 1, 100_000),
            page_size=_int(opts, "pagesize", MAX_PAGE, 1, MAX_PAGE),
            max_per_trigger=_maybe_int(opts, "maxmessagespertrigger", 1, 2**53),
            fail_on_data_loss=_flag(opts, "failondataloss", True),
            dls=_flag(opts, "dls", False),
            group=opts.get("group") or None,
            msg_id_column=opts.get("msgidcolumn") or None,
            allow_duplicates=_flag(opts, "allowduplicates", False),
            data_column=opts.get("datacolumn", "data"),
            headers_column=opts.get("headerscolumn", "headers"),
            chunk_size=_int(opts, "chunksize", DEFAULT_CHUNK, 1, MAX_MESSAGES_PER_POST),
            producer_prefix=prefix,
            report_path=opts.get("reportpath") or None,
            cursor=opts.get("cursor") or None,
            given=frozenset(_NAMES[k] for k in opts if k in _NAMES),
        )

    @property
    def api_path(self) -> str:
        """The station under the management API: ``/api/stations/{name}``."""
        return f"/api/stations/{path_segment(self.station, 'station')}"

    @property
    def stream_path(self) -> str:
        """The station as a Durable Streams URL path: ``/v1/stream/{name}``."""
        return f"/v1/stream/{stream_path(self.station)}"

    def http(self) -> BlockingHttp:
        """A blocking transport of the client core to the server (one connection)."""
        return BlockingHttp(self.url, self.token, timeout=self.timeout, retry=CONNECTOR_RETRY)


def refuse(cfg: Config, names: Iterable[str], why: str) -> None:
    """Refuse the first of ``names`` that was given: ``why`` says what it is for. Ignored, an
    option silently changed nothing the user asked for (``group`` read every group's letters)."""
    for name in names:
        if name in cfg.given:
            raise ValueError(f"option {name} is {why}")


def check_read(cfg: Config, *, streaming: bool) -> None:
    """Refuse the options a read (batch or streaming) would ignore."""
    refuse(cfg, WRITE_OPTIONS, "for writes (df.write, writeStream): a read does not use it")
    if not streaming:
        refuse(
            cfg,
            ("cursor", "maxMessagesPerTrigger"),
            "for streaming reads (spark.readStream): a batch read reads its whole range in one "
            "job and stores no progress on the server",
        )
    if not cfg.dls:
        refuse(
            cfg,
            ("group",),
            "for dead-letter reads (with option dls=true): it picks the group whose dead "
            "letters are read, and a read of the messages has no groups",
        )
    else:
        refuse(
            cfg,
            _MESSAGE_READ_OPTIONS,
            "for reads of the messages: a dead-letter read (dls=true) reads the whole "
            "dead-letter store (filter by group with option group)",
        )


def check_write(cfg: Config, *, streaming: bool) -> None:
    """Refuse the options a write (batch or streaming) would ignore."""
    refuse(cfg, READ_OPTIONS, "for reads (spark.read, spark.readStream): a write does not use it")
    if streaming:
        refuse(
            cfg,
            ("allowDuplicates", "reportPath"),
            "for batch writes (df.write): a streaming write deduplicates replayed batches by its "
            "producer sequence, and Spark reports its progress",
        )
    else:
        refuse(
            cfg,
            ("producerIdPrefix",),
            "for streaming writes (writeStream): a batch write deduplicates by the ids of "
            "msgIdColumn and sends no producer id",
        )


def station_view(cfg: Config) -> dict[str, Any]:
    """The station's view (config and stats); one clear line when it is missing or the
    server cannot be reached."""
    with cfg.http() as http:
        try:
            view: dict[str, Any] = http.call("GET", cfg.api_path, what="station").json()
        except StationNotFound:
            raise StationNotFound(
                f"station {cfg.station!r} does not exist at {cfg.url}", status=404
            ) from None
        except ConnectionFailed as exc:
            raise ConnectionFailed(unreachable(cfg.url, exc)) from None
    return view


def unreachable(url: str, exc: BaseException) -> str:
    return (
        f"cannot reach the Stations server at {url} ({exc}): the url must be reachable from "
        "the Spark driver and every executor (not 127.0.0.1 when executors run on other hosts)"
    )
