"""Message framing: how a request body becomes messages and messages become a response body.

JSON streams keep message boundaries: a body that is an array is flattened one level, anything
else is one message, and reads answer a JSON array. Other content types store each append as
one opaque message and read back as the concatenated bytes.
"""

from __future__ import annotations

import gc
import json
import math
import re
import traceback
from collections.abc import Iterator, Sequence
from typing import overload

import msgspec
import orjson

from stations.errors import BadRequest, TooLarge
from stations.records import exact_ints

SEP = b"\n"  # between the messages of a multi-message JSON row: compact JSON has no raw newline

# How a nonzero number that a double holds as 0 (below 2.5e-324) is written: with a negative
# exponent of three digits or more, or else with hundreds of zeros after the point (twenty are
# enough to look closer). The exponent's pattern starts with "-" for a fast scan.
_TINY_EXPONENT = re.compile(rb"-[0-9]{3}(?<=[eE]-[0-9]{3})")
_TINY_FRACTION = re.compile(rb"\.0{20}")
# How deep arrays and objects may nest in a JSON body. Deeper bodies are refused with a 400
# naming this limit; without one, Python's recursion limit would decide, as a 500.
MAX_DEPTH = 512
TOO_DEEP = f"the body is not valid JSON: nested deeper than {MAX_DEPTH} levels"


# The most digits an integer in a message may have: Python's own bound on turning digits into
# an integer and back (longer ones take time quadratic in their length), met with a clear 400.
MAX_INT_DIGITS = 4300


class OutOfRange(ValueError):
    """A JSON number that would not be stored as sent: one no double holds (it would be
    stored as infinity, refused by orjson and the standard library alike, or, nonzero, as
    0), or an integer of more than ``MAX_INT_DIGITS`` digits. ``path``: where in the body,
    dotted (empty: the body itself)."""

    def __init__(self, number: str, path: str) -> None:
        where = f" at {path}" if path else ""
        if _is_integer(number):
            why = f"has more than {MAX_INT_DIGITS} digits (send it as a string)"
        else:
            why = "is out of the range of a double (it would not be stored as sent)"
        super().__init__(f"the number {number[:40]}{where} {why}")
        self.path = path


def _is_integer(literal: str) -> bool:
    return literal.lstrip("-").isdigit()


class _OutOfRangeMark:
    """Stands for an out-of-range number in a parsed value until its path is known."""


_MARK = _OutOfRangeMark()


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def number_doubts(body: bytes) -> tuple[bool, bool]:
    """Whether ``body`` may hold (an integer orjson rounded: 20 digits or more, a nonzero
    number orjson took as 0: ``1e-99999``). Either may be in a string only."""
    long_ints = not exact_ints(body)  # true too where 20 digits follow a point
    tiny = _TINY_EXPONENT.search(body) is not None
    return long_ints, tiny or (long_ints and _TINY_FRACTION.search(body) is not None)


def exact_numbers(body: bytes) -> bool:
    """Whether orjson parsed every number of ``body`` as sent: no integer it rounded, none it
    took as 0. It refuses those that would be infinite by itself."""
    return not any(number_doubts(body))


def loads_exact(text: str) -> object:
    """``json.loads`` without the NaN / Infinity extensions, keeping every integer exactly
    and refusing (``OutOfRange``) a number a double cannot hold, infinite or nonzero read as
    0, and an integer of more than ``MAX_INT_DIGITS`` digits. Raises ValueError or
    RecursionError."""
    out: list[str] = []

    def number(literal: str) -> object:
        value = float(literal)
        nonzero = literal.lower().partition("e")[0].strip("-0.") != ""
        if math.isfinite(value) and (value != 0.0 or not nonzero):
            return value
        out.append(literal)
        return _MARK

    def integer(literal: str) -> object:
        if len(literal) - literal.startswith("-") <= MAX_INT_DIGITS:
            return int(literal)
        out.append(literal)
        return _MARK

    value = json.loads(text, parse_constant=_reject_constant, parse_float=number, parse_int=integer)
    if out:
        raise OutOfRange(out[0], _path_of_mark(value))
    return value


def _path_of_mark(value: object) -> str:
    """The dotted path of the first ``_MARK`` in ``value`` (iterative: ``value`` may nest as
    deep as the parser allowed)."""
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if item is _MARK:
            return path
        children: list[tuple[object, object]] = []
        if isinstance(item, dict):
            children = list(item.items())
        elif isinstance(item, list):
            children = list(enumerate(item))
        for key, child in reversed(children):  # the first child comes off the stack first
            stack.append((child, f"{path}.{key}" if path else str(key)))
    return ""


_REFUSED = object()  # what _orjson returns for a body orjson does not take


