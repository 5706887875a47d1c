"""The DLS tab asks the server for the groups it offers and the counts it shows, in a real
headless Chromium against ``stations serve``: it downloaded every group of the station (855 KB
at 5,000 groups) for its Group filter when it opened, every ~10 s, and every 2 s while a group
was chosen (that group's count). The filter now offers a page of groups the server searches
(``contains``, ``limit``), and a group's count is a page of that one group (``prefix``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
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

GROUPS = [f"g{k:03d}" for k in range(300)]
DEAD = {"g010": 1, "g250": 2}  # g250: off the first page of 100 groups


def _groups_asked(asked: list[str], station: str) -> list[dict[str, list[str]]]:
    """The query of each request made for the station's groups list."""
    path = f"/api/stations/{station}/groups"
    return [parse_qs(urlsplit(url).query) for url in asked if urlsplit(url).path == path]


def test_the_dls_tab_reads_a_page_of_groups_and_finds_one_off_it(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("wide")
    api.produce("wide", *({"data": {"n": n}} for n in range(5)))
    base = "/api/stations/wide/groups"
    puts = [(f"{base}/{g}", {"startFrom": "latest"}) for g in GROUPS if g not in DEAD]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda put: api.call("PUT", *put), puts))
    for group, n in DEAD.items():
        api.dead_letter("wide", group, n)
    page = console.page
    asked: list[str] = []

    def seen(request: Request) -> None:
        asked.append(request.url)

    page.on("request", seen)

    console.open("#/s/wide/dls")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(3)
    expect(page.locator("#tab-dls .badge")).to_have_text("3")
    page.wait_for_timeout(2500)  # a poll
    groups = _groups_asked(asked, "wide")
    assert groups and all("limit" in q for q in groups), groups

    # The filter offers the first page of groups by name, and the server finds the others.
    select = page.get_by_label("Group", exact=True)
    options = select.locator("option")
    expect(options).to_have_count(101)
    expect(options.nth(1)).to_have_text("g000")
    expect(options.last).to_have_text("g099")
    page.get_by_label("Search groups").fill("G25")
    expect(options).to_have_text(["All groups", *(f"g25{k}" for k in range(10))])
    assert {"contains": ["G25"], "limit": ["100"]} in _groups_asked(asked, "wide")
    select.select_option("g250")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("g250")

    # The count of a group off the first page is right: in Replay all, and when it moves.
    page.get_by_role("button", name="Replay all").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_contain_text("Replay all 2 dead letters of group g250?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    leased = api.call("POST", f"{base}/g250/fetch", {"max": 1, "waitMs": 0})["messages"]
    api.call("POST", f"{base}/g250/nack", {"offsets": [leased[0]["offset"]]})
    expect(rows).to_have_count(3, timeout=10_000)
    expect(page.get_by_text("3 entries shown, 0 selected.")).to_be_visible()
    expect(page.locator("#tab-dls .badge")).to_have_text("4")

    # The search emptied, the group chosen stays chosen, off the page offered.
    page.get_by_label("Search groups").fill("")
    expect(options).to_have_count(102)
    expect(options.last).to_have_text("g250")
    expect(select).to_have_value("g250")
    expect(rows).to_have_count(3)

    # The Groups tab's "Dead letters" link to a group off the first page picks it.
    console.open("#/")
    console.open("#/s/wide/dls?group=g250")
    expect(select).to_have_value("g250")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("g250")
    page.wait_for_timeout(2500)  # a poll with a group chosen

    # Never the whole list.
    groups = _groups_asked(asked, "wide")
    assert all("limit" in q for q in groups), [q for q in groups if "limit" not in q]
    assert len(groups) < 20, groups
