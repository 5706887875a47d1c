"""How appended messages become request bodies: item kinds, sealed batches and JSON encoding.

No I/O and no scheduling: ``stations.client.producer`` decides when a batch is sealed and sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

# Item kinds: ready bytes, UTF-8 text whose meaning depends on the stream (a JSON string, or
# text), or an already JSON-encoded value (only valid on a JSON stream).
RAW, TEXT, OBJ = 0, 1, 2


@dataclass(eq=False)
class Batch:
    # Either the messages already joined (JSON values separated by ",", or the bytes of a byte
    # stream, back to back) or, for messages appended before the stream's content type was
    # known, a list of (kind, bytes) items, turned into a body when the batch is sent.
    data: bytes | None
    items: list[tuple[int, bytes]] | None
    size: int
    order: int  # position among all batches, never changes (seq does, on an epoch change)
    epoch: int = 0
    seq: int = 0
    settled: bool = False
    # A request for (epoch, seq) may have reached the server without a definite refusal: only
    # then is a 204 "duplicate" our own earlier attempt; before that it is another instance's.
    maybe_stored: bool = False


def batch_body(batch: Batch, is_json: bool, content_type: str | None) -> bytes:
    """The request body of ``batch``: a JSON array on a JSON stream, else the bytes joined."""
    if batch.data is not None:
        return b"[" + batch.data + b"]" if is_json else batch.data
    items = batch.items or []
    if is_json:
        parts = [json_bytes(p.decode()) if kind == TEXT else p for kind, p in items]
        return b"[" + b",".join(parts) + b"]"
    if any(kind == OBJ for kind, _ in items):
        raise TypeError(f"a {content_type} stream takes bytes or str, not JSON values")
    return b"".join(p for _, p in items)


# orjson's own types beyond JSON that json.dumps refuses too stay refused (TypeError).
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def json_bytes(value: Any) -> bytes:
    """One JSON value, compact. orjson for speed; json.dumps for what orjson does not take
    (non-string keys, integers beyond 64 bits, lone surrogates) and whenever orjson wrote a
    ``null``, because orjson writes NaN and Infinity as null where json.dumps refuses them: NaN
    and Infinity are not JSON, refuse them in append(), not as a 400 that stops the producer."""
    try:
        data = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError
        data = b"null"
    if b"null" in data:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return data
