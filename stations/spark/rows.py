"""How rows become messages (writes) and messages rows (reads): JSON, text and bytes payloads,
ids and headers."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from stations.spark.options import Config

if TYPE_CHECKING:
    import pyarrow as pa

# Every digit as "0", every other byte as a space: a run of 19 digits is then a substring
# (translate and a substring search are a fraction of orjson's own time on a page).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19
# Where an integer orjson reads inexactly can start (as the server checks its bodies): 20
# digits after a separator, or a negative of 19. A 19-digit nanosecond timestamp or snowflake
# id orjson reads exactly, and sent the whole page to the slower parser (3x).
_INEXACT = re.compile(rb"(?:^|[\s:,\[-])[0-9]{20}|-[0-9]{19}")
_MSG_ID = re.compile(r"[\x21-\x7e]{1,256}")  # the server's Msg-Id rule (stations.domain.messages)


# How a DataFrame's NaN becomes null, in the error a NaN row gets (``stations pipeline``, which
# has no DataFrame for the user to change, says how in a source file instead).
NANVL_HINT = "(F.nanvl(col, F.lit(None)) for NaN)"


def _exact_int(text: str) -> int | orjson.Fragment:
    """An integer as it is: one beyond 64 bits as its own digits, which ``dumpb`` writes
    back unchanged (orjson has no such integers)."""
    value = int(text)
    return value if -(2**63) <= value < 2**64 else orjson.Fragment(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: bytes | str) -> Any:
    """JSON text as Python values, every number as the server stores it.

    orjson reads an integer beyond 64 bits as a float (digits lost), where the server and the
    SDK keep it exactly. A text that may hold one (``_INEXACT``) is read by the standard
    library, keeping those integers exact; the rest (nearly every page) by orjson."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if _LONG_RUN not in raw.translate(_DIGITS_ONLY) or not _INEXACT.search(raw):
        return orjson.loads(text)
    # Decoded here: given bytes, json.loads would take UTF-16 and UTF-32 too.
    decoded = text if isinstance(text, str) else text.decode("utf-8")
    return json.loads(decoded, parse_int=_exact_int, parse_constant=_no_constant)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        # Its own digits (as a float it kept about 16); JSON has no NaN or Infinity: null,
        # as orjson writes a NaN float. (A Spark decimal is never one, and rows with a NaN or
        # an Infinity float are refused before they get here: RowShape.check_finite.)
        return orjson.Fragment(str(value)) if value.is_finite() else None
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
    # The columns that hold floats (at any depth) and become JSON or the id: each batch is
    # checked for NaN and Infinity in them (see check_finite).
    float_columns: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: Config, schema: StructType, is_json: bool) -> RowShape:
        """Checked on the driver, naming the option: on an executor a wrong column was a
        Python error deep in a task, or no error at all (a misspelt dataColumn)."""
        names = {f.name: f for f in schema.fields}
        listed = ", ".join(names)
        if cfg.msg_id_column is not None:
            ident = names.get(cfg.msg_id_column)
            if ident is None:
                raise ValueError(
                    f"msgIdColumn {cfg.msg_id_column!r} is not a column of the DataFrame ({listed})"
                )
            if isinstance(ident.dataType, _NOT_AN_ID):
                raise ValueError(
                    f"msgIdColumn {cfg.msg_id_column!r} is a {ident.dataType.simpleString()} "
                    "column: a message id is text without spaces; cast it to a string"
                )
        # An option given by name must name a column (only the defaults may be absent).
        for option, column, default in (
            ("dataColumn", cfg.data_column, "data"),
            ("headersColumn", cfg.headers_column, "headers"),
        ):
            if column != default and column not in names:
                raise ValueError(f"{option} {column!r} is not a column of the DataFrame ({listed})")
        heads = names.get(cfg.headers_column)
        if heads is not None and not isinstance(heads.dataType, MapType):
            raise ValueError(
                f"headersColumn {cfg.headers_column!r} is a {heads.dataType.simpleString()} "
                "column: headers are a map of strings (create_map, or map_from_entries)"
            )
        data = names.get(cfg.data_column)
        headers = cfg.headers_column if cfg.headers_column in names else None
        # The payload is the data column or, without one, every column but the headers.
        sent = [data.name] if data else [n for n in names if n != headers]
        if cfg.msg_id_column is not None:
            sent.append(cfg.msg_id_column)
        return cls(
            is_json=is_json,
            data_column=data.name if data else None,
            data_is_text=data is not None and isinstance(data.dataType, StringType),
            data_is_binary=data is not None and isinstance(data.dataType, BinaryType),
            headers_column=headers,
            id_column=cfg.msg_id_column,
            float_columns=tuple(dict.fromkeys(n for n in sent if _has_floats(names[n].dataType))),
        )

    def check_finite(self, batch: pa.RecordBatch) -> None:
        """Refuse a batch with a NaN or an Infinity in a column that becomes JSON or the id,
        naming the column. JSON has none: orjson writes them as null, so a NaN score was stored
        as null without a word; as an id, every NaN row got the id "nan" and all but the first
        were dropped as duplicates. Vectorised: rows are walked only to name the bad one."""
        for name in self.float_columns:
            column = batch.column(batch.schema.get_field_index(name))
            path = _nonfinite_path(column, name)
            if path is None:
                continue
            for index, value in enumerate(column.to_pylist()):
                what = _nonfinite(value)
                if what is not None:  # (a value under a null struct is no value: skipped)
                    raise self._nonfinite_error(path, what, batch, index)

    def _nonfinite_error(
        self, path: str, what: str, batch: pa.RecordBatch, index: int
    ) -> ValueError:
        where = "a row"
        if self.id_column is not None and self.id_column != path:
            ident = batch.column(batch.schema.get_field_index(self.id_column))[index].as_py()
            where = f"the row with {self.id_column} {str(ident)[:60]!r}"
        return ValueError(
            f"column {path!r} holds {what} in {where}: JSON has no NaN or Infinity, and "
            "writing null instead would change the data; replace it with null yourself if "
            f"that is meant {NANVL_HINT}, or filter such rows out"
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
            if self.data_is_binary and value is not None:
                # The JSON the bytes hold (a Kafka value, say), in both writes: a streaming
                # write sent them through dumpb, which stored a JSON string of their base64.
                try:
                    return _loads(bytes(value))
                except ValueError:
                    raise ValueError(
                        f"column {self.data_column!r} must hold UTF-8 JSON for a JSON station "
                        f"(got {bytes(value)[:60]!r}): cast it to a string and build the JSON, "
                        "or write to a binary station"
                    ) from None
            return value
        if self.data_is_text or self.data_is_binary or value is None:
            return value
        return dumps(value)

    def empty_row(self) -> ValueError:
        return ValueError(
            f"a row's {self.data_column or 'data'} is null or empty: a text or binary station "
            "has no empty messages (filter such rows out, or give them a value)"
        )

    def message(self, row: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {}
        if self.id_column is not None:
            ident = row[self.id_column]
            if ident is None or ident == "":
                raise ValueError(
                    f"msgIdColumn {self.id_column!r} is null or empty in a row: every message needs an id"
                )
            msg["id"] = str(ident)
            if not _MSG_ID.fullmatch(msg["id"]):
                # The server's rule (Msg-Id), said before sending: its 400 named a place in
                # one request ("messages.5.id"), not the column nor the value.
                raise ValueError(
                    f"msgIdColumn {self.id_column!r} holds {msg['id'][:80]!r} in a row: a "
                    "message id is 1 to 256 printable ASCII characters, without spaces"
                )
        value = self.payload(row)
        if not self.is_json and not value:
            # Stored as an empty message, which Durable Streams readers never see (a streaming
            # write refused such rows already).
            raise self.empty_row()
        if isinstance(value, (bytes, bytearray)):
            msg["dataBase64"] = base64.b64encode(bytes(value)).decode()
        else:
            msg["data"] = value
        if self.headers_column is not None and row[self.headers_column]:
            # A null value is no header (it was stored as the text "None").
            given = dict(row[self.headers_column]).items()
            msg["headers"] = {str(k): str(v) for k, v in given if v is not None}
        return msg


def rows_of(
    batches: Iterable[pa.RecordBatch], shape: RowShape | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of ``batches``; with ``shape``, each batch checked first (``check_finite``)."""
    for batch in batches:
        if shape is not None:
            shape.check_finite(batch)
        yield from batch.to_pylist(maps_as_pydicts="lossy")


def _has_floats(kind: DataType) -> bool:
    if isinstance(kind, (FloatType, DoubleType)):
        return True
    if isinstance(kind, StructType):
        return any(_has_floats(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return _has_floats(kind.elementType)
    if isinstance(kind, MapType):
        return _has_floats(kind.keyType) or _has_floats(kind.valueType)
    return False


def _nonfinite_path(array: pa.Array[Any], path: str) -> str | None:
    """Where in ``array`` a NaN or an Infinity is (``col``, ``col.field``, ``col[]``,
    ``col{}``), found with Arrow's kernels; None when there is none."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.FloatingPointArray):
        return path if pc.any(pc.invert(pc.is_finite(array))).as_py() else None
    if isinstance(array, pa.StructArray):
        for i in range(array.type.num_fields):
            found = _nonfinite_path(array.field(i), f"{path}.{array.type.field(i).name}")
            if found is not None:
                return found
        return None
    if isinstance(array, pa.MapArray):  # (a MapArray is a ListArray too)
        return _nonfinite_path(array.keys, f"{path}{{}}") or _nonfinite_path(
            array.items, f"{path}{{}}"
        )
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        return _nonfinite_path(array.flatten(), f"{path}[]")
    return None


def _nonfinite(value: Any) -> str | None:
    """``"NaN"`` or ``"Infinity"`` when ``value`` (a row's Python value) holds one."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return None
    if isinstance(value, dict):
        value = list(value.items())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _nonfinite(item)
            if found is not None:
                return found
    return None


# The most bytes of messages one request carries: below the server's default body limit (64 MiB)
# with room for the JSON around them. A chunk of chunkSize rows of 34 MB each was refused (413)
# on every replay, the chunk size being pinned by the batch's epoch.
MAX_CHUNK_BYTES = 48 * 1024 * 1024
# Boolean too: every row's id was "True" or "False", and all but two rows were "duplicates".
_NOT_AN_ID = (
    BinaryType,
    BooleanType,
    ArrayType,
    MapType,
    StructType,
    TimestampType,
    TimestampNTZType,
)


def chunks(
    messages: Iterable[bytes], size: int, max_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[list[bytes]]:
    """Encoded ``messages`` in lists of at most ``size`` and of at most ``max_bytes`` (with a
    separator each), but always at least one. The same messages are cut the same way every
    time: a replayed streaming batch sends the same requests."""
    chunk: list[bytes] = []
    used = 0
    for item in messages:
        weight = len(item) + 1
        if chunk and used + weight > max_bytes:
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += weight
        if len(chunk) >= size:
            yield chunk
            chunk, used = [], 0
    if chunk:
        yield chunk
