"""The console behind a proxy that mounts the server under a path prefix and strips it (nginx's
``location /stations/ { proxy_pass http://backend/; }``): its page, scripts and every request
it makes must stay under the prefix. They named the server's root (``/ui/app.js``,
``/api/...``, ``/v1/stream/...``), which the proxy does not serve: the page stayed blank."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.harness import Server, free_port
from tests.test_console import (  # noqa: F401  (fixtures)
    Console,
    browser,
    expect,
    open_console,
    sqlite_url,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser

MakeServer = Callable[..., Server]
PREFIX = "/stations"
_HOP = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}


class PrefixProxy:
    """Serves ``PREFIX/...`` from the backend's ``/...``; anything else is a 404, as at a proxy
    that mounts nothing else there."""

    def __init__(self, backend: str) -> None:
        self.seen: list[str] = []
        upstream = httpx.Client(base_url=backend, timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                self.seen_path = self.path
                proxy.seen.append(self.path)
                if not self.path.startswith(PREFIX + "/"):
                    self._answer(404, {"Content-Type": "text/plain"}, b"not here")
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                answer = upstream.request(
                    self.command, self.path[len(PREFIX) :], content=body, headers=headers
                )
                kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
                kept.pop("content-encoding", None)  # httpx decoded the body
                self._answer(answer.status_code, kept, answer.content)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _forward  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._upstream = upstream
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{PREFIX}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()


@pytest.fixture
def behind(
    make_server: MakeServer,
    sqlite_url: str,  # noqa: F811
) -> Iterator[tuple[Server, PrefixProxy]]:
    server = make_server(sqlite_url, "--long-poll-timeout-ms", "1000", "--sse-lifetime-ms", "2000")
    proxy = PrefixProxy(server.url)
    yield server, proxy
    proxy.close()


def test_the_console_works_under_a_path_prefix(
    browser: Browser,  # noqa: F811
    behind: tuple[Server, PrefixProxy],
) -> None:
    server, proxy = behind
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.post("/api/stations", json={"name": "shop/orders"}).status_code == 201
        body = {"messages": [{"data": {"n": 1}}]}
        assert http.post("/api/stations/shop%2Forders/messages", json=body).is_success

    with open_console(browser, server) as console:
        page = console.page
        page.goto(proxy.url + "/")  # redirected to ui/, under the prefix
        expect(page.get_by_role("heading", name="Stations")).to_be_visible()
        expect(page.get_by_role("link", name="shop/orders")).to_be_visible()

        # A write goes through the prefix too.
        page.get_by_role("link", name="New station").click()
        page.get_by_label("Name").fill("shop/refunds")
        page.get_by_role("button", name="Create station").click()
        expect(page.get_by_role("heading", name="shop/refunds")).to_be_visible()

    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/api/stations/shop%2Frefunds").status_code == 200
    outside = [path for path in proxy.seen if not path.startswith(PREFIX + "/")]
    assert outside == [], outside  # nothing asked outside the prefix
