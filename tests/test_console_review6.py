"""Console faults a sixth review found, each in a real headless Chromium against ``stations
serve``: the Overview's "Delete station" deleted a station that had been deleted and created
again elsewhere since the page loaded, and with a token that may not read groups (a producer's,
or one whose stations no longer cover the station) the Groups tab, its reader cursors, the
station badge and the Overview's lag chart asked again every 2 to 5 s for the same 403."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.browser import Api
from tests.test_console import (  # noqa: F401  (fixtures)
    ADMIN,
    Console,
    MakeServer,
    api,
    browser,
    console,
    expect,
    open_console,
    server,
    sqlite_url,
)
from tests.test_console_review import _SET_HIDDEN
from tests.test_console_review2 import sign_in_again

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.harness import Server

PRODUCER = "producer-secret-1"
SCOPED = "consumer-secret-1"
_RECREATED = "was deleted and created again"


def _wait_until(page: Page, done: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        page.wait_for_timeout(100)


# -- D: the Overview's Delete station names the station it shows ------------------------------


def test_d1_delete_station_asked_before_the_station_was_created_again_deletes_nothing(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The confirmation was open while the station was deleted and created again elsewhere:
    confirming deleted the NEW station (the DELETE named only the name). It now names the
    createdAt the page knows, the server refuses (409), and the page says nothing was deleted
    and that the station shown was the old one."""
    api.create("orders")
    page = console.open("#/s/orders")
    expect(page.get_by_role("heading", name="Live stats")).to_be_visible()
    # A background tab's polls wait, so it is the delete that meets the new station (a poll
    # would find it first: see d3).
    page.evaluate(_SET_HIDDEN, True)
    page.get_by_role("button", name="Delete station").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_contain_text("Delete station orders?")
    api.call("DELETE", "/api/stations/orders", expect=204)
    new = api.create("orders")["createdAt"]
    api.produce("orders", *({"data": {"n": n}} for n in range(3)))
    dialog.get_by_role("button", name="Delete").click()
    notice = page.locator("#panel").get_by_role("alert")
    expect(notice).to_contain_text("Nothing was deleted.")
    expect(notice).to_contain_text(_RECREATED)
    view = api.call("GET", "/api/stations/orders")
    assert view["createdAt"] == new
    assert view["stats"]["messages"] == 3
    assert page.url.endswith("#/s/orders"), page.url


def test_d2_delete_station_sends_the_created_at_it_shows_and_deletes_it(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    created = api.create("shop/orders")["createdAt"]
    page = console.open("#/s/shop%2Forders")
    expect(page.get_by_role("heading", name="Live stats")).to_be_visible()
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "DELETE" else None)
    page.get_by_role("button", name="Delete station").click()
    page.locator("#confirm").get_by_role("button", name="Delete").click()
    expect(page.get_by_role("heading", name="Stations")).to_be_visible()
    api.call("GET", "/api/stations/shop%2Forders", expect=404)
    assert len(sent) == 1, sent
    assert sent[0].endswith("/api/stations/shop%2Forders?createdAt=" + created.replace(":", "%3A"))


