"""Bearer tokens with roles and station patterns (CONTRACT.md §5).

Without a tokens file the server is open and listens on loopback only. With one, every request
but ``/healthz``, CORS preflights and the console's static files needs
``Authorization: Bearer <token>``: 401 without a valid token, 403 outside the token's role or
station patterns. Tokens are compared in constant time and never logged.

Tokens file (JSON)::

    {"tokens": [{"token": "s3cret", "role": "admin"},
                {"token": "p1", "role": "producer", "stations": ["orders", "orders/*"]}]}
"""

from __future__ import annotations

import fnmatch
import hmac
import json
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from stations.api import subscriptions
from stations.api.errors import error_response

ROLES = ("admin", "producer", "consumer")

# What each role may do; the route classes are decided by ``route_class``.
ALLOWED = {
    "admin": {"admin", "produce", "consume", "read"},
    "producer": {"produce", "read"},
    "consumer": {"consume", "read"},
}


class TokensFileError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    secret: bytes
    role: str
    stations: tuple[str, ...] = field(default_factory=tuple)  # empty: every station

    def covers(self, station: str | None) -> bool:
        if station is None or not self.stations:
            return True
        return any(fnmatch.fnmatchcase(station, pattern) for pattern in self.stations)


def load_tokens(path: str) -> list[Token]:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TokensFileError(f"cannot read tokens file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TokensFileError(f"tokens file {path} is not JSON: {exc}") from None
    entries = raw.get("tokens") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise TokensFileError(f'tokens file {path} needs {{"tokens": [...]}} with at least one')
    tokens = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            raise TokensFileError(f"tokens[{i}] needs a string token")
        if len(entry["token"]) < 8:
            raise TokensFileError(f"tokens[{i}].token must be at least 8 characters")
        if entry.get("role") not in ROLES:
            raise TokensFileError(f"tokens[{i}].role must be one of {', '.join(ROLES)}")
        patterns = entry.get("stations", [])
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise TokensFileError(f"tokens[{i}].stations must be a list of name patterns")
        tokens.append(Token(entry["token"].encode(), entry["role"], tuple(patterns)))
    return tokens


def find(tokens: list[Token], presented: str) -> Token | None:
    """Compare against every token, always all of them, in constant time per comparison."""
    given = presented.encode()
    match = None
    for token in tokens:
        if hmac.compare_digest(token.secret, given):
            match = token
    return match


def route_class(request: web.Request) -> str:
    """admin, produce, consume or read: what the request does."""
    method, path = request.method, request.path
    if path.startswith(subscriptions.PREFIX + "/"):
        return subscriptions.route_class(method, path) or "read"
    if path.startswith("/v1/stream/"):
        if method in ("GET", "HEAD"):
            return "consume"
        if method == "POST":
            return "produce"
        return "admin"  # PUT (create, fork) and DELETE
    if path.startswith("/api/stations"):
        tail = path[len("/api/stations") :]
        if method == "GET":
            if "/messages" in tail or "/groups" in tail or tail.endswith("/dls"):
                return "consume"
            return "read"
        if tail.endswith("/messages") and method == "POST":
            return "produce"
        if "/groups/" in tail and method in ("PUT", "POST"):
            return "consume"
        if "/cursors/" in tail and method == "PUT":  # a reader committing its position
            return "consume"
        return "admin"
    if path == "/api/transactions":
        return "read"  # each item's station and role: stations/api/transactions.py
    return "read"


def station_of(request: web.Request) -> str | None:
    info = request.match_info
    return info.get("name") if request.path.startswith(("/api/stations/", "/v1/stream/")) else None


OPEN_PATHS = ("/healthz",)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens: list[Token] | None = request.app.get("tokens")
    if (
        not tokens
        or request.method == "OPTIONS"
        or request.path in OPEN_PATHS
        or request.path == "/"
        or request.path.startswith("/ui")
        # the JWKS is public; wake callbacks, acks and releases carry their own token
        or (
            request.path.startswith(subscriptions.PREFIX + "/")
            and subscriptions.route_class(request.method, request.path) is None
        )
    ):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    token = find(tokens, presented.strip()) if scheme.lower() == "bearer" else None
    if token is None:
        response = error_response(401, "unauthorized", "a valid bearer token is required")
        response.headers["WWW-Authenticate"] = 'Bearer realm="stations"'
        return response
    request["token"] = token
    needed = route_class(request)
    if needed not in ALLOWED[token.role]:
        return error_response(403, "forbidden", f"role {token.role} may not {needed} here")
    if not token.covers(station_of(request)):
        return error_response(403, "forbidden", "this token does not cover that station")
    return await handler(request)
