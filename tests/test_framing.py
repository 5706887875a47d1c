"""How a JSON body becomes messages: an array body written the way messages are stored is split
as it is (one ``Span``), anything else is parsed and written again, message by message; both
ways store the same bytes."""

from __future__ import annotations

import json

import orjson
import pytest

from stations.domain import framing
from stations.errors import BadRequest


def one_by_one(body: bytes) -> list[bytes]:
    """What each message is stored as, written again one by one (the slow way)."""
    value = json.loads(body)
    return [framing.dumps(v) for v in value] if isinstance(value, list) else [framing.dumps(value)]


BODIES = [
    b'[{"i":0,"pad":"abc"},{"i":1,"pad":"def"}]',  # as clients (and orjson) write it
    b"  [1,2,3]\n",  # whitespace around the array only
    b"[1, 2, 3]",  # whitespace inside: written again
    b'[{"a" : 1}, [ ]]',
    b"[1E2,-0,1.50,100.0]",  # numbers orjson writes differently
    b'["\\u00e9","\\/","\\n","\\u2028","\xc3\xa9"]',  # escapes and UTF-8
    b'[{"a":1,"a":2},{}]',  # a repeated key
    b"[123456789012345678901234567890,18446744073709551615,1]",  # beyond 64 bits, and at it
    b'[[[[1]]],{"x":[{"y":null}]},true,false,null,"s"]',
    b'["\\ud800",1]',  # a lone surrogate escape: orjson refuses it, the standard library keeps it
    b"[1]",  # one message
    b'{"a":[1,2]}',  # not an array: one message
    b'"text"',
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b[:30].decode("utf-8", "replace"))
def test_split_stores_what_writing_each_message_again_stores(body: bytes) -> None:
    messages = framing.split_json(body, allow_empty=False)
    assert list(messages) == one_by_one(body)
    assert len(messages) == len(one_by_one(body))
    assert framing.joined(messages) == framing.SEP.join(one_by_one(body))
    assert framing.size(messages) == sum(map(len, one_by_one(body)))


def test_a_body_written_as_stored_is_split_without_writing_it_again() -> None:
    value = [{"i": i, "pad": "x" * (i % 7), "f": i / 3, "u": "é\u2028"} for i in range(50)]
    body = orjson.dumps(value)
    span = framing.split_json(body, allow_empty=False)
    assert isinstance(span, framing.Span)
    assert span.data == b"\n".join(orjson.dumps(v) for v in value)
    assert len(span) == 50 and span.size == len(body) - 2 - 49
    assert span[0] == orjson.dumps(value[0]) and span[-1] == orjson.dumps(value[-1])
    assert span[1:3] == [orjson.dumps(value[1]), orjson.dumps(value[2])]


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b" [ ] ",
        b"[1,]",
        b"[1] x",
        b"[1e400,1]",
        b"[NaN,1]",
        b'["\xff",1]',
        b"[" * 600 + b"]" * 600,
    ],
    ids=lambda b: b[:20].decode("utf-8", "replace"),
)
def test_bad_arrays_are_refused(body: bytes) -> None:
    with pytest.raises(BadRequest):
        framing.split_json(body, allow_empty=False)


def test_deep_but_allowed_arrays_are_kept() -> None:
    deep = b"[" * 300 + b"1" + b"]" * 300  # beyond orjson's writer (255), within the limit
    body = b"[" + deep + b"," + deep + b"]"
    assert list(framing.split_json(body, allow_empty=False)) == [deep, deep]
