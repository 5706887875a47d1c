"""CORS and security headers on every response (Durable Streams §12.7), and the loopback
mode's ``Host`` check.

Which origins get a cross-origin grant (``Access-Control-Allow-Origin``):
- the ``--cors-origin`` list when one is given (``*``: any origin);
- else, with tokens, any origin (a page on another origin still needs a token, which a browser
  never adds by itself);
- else (the token-less loopback mode) only loopback origins: a page from the web must not drive
  a server that trusts every request.
A preflight always answers 204 with the methods and headers (the conformance suite checks them);
without the grant the browser still refuses the request.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from yarl import URL

from stations.api.auth import TOKENS
from stations.api.errors import error_response
from stations.api.public import is_public_host, is_public_origin

# The console runs no inline script and loads nothing from elsewhere.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
ALLOW_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = ", ".join(
    [
        "Authorization",
        "Content-Type",
        "If-None-Match",
        "If-Match",
        "Last-Event-ID",
        "Msg-Id",
        "Producer-Id",
        "Producer-Epoch",
        "Producer-Seq",
        "Stream-Closed",
        "Stream-Expires-At",
        "Stream-Fork-Offset",
        "Stream-Fork-Sub-Offset",
        "Stream-Forked-From",
        "Stream-Seq",
        "Stream-TTL",
    ]
)
EXPOSE_HEADERS = ", ".join(
    [
        "Content-Type",
        "ETag",
        "Location",
        "Msg-Duplicate",
        "Msg-Offset",
        "Producer-Epoch",
        "Producer-Expected-Seq",
        "Producer-Received-Seq",
        "Producer-Seq",
        "Stream-Closed",
        "Stream-Cursor",
        "Stream-Expires-At",
        "Stream-Next-Offset",
        "Stream-SSE-Data-Encoding",
        "Stream-TTL",
        "Stream-Up-To-Date",
    ]
)


@functools.lru_cache(maxsize=256)  # one parse per distinct name, not one per request
def is_loopback_host(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (``host`` without its port)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    if host.startswith("["):  # an IPv6 address, bracketed whole ("[::1" is no host)
        if not host.endswith("]"):
            return False
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name of a ``Host`` header value: ``[::1]:80`` → ``[::1]``, ``a:80`` → ``a``."""
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class CorsPolicy:
    origins: tuple[str, ...] = ()  # configured; "*" means any
    any_origin: bool = False  # tokens mode without a configured list
    loopback_host_only: bool = False  # token-less loopback mode: refuse other Host names

    def grants(self, origin: str) -> bool:
        if self.origins:
            return "*" in self.origins or origin.rstrip("/") in self.origins
        if self.any_origin:
            return True
        try:
            host = urlsplit(origin).hostname
        except ValueError:  # "http://[::1" and the like: no origin a browser sends
            return False
        return host is not None and is_loopback_host(host)


DATA_CSP = "sandbox; default-src 'none'"


def _policy(request: web.Request) -> CorsPolicy:
    policy: CorsPolicy = request.app.get(CORS) or CorsPolicy(any_origin=True)
    return policy


def _decorate(request: web.Request, response: web.StreamResponse) -> None:
    h = response.headers
    policy = _policy(request)
    # Any origin may read: a grant without an Origin too, and embedding from other sites.
    anyone = policy.any_origin or "*" in policy.origins
    origin = request.headers.get("Origin")
    if origin is None:
        if anyone:
            h.setdefault("Access-Control-Allow-Origin", "*")
    elif policy.grants(origin):
        h.setdefault("Access-Control-Allow-Origin", origin)
    h.setdefault("Access-Control-Expose-Headers", EXPOSE_HEADERS)
    h.setdefault("X-Content-Type-Options", "nosniff")
    # Everything but the console's pages (``console`` sets their policy first) is data: a
    # stream's read is sent with the stream's own media type, so a station of text/html or
    # SVG was a page on this origin running its messages' scripts, which could act with the
    # console's rights (its token, or a tokenless server's same-origin writes).
    h.setdefault("Content-Security-Policy", DATA_CSP)
    h.setdefault("Cross-Origin-Resource-Policy", "cross-origin" if anyone else "same-origin")
    # Whether, and which, origin is granted depends on Origin, its absence included: a shared
    # cache that kept the answer to a request without one (no grant, or "*") must not hand it
    # to a page whose origin is granted by name, and public reads are cacheable for minutes.
    vary = h.get("Vary")
    if vary is None:
        h["Vary"] = "Origin"
    elif "origin" not in {v.strip().lower() for v in vary.split(",")}:
        h["Vary"] = f"{vary}, Origin"


