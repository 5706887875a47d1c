"""CORS and security headers on every response (Durable Streams §12.7)."""

from __future__ import annotations

from aiohttp import web

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


def _decorate(request: web.Request, response: web.StreamResponse) -> None:
    h = response.headers
    h.setdefault("Access-Control-Allow-Origin", request.headers.get("Origin", "*"))
    h.setdefault("Access-Control-Expose-Headers", EXPOSE_HEADERS)
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("Cross-Origin-Resource-Policy", "cross-origin")
    if "Origin" in request.headers:
        h.setdefault("Vary", "Origin")


@web.middleware
async def headers_middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
    if request.method == "OPTIONS":
        response = web.Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = ALLOW_METHODS
        response.headers["Access-Control-Allow-Headers"] = request.headers.get(
            "Access-Control-Request-Headers", ALLOW_HEADERS
        )
        response.headers["Access-Control-Max-Age"] = "86400"
        _decorate(request, response)
        return response
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _decorate(request, exc)
        raise
    if not response.prepared:
        _decorate(request, response)
    return response


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Streaming responses (SSE) are prepared inside the handler: decorate them there too."""
    _decorate(request, response)
