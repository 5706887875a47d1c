"""Console faults a seventh review found, each in a real headless Chromium against ``stations
serve``: visible tabs tailing a station held all six of the browser's connections to the server
(every other request of every tab of the console waited up to a minute), and the Groups tab and
its reader cursors laid out every group and cursor of the station, however many."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

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
from tests.test_console_review import messages_list

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Request

# What the console lets its tabs hold at once of the browser's six connections to a server.
LIVE_SLOTS = 4


def _wait_until(page: Page, done: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        page.wait_for_timeout(100)


class _Waiting:
    """The waiting reads (long-poll, SSE) under way in a browser context, by page."""

    def __init__(self) -> None:
        self.open: dict[Request, Page] = {}
        self.most = 0

    def watch(self, page: Page) -> None:
        page.on("request", lambda r: self._start(page, r))
        page.on("requestfinished", self._end)
        page.on("requestfailed", self._end)
        page.on("close", self._closed)

    def _start(self, page: Page, request: Request) -> None:
        if "live=" in request.url:
            self.open[request] = page
            self.most = max(self.most, len(self.open))

    def _end(self, request: Request) -> None:
        self.open.pop(request, None)

    def _closed(self, page: Page) -> None:
        for request in [r for r, p in self.open.items() if p is page]:
            del self.open[request]

    def pages(self) -> list[Page]:
        return list(self.open.values())


# -- C: six visible tabs tailing held every connection to the server ---------------------------


@pytest.mark.parametrize("signed_in", [False, True], ids=["sse", "long-poll"])
def test_c1_tabs_tailing_leave_connections_to_the_rest_of_the_console(
    browser: Browser,  # noqa: F811
    make_server: MakeServer,
    sqlite_url: str,  # noqa: F811
    tmp_path: Path,
    signed_in: bool,
) -> None:
    """A browser opens at most six HTTP/1.1 connections to a server, shared by all its tabs. A
    hidden tab's tail lets go of its own, but six tabs shown side by side (two windows, two
    screens), each tailing, held all six for an SSE's minute or a long-poll's 30 s: a seventh
    tab showed nothing, and every refresh of the six (their badges, the catch-up reads) waited
    as long. At most four tabs now hold a waiting read at once; the others' tails look every
    2 s with a short request, and take a waiting read over when one is let go."""
    flags: list[str] = []  # the server's own waits: an SSE lasts a minute, a long-poll 30 s
    if signed_in:
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"}]}))
        flags = ["--tokens", str(tokens)]
    slow = make_server(sqlite_url, *flags)
    client = Api(slow.url, ADMIN if signed_in else None)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(7000)
    if signed_in:
        context.add_init_script(f"sessionStorage.setItem('stations.token', '{ADMIN}')")
    waiting = _Waiting()
    try:
        client.create("busy")
        tabs = []
        for _ in range(6):
            tab = Console(context.new_page(), slow.url)
            waiting.watch(tab.page)
            page = tab.open("#/s/busy/messages")
            expect(page.get_by_text("No messages from this offset yet.")).to_be_visible()
            page.get_by_label("Live tail").check()
            status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
            expect(status).to_contain_text("Live")
            tabs.append(tab)

        # A seventh tab loads (within the 7 s every step here is given), shown like the six.
        seventh = Console(context.new_page(), slow.url)
        page = seventh.open("")
        expect(page.get_by_role("link", name="busy")).to_be_visible()

        # Every tail still follows: those with a waiting read at once, the others within 2 s.
        client.produce("busy", {"id": "first", "data": {"n": 1}})
        for tab in tabs:
            expect(messages_list(tab.page).filter(has_text="first")).to_have_count(1)
        assert waiting.most <= LIVE_SLOTS, waiting.most
        _wait_until(page, lambda: len(waiting.open) == LIVE_SLOTS, "four waiting reads")

        # A tab that held one closes: a tab that looked every 2 s takes its place.
        holder = waiting.pages()[0]
        holders = set(waiting.pages())
        assert len(holders) == LIVE_SLOTS, holders
        holder.close()
        _wait_until(
            seventh.page,
            lambda: len(waiting.open) == LIVE_SLOTS and set(waiting.pages()) != holders - {holder},
            "no tab took the waiting read let go",
        )
        assert waiting.most <= LIVE_SLOTS, waiting.most
        client.produce("busy", {"id": "second", "data": {"n": 2}})
        for tab in tabs:
            if tab.page.is_closed():
                continue
            expect(messages_list(tab.page).filter(has_text="second")).to_have_count(1)
        for tab in [*tabs, seventh]:
            assert tab.errors == [] and tab.dialogs == [], (tab.errors, tab.dialogs)
    finally:
        context.close()
        client.close()


# -- L: long lists are laid out a page at a time ----------------------------------------------

OFFSET0 = "0000000000000000_0000000000000000"


def test_l1_the_groups_tab_lays_out_a_page_of_groups_and_of_cursors_at_a_time(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The API answers a station's groups and reader cursors whole, and the tab laid out every
    one of them, again every 2 s (the cursors rebuilt from scratch): 5,000 of each took 3 s to
    show, and each refresh held the tab up to a third of a second. Each table now shows 100
    rows, with Previous and Next through the rest, each page asked of the server (which counts
    nothing: the total shows on the last page); the Move form offers the page's groups. (250
    groups and 130 cursors here: the bound is what is pinned.)"""
    api.create("wide")
    for n in range(250):
        api.call("PUT", f"/api/stations/wide/groups/g{n:03}", {})
    for n in range(130):
        api.call("PUT", f"/api/stations/wide/cursors/c{n:03}", {"offset": OFFSET0})
    page = console.open("#/s/wide/groups")
    rows = page.locator("table.groups tbody tr")
    pager = page.get_by_role("navigation", name="Pages of consumer groups")
    following = pager.get_by_role("button", name="Next page")
    previous = pager.get_by_role("button", name="Previous page")
    expect(rows).to_have_count(100)
    expect(rows.first).to_contain_text("g000")
    expect(pager).to_contain_text("1–100")
    expect(previous).to_be_disabled()
    following.click()
    expect(rows.first).to_contain_text("g100")
    expect(rows).to_have_count(100)
    expect(pager).to_contain_text("101–200")
    following.click()
    expect(rows).to_have_count(50)
    expect(rows.last).to_contain_text("g249")
    expect(following).to_be_disabled()
    # Disabled under the keyboard's focus, Next hands it to Previous.
    expect(previous).to_be_focused()
    # The page shown follows the groups: one deleted elsewhere goes at the next refresh.
    api.call("DELETE", "/api/stations/wide/groups/g249", expect=204)
    expect(rows).to_have_count(49)
    expect(pager).to_contain_text("201–249 of 249")
    expect(page.locator("#seek-group option")).to_have_count(49)
    previous.click()
    expect(rows.first).to_contain_text("g100")

    cursors = page.locator("table.cursors tbody tr")
    cursor_pages = page.get_by_role("navigation", name="Pages of reader cursors")
    expect(cursors).to_have_count(100)
    expect(cursor_pages).to_contain_text("1–100")
    cursor_pages.get_by_role("button", name="Next page").click()
    expect(cursors).to_have_count(30)
    expect(cursors.first).to_contain_text("c100")
    expect(cursor_pages).to_contain_text("101–130 of 130")


def test_l2_a_short_list_has_no_pages(console: Console, api: Api) -> None:  # noqa: F811
    api.create("narrow")
    api.call("PUT", "/api/stations/narrow/groups/billing", {})
    api.call("PUT", "/api/stations/narrow/cursors/spark", {"offset": OFFSET0})
    page = console.open("#/s/narrow/groups")
    expect(page.locator("table.groups tbody tr")).to_have_count(1)
    expect(page.locator("table.cursors tbody tr")).to_have_count(1)
    expect(page.get_by_role("navigation", name="Pages of consumer groups")).to_be_hidden()
    expect(page.get_by_role("navigation", name="Pages of reader cursors")).to_be_hidden()
