"""The server's own address as its clients reach it: ``--public-url`` when it has one (a TLS
proxy, a path prefix the proxy strips, several processes behind one address), else what the
request reached. Whatever the server hands out that names itself is built here."""

from __future__ import annotations

import functools
from urllib.parse import unquote, urlsplit

from aiohttp import web

from stations.api import keys

_DEFAULT_PORTS = {"http": 80, "https": 443}


def base_url(request: web.Request) -> str:
    """The root this process serves, as clients reach it: ``--public-url``, else the scheme
    and host ``request`` reached (``http`` behind a TLS proxy, or a loopback address when
    asked on the server's host)."""
    return request.app[keys.PUBLIC_URL] or f"{request.scheme}://{request.host}"


def own_url(request: web.Request, raw_path: str) -> str:
    """The absolute URL of ``raw_path`` (percent-encoded, from the root this process serves)."""
    return base_url(request) + raw_path


def path_as_asked(request: web.Request) -> str | None:
    """``request``'s path under ``--public-url``'s path prefix, as a client behind the proxy
    that stripped the prefix asked for it; None without a prefix, or when the path holds it
    already (a proxy that does not strip it, or a request straight to this process)."""
    public_url = request.app[keys.PUBLIC_URL]
    if public_url is None:
        return None
    prefix = _prefix(public_url)
    if not prefix or request.path == prefix or request.path.startswith(prefix + "/"):
        return None
    return prefix + request.path


@functools.lru_cache(maxsize=8)
def _prefix(public_url: str) -> str:
    # Decoded, as request.path is.
    return unquote(urlsplit(public_url).path).rstrip("/")


@functools.lru_cache(maxsize=8)
def _origin_and_host(public_url: str) -> tuple[str, str]:
    """The public URL's origin as a browser sends it (no default port, no path) and its host
    name as a ``Host`` header names it (IPv6 in brackets), both lower case."""
    parts = urlsplit(public_url)
    name = (parts.hostname or "").rstrip(".")
    host = f"[{name}]" if ":" in name else name
    port = parts.port
    shown = "" if port is None or port == _DEFAULT_PORTS[parts.scheme] else f":{port}"
    return f"{parts.scheme}://{host}{shown}".lower(), host.lower()


def is_public_origin(request: web.Request, origin: str) -> bool:
    base = request.app.get(keys.PUBLIC_URL)
    return base is not None and origin.rstrip("/").lower() == _origin_and_host(base)[0]


def is_public_host(request: web.Request, host_name: str) -> bool:
    """``host_name``: a ``Host`` header's name, without its port."""
    base = request.app.get(keys.PUBLIC_URL)
    return base is not None and host_name.lower().rstrip(".") == _origin_and_host(base)[1]
