"""The browser harness for the console tests and the README screenshots: Playwright for Python
driving Debian's Chromium (``/usr/bin/chromium``) headless; ``playwright install`` is not used.

In CI (``CI=true``) a missing Chromium or Playwright is a failure, elsewhere a skip.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.harness import IN_CI

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    if not Path(CHROMIUM).exists():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    return None


def require_browser() -> None:
    """Fail in CI, skip elsewhere, when the browser is missing."""
    import pytest

    reason = missing()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Api:
    """A small management API client for arranging what the console then shows."""

    def __init__(self, base: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base, headers=headers, timeout=10)

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, body: Any = None, expect: int | None = None) -> Any:
        response = self.http.request(
            method, path, content=None if body is None else json.dumps(body)
        )
        if expect is not None:
            assert response.status_code == expect, (method, path, response.text)
        else:
            assert response.status_code < 300, (method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def create(self, name: str, **config: Any) -> dict[str, Any]:
        return self.call("POST", "/api/stations", {"name": name, **config})

    def produce(self, station: str, *messages: dict[str, Any]) -> dict[str, Any]:
        return self.call(
            "POST", f"/api/stations/{quote(station)}/messages", {"messages": list(messages)}
        )

    def dead_letter(self, station: str, group: str, count: int) -> list[dict[str, Any]]:
        """Lease ``count`` messages to a one-delivery group and nack them into the DLS."""
        base = f"/api/stations/{quote(station)}/groups/{group}"
        self.call("PUT", base, {"maxMsgDeliveries": 1})
        leased = self.call("POST", base + "/fetch", {"max": count, "waitMs": 2000})["messages"]
        assert len(leased) == count, leased
        answer = self.call("POST", base + "/nack", {"offsets": [m["offset"] for m in leased]})
        assert answer == {"nacked": count, "unknown": []}
        entries = self.call("GET", f"/api/stations/{quote(station)}/dls?group={group}")["entries"]
        assert len(entries) == count, entries
        return entries


def quote(name: str) -> str:
    """A station name as one path segment (``%2F`` for ``/``)."""
    return urllib.parse.quote(name, safe="")
