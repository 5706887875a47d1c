"""Message framing: how a request body becomes messages and messages become a response body.

JSON streams keep message boundaries: a body that is an array is flattened one level, anything
else is one message, and reads answer a JSON array. Other content types store each append as
one opaque message and read back as the concatenated bytes.
"""

from __future__ import annotations

import json

import orjson

from stations.domain.errors import BadRequest

# Every digit becomes "0", everything else a space: a run of 20 zeros is then a run of 20 digits,
# which bytes.translate and a substring search find far faster than a regular expression.
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_TWENTY_DIGITS = b"0" * 20
# How deep arrays and objects may nest in a JSON body. Deeper bodies are refused with a 400
# naming this limit; without one, Python's recursion limit would decide, as a 500.
MAX_DEPTH = 512
TOO_DEEP = f"the body is not valid JSON: nested deeper than {MAX_DEPTH} levels"


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def exact_ints(body: bytes) -> bool:
    """Whether orjson parsed every integer of ``body`` exactly (none has 20 digits or more)."""
    return _TWENTY_DIGITS not in body.translate(_DIGITS_ONLY)


def _loads(body: bytes) -> object:
    try:
        value = orjson.loads(body)
        # orjson turns an integer beyond 64 bits into a float, losing digits; only a run of 20
        # or more digits can be one, and then the standard library parses it exactly.
        if exact_ints(body):
            return value
    except orjson.JSONDecodeError:
        pass
    try:
        # The standard library is laxer than JSON in other ways: it must not take NaN/Infinity
        # or a number that only fits as infinity (they would be stored as null).
        text = body.decode("utf-8")  # JSON text is UTF-8 (RFC 8259 §8.1), not UTF-16/32
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", "body") from None
    except RecursionError:
        raise BadRequest(TOO_DEEP, "body") from None


def check_depth(value: object) -> None:
    """400 if ``value`` nests arrays and objects deeper than ``MAX_DEPTH`` (iterative: a deep
    value must not exhaust the stack here either)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(TOO_DEEP, "body")
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((c, depth + 1) for c in children if isinstance(c, list | dict))


def dumps(value: object) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        pass
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate escape ("\ud800") is JSON syntax; keep it escaped.
        return json.dumps(value, separators=(",", ":")).encode()


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
        try:
            return list(map(orjson.dumps, value))  # the fast path: every value is plain JSON
        except TypeError:
            # orjson refuses values nested deeper than 255 levels (among others): the standard
            # library writes those, once the depth is known to be within the limit.
            check_depth(value)
            return [dumps(v) for v in value]
    try:
        return [orjson.dumps(value)]
    except TypeError:
        check_depth(value)
        return [dumps(value)]


def join_json(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"
