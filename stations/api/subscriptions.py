"""Durable Streams subscriptions over HTTP: ``/v1/stream/__ds/...`` (PROTOCOL.md §6-7).

Routed before the stream routes, so no control path is taken for a stream. Callbacks, acks and
releases are authorized by the wake's own bearer token (checked before the writer), not by a
service token; the JWKS is public; everything else follows the token roles (each handler's
``needs`` class).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from stations.api import keys, public
from stations.api.auth import TOKEN, covers_pattern, may_see_internals, needs
from stations.api.limits import with_expect_continue
from stations.api.webhooks import WebhookSender, resolve_refusal
from stations.domain import lifecycle, messages, text
from stations.domain.subscriptions import links, spec, wakes
from stations.domain.subscriptions.engine import SubscriptionEngine
from stations.domain.subscriptions.errors import (
    AlreadyExists,
    InvalidRequest,
    NoPendingWork,
    SubscriptionNotFound,
    TokenRefused,
)
from stations.domain.subscriptions.keys import TokenClaims
from stations.errors import Forbidden, StationsError

PREFIX = "/v1/stream/__ds"
SUBS = PREFIX + "/subscriptions/{id}"
JWKS = PREFIX + "/jwks.json"
WAKE_ACTIONS = ("callback", "ack", "release")


def _engine(request: web.Request) -> SubscriptionEngine:
    engine: SubscriptionEngine = request.app[keys.SUBSCRIPTIONS]
    return engine


def _error(request: web.Request, exc: StationsError) -> web.Response:
    status = getattr(exc, "status", None)
    if status is None:
        from stations.api.errors import from_domain

        return from_domain(exc, internals=may_see_internals(request))
    body = {"error": {"code": exc.code, "message": exc.message, "field": exc.field, **exc.extra}}
    return web.json_response(body, status=status)


def _handler(fn: Any) -> Any:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)  # type: ignore[no-any-return]
        except StationsError as exc:
            return _error(request, exc)

    return wrapped


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return messages.loads_body(raw)
    except messages.LoneSurrogate as exc:
        raise InvalidRequest(str(exc), exc.field or "body") from None
    except RecursionError:
        raise InvalidRequest("the body is nested too deeply", "body") from None
    except ValueError:  # UnicodeDecodeError included
        raise InvalidRequest("the body is not valid JSON", "body") from None


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TokenRefused("TOKEN_INVALID")
    return token.strip()


def _scope(request: web.Request, paths: Sequence[str | None], pattern: str | None = None) -> None:
    """A token limited to some stations reaches only subscriptions over those stations: the
    streams named, and every stream the pattern may match."""
    token = request.get(TOKEN)
    if token is None or not token.stations:
        return
    for path in paths:
        if path is not None and not token.covers(path):
            raise Forbidden(f"this token does not cover stream {path}", "streams")
    if pattern is not None and not covers_pattern(token.stations, pattern):
        raise Forbidden(f"this token does not cover every stream {pattern} matches", "pattern")


async def _scope_of(request: web.Request, sub_id: str) -> None:
    """One outside the token's scope is answered as one that does not exist (its id tells
    nothing)."""
    token = request.get(TOKEN)
    if token is None or not token.stations:
        return
    row, followed = await request.app[keys.SERVICE].read_db(links.read_view, sub_id)
    try:
        _scope(request, [row["wake_stream"], *[link.path for link in followed]], row["pattern"])
    except Forbidden:
        raise SubscriptionNotFound(f"subscription {sub_id} not found", "id") from None


def _id(request: web.Request) -> str:
    return spec.valid_id(request.match_info["id"])


@needs("open")  # the public signing keys
@_handler
async def jwks(request: web.Request) -> web.Response:
    response = web.json_response(_engine(request).signer.jwks())
    response.content_type = "application/jwk-set+json"
    response.headers["Cache-Control"] = "public, max-age=300"
    return response


@needs("admin")
@_handler
async def put_subscription(request: web.Request) -> web.Response:
    sub_id = _id(request)
    definition = spec.parse_spec(await _json(request))
    _scope(request, [definition.wake_stream, *definition.streams], definition.pattern)
    engine = _engine(request)
    if definition.webhook_url is not None:
        await resolve_refusal(definition.webhook_url, request.app[keys.WEBHOOKS_ALLOW_LOOPBACK])
    service = request.app[keys.SERVICE]
    base_url = public.base_url(request)
    try:
        _, created = await service.write(links.create_or_confirm, sub_id, definition, base_url)
    except AlreadyExists:
        await _scope_of(request, sub_id)  # one outside the scope "does not exist" here too
        raise
    if not created:  # the one that exists may link more streams since (``/streams``)
        await _scope_of(request, sub_id)
    await engine.changed(sub_id)
    return web.json_response(await _view(request, sub_id), status=201 if created else 200)


async def _view(request: web.Request, sub_id: str) -> dict[str, Any]:
    row, followed = await request.app[keys.SERVICE].read_db(links.read_view, sub_id)
    view = links.view(row, followed, _engine(request).signer, request.app[keys.PUBLIC_URL])
    token = request.get(TOKEN)
    if view["webhook"] is not None and token is not None and token.role != "admin":
        # A webhook's address may be its secret (a chat service's incoming webhook is): only
        # the role that sets it sees it.
        del view["webhook"]["url"]
    return view


@needs("read")
@_handler
async def get_subscription(request: web.Request) -> web.Response:
    sub_id = _id(request)
    await _scope_of(request, sub_id)
    return web.json_response(await _view(request, sub_id))


@needs("admin")
@_handler
async def delete_subscription(request: web.Request) -> web.Response:
    sub_id = _id(request)
    await _scope_of(request, sub_id)
    await request.app[keys.SERVICE].write(links.delete, sub_id)
    await _engine(request).changed(sub_id)
    return web.Response(status=204)


@needs("admin")
@_handler
async def add_streams(request: web.Request) -> web.Response:
    sub_id = _id(request)
    body = await _json(request)
    raw = body.get("streams") if isinstance(body, dict) else None
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("streams must be a non-empty list of stream paths", "streams")
    spec.too_many(raw)
    paths = list(dict.fromkeys(spec.station_path(p, "streams") for p in raw))
    _scope(request, paths)
    await _scope_of(request, sub_id)
    await request.app[keys.SERVICE].write(links.add_streams, sub_id, paths)
    await _engine(request).changed(sub_id)
    return web.Response(status=204)


@needs("admin")
@_handler
async def remove_stream(request: web.Request) -> web.Response:
    sub_id = _id(request)
    path = spec.normalize_path(request.match_info["path"])  # decoded once already, by aiohttp
    await _scope_of(request, sub_id)
    await request.app[keys.SERVICE].write(links.remove_stream, sub_id, path)
    await _engine(request).changed(sub_id)
    return web.Response(status=204)


def _wake_claims(request: web.Request, sub_id: str) -> TokenClaims:
    """The wake token is checked here, on the event loop, before the writer: without a token
    the server signed for this id, a request is 401 whether or not the id exists (it learned
    which ids exist, and their type), and takes no writer transaction (nor its row lock)."""
    engine = _engine(request)
    assert engine.ctx is not None
    return wakes.verify_token(engine.ctx, sub_id, _bearer(request))


@needs("open")  # carries its own wake token
@_handler
async def callback(request: web.Request) -> web.Response:
    sub_id = _id(request)
    claims = _wake_claims(request, sub_id)
    answer = await _engine(request).run(
        wakes.settle, sub_id, claims, await _json(request), "callback"
    )
    return web.json_response(answer)


@needs("open")  # carries its own wake token
@_handler
async def ack(request: web.Request) -> web.Response:
    sub_id = _id(request)
    claims = _wake_claims(request, sub_id)
    answer = await _engine(request).run(wakes.settle, sub_id, claims, await _json(request), "ack")
    return web.json_response(answer)


@needs("open")  # carries its own wake token
@_handler
async def release(request: web.Request) -> web.Response:
    sub_id = _id(request)
    claims = _wake_claims(request, sub_id)
    await _engine(request).run(wakes.release, sub_id, claims, await _json(request))
    return web.Response(status=204)


@needs("consume")
@_handler
async def claim(request: web.Request) -> web.Response:
    sub_id = _id(request)
    body = await _json(request)
    worker = body.get("worker") if isinstance(body, dict) else None
    if not isinstance(worker, str) or not 1 <= len(worker) <= text.NAME or "\x00" in worker:
        raise InvalidRequest(
            f"worker must be a string of 1 to {text.NAME} characters, without NUL", "worker"
        )
    await _scope_of(request, sub_id)
    engine = _engine(request)
    try:
        return web.json_response(await engine.run(wakes.claim, sub_id, worker))
    except NoPendingWork:
        await engine.run(wakes.end_idle, sub_id)
        raise


@needs("read")
@_handler
async def not_found(request: web.Request) -> web.Response:
    raise SubscriptionNotFound("no Durable Streams control route here", "path")


def routes() -> list[web.RouteDef]:
    return [
        web.get(JWKS, jwks, allow_head=False),
        web.put(SUBS, put_subscription),
        web.get(SUBS, get_subscription, allow_head=False),
        web.delete(SUBS, delete_subscription),
        web.post(SUBS + "/streams", add_streams),
        web.delete(SUBS + "/streams/{path:.+}", remove_stream),
        web.post(SUBS + "/callback", callback),
        web.post(SUBS + "/claim", claim),
        web.post(SUBS + "/ack", ack),
        web.post(SUBS + "/release", release),
        web.route("*", PREFIX + "/{tail:.*}", not_found),
    ]


def setup(app: web.Application, *, allow_loopback: bool = False) -> None:
    """The routes; call before the stream routes are added (after ``keys.PUBLIC_URL``)."""
    app[keys.WEBHOOKS_ALLOW_LOOPBACK] = allow_loopback
    app.router.add_routes(with_expect_continue(routes()))
    if links.purge_stream not in lifecycle.purge_hooks:
        lifecycle.purge_hooks.append(links.purge_stream)


def attach(app: web.Application) -> None:
    """The engine's life cycle; call after the service's own start hook is registered."""
    allow_loopback = app[keys.WEBHOOKS_ALLOW_LOOPBACK]

    async def start(app: web.Application) -> None:
        sender = WebhookSender(allow_loopback)
        app[keys.WEBHOOK_SENDER] = sender
        engine = SubscriptionEngine(app[keys.SERVICE], sender.send, public_url=app[keys.PUBLIC_URL])
        app[keys.SUBSCRIPTIONS] = engine
        await engine.start()

    async def stop(app: web.Application) -> None:
        await app[keys.SUBSCRIPTIONS].stop()
        await app[keys.WEBHOOK_SENDER].close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
