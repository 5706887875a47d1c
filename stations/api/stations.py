"""The management API under ``/api`` (CONTRACT.md §4): stations and producing with ids."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from stations.api import keys, reading
from stations.api.auth import TOKEN, needs, require_station
from stations.api.limits import LIMITS
from stations.domain import instants, messages
from stations.domain.offsets import EARLIEST, BadOffset, decode_start, encode, encode_template
from stations.domain.pages import BY_NAME, Page
from stations.domain.service import BROWSE_BYTES
from stations.domain.station import validate_name
from stations.errors import BadRequest


def service(request: web.Request):  # type: ignore[no-untyped-def]
    return request.app[keys.SERVICE]


def station_name(request: web.Request) -> str:
    # aiohttp has already decoded %2F into "/" in the matched path.
    name = request.match_info["name"]
    if "\x00" in name:  # no station has one, and PostgreSQL cannot even compare it (a 500)
        raise BadRequest("a station name never holds NUL", "name")
    # A name no station can have is a 400 naming the rule, as on /v1/stream (it was "station
    # ... not found", the whole name repeated however long).
    return validate_name(name, "name")


_DIGITS = re.compile(r"[0-9]{1,18}")
# One result of a produce: its offset token (see ``encode``) and whether it was a duplicate.
_STORED = f'{{"offset":"{encode_template()}","duplicate":false}}'
_DUPLICATE = f'{{"offset":"{encode_template()}","duplicate":true}}'
_UNKNOWN = '{"offset":null,"duplicate":true}'


async def json_body(request: web.Request, max_messages: int | None = None) -> Any:
    """The request's JSON body; with ``max_messages``, a produce body of more messages is
    refused as soon as it is parsed (see ``messages.check_count``)."""
    if not request.can_read_body:
        raise BadRequest("a JSON body is required", None)
    raw = await request.read()
    try:
        return messages.loads_body(raw, max_messages)
    except messages.LoneSurrogate as exc:
        raise BadRequest(str(exc), exc.field or None) from None
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8", None) from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply", None) from None
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", None) from None


async def settings_body(request: web.Request) -> Any:
    """A body of settings (a station's, a group's): JSON as ``json_body`` takes it, and no key
    given twice in one object. Parsers differ on which of two copies wins (this one took the
    last, others the first), so a client and the server could read different settings."""
    body = await json_body(request)
    try:
        json.loads(await request.read(), object_pairs_hook=_refuse_repeated_keys)
    except _RepeatedKey as exc:
        raise BadRequest(f"{exc.key} is given twice in one object", exc.key) from None
    except (ValueError, RecursionError):  # json_body took it: parsers' limits differ
        raise BadRequest("the body is nested too deeply", None) from None
    return body


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def query_once(request: web.Request, name: str) -> str | None:
    """A query parameter that may be given once (which of two was meant is unsaid)."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise BadRequest(f"{name} may be given once", name)
    return values[0] if values else None


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = query_once(request, name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not lo <= int(raw) <= hi:
        raise BadRequest(f"{name} must be an integer from {lo} to {hi}", name)
    return int(raw)


MAX_PAGE = 1000
PAGE_KEYS = ("limit", "after", "prefix", "contains")


def page_query(
    request: web.Request,
    shown: Callable[[str], bool] | None = None,
    order: str | None = None,
) -> Page | None:
    """The page a list asks for (``limit``, ``after``, ``prefix``, ``contains``), or None for
    the whole list as the contract has it. A console at 10,000 stations downloaded 4.5 MB
    every two seconds to show a hundred rows. ``order`` (given: the list is paged whatever
    else is asked) is the page's order."""
    asked = {key: query_once(request, key) for key in PAGE_KEYS}
    if order is None and all(value is None for value in asked.values()):
        return None
    for key, value in asked.items():
        if value is not None and "\x00" in value:  # no name holds one; PostgreSQL refuses it
            raise BadRequest(f"{key} must not hold a NUL character", key)
    return Page(
        limit=_int_param(request, "limit", 100, 1, MAX_PAGE),
        after=asked["after"],
        prefix=asked["prefix"] or "",
        contains=asked["contains"] or "",
        shown=shown,
        order=order or BY_NAME,
    )


def paged(key: str, views: list[dict[str, Any]], page: Page) -> web.Response:
    """A page of a list answered: at most its limit of ``views`` (given one more when there
    is a next page) and ``next``, the ``after`` of the next page (null on the last)."""
    more = len(views) > page.limit
    views = views[: page.limit]
    return json_answer({key: views, "next": views[-1]["name"] if more else None})


def json_answer(answer: Any) -> web.Response:
    try:  # orjson: the standard library's encoder took most of the time at 10,000 stations
        body = orjson.dumps(answer)
    except TypeError:  # an integer beyond 64 bits, which a config of an old version may hold
        body = json.dumps(answer).encode()
    return web.Response(body=body, content_type="application/json", charset="utf-8")


@needs("read")
async def list_stations(request: web.Request) -> web.Response:
    token = request.get(TOKEN)
    page = page_query(request, token.covers if token is not None else None)
    if page is not None:
        return paged("stations", await service(request).stations(page), page)
    views = await service(request).stations()
    if token is not None:  # a token limited to some stations lists only those
        views = [v for v in views if token.covers(v["name"])]
    return json_answer({"stations": views})


def _require_named_stations(request: web.Request, body: Any) -> None:
    """The stations a create or PATCH body names besides the path's: its ``name`` and its
    ``dls.forwardTo`` target, which dead letters are written into (CONTRACT.md §5)."""
    if not isinstance(body, dict):
        return
    require_station(request, body.get("name"), "name")
    dls = body.get("dls")
    if isinstance(dls, dict):
        require_station(request, dls.get("forwardTo"), "dls.forwardTo")


@needs("admin")
async def create_station(request: web.Request) -> web.Response:
    body = await settings_body(request)
    _require_named_stations(request, body)
    view, created = await service(request).create_station(body)
    return web.json_response(view, status=201 if created else 200)


@needs("read")
async def get_station(request: web.Request) -> web.Response:
    return web.json_response(await service(request).station(station_name(request)))


@needs("admin")
async def patch_station(request: web.Request) -> web.Response:
    body = await settings_body(request)
    _require_named_stations(request, body)
    # ?createdAt=, as on DELETE: only the station created then is changed.
    name = station_name(request)
    return web.json_response(await service(request).patch_station(name, body, _created_at(request)))


def _created_at(request: web.Request) -> int | None:
    """The ``createdAt`` a DELETE or PATCH names (as a StationView gives it), in ms; None if
    not given."""
    raw = query_once(request, "createdAt")
    if raw is None:
        return None
    when = instants.parse(raw, "createdAt")
    # A createdAt is whole ms: rounding could match what was not meant.
    if not when.whole_ms:
        raise BadRequest("createdAt is given to the millisecond at most", "createdAt")
    return when.ms


@needs("admin")
async def delete_station(request: web.Request) -> web.Response:
    # ?createdAt=: only the station created then (one deleted and created again since is a
    # 409 naming createdAt, and nothing is deleted); decided in the delete's own transaction.
    name = station_name(request)
    await service(request).delete(name, _created_at(request))
    return web.Response(status=204)


@needs("produce")
async def produce(request: web.Request) -> web.Response:
    cap = request.app[LIMITS].max_append_messages
    body = await json_body(request, cap)
    result, _state = await service(request).produce(station_name(request), body, cap)
    # Written directly: a dict per message for a JSON encoder cost twice as much.
    answer = ",".join(
        [
            _UNKNOWN if offset is None else (_DUPLICATE if dup else _STORED) % offset
            for offset, dup in result.results
        ]
    )
    text = f'{{"results":[{answer}],"nextOffset":"{encode(result.tail)}"}}'
    return web.Response(body=text.encode(), content_type="application/json")


@needs("consume")
async def browse(request: web.Request) -> web.StreamResponse:
    tokens = request.query.getall("offset", ["-1"])
    token = tokens[0]
    if len(tokens) > 1:
        raise BadRequest("offset may be given once", "offset")
    try:
        # ``-1`` is the earliest retained message; an offset the client names is that position,
        # 410 once retention dropped it (the zero offset too), as on the Durable Streams read.
        position = decode_start(token)
        # Only the exact tokens the server mints (``decode`` lets a trailing newline through).
        if position is not EARLIEST and encode(position) != token:
            raise BadOffset(token)
    except BadOffset:
        raise BadRequest(f"malformed offset {token[:80]!r}", "offset") from None
    limit = _int_param(request, "limit", 100, 1, 1000)
    svc = service(request)
    # The page and its answer are counted in the read budget until sent, as a stream read's.
    async with svc.budget.room(BROWSE_BYTES, lambda: reading.connected(request)) as room:
        result = await svc.browse(station_name(request), position, limit, room.granted)
        response = web.json_response(
            {
                "messages": [messages.to_view(result.state, m) for m in result.messages],
                "nextOffset": encode(result.next),
                "upToDate": result.up_to_date,
            }
        )
        del result
        assert isinstance(response.body, bytes)
        room.resize(len(response.body))
        return await reading.send_built(request, response)


@needs("read")
async def not_found(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()


def routes() -> list[web.RouteDef]:
    one = "/api/stations/{name:[^{}]+?}"
    return [
        web.get("/api/stations", list_stations),
        web.post("/api/stations", create_station),
        web.post(one + "/messages", produce),
        web.get(one + "/messages", browse),
        web.get(one, get_station),
        web.patch(one, patch_station),
        web.delete(one, delete_station),
    ]
