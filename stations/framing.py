"""Message framing: how a request body becomes messages and messages become a response body.

JSON streams keep message boundaries: a body that is an array is flattened one level, anything
else is one message, and reads answer a JSON array. Other content types store each append as
one opaque message and read back as the concatenated bytes.
"""

from __future__ import annotations

import json

import orjson

from stations.errors import BadRequest


def _loads(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        # orjson refuses integers beyond 64 bits, which are still valid JSON.
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", "body") from None


def dumps(value: object) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def split_json(body: bytes, *, allow_empty: bool) -> list[bytes]:
    """The messages of a JSON body: an array is flattened one level."""
    if not body.strip():
        if allow_empty:
            return []
        raise BadRequest("the body is empty", "body")
    value = _loads(body)
    if isinstance(value, list):
        if not value and not allow_empty:
            raise BadRequest("an empty JSON array appends nothing", "body")
        return [dumps(v) for v in value]
    return [dumps(value)]


def join_json(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"