def test_d3_the_overview_says_when_the_station_was_created_again(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The Overview's poll showed the new station's figures under the old one's settings and
    said nothing (the other tabs tell the two apart by createdAt). It now says so and stops."""
    api.create("orders", idempotencyWindowMs=60_000)
    page = console.open("#/s/orders")
    expect(page.get_by_role("heading", name="Live stats")).to_be_visible()
    # Hidden meanwhile: a poll between the delete and the create would find no station (and
    # rightly say it was deleted).
    page.evaluate(_SET_HIDDEN, True)
    page.wait_for_timeout(300)  # a poll already under way
    api.call("DELETE", "/api/stations/orders", expect=204)
    api.create("orders")
    api.produce("orders", {"data": {"n": 1}})
    page.evaluate(_SET_HIDDEN, False)
    notice = page.locator("#panel").get_by_role("alert")
    expect(notice).to_contain_text(_RECREATED, timeout=10_000)
    expect(page.get_by_role("button", name="Delete station")).to_have_count(0)


# -- P: a token that may not read groups ------------------------------------------------------


def _write_tokens(path: Path, entries: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}, *entries]}))


class Tokens:
    """A server with a tokens file the test rewrites, read again on SIGHUP."""

    def __init__(self, running: Server, path: Path) -> None:
        self.server = running
        self.path = path
        self.admin = Api(running.url, ADMIN)

    def reload(self, entries: list[dict[str, Any]], secret: str, path: str, status: int) -> None:
        """Rewrite the file, SIGHUP, and wait until ``secret`` is answered ``status`` on
        ``path`` (the server has read the file)."""
        _write_tokens(self.path, entries)
        assert self.server.proc is not None
        self.server.proc.send_signal(signal.SIGHUP)
        client = Api(self.server.url, secret)
        try:
            deadline = time.monotonic() + 10
            while client.http.get(path).status_code != status:
                assert time.monotonic() < deadline, "the server did not read the tokens again"
                time.sleep(0.05)
        finally:
            client.close()


@pytest.fixture
def tokens(make_server: MakeServer, sqlite_url: str, tmp_path: Path) -> Iterator[Tokens]:  # noqa: F811
    path = tmp_path / "tokens.json"
    _write_tokens(
        path,
        [
            {"token": PRODUCER, "role": "producer", "stations": ["orders"]},
            {"token": SCOPED, "role": "consumer", "stations": ["orders"]},
        ],
    )
    running = make_server(sqlite_url, "--tokens", str(path), "--long-poll-timeout-ms", "1000")
    t = Tokens(running, path)
    t.admin.create("orders")
    t.admin.produce("orders", *({"data": {"n": n}} for n in range(3)))
    t.admin.dead_letter("orders", "billing", 1)
    yield t
    t.admin.close()


def _as(page: Page, secret: str) -> None:
    """Every page of this context starts signed in with ``secret`` (unless it signed in again)."""
    page.context.add_init_script(
        f"sessionStorage.getItem('stations.token') || "
        f"sessionStorage.setItem('stations.token', '{secret}')"
    )


def _record(page: Page) -> list[tuple[str, int]]:
    """(path and query, status) of every answer to /api/ from now on."""
    seen: list[tuple[str, int]] = []
    page.on(
        "response",
        lambda r: seen.append((r.url.split("/api/", 1)[1], r.status)) if "/api/" in r.url else None,
    )
    return seen


def test_p1_the_groups_tab_of_a_producer_token_says_so_and_stops_asking(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """A producer may not read groups: the tab showed an error and asked again every 2 s, for
    the same 403. It now says the token may not read consumer groups, hides the rows and the
    Move form, and asks no more (the reader cursors, which a producer may read, still show)."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, PRODUCER)
        seen = _record(page)
        tab.open("#/s/orders/groups")
        refused = page.locator("#panel .refused")
        expect(refused).to_contain_text("This token may not read consumer groups")
        expect(refused.get_by_role("button", name="Try again")).to_be_visible()
        expect(page.locator("table.groups")).to_be_hidden()
        expect(page.locator("form.seek-form")).to_be_hidden()
        expect(page.get_by_text("No reader cursors.")).to_be_visible()
        before = [s for s in seen if s[0].startswith("stations/orders/groups")]
        assert before and all(status == 403 for _, status in before), before
        page.wait_for_timeout(6500)
        after = [s for s in seen if s[0].startswith("stations/orders/groups")]
        assert after == before, after
        # The cursors are still read (a producer may): the page is alive.
        assert [s for s in seen if s[0].startswith("stations/orders/cursors")][-1][1] == 200

        # Try again asks once more (the same 403: said again, and still no polling).
        refused.get_by_role("button", name="Try again").click()
        _wait_until(
            page,
            lambda: (
                len([s for s in seen if s[0].startswith("stations/orders/groups")]) > len(after)
            ),
            "Try again did not ask",
        )
        expect(refused).to_be_visible()


def test_p2_the_overview_of_a_producer_token_stops_asking_for_the_groups(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """The Overview read the groups (for its lag chart) every 2 s and swallowed the 403. It now
    says once that the lag is not shown, and reads only the station's own figures."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, PRODUCER)
        seen = _record(page)
        tab.open("#/s/orders")
        expect(page.locator(".lag-refused")).to_contain_text(
            "This token may not read consumer groups: their lag is not shown"
        )
        groups = [s for s in seen if s[0].startswith("stations/orders/groups")]
        station = len([s for s in seen if s[0] == "stations/orders"])
        page.wait_for_timeout(5000)
        assert [s for s in seen if s[0].startswith("stations/orders/groups")] == groups
        assert len([s for s in seen if s[0] == "stations/orders"]) >= station + 2


def test_p3_signing_in_with_another_token_shows_the_groups_again(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """Stopped after the 403, the tab must not stay stopped once the person has a token that
    may read groups: here the producer token is revoked, the page asks for another over it,
    and with an admin token the groups come back without reloading the page."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, PRODUCER)
        tab.open("#/s/orders/groups")
        refused = page.locator("#panel .refused")
        expect(refused).to_be_visible()
        tokens.reload(
            [{"token": SCOPED, "role": "consumer", "stations": ["orders"]}],
            PRODUCER,
            "/api/stations",
            401,
        )
        # The cursors' poll (and the badge's) meet the 401: the sign-in comes over the page.
        sign_in_again(page, ADMIN)
        expect(page.locator("table.groups tbody tr")).to_have_count(1, timeout=10_000)
        expect(page.locator("table.groups")).to_contain_text("billing")
        expect(refused).to_have_count(0)
        expect(page.locator("form.seek-form")).to_be_visible()


def test_p4_a_token_whose_stations_no_longer_cover_the_station_stops_every_poll(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """A token's stations narrowed by a SIGHUP reload: the Groups tab, its reader cursors and
    the DLS badge each asked again every 2 to 5 s, for ever, for the same 403. Each now says
    so (the tab) or stops (the badge) and asks nothing more."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, SCOPED)
        seen = _record(page)
        tab.open("#/s/orders/groups")
        expect(page.locator("table.groups tbody tr")).to_have_count(1)
        expect(page.locator("#tab-dls .badge")).to_have_text("1")
        tokens.reload(
            [{"token": SCOPED, "role": "consumer", "stations": ["other"]}],
            SCOPED,
            "/api/stations/orders",
            403,
        )
        refused = page.locator("#panel .refused")
        expect(refused.filter(has_text="consumer groups")).to_be_visible(timeout=10_000)
        expect(refused.filter(has_text="reader cursors")).to_be_visible(timeout=10_000)
        # The badge's poll (every 5 s) meets its 403 too.
        _wait_until(
            page,
            lambda: ("stations/orders", 403) in seen,
            "the badge's poll never met the 403",
        )
        asked = len(seen)
        page.wait_for_timeout(6500)
        assert seen[asked:] == [], seen[asked:]
