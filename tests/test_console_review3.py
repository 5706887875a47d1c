"""Console faults a third review found, each in a real headless Chromium against ``stations
serve``: a test message sent again after a lost answer was stored twice (no message id), the
station list read every station every 2 s (megabytes a refresh with thousands of them), and
the DLS tab and its badge did not follow dead letters that came while the page was open."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.browser import Api
from tests.test_console import (  # noqa: F401  (fixtures)
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

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Request, Response, Route


# -- the produce form: a message id kept across a resend --------------------------------------


def test_a_resend_after_a_lost_answer_is_a_duplicate_not_a_second_copy(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The form sent no message id: when the server stored a message but its answer was lost
    (a server not answering, a dropped connection), sending it again stored it twice. A
    message sent with the id field empty now carries an id of the console's, kept while the
    same content is sent again after a failure: the resend is answered as a duplicate and said
    so. A stored message or a changed form gets a fresh id."""
    api.create("resend")
    page = console.open("#/s/resend/messages")
    result = page.get_by_role("status").filter(has_text="offset")
    lost: list[str] = []

    def lose_the_answer(route: Route) -> None:
        # The request reaches the server (which stores the message); its answer never arrives.
        if route.request.method == "POST":
            lost.append(route.fetch().text())
            route.abort("connectionreset")
        else:
            route.continue_()

    def stored() -> list[Any]:
        return api.call("GET", "/api/stations/resend/messages")["messages"]  # type: ignore[no-any-return]

    page.get_by_label("Payload").fill('{"order": 1}')
    page.route("**/api/stations/resend/messages", lose_the_answer)
    page.get_by_role("button", name="Produce").click()
    failure = page.get_by_role("status").filter(has_text="cannot be reached")
    expect(failure).to_be_visible()
    assert len(lost) == 1 and '"duplicate":false' in lost[0], lost
    first = stored()
    assert len(first) == 1, first
    page.unroute("**/api/stations/resend/messages")

    # The same content again: answered as a duplicate of what the lost attempt stored.
    page.get_by_role("button", name="Produce").click()
    expect(result).to_be_visible()
    assert stored() == first
    assert first[0]["id"].startswith("console-"), first
    expect(result).to_contain_text("Duplicate: not stored.")
    expect(result).to_contain_text("answer was lost")
    expect(result).to_contain_text(first[0]["offset"])
    expect(result).to_contain_text(first[0]["id"])

    # Once stored, the same content again is a new message (sent again on purpose).
    page.get_by_role("button", name="Produce").click()
    expect(result).to_contain_text("Stored.")
    assert len(stored()) == 2

    # A failed send, then a changed form: a new message, not a duplicate of the failed one.
    page.get_by_label("Payload").fill('{"order": 2}')
    page.route("**/api/stations/resend/messages", lose_the_answer)
    page.get_by_role("button", name="Produce").click()
    expect(failure).to_contain_text("Sending it again unchanged reuses message id console-")
    expect(failure).to_contain_text("idempotency window (2 min)")
    page.unroute("**/api/stations/resend/messages")
    page.get_by_label("Payload").fill('{"order": 3}')
    page.get_by_role("button", name="Produce").click()
    expect(result).to_contain_text("Stored.")
    after = stored()
    assert [m["data"] for m in after] == [{"order": 1}, {"order": 1}, {"order": 2}, {"order": 3}]
    assert len({m["id"] for m in after}) == 4, after

    # An id typed in the form is sent as typed.
    page.get_by_label("Message id").fill("typed-7")
    page.get_by_role("button", name="Produce").click()
    expect(result).to_contain_text("Stored.")
    assert stored()[-1]["id"] == "typed-7"


# -- the station list: one page of the server's a refresh -------------------------------------

STATIONS = 3000


def _create_many(base: str, count: int) -> None:
    def some(first: int) -> None:
        client = Api(base)
        try:
            for n in range(first, count, 8):
                client.create(f"load/s{n:05d}")
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(some, range(8)))


