"""Messages as the management API and consumers see them: ids, headers and decoded data.

``parse_batch`` turns ``{"messages": [{"id", "data" | "dataBase64", "headers"}]}`` into an
append for a station; ``to_view`` turns stored messages back into JSON-ready dicts.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import re
from typing import TYPE_CHECKING, Any

import orjson

from stations.domain import framing, log
from stations.domain.fields import body_of
from stations.domain.idwindow import IdWindow
from stations.domain.instants import format_ms
from stations.domain.log import AppendRequest, AppendResult
from stations.domain.offsets import encode
from stations.domain.reads import Message
from stations.errors import BadRequest
from stations.records import StreamState

if TYPE_CHECKING:
    from stations.store.writer import Batch

MAX_BATCH = 10_000
_MSG_ID = re.compile(r"[\x21-\x7e]{1,256}")
# Where a number orjson may have read inexactly can start: 20 digits after a comma, colon,
# bracket, minus or white space, or a negative of 19 (below -2^63).
_LONG_NUMBER = re.compile(rb"(?:^|[\s:,\[-])[0-9]{20}|-[0-9]{19}")


def valid_msg_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _MSG_ID.fullmatch(value):
        raise BadRequest(f"{field} must be 1 to 256 printable ASCII characters", field)
    return value


def _headers(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{field} must be an object of string values", field)
    return json.dumps(value, separators=(",", ":")) if value else None


def _one_json_value(data: bytes, field: str) -> bytes:
    """``dataBase64`` on a JSON station: exactly one JSON value, stored in canonical form."""
    try:
        value = loads_strict(data.decode("utf-8"))
    except framing.OutOfRange as exc:
        raise BadRequest(f"{field}: {exc}", field) from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(f"{field} must encode one UTF-8 JSON value", field) from None
    return _dumps(value, field)


def loads_strict(text: str) -> Any:
    """``json.loads`` without the NaN / Infinity extensions and without numbers that overflow
    to infinity (both would come back as ``null``). Raises ValueError or RecursionError.

    orjson parses it first (about 5x faster on a batch of messages); the standard library
    decides whatever orjson refuses (its error messages, lone surrogate escapes it accepts)
    and any body where orjson may have turned an integer beyond 64 bits into a float."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if framing.exact_numbers(text.encode("utf-8", "surrogatepass")):
            return value
    return framing.loads_exact(text)


