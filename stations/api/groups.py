"""Consumer groups and the dead-letter store under ``/api/stations/{name}`` (CONTRACT.md §4)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from stations.api import reading
from stations.api.auth import needs, reach
from stations.api.limits import may_wait, no_slot
from stations.api.stations import (
    _int_param,
    json_body,
    page_query,
    paged,
    query_once,
    service,
    settings_body,
    station_name,
)
from stations.domain import dls, messages, text
from stations.domain.fields import body_of, integer
from stations.domain.groups import (
    MAX_FETCH,
    Delivered,
    Named,
    parse_leases,
    parse_offsets,
    parse_seek,
    validate_name,
)
from stations.domain.instants import format_ms
from stations.domain.offsets import encode
from stations.domain.pages import BY_LAG, BY_NAME
from stations.domain.station import MAX_ACK_MS, MIN_ACK_MS
from stations.errors import BadRequest

MAX_WAIT_MS = 300_000


def _group(request: web.Request) -> str:
    return validate_name(request.match_info["group"])


def _body_int(body: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    return integer(body.get(key, default), key, lo, hi)


@needs("consume")
async def put_group(request: web.Request) -> web.Response:
    body = await settings_body(request) if request.can_read_body else {}
    # A group's limits decide when the lease timer dead-letters a message, and so copies it
    # into the station's dls.forwardTo: the token must cover that station too (CONTRACT.md
    # §5), which the write checks under the station's lock (``reach``), as fetch, nack and
    # dead-letter do.
    view, created = await service(request).ensure_group(
        station_name(request), _group(request), body, _exists(request), reach(request)
    )
    return web.json_response(view, status=201 if created else 200)


def _exists(request: web.Request) -> bool | None:
    """What ``If-Match: *`` (the group must exist: an edit never makes it again) or
    ``If-None-Match: *`` (it must not: a create never changes a standing one) ask; None for
    neither. Groups have no entity tags, so ``*`` is the one value either takes."""
    asked = {h: request.headers.getall(h, []) for h in ("If-Match", "If-None-Match")}
    for header, values in asked.items():
        if values and [v.strip() for v in values] != ["*"]:
            raise BadRequest(f"{header} takes only * on a group", header)
    if asked["If-Match"] and asked["If-None-Match"]:
        raise BadRequest("give If-Match or If-None-Match, not both", "If-None-Match")
    return True if asked["If-Match"] else False if asked["If-None-Match"] else None


@needs("consume")
async def list_groups(request: web.Request) -> web.Response:
    """Every group (the contract's list); with ``limit``, ``after``, ``prefix`` or ``contains``
    a page of them by name; with ``order=lag`` the ``limit`` furthest behind, one page only."""
    order = query_once(request, "order")
    if order not in (None, BY_NAME, BY_LAG):
        raise BadRequest(f"order must be {BY_NAME} or {BY_LAG}", "order")
    page = page_query(request, order=order)
    if page is None:
        return web.json_response({"groups": await service(request).groups(station_name(request))})
    if page.order == BY_LAG and page.after is not None:
        # Lags move between two requests: a group would be answered twice, or never.
        raise BadRequest("order=lag answers one page: after is not taken with it", "after")
    return paged("groups", await service(request).groups(station_name(request), page), page)


@needs("admin")
async def delete_group(request: web.Request) -> web.Response:
    await service(request).delete_group(station_name(request), _group(request))
    return web.Response(status=204)


@needs("consume")
async def fetch(request: web.Request) -> web.StreamResponse:
    # Every field has a default, so an empty body is a fetch with the defaults.
    raw = await json_body(request) if request.can_read_body else {}
    body = body_of(raw, {"max", "waitMs", "consumer"})
    max_count = _body_int(body, "max", 10, 1, MAX_FETCH)
    wait_ms = _body_int(body, "waitMs", 0, 0, MAX_WAIT_MS)
    consumer = text.check(body.get("consumer", "default"), "consumer", text.NAME)
    svc = service(request)
    name = station_name(request)
    waiting = wait_ms if may_wait(request) else 0
    # A fetch settles expired leases first, which may dead-letter: ``reach`` (as for nack).
    out = await svc.fetch(
        name, _group(request), max_count, waiting / 1000, consumer, reach(request)
    )
    if wait_ms and not waiting and not out.messages and not out.closed:
        raise no_slot(request)  # it would wait, and no slot is free for it
    answer: dict[str, Any] = {"messages": _views(out.is_json, out.messages)}
    if out.closed:  # the station is closed and the group has nothing left: stop fetching
        answer["closed"] = True
    encoded = orjson.dumps(answer)
    del answer
    # Counted in the read budget until sent (``out`` lives as long as this frame), and the
    # next fetches' answers shrink to what it has free (``Service._fetch_within_budget``).
    svc.budget.charge(out, len(encoded))
    return await reading.send_built(
        request, web.Response(body=encoded, content_type="application/json")
    )


def _views(is_json: bool, delivered: list[Delivered]) -> list[dict[str, Any]]:
    """A fetch's messages as the API answers them. Stored JSON (data on a JSON station, headers)
    is valid compact JSON already: it goes into the answer as it is (``orjson.Fragment``)
    instead of being parsed and serialized again, which was most of a fetch's cost per
    message."""
    deadline = format_ms(delivered[0].ack_deadline) if delivered else ""
    views: list[dict[str, Any]] = []
    for d in delivered:
        view: dict[str, Any] = {
            "offset": encode(d.seq - 1),
            "id": d.msg_id,
            "headers": orjson.Fragment(d.headers) if d.headers else {},
        }
        if is_json:
            view["data"] = orjson.Fragment(d.data)
        else:
            messages.put_data(view, d.data)
        view["deliveryCount"] = d.delivery_count
        view["ackDeadline"] = deadline  # one per fetch
        views.append(view)
    return views


async def _settle(
    request: web.Request, extra: set[str], by_lease: bool = False
) -> tuple[dict[str, Any], list[int], Named | None]:
    """The body, its positions and, with ``by_lease``, the deliveries its ``leases`` name
    (offset, deliveryCount, ackDeadline as a fetch answered them), given instead of
    ``offsets``: only those deliveries are settled, not a later one of the same message."""
    body = body_of(await json_body(request), {"offsets", *extra, *(["leases"] if by_lease else [])})
    if "leases" in body:
        if "offsets" in body:
            raise BadRequest("give offsets or leases (one of them)", "offsets")
        named = parse_leases(body["leases"])
        return body, list(named), named
    return body, parse_offsets(body.get("offsets")), None


@needs("consume")
async def ack(request: web.Request) -> web.Response:
    # By lease too, as nack and dead-letter: an ack by offset from a consumer whose lease a
    # seek revoked (or that expired) settles the message's later delivery, whose holder's
    # nack then finds nothing, and the redelivery the seek asked for was lost.
    _, seqs, named = await _settle(request, set(), by_lease=True)
    n, unknown = await service(request).ack(station_name(request), _group(request), seqs, named)
    return web.json_response({"acked": n, "unknown": unknown})


@needs("consume")
async def extend(request: web.Request) -> web.Response:
    body, seqs, named = await _settle(request, {"leaseMs", "consumer"}, by_lease=True)
    lease_ms = None
    if "leaseMs" in body:
        lease_ms = _body_int(body, "leaseMs", 0, MIN_ACK_MS, MAX_ACK_MS)
    consumer = None
    if "consumer" in body:
        consumer = text.check(body["consumer"], "consumer", text.NAME)
    n, deadline, unknown = await service(request).extend(
        station_name(request), _group(request), seqs, lease_ms, consumer, named
    )
    return web.json_response(
        # Not "ackDeadline": that is the lease's name, as its fetch answered it, which a
        # transaction gives; taken for it, this deadline could name a later delivery.
        {"extended": n, "leaseUntil": format_ms(deadline) if n else None, "unknown": unknown}
    )


@needs("consume")
async def nack(request: web.Request) -> web.Response:
    body, seqs, named = await _settle(request, {"delayMs"}, by_lease=True)
    delay = _body_int(body, "delayMs", 0, 0, 86_400_000)
    n, unknown = await service(request).nack(
        station_name(request), _group(request), seqs, delay, named, reach(request)
    )
    return web.json_response({"nacked": n, "unknown": unknown})


@needs("consume")
async def dead_letter(request: web.Request) -> web.Response:
    body, seqs, named = await _settle(request, {"reason"}, by_lease=True)
    reason = body.get("reason")
    if reason is not None:
        text.check(reason, "reason", text.LONG, least=0)
    n, unknown = await service(request).dead_letter(
        station_name(request), _group(request), seqs, reason, named, reach(request)
    )
    return web.json_response({"deadLettered": n, "unknown": unknown})


@needs("consume")
async def seek(request: web.Request) -> web.Response:
    target = parse_seek(await json_body(request))
    result = await service(request).seek(station_name(request), _group(request), target)
    return web.json_response(
        {"cursor": encode(result.cursor), "revoked": result.revoked, "dropped": result.dropped}
    )


@needs("consume")
async def list_dls(request: web.Request) -> web.StreamResponse:
    group = query_once(request, "group")
    if group is not None:  # empty, or not a group's name: PostgreSQL could not compare a NUL
        validate_name(group)
    limit = _int_param(request, "limit", 100, 1, 1000)
    after_raw = query_once(request, "after")
    after = None
    if after_raw:
        after = dls.parse_entry_id(after_raw)
        if after is None:
            raise BadRequest("after must be a DLS entry id", "after")
        after = min(after, dls.MAX_ENTRY_ID)  # past every entry: an empty page
    svc = service(request)
    # The page and its answer are counted in the read budget until sent, as a stream read's.
    async with svc.budget.room(dls.MAX_PAGE_BYTES, lambda: reading.connected(request)) as room:
        entries, nxt = await svc.dls_entries(
            station_name(request), group, limit, after, room.granted
        )
        response = web.json_response({"entries": entries, "next": nxt})
        del entries
        assert isinstance(response.body, bytes)
        room.resize(len(response.body))
        return await reading.send_built(request, response)


@needs("admin")
async def replay(request: web.Request) -> web.Response:
    n = await service(request).replay(station_name(request), await json_body(request))
    return web.json_response({"replayed": n})


@needs("admin")
async def drop(request: web.Request) -> web.Response:
    n = await service(request).drop(station_name(request), await json_body(request))
    return web.json_response({"dropped": n})


def routes() -> list[web.RouteDef]:
    one = "/api/stations/{name:[^{}]+?}"
    group = one + "/groups/{group:[^/{}]+}"
    return [
        web.get(one + "/groups", list_groups),
        web.put(group, put_group),
        web.delete(group, delete_group),
        web.post(group + "/fetch", fetch),
        web.post(group + "/ack", ack),
        web.post(group + "/extend", extend),
        web.post(group + "/nack", nack),
        web.post(group + "/dead-letter", dead_letter),
        web.post(group + "/seek", seek),
        web.get(one + "/dls", list_dls),
        web.post(one + "/dls/replay", replay),
        web.post(one + "/dls/drop", drop),
    ]