class _Reads:
    """The API requests a tab makes: each list read's query, station count and size."""

    def __init__(self) -> None:
        self.lists: list[tuple[dict[str, list[str]], int, int]] = []
        self.others: list[str] = []
        # Requests sent since the last clear(): an answer to one sent before it (a refresh
        # under way as the tab was hidden, answered late on a loaded box) is not counted.
        self.sent: set[Request] = set()

    def watch(self, page: Page) -> None:
        page.on("request", self.sending)
        page.on("response", self.record)

    def sending(self, request: Request) -> None:
        self.sent.add(request)

    def record(self, response: Response) -> None:
        if response.request not in self.sent:
            return
        url = urlsplit(response.url)
        path = unquote(url.path)
        if path == "/api/stations" and response.request.method == "GET":
            body = response.body()
            stations = len(json.loads(body)["stations"]) if response.ok else 0
            self.lists.append((parse_qs(url.query), stations, len(body)))
        elif path.startswith("/api/"):
            self.others.append(f"{response.request.method} {path}")

    def clear(self) -> None:
        self.lists.clear()
        self.others.clear()
        self.sent.clear()

    def last(self) -> dict[str, list[str]]:
        return self.lists[-1][0]


def test_the_station_list_reads_one_page_of_the_server_per_refresh(
    browser: Browser,  # noqa: F811
    make_server: MakeServer,
    sqlite_url: str,  # noqa: F811
) -> None:
    """The list read every station every 2 s: 1.35 MB a refresh at 3,000 stations (4.5 MB at
    10,000), whatever was on screen. A first fix paged in the browser: the whole list again
    every minute at this size, and each row on screen on its own every 4 s, so a station
    created meanwhile showed a minute late. Now each refresh (every 2 s while the tab is
    shown) is one page of the server's (``limit=100``, ``after``, ``contains``): new stations
    show at the next one, Previous and Next go through the pages, and the search is the
    server's, so it finds a station on any page."""
    running = make_server(sqlite_url, "--durability", "process")
    _create_many(running.url, STATIONS)
    client = Api(running.url)
    whole = len(client.http.get("/api/stations").content)
    assert whole > 1_000_000, whole
    page_bytes = len(client.http.get("/api/stations?limit=100").content)
    with open_console(browser, running) as tab:
        reads = _Reads()
        reads.watch(tab.page)
        page = tab.open()
        rows = page.get_by_role("table").get_by_role("row").filter(has=page.get_by_role("link"))
        pager = page.get_by_role("navigation", name="Pages of stations")
        previous = page.get_by_role("button", name="Previous page")
        following = page.get_by_role("button", name="Next page")
        search = page.get_by_label("Search stations")
        expect(rows.first).to_contain_text("load/s00000", timeout=15_000)
        expect(rows).to_have_count(100)
        # No read of the whole list: the first one is the first page already.
        assert reads.lists and all(q.get("limit") == ["100"] for q, _, _ in reads.lists), (
            reads.lists
        )
        expect(page.get_by_text("More than 100 stations", exact=True)).to_be_visible()
        reads.clear()

        # Over 10 s: one page every 2 s, and nothing else. A station created meanwhile shows,
        # and so does a figure that moved.
        client.create("load/new")
        client.produce("load/s00001", {"id": "a", "data": 1}, {"id": "b", "data": 2})
        page.wait_for_timeout(10_000)
        lists = list(reads.lists)
        assert reads.others == [], reads.others
        assert all(q == {"limit": ["100"]} for q, _, _ in lists), lists
        assert all(count <= 100 for _, count, _ in lists), lists
        # Before: one whole list (1.35 MB) in that time, and a request a row on screen every
        # 4 s (about 30 a second at this window's size).
        assert 3 <= len(lists) <= 6, lists
        read = sum(size for _, _, size in lists)
        assert read <= 6 * page_bytes * 1.2, (read, page_bytes, len(lists))
        expect(rows.first).to_contain_text("load/new")
        row = rows.filter(has=page.get_by_role("link", name="load/s00001", exact=True))
        expect(row.get_by_role("cell").nth(1)).to_have_text("2")
        expect(rows).to_have_count(100)

        # Hidden, the tab asks nothing; shown again, it refreshes.
        page.evaluate(_SET_HIDDEN, True)
        page.wait_for_timeout(500)
        reads.clear()
        page.wait_for_timeout(4500)
        assert reads.lists == [] and reads.others == [], (reads.lists, reads.others)
        page.evaluate(_SET_HIDDEN, False)
        page.wait_for_timeout(3000)
        assert reads.lists, "no refresh once shown again"

        # Next and Previous go through the pages (load/new, s00000 to s00098 are the first).
        expect(previous).to_be_disabled()
        following.click()
        expect(rows.first).to_contain_text("load/s00099")
        expect(pager).to_contain_text("101–200")
        assert reads.last() == {"limit": ["100"], "after": ["load/s00098"]}, reads.last()
        following.click()
        expect(rows.first).to_contain_text("load/s00199")
        expect(pager).to_contain_text("201–300")
        expect(rows).to_have_count(100)
        previous.click()
        expect(rows.first).to_contain_text("load/s00099")
        expect(pager).to_contain_text("101–200")
        previous.click()
        expect(rows.first).to_contain_text("load/new")
        expect(previous).to_be_disabled()

        # The search is the server's: it finds a station of a later page, and one created
        # after it was typed.
        reads.clear()
        search.fill("s02999")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("load/s02999")
        expect(page.get_by_text("1 station matches “s02999”")).to_be_visible()
        assert reads.last() == {"limit": ["100"], "contains": ["s02999"]}, reads.last()
        # Typing is read once it pauses, not at each key.
        assert len(reads.lists) <= 2, reads.lists
        expect(pager).to_be_hidden()
        client.create("load/s02999x")
        expect(rows).to_have_count(2, timeout=5000)
        expect(rows.nth(1)).to_contain_text("load/s02999x")

        # A page emptied (its stations deleted) gives way to the first one.
        search.fill("s029")
        expect(rows).to_have_count(100)
        expect(page.get_by_text("More than 100 stations match “s029”")).to_be_visible()
        following.click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("load/s02999x")
        expect(pager).to_contain_text("101 of 101")
        expect(following).to_be_disabled()
        client.call("DELETE", "/api/stations/load%2Fs02999x", expect=204)
        expect(rows.first).to_contain_text("load/s02900", timeout=5000)
        expect(rows).to_have_count(100)
        expect(pager).to_be_hidden()  # a single page now
        expect(page.get_by_text("100 stations match “s029”", exact=True)).to_be_visible()

        search.fill("")
        expect(rows.first).to_contain_text("load/new")
        expect(page.get_by_text("More than 100 stations", exact=True)).to_be_visible()
    client.close()


