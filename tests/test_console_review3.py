"""Console faults a third review found, each in a real headless Chromium against ``stations
serve``: a test message sent again after a lost answer was stored twice (no message id), the
station list read every station every 2 s (megabytes a refresh with thousands of them), and
the DLS tab and its badge did not follow dead letters that came while the page was open."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

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
    from playwright.sync_api import Browser, Response, Route


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


# -- the station list: proportional to what is shown ------------------------------------------

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


def test_the_station_list_downloads_in_proportion_to_what_it_shows(
    browser: Browser,  # noqa: F811
    make_server: MakeServer,
    sqlite_url: str,  # noqa: F811
) -> None:
    """The list read every station every 2 s: 1.35 MB a refresh at 3,000 stations (4.5 MB at
    10,000), whatever was on screen. Now it shows a page at a time, reads the whole list again
    at a pace that slows with its size, and in between only the stations on screen: over
    10 s it downloads a few kilobytes instead of megabytes, and the figures stay live."""
    running = make_server(sqlite_url, "--durability", "process")
    _create_many(running.url, STATIONS)
    client = Api(running.url)
    whole = len(client.http.get("/api/stations").content)
    assert whole > 1_000_000, whole
    with open_console(browser, running) as tab:
        seen: list[tuple[str, int]] = []

        def record(response: Response) -> None:
            path = urlsplit(response.url).path
            if path.startswith("/api/"):
                seen.append((unquote(path), int(response.headers.get("content-length", "0"))))

        tab.page.on("response", record)
        page = tab.open()
        rows = page.get_by_role("table").get_by_role("row").filter(has=page.get_by_role("link"))
        expect(rows.first).to_contain_text("load/s00000", timeout=15_000)
        # The first read is the whole list: what there is to show.
        assert {p for p, _ in seen} == {"/api/stations"}, seen
        seen.clear()

        # A figure of a station on screen follows within seconds.
        client.produce("load/s00001", {"id": "a", "data": 1}, {"id": "b", "data": 2})
        row = rows.filter(has=page.get_by_role("link", name="load/s00001", exact=True))
        expect(row.get_by_role("cell").nth(1)).to_have_text("2", timeout=8000)
        page.wait_for_timeout(10_000)
        lists = [p for p, _ in seen if p == "/api/stations"]
        read = sum(size for _, size in seen)
        # Before: a whole list every 2 s, at least five (6.7 MB) in those 10 s.
        assert lists == [], seen
        assert read < 100_000, (read, len(seen))
        ones = {p.removeprefix("/api/stations/") for p, _ in seen}
        # Only the rows on screen (a 1280 x 800 window shows fewer than 30), of the first page.
        assert ones <= {f"load/s{n:05d}" for n in range(30)}, sorted(ones)

        expect(rows).to_have_count(100)
        expect(page.get_by_text(f"{STATIONS:,} stations", exact=True)).to_be_visible()

        # The other stations are a page or a search away.
        page.get_by_role("button", name="Next page").click()
        expect(rows.first).to_contain_text("load/s00100")
        expect(page.get_by_role("navigation", name="Pages of stations")).to_contain_text(
            "101–200 of 3,000"
        )
        page.get_by_label("Search stations").fill("s02999")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("load/s02999")
        expect(page.get_by_text("1 of 3,000 stations shown")).to_be_visible()
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
