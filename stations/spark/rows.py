"""How rows become messages (writes) and messages rows (reads): JSON, text and bytes payloads,
ids and headers."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.types import BinaryType, StringType, StructType

from stations.spark.options import Config

if TYPE_CHECKING:
    import pyarrow as pa

_loads = orjson.loads


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


def dumpb(value: Any) -> bytes:
    """Spark values as JSON: decimals as numbers, bytes as base64, dates as ISO 8601."""
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


def dumps(value: Any) -> str:
    return dumpb(value).decode()


def data_text(msg: dict[str, Any], is_json: bool) -> str | None:
    """A message's payload as the ``data`` column: JSON text, text, or base64 of bytes."""
    if is_json:
        return dumps(msg.get("data"))
    if msg.get("dataBase64") is not None:  # not UTF-8: its base64 text
        return str(msg["dataBase64"])
    data = msg.get("data")
    return None if data is None else str(data)


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class RowShape:
    """How a row of the input DataFrame becomes a message."""

    is_json: bool
    data_column: str | None  # None: the whole row (without the headers column) is the payload
    data_is_text: bool
    data_is_binary: bool
    headers_column: str | None
    id_column: str | None

    @classmethod
    def of(cls, cfg: Config, schema: StructType, is_json: bool) -> RowShape:
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
            return value if self.is_json else dumps(value)
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
        return dumps(value)

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


def rows_of(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist(maps_as_pydicts="lossy")


def chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