def _orjson(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _REFUSED


def _loads(body: bytes) -> object:
    return _exact(body, _orjson(body))


def _exact(body: bytes, value: object) -> object:
    """``body``'s value exactly, given what orjson made of it (or ``_REFUSED``)."""
    # orjson turns an integer beyond 64 bits into a float, losing digits, and a nonzero
    # number below a double's range into 0.0; only a body exact_numbers doubts can hold one,
    # and then the standard library parses it exactly or refuses it.
    if value is not _REFUSED and exact_numbers(body):
        return value
    try:
        # The standard library is laxer than JSON in other ways: it must not take NaN/Infinity
        # or a number that only fits as infinity (they would be stored as null).
        text = body.decode("utf-8")  # JSON text is UTF-8 (RFC 8259 §8.1), not UTF-16/32
        return loads_exact(text)
    except OutOfRange as exc:
        raise BadRequest(str(exc), "body") from None
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


class Span(Sequence[bytes]):
    """The messages of a JSON array, already joined by ``SEP`` as one row of the messages table
    stores them: the append path never holds them one by one."""

    __slots__ = ("data", "n")

    def __init__(self, data: bytes, n: int) -> None:
        self.data = data
        self.n = n

    @property
    def size(self) -> int:
        """The bytes of the messages themselves (without separators)."""
        return len(self.data) - (self.n - 1)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data.split(SEP))

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        return self.data.split(SEP)[index]


# A JSON array's elements as they are written, without parsing them (msgspec's Raw).
_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])


def _canonical_span(body: bytes, value: object) -> Span | None:
    """The messages of an array body that is already written the way each message is stored
    (orjson's compact form, as most clients send it), or None. Then the body's elements are the
    stored messages byte for byte, and one split of the body replaces a serialization of every
    message; a number orjson could not hold exactly reads back different, so it never passes."""
    if not isinstance(value, list) or len(value) < 2:
        return None
    try:
        canonical = orjson.dumps(value)
    except TypeError:
        return None
    if canonical != body:
        stripped = body.strip(b" \t\r\n")
        if canonical != stripped:
            return None
    try:
        elements = _ELEMENTS.decode(canonical)
    except msgspec.DecodeError:  # not expected of orjson's output; the slow path decides
        return None
    return Span(SEP.join(elements), len(elements)) if len(elements) == len(value) else None


def _span(values: list[object]) -> Sequence[bytes]:
    """``values`` as stored messages (orjson's compact form; raises TypeError where orjson
    does). Written as one array and split, not one ``orjson.dumps`` per value: each call
    leaves its 4 KiB buffer's tail behind in the heap, about 3 KB a message for good."""
    if len(values) < 2:
        return list(map(orjson.dumps, values))
    elements = _ELEMENTS.decode(orjson.dumps(values))
    return Span(SEP.join(elements), len(elements))


def joined(messages: Sequence[bytes]) -> bytes:
    """Messages as one row stores them, separated by ``SEP``."""
    return messages.data if isinstance(messages, Span) else SEP.join(messages)


def size(messages: Sequence[bytes]) -> int:
    """The bytes of the messages (separators not counted)."""
    return messages.size if isinstance(messages, Span) else sum(map(len, messages))


def too_many(count: int, max_messages: int) -> TooLarge:
    return TooLarge(
        f"the body holds {count} messages; an append takes at most {max_messages} "
        "(the server's --max-append-messages): send them in smaller appends",
        "body",
    )


def split_json(
    body: bytes, *, allow_empty: bool, max_messages: int | None = None
) -> Sequence[bytes]:
    """The messages of a JSON body: an array is flattened one level. An array of more than
    ``max_messages`` elements is refused (413) as soon as it is parsed, before any message is
    written out or stored."""
    if not body.strip():
        if allow_empty:
            return []
        raise BadRequest("the body is empty", "body")
    # The collector stays off for the whole split, the standard library's exact parse
    # included: parsing makes an object per JSON value (22 million for 64 MiB of
    # ``[[],[],...]``), and the collections those allocations set off, each over every young
    # object, made orjson's parse of that body 12 s instead of 2 s. JSON values hold no
    # cycles: reference counting frees them all. Off, the collector also never counts the
    # parsed value, garbage right after (a dict per message), so it does not grow the old
    # generation into full collections.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _split(body, allow_empty, max_messages)
    except BaseException as exc:
        # A refusal's traceback would keep the parsed value alive once the collector is back
        # on, and its first collection would go over all of it.
        drop_frames(exc)
        raise
    finally:
        if paused:
            gc.enable()


def drop_frames(exc: BaseException | None) -> None:
    """Clear the locals of the finished frames in ``exc``'s traceback and its context's."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__context__


def _split(body: bytes, allow_empty: bool, max_messages: int | None) -> Sequence[bytes]:
    value = _orjson(body)
    if max_messages is not None and isinstance(value, list) and len(value) > max_messages:
        count = len(value)
        del value  # freed while the collector is off
        raise too_many(count, max_messages)
    span = _canonical_span(body, value)
    if span is not None:
        return span
    value = _exact(body, value)
    if isinstance(value, list):
        if max_messages is not None and len(value) > max_messages:
            raise too_many(len(value), max_messages)  # a body orjson refused
        if not value and not allow_empty:
            raise BadRequest("an empty JSON array appends nothing", "body")
        try:
            return _span(value)  # the fast path: every value is plain JSON
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
