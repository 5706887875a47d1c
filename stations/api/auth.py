"""Bearer tokens with roles and station patterns (CONTRACT.md §5).

Without a tokens file the server is open and listens on loopback only. With one, every request
but ``/healthz``, CORS preflights and the console's static files needs
``Authorization: Bearer <token>``: 401 without a valid token, 403 outside the token's role or
station patterns. Tokens are compared in constant time and never logged.

A token's patterns cover every station a request touches: the one its route names in the path
(the router's match, URL-decoded, never guessed from the path's text), and the ones it names
elsewhere, which the handlers check with ``require_station`` (a create body's ``name``, a fork's
``Stream-Forked-From``, a ``dls.forwardTo`` set on create or PATCH). Where a request's dead
letters may be copied (the station's ``dls.forwardTo``) is checked by the write itself, under
the station's lock: the handlers pass the token's ``reach``.

The tokens file is read by ``stations.tokens``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from stations.api.errors import error_response
from stations.errors import Forbidden
from stations.tokens import ROLES, Token, find

# What each role may do; the route classes are decided by ``route_class``.
ALLOWED = {
    "admin": {"admin", "produce", "consume", "read"},
    "producer": {"produce", "read"},
    "consumer": {"consume", "read"},
}


_WILDCARDS = "*?["


def covers_pattern(stations: list[str], pattern: str) -> bool:
    """Whether every stream a subscription's glob ``pattern`` may match (``*`` within a
    segment, ``**`` any number of segments, none included) is a station the token's patterns
    name. Decided on a sufficient rule: a pattern without wildcards by ``covers``; else by its
    literal prefix, which every stream it matches starts with, under a token pattern of the
    form ``<literal>*`` (fnmatch's ``*`` takes any characters, ``/`` included). Anything else
    is refused (a token pattern ``orders-v?`` does not cover the glob ``orders-v*``)."""
    first = min((pattern.index(c) for c in _WILDCARDS if c in pattern), default=None)
    if first is None:
        return any(fnmatch.fnmatchcase(pattern, p) for p in stations)
    prefix = pattern[:first]
    rest = pattern[first:].split("/")
    # ``a/**`` matches ``a`` itself besides what starts with ``a/``: a scope written ``a`` and
    # ``a/*`` covers it (the prefix cut to ``a`` asked for ``a*``, wider).
    itself = prefix.endswith("/") and all(segment == "**" for segment in rest)
    if itself and not covers_pattern(stations, prefix[:-1]):
        return False
    return any(
        p.endswith("*") and not any(c in p[:-1] for c in _WILDCARDS) and prefix.startswith(p[:-1])
        for p in stations
    )


# The route class of each handler, set where the handler is defined (``needs``). A request is
# classified by the route the router matched, never by the text of its path: a station may be
# named ``b1/groups/y``, and its encoded name must not make a DLS replay look like group work.
_CLASS_ATTR = "_stations_route_class"
H = TypeVar("H", bound=Callable[..., Any])


_EVERY_STATION_ATTR = "_stations_every_station"


def needs(klass: str, *, every_station: bool = False) -> Callable[[H], H]:
    """Mark a handler with the route class a token's role must allow. ``every_station``: the
    answer tells about every station (``/metrics``), so only a token without station patterns
    may have it."""
    if klass not in ("admin", "produce", "consume", "read", "open"):
        raise ValueError(f"unknown route class {klass}")

    def mark(handler: H) -> H:
        setattr(handler, _CLASS_ATTR, klass)
        setattr(handler, _EVERY_STATION_ATTR, every_station)
        return handler

    return mark


def route_class(request: web.Request) -> str:
    """admin, produce, consume, read or open: what the matched route does.

    A path no route matches answers 404/405 whoever asks: ``read``. A matched route whose
    handler carries no class is admin work, so a route added without thought is closed."""
    match = request.match_info
    if match.http_exception is not None:
        return "read"
    return class_of(match.route.handler) or "admin"


def class_of(handler: Any) -> str | None:
    """The class ``needs`` gave a handler, or None."""
    klass = getattr(handler, _CLASS_ATTR, None)
    return klass if isinstance(klass, str) else None


def _every_station(request: web.Request) -> bool:
    match = request.match_info
    return match.http_exception is None and bool(
        getattr(match.route.handler, _EVERY_STATION_ATTR, False)
    )


def station_of(request: web.Request) -> str | None:
    """The station the matched route names in its path (already URL-decoded by the router)."""
    return request.match_info.get("name")


def require_station(request: web.Request, name: object, field: str | None) -> None:
    """403 unless the request's token covers ``name``: for stations a request names outside
    its path (a create body, a fork source, a ``dls.forwardTo`` target). Anything that is not
    a string is left to the validation that follows (a 400)."""
    token: Token | None = request.get(TOKEN)
    if token is not None and isinstance(name, str) and not token.covers(name):
        raise Forbidden(f"this token does not cover station {name[:200]!r}", field)


def reach(request: web.Request) -> Callable[[str], bool] | None:
    """The stations the request's token may write to, for the writes a request makes beyond
    its path's station (a dead letter's copy in ``dls.forwardTo``), which the domain checks
    under the station's lock; None: every station."""
    token: Token | None = request.get(TOKEN)
    return token.covers if token is not None and token.stations else None