# -- the DLS tab and its badge follow by themselves -------------------------------------------


def _dead_letter_one_more(client: Api, station: str, group: str) -> None:
    base = f"/api/stations/{station}/groups/{group}"
    fetched = client.call("POST", base + "/fetch", {"max": 1, "waitMs": 2000})["messages"]
    assert len(fetched) == 1, fetched
    client.call("POST", base + "/dead-letter", {"offsets": [fetched[0]["offset"]]})


def test_the_dls_tab_and_badge_show_dead_letters_that_come_while_open(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The DLS tab read its entries once, and the DLS badge changed only on the Overview or
    after a replay or drop: a dead letter that came while the page was open showed only after
    a reload. Both now follow on a poll (a count first, the entries only when it moved),
    paused while the browser tab is hidden, and a reload keeps what was selected."""
    api.create("dead")
    api.produce("dead", *({"id": f"m{n}", "data": n} for n in range(5)))
    entries = api.dead_letter("dead", "g", 1)
    page = console.open("#/s/dead/dls")
    tab = page.get_by_role("tab", name="DLS")
    table = page.get_by_role("table")
    boxes = table.get_by_role("checkbox")
    expect(boxes).to_have_count(1)
    expect(tab.locator(".badge")).to_have_text("1")
    first = page.get_by_label(f"Select Entry {entries[0]['id']}", exact=True)
    first.check()

    _dead_letter_one_more(api, "dead", "g")
    expect(boxes).to_have_count(2, timeout=8000)
    expect(tab.locator(".badge")).to_have_text("2")
    expect(first).to_be_checked()
    expect(page.get_by_text("2 entries shown, 1 selected.")).to_be_visible()

    # Hidden, the page asks nothing; shown again, it catches up.
    page.evaluate(_SET_HIDDEN, True)
    page.wait_for_timeout(500)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    _dead_letter_one_more(api, "dead", "g")
    page.wait_for_timeout(4500)
    assert asked == [], asked
    expect(boxes).to_have_count(2)
    page.evaluate(_SET_HIDDEN, False)
    expect(boxes).to_have_count(3, timeout=8000)
    expect(tab.locator(".badge")).to_have_text("3")

    # On another tab, the badge follows too.
    page.get_by_role("tab", name="Messages").click()
    expect(page.get_by_role("tabpanel")).to_contain_text("Browse messages")
    _dead_letter_one_more(api, "dead", "g")
    expect(tab.locator(".badge")).to_have_text("4", timeout=10_000)
    assert api.call("GET", "/api/stations/dead")["stats"]["deadLettered"] == 4