def preflight(request: web.Request) -> web.Response:
    """A CORS preflight: 204 with the methods and headers, whoever asks (see the module)."""
    response = web.Response(status=204)
    response.headers["Access-Control-Allow-Methods"] = ALLOW_METHODS
    response.headers["Access-Control-Allow-Headers"] = request.headers.get(
        "Access-Control-Request-Headers", ALLOW_HEADERS
    )
    response.headers["Access-Control-Max-Age"] = "86400"
    return response


def console(response: web.StreamResponse) -> None:
    """The console's own pages: no inline script, nothing loaded from elsewhere, no framing."""
    response.headers["Content-Security-Policy"] = CONSOLE_CSP
    response.headers["Cross-Origin-Resource-Policy"] = "same-origin"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-cache"


@functools.lru_cache(maxsize=256)
def valid_authority(host: str) -> bool:
    """Whether ``request.url`` can be built with this ``Host``: yarl refuses a port out of
    range or not a number and a bad bracketed address, and a handler asking for the URL
    (a create's ``Location``) answered 500 after the stream was created."""
    if any(c in _NOT_IN_AUTHORITY or not c.isprintable() for c in host):
        return False  # spaces, controls, quotes...: no host name holds them (RFC 3986 §3.2)
    if host.startswith("[") != ("]" in host):
        return False  # yarl closes an unclosed "[::1" itself
    try:
        URL.build(scheme="http", authority=host)
    except ValueError:
        return False
    return True


_NOT_IN_AUTHORITY = frozenset(' "<>\\^`{|}')


def refused_host(request: web.Request) -> web.Response | None:
    """A ``Host`` that is no host and port is a 400 (RFC 9112 §3.2). Token-less loopback mode:
    only loopback ``Host`` names and the ``--public-url``'s (against DNS rebinding, where a web
    page's own host name comes to point at 127.0.0.1)."""
    host = request.headers.get("Host")
    if host is None:
        return None
    if not valid_authority(host):
        return error_response(
            400, "bad_request", "the Host header must be a host name and a port", "Host"
        )
    name = _host_name(host)
    # The --public-url's host is the operator's own name, which no rebinding page controls: a
    # proxy on this host may forward it as it came.
    if (
        _policy(request).loopback_host_only
        and not is_loopback_host(name)
        and not is_public_host(request, name)
    ):
        return error_response(
            403,
            "forbidden_host",
            "without --tokens the server answers only loopback Host names "
            "(localhost, 127.0.0.1, [::1]) and the --public-url's host",
            "Host",
        )
    return None


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refused_origin(request: web.Request) -> web.Response | None:
    """Without tokens the server acts on every request it gets, and any web page can make a
    browser send one (a "simple" POST needs no preflight; CORS only hides the answer). So a
    request that may change something, sent by a page (it names its ``Origin``) that is not
    this server's own and not granted, is refused before anything is done. With tokens the
    bearer token, which no page sends by itself, is the guard."""
    if request.method in SAFE_METHODS or request.app[TOKENS]:
        return None
    origin = request.headers.get("Origin")
    if origin is None or _policy(request).grants(origin) or _same_origin(request, origin):
        return None
    return error_response(
        403,
        "forbidden_origin",
        "without --tokens only this server's own pages, loopback pages and --cors-origin "
        "origins may send writes",
        "Origin",
    )


def _same_origin(request: web.Request, origin: str) -> bool:
    # Behind a TLS proxy this process sees http and perhaps the proxy's Host: the console's
    # pages, served from the --public-url, name that URL's origin.
    if is_public_origin(request, origin):
        return True
    host = request.headers.get("Host")
    return host is not None and origin.rstrip("/").lower() == f"{request.scheme}://{host}".lower()


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Every response is decorated as it is prepared: the handlers' own, the edge's refusals,
    HTTP exceptions (aiohttp builds a response from them) and streams (SSE) a handler prepares
    itself."""
    _decorate(request, response)


# Its object in the application (see stations.api.keys).
CORS: web.AppKey[CorsPolicy] = web.AppKey("cors")