def _is_open(request: web.Request) -> bool:
    """Health probes, the console's own files (it is what asks for a token), and a method no
    route of the path takes: the 405 names the methods the API publishes anyway, where a 401
    would tell a client to come back with a token for a request that can never work."""
    match = request.match_info
    if match.http_exception is None and route_class(request) == "open":
        return True
    if isinstance(match.http_exception, web.HTTPMethodNotAllowed):
        return True
    resource = match.route.resource
    return resource is not None and (
        resource.canonical == "/ui" or resource.canonical.startswith("/ui/")
    )


def revoked_answer() -> web.Response:
    """A waiting request's token was revoked (or its role or stations changed) meanwhile."""
    response = error_response(
        401, "unauthorized", "this token was revoked while the request waited"
    )
    response.headers["WWW-Authenticate"] = 'Bearer realm="stations"'
    return response


def presented(request: web.Request, tokens: list[Token]) -> Token | None:
    """The valid token the request's ``Authorization`` header carries, if any."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return find(tokens, secret.strip()) if scheme.lower() == "bearer" else None


def may_see_internals(request: web.Request) -> bool:
    """Whether an answer may tell this request what only an operator should read (the
    database's own error text names its host, port, database and role): without tokens
    (loopback, or --insecure), or with an admin token of every station (as /metrics asks:
    one scoped to some stations is a tenant's)."""
    tokens: list[Token] | None = request.app[TOKENS]
    if not tokens:
        return True
    # ``refused`` found it already, unless the route is open: not hashed a second time.
    token = request.get(TOKEN) or presented(request, tokens)
    return token is not None and token.role == "admin" and not token.stations


def refused(request: web.Request) -> web.Response | None:
    """401 or 403 when the request's token may not do this, else None (the token, if any, is
    then ``request[TOKEN]`` for the handlers' own checks)."""
    tokens: list[Token] | None = request.app[TOKENS]
    if not tokens or request.method == "OPTIONS" or _is_open(request):
        return None
    token = presented(request, tokens)
    if token is None:
        response = error_response(401, "unauthorized", "a valid bearer token is required")
        response.headers["WWW-Authenticate"] = 'Bearer realm="stations"'
        return response
    request[TOKEN] = token
    needed = route_class(request)
    if needed not in ALLOWED[token.role]:
        able = " or ".join(role for role in ROLES if needed in ALLOWED[role])
        return error_response(
            403, "forbidden", f"role {token.role} may not do this: it needs a token of role {able}"
        )
    name = station_of(request)
    if not token.covers(name):
        # The name is the request's own (its path): saying it tells the client nothing new.
        return error_response(
            403, "forbidden", f"this token does not cover station {(name or '')[:200]!r}"
        )
    if token.stations and _every_station(request):
        return error_response(
            403, "forbidden", "this answer covers every station; this token covers only some"
        )
    return None


# Its object in the application (see stations.api.keys).
TOKENS: web.AppKey[list[Token] | None] = web.AppKey("tokens")  # None: no tokens asked for
# A request's valid token, once ``refused`` has let it through (aiohttp warns of string keys).
TOKEN: web.RequestKey[Token] = web.RequestKey("token", Token)
