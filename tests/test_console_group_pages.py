"""The console asks the server for the page of groups and of reader cursors it shows, in a real
headless Chromium against ``stations serve``: the Groups tab downloaded every group of the
station every 2 s to show a hundred (855 KB at 5,000 groups), its search box searches the
server, and the Overview asks for the six groups furthest behind instead of reading every group
to chart the first six by name."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.browser import Api
from tests.test_console import (  # noqa: F401  (fixtures)
    Console,
    api,
    browser,
    console,
    expect,
    server,
    sqlite_url,
)

if TYPE_CHECKING:
    from playwright.sync_api import Request

OFFSET0 = "0000000000000000_0000000000000000"
GROUPS = [f"g{k:03d}" for k in range(300)]
BEHIND = ["g150", "g201", "g250", "g299"]  # the groups that have not read the 5 messages


def _put_all(client: Api, puts: list[tuple[str, dict[str, Any]]]) -> None:
    """PUT every (path, body), 16 at a time."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda put: client.call("PUT", *put), puts))


def _lists(asked: list[str], station: str, what: str) -> list[dict[str, list[str]]]:
    """The query of each request made for the station's groups (or cursors) list."""
    path = f"/api/stations/{station}/{what}"
    return [parse_qs(urlsplit(url).query) for url in asked if urlsplit(url).path == path]


def test_the_groups_tab_reads_a_page_and_searches_the_server(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("wide")
    api.produce("wide", *({"data": {"n": n}} for n in range(5)))
    base = "/api/stations/wide"
    puts = [
        (f"{base}/groups/{name}", {} if name in BEHIND else {"startFrom": "latest"})
        for name in GROUPS
    ]
    puts += [(f"{base}/cursors/c{k:03d}", {"offset": OFFSET0}) for k in range(130)]
    _put_all(api, puts)
    page = console.page
    asked: list[str] = []

    def seen(request: Request) -> None:
        asked.append(request.url)

    page.on("request", seen)

    # The Overview charts the groups furthest behind: it asks the server for those six.
    console.open("#/s/wide")
    lag = page.locator("figure.chart").filter(has_text="Consumer group lag")
    expect(lag.locator(".chart-now")).to_have_text(
        "Now: g000 0, g001 0, g150 5, g201 5, g250 5, g299 5", timeout=10_000
    )
    overview = _lists(asked, "wide", "groups")
    assert overview and all(q == {"order": ["lag"], "limit": ["6"]} for q in overview), overview

    asked.clear()
    console.open("#/s/wide/groups")
    rows = page.locator("table.groups tbody tr")
    pager = page.get_by_role("navigation", name="Pages of consumer groups")
    following = pager.get_by_role("button", name="Next page")
    expect(rows).to_have_count(100)
    expect(rows.first).to_contain_text("g000")
    expect(pager.locator("p")).to_have_text("1–100")  # the count is known on the last page
    following.click()
    expect(rows.first).to_contain_text("g100")
    expect(pager.locator("p")).to_have_text("101–200")
    following.click()
    expect(rows.last).to_contain_text("g299")
    expect(pager.locator("p")).to_have_text("201–300 of 300")
    expect(following).to_be_disabled()
    # The Move form offers the groups of the page shown.
    expect(page.locator("#seek-group option")).to_have_count(100)
    expect(page.locator("#seek-group option").first).to_have_text("g200")
    page.wait_for_timeout(2500)  # a refresh of the page shown
    groups = _lists(asked, "wide", "groups")
    assert groups and all(q.get("limit") == ["100"] for q in groups), groups
    assert {q.get("after", [None])[0] for q in groups} == {None, "g099", "g199"}, groups

    # The search is the server's: it finds groups on any page.
    asked.clear()
    page.get_by_label("Search groups").fill("G12")
    expect(rows).to_have_count(10)
    expect(rows.first).to_contain_text("g120")
    expect(pager).to_be_hidden()
    assert {"contains": ["G12"], "limit": ["100"]} in _lists(asked, "wide", "groups")
    page.get_by_label("Search groups").fill("nope")
    expect(page.get_by_text("No group matches “nope”.")).to_be_visible()
    expect(rows).to_have_count(0)
    page.get_by_label("Search groups").fill("")
    expect(rows).to_have_count(100)
    expect(rows.first).to_contain_text("g000")

    # A group off the page is still moved once chosen, and one deleted is found gone.
    page.get_by_label("Group", exact=True).select_option("g099")
    page.get_by_label("Search groups").fill("g15")
    expect(rows).to_have_count(10)
    expect(page.get_by_label("Group", exact=True)).to_have_value("g099")
    api.call("DELETE", f"{base}/groups/g099", expect=204)
    page.get_by_role("button", name="Seek").click()
    expect(page.locator("#seek-result")).to_contain_text("Group g099 no longer exists")
    expect(page.get_by_role("dialog")).to_be_hidden()

    # The reader cursors below are paged by the server too.
    cursors = page.locator("table.cursors tbody tr")
    cursor_pages = page.get_by_role("navigation", name="Pages of reader cursors")
    expect(cursors).to_have_count(100)
    expect(cursor_pages.locator("p")).to_have_text("1–100")
    cursor_pages.get_by_role("button", name="Next page").click()
    expect(cursors).to_have_count(30)
    expect(cursors.first).to_contain_text("c100")
    expect(cursor_pages.locator("p")).to_have_text("101–130 of 130")
    page.get_by_label("Search cursors").fill("c12")
    expect(cursors).to_have_count(10)
    listed = _lists(asked, "wide", "cursors")
    assert listed and all(q.get("limit") == ["100"] for q in listed), listed
    # Never the whole list of either.
    assert all("limit" in q for q in _lists(asked, "wide", "groups")), asked