class LoneSurrogate(ValueError):
    """A string of the body holds half of a UTF-16 surrogate pair (``"\\ud800"``): valid JSON,
    not text; no name, reason or message can be stored so. ``field``: where, dotted."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field or 'the body'} holds a lone UTF-16 surrogate escape")
        self.field = field


# A \uD800-\uDFFF escape: only then is a string looked at (orjson refuses lone ones, so this is
# the slow path already).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _find_lone_surrogate(value: Any, path: str = "") -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        where = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and _find_lone_surrogate(key) is not None:
            return where
        found = _find_lone_surrogate(item, where)
        if found is not None:
            return found
    return None


def loads_body(raw: bytes, max_messages: int | None = None) -> Any:
    """``loads_strict`` of a request body as it arrived: orjson reads the bytes (checking
    UTF-8 itself), so the body is neither decoded nor encoded again first. Raises ValueError,
    RecursionError, or UnicodeDecodeError for a body that is not UTF-8. With
    ``max_messages``, a produce body of more messages is refused (``check_count``) before
    its parsed value outlives the call."""
    # With the collector on, the collections that parsing's allocations set off, each over
    # every young object, made 64 MiB of {"messages":[[],[],...]} (22 million lists) take 12 s
    # of the event loop instead of 2 s. JSON values hold no cycles to collect; a refused value
    # is freed before the collector is back on, which would otherwise go over all of it once.
    paused = gc.isenabled()
    gc.disable()
    try:
        value = _loads_body(raw)
        if max_messages is not None:
            check_count(value, max_messages)
        return value
    except BaseException as exc:
        framing.drop_frames(exc)
        value = None  # this frame's own reference: drop_frames skips a running frame
        raise
    finally:
        if paused:
            gc.enable()


def _loads_body(raw: bytes) -> Any:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        # A run of 20 digits may be a number orjson read inexactly, or only part of a string
        # (a hex message id holds one about once in a thousand): only a run where a number
        # can start, after a comma, colon, bracket, minus or white space, sends the body to
        # the slow exact parser.
        long_ints, tiny = framing.number_doubts(raw)
        if not tiny and (not long_ints or not _LONG_NUMBER.search(raw)):
            return value
    try:
        value = loads_strict(raw.decode("utf-8"))
    except framing.OutOfRange as exc:
        # Stored, the number would read back as another value (0, or infinity): refused,
        # naming where it is (messages.0.data.x).
        raise BadRequest(str(exc), exc.path or "body") from None
    if _SURROGATE_ESCAPE.search(raw):
        found = _find_lone_surrogate(value)
        if found is not None:
            raise LoneSurrogate(found)
    return value


def _dumps(value: Any, field: str) -> bytes:
    try:
        return framing.dumps(value)
    except RecursionError:
        raise BadRequest(f"{field} is nested too deeply", field) from None
    except UnicodeEncodeError:
        raise BadRequest(f"{field} holds a lone surrogate, which is not Unicode", field) from None


def _data(item: dict[str, Any], state: StreamState, field: str) -> bytes:
    has_data, has_b64 = "data" in item, "dataBase64" in item
    if has_data == has_b64:
        raise BadRequest(f"{field} needs exactly one of data and dataBase64", f"{field}.data")
    if has_b64:
        raw = item["dataBase64"]
        try:
            data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None:
            raise BadRequest(f"{field}.dataBase64 must be base64", f"{field}.dataBase64")
        if state.is_json:
            return _one_json_value(data, f"{field}.dataBase64")
        return data
    if state.is_json:
        return _dumps(item["data"], f"{field}.data")
    if not isinstance(item["data"], str):
        raise BadRequest(
            f"{field}.data must be a string for a {state.content_type} station (or use dataBase64)",
            f"{field}.data",
        )
    try:
        return item["data"].encode()
    except UnicodeEncodeError:
        # A lone surrogate (an escaped "\\ud800") is no UTF-8 text.
        raise BadRequest(f"{field}.data must be valid Unicode text", f"{field}.data") from None


_PLAIN_KEYS = {"id", "data"}
# Many ids checked by one match over them joined by newlines (no id may hold one).
_MSG_IDS = re.compile(r"[\x21-\x7e]{1,256}(?:\n[\x21-\x7e]{1,256})*")


def _plain_items(items: list[Any]) -> tuple[list[str | None], None, list[bytes]] | None:
    """The common shape on a JSON station, a column at a time: every item an object with
    ``data`` and maybe an ``id``, nothing else. None: some item is not, and the careful
    per-item path decides (and names the offending field)."""
    try:
        if not all([type(item) is dict and item.keys() <= _PLAIN_KEYS for item in items]):
            return None
        datas = [orjson.dumps(item["data"]) for item in items]
        ids = [item.get("id") for item in items]
        given = [msg_id for msg_id in ids if msg_id is not None]
        joined = "\n".join(given)
        if given and (joined.count("\n") >= len(given) or not _MSG_IDS.fullmatch(joined)):
            return None  # an id holding a newline, too long, empty or not printable ASCII
    # A missing data, a non-string id, a value orjson cannot write (an integer beyond 64 bits,
    # a lone surrogate, deep nesting): the careful path.
    except (KeyError, TypeError, RecursionError):
        return None
    return ids, None, datas


def check_count(body: Any, max_messages: int = MAX_BATCH) -> None:
    """400 for a produce body of more messages than a request may carry: checked before the
    request waits for the writer (``parse_batch`` checks again, with the rest of the shape)."""
    limit = min(MAX_BATCH, max_messages)  # the server's --max-append-messages may be lower
    items = body.get("messages") if isinstance(body, dict) else None
    if isinstance(items, list) and len(items) > limit:
        raise BadRequest(f"at most {limit} messages per request", "messages")


_BATCH_KEYS = frozenset({"messages"})


def parse_batch(state: StreamState, body: Any, max_messages: int = MAX_BATCH) -> AppendRequest:
    items = body_of(body, _BATCH_KEYS, '{"messages": [...]}').get("messages")
    if not isinstance(items, list) or not items:
        raise BadRequest("messages must be a non-empty array", "messages")
    check_count(body, max_messages)
    req = AppendRequest(name=state.name, content_type=state.content_type)
    fast = _plain_items(items) if state.is_json else None
    if fast is not None:
        req.msg_ids, req.headers, req.messages = fast
        return req
    ids: list[str | None] = []
    headers: list[str | None] = []
    datas: list[bytes] = []
    is_json = state.is_json
    fields = {"id", "data", "dataBase64", "headers"}
    for i, item in enumerate(items):
        # The common shape is checked inline; anything else takes the careful path that
        # names the offending field.
        if type(item) is dict and item.keys() <= fields:
            msg_id = item.get("id")
            if msg_id is not None and (type(msg_id) is not str or not _MSG_ID.fullmatch(msg_id)):
                valid_msg_id(msg_id, f"messages.{i}.id")
            raw_headers = item.get("headers")
            if is_json and "data" in item and "dataBase64" not in item:
                try:
                    data = framing.dumps(item["data"])
                except (RecursionError, UnicodeEncodeError):
                    data = _data(item, state, f"messages.{i}")
            else:
                data = _data(item, state, f"messages.{i}")
            ids.append(msg_id)
            headers.append(
                None if raw_headers is None else _headers(raw_headers, f"messages.{i}.headers")
            )
            datas.append(data)
            continue
        field = f"messages.{i}"
        if not isinstance(item, dict):
            raise BadRequest(f"{field} must be an object", field)
        path = f"{field}.{sorted(set(item) - fields)[0]}"
        raise BadRequest(f"unknown field {path}", path)
    req.msg_ids, req.headers, req.messages = ids, headers, datas
    return req


def produce(
    batch: Batch, window: IdWindow, name: str, body: Any, max_messages: int = MAX_BATCH
) -> tuple[AppendResult, StreamState]:
    """``POST /api/stations/{name}/messages`` as one op of the writer: the station's state is
    the batch's own, so the request costs no separate read of it first."""
    state = log.live_stream(batch.stream(name), name, batch.now)
    return log.append(batch, window, parse_batch(state, body, max_messages)), state


def put_data(view: dict[str, Any], data: bytes) -> None:
    """A non-JSON station's data: as text where it is UTF-8, else base64."""
    try:
        view["data"] = data.decode()
    except UnicodeDecodeError:
        view["data"] = None
        view["dataBase64"] = base64.b64encode(data).decode()


def to_view(state: StreamState, msg: Message) -> dict[str, Any]:
    view: dict[str, Any] = {
        "offset": encode(msg.seq - 1),
        "id": msg.msg_id,
        "headers": json.loads(msg.headers) if msg.headers else {},
        "time": format_ms(msg.stored_at),
    }
    if state.is_json:
        view["data"] = json.loads(msg.data)
    else:
        put_data(view, msg.data)
    return view
