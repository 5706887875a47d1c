"""Console faults a review found, each in a real headless Chromium against ``stations serve``:
exact JSON numbers, closed stations, the live tail's followers, partial settings saves, focus on
refreshed rows, failures that must be reported, the DLS badge and its paging, long values,
JSON payload types and the token field."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
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

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.harness import Server

SHOP_ADMIN = "shop-admin-secret-1"


@pytest.fixture
def token_server(make_server: MakeServer, sqlite_url: str, tmp_path: Path) -> Server:  # noqa: F811
    """A server with tokens: the live tail then long-polls (EventSource sends no header)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": ADMIN, "role": "admin"},
                    {"token": SHOP_ADMIN, "role": "admin", "stations": ["shop-*"]},
                ]
            }
        )
    )
    flags = ["--tokens", str(tokens), "--long-poll-timeout-ms", "1000", "--sse-lifetime-ms", "5000"]
    return make_server(sqlite_url, *flags)


@pytest.fixture
def admin(token_server: Server) -> Iterator[Api]:
    client = Api(token_server.url, ADMIN)
    yield client
    client.close()


def sign_in(tab: Console, secret: str, route: str = "") -> Page:
    page = tab.open(route)
    page.get_by_label("Token").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", level=1).filter(has_not_text="Sign in").wait_for()
    return page


def close_stream(client: Api, name: str) -> None:
    answer = client.http.post(
        f"/v1/stream/{name}",
        headers={"Stream-Closed": "true", "Content-Type": "application/json"},
    )
    assert answer.status_code in (200, 204), answer.text


def messages_list(page: Page) -> Any:
    return page.get_by_role("list", name="Messages").get_by_role("listitem")


# -- 1: JSON numbers beyond 2^53 --------------------------------------------------------------


def test_json_numbers_beyond_2_53_are_shown_and_produced_exactly(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("bigint")
    raw = '{"messages": [{"data": {"account": 9007199254740993, "ratio": 1.0}}]}'
    assert api.http.post("/api/stations/bigint/messages", content=raw).status_code == 200
    page = console.open("#/s/bigint/messages")
    # Shown as stored: JSON.parse would make it ...992 (and 1.0 would lose its ".0").
    expect(page.locator("pre.payload")).to_have_text(
        '{\n  "account": 9007199254740993,\n  "ratio": 1.0\n}'
    )

    page.get_by_label("Payload (JSON)").fill('{"account": 9007199254740995, "n": [1e400]}')
    page.get_by_role("button", name="Produce").click()
    # A number the server cannot store exactly is refused, at the payload field.
    expect(page.get_by_label("Payload (JSON)")).to_have_attribute("aria-invalid", "true")
    page.get_by_label("Payload (JSON)").fill('{"account": 9007199254740995}')
    page.get_by_role("button", name="Produce").click()
    expect(page.get_by_role("status").filter(has_text="offset")).to_contain_text("Stored.")
    text = api.http.get("/api/stations/bigint/messages").text
    stored = [m["data"] for m in json.loads(text)["messages"]]  # Python ints are exact
    assert stored[-1] == {"account": 9007199254740995}, text
    expect(messages_list(page)).to_have_count(2)
    expect(page.locator("pre.payload").last).to_have_text('{\n  "account": 9007199254740995\n}')


# -- 2: a closed station ----------------------------------------------------------------------


def _live_tail_on_a_closed_station(tab: Console, page: Page, client: Api, sse: bool) -> None:
    client.create("shop-closed")
    client.produce("shop-closed", {"id": "last", "data": {"n": 1}})
    close_stream(client, "shop-closed")
    assert client.call("GET", "/api/stations/shop-closed")["closed"] is True

    page.goto(f"{tab.base}/ui/#/s/shop-closed")
    # Every tab of the station says it is closed; the Overview says what that means.
    expect(page.locator(".page-head")).to_contain_text("closed")
    expect(page.get_by_role("tabpanel")).to_contain_text("This station is closed")

    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if "/v1/stream/" in r.url else None)
    page.get_by_role("tab", name="Messages").click()
    expect(page.locator(".page-head")).to_contain_text("closed")
    live = page.get_by_label("Live tail")
    live.click()  # not check(): the switch may go off again before check() looks
    status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
    # The tail stops on Stream-Closed and says why, instead of reading again and again.
    expect(status).to_contain_text("The station is closed", timeout=10_000)
    expect(live).not_to_be_checked()
    expect(messages_list(page).filter(has_text="last")).to_have_count(1)
    assert reads and all(("live=sse" in u) == sse for u in reads), reads
    seen = len(reads)
    page.wait_for_timeout(2500)  # a follower still running reads at least every second
    assert len(reads) == seen, reads[seen:]


def test_live_tail_stops_on_a_closed_station_sse(console: Console, api: Api) -> None:  # noqa: F811
    _live_tail_on_a_closed_station(console, console.page, api, sse=True)


def test_live_tail_stops_on_a_closed_station_long_poll(
    browser: Browser,  # noqa: F811
    token_server: Server,
    admin: Api,
) -> None:
    with open_console(browser, token_server) as tab:
        page = sign_in(tab, ADMIN)
        _live_tail_on_a_closed_station(tab, page, admin, sse=False)


# -- 3: one follower however quickly the switch is toggled ------------------------------------


def test_live_tail_toggled_on_off_on_follows_once(console: Console, api: Api) -> None:  # noqa: F811
    api.create("race")
    api.produce("race", *({"data": {"n": n}} for n in range(120)))  # more than a page
    page = console.open("#/s/race/messages")
    items = messages_list(page)
    expect(items).to_have_count(50)

    # Hold the station reads that starting the tail awaits, so that both starts are waiting
    # at once, as on a slow server.
    held: list[Any] = []
    page.route(re.compile(r"/api/stations/race$"), lambda route: held.append(route))
    sse: list[str] = []
    page.on("request", lambda r: sse.append(r.url) if "live=sse" in r.url else None)
    page.evaluate(
        """() => { const box = document.getElementById('live-tail');
                   box.click(); box.click(); box.click(); }"""
    )
    deadline = time.monotonic() + 7
    while len(held) < 2:
        assert time.monotonic() < deadline, held
        page.wait_for_timeout(50)
    for route in held:
        route.continue_()
    status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
    expect(status).to_contain_text("Live")
    expect(items).to_have_count(0)
    api.produce("race", {"id": "live-1", "data": {"n": "live"}})
    expect(items.filter(has_text="live-1")).to_have_count(1)
    page.wait_for_timeout(1500)  # a second follower would have shown it again by now
    expect(items.filter(has_text="live-1")).to_have_count(1)
    assert sse

    # Leaving the page stops the one follower: nothing reads the station any more.
    page.get_by_label("Live tail").uncheck()
    page.get_by_role("link", name="All stations").click()
    expect(page.get_by_role("heading", name="Stations", exact=True)).to_be_visible()
    later: list[str] = []
    page.on("request", lambda r: later.append(r.url) if "race" in r.url else None)
    api.produce("race", {"id": "after", "data": {"n": "after"}})
    page.wait_for_timeout(1500)
    assert later == [], later


# -- 4: Save sends only what changed ----------------------------------------------------------


def test_settings_save_patches_only_what_changed(
    browser: Browser,  # noqa: F811
    token_server: Server,
    admin: Api,
) -> None:
    admin.create("secret-dlq")
    admin.create("shop-a", dls={"poison": True, "forwardTo": "secret-dlq"})
    with open_console(browser, token_server) as tab:
        page = sign_in(tab, SHOP_ADMIN, "#/s/shop-a/settings")
        expect(page.get_by_label("Forward dead letters to")).to_have_value("secret-dlq")
        # Someone else changes another setting while the form is open: it must survive.
        admin.call("PATCH", "/api/stations/shop-a", {"retention": {"maxMessages": 777}})
        sent: list[Any] = []
        page.on(
            "request",
            lambda r: (
                sent.append(json.loads(r.post_data or "null")) if r.method == "PATCH" else None
            ),
        )
        page.get_by_label("Idempotency window").fill("5")
        page.get_by_label("Unit").select_option("min")
        page.get_by_label("Max ack time").fill("45s")
        page.get_by_role("button", name="Save changes").click()
        # A token scoped to shop-* may save a station whose forwardTo it cannot name.
        expect(page.get_by_role("tab", name="Overview")).to_have_attribute("aria-selected", "true")
        assert sent == [
            {"idempotencyWindowMs": 300_000, "consumerDefaults": {"maxAckTimeMs": 45_000}}
        ]
        view = admin.call("GET", "/api/stations/shop-a")
        assert view["idempotencyWindowMs"] == 300_000
        assert view["consumerDefaults"] == {"maxAckTimeMs": 45_000, "maxMsgDeliveries": 2}
        assert view["retention"]["maxMessages"] == 777
        assert view["dls"]["forwardTo"] == "secret-dlq"

        # A redrive policy goes whole (the API replaces it), other dls keys stay out.
        page.get_by_role("tab", name="Settings").click()
        page.get_by_label("Redrive at most").fill("2")
        page.get_by_role("button", name="Save changes").click()
        expect(page.get_by_role("tab", name="Overview")).to_have_attribute("aria-selected", "true")
        assert sent[1] == {"dls": {"redrive": {"maxRedrives": 2, "delayMs": 60_000, "backoff": 1}}}
        assert admin.call("GET", "/api/stations/shop-a")["dls"]["redrive"]["maxRedrives"] == 2


# -- 5: focus stays on a refreshed row --------------------------------------------------------


def test_groups_tab_keeps_keyboard_focus_across_refreshes(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("focus")
    api.produce("focus", {"data": 1}, {"data": 2})
    api.dead_letter("focus", "g1", 1)
    page = console.open("#/s/focus/groups")
    # Focus is the focused page's: another test's page left in front made this one "inactive".
    page.bring_to_front()
    link = page.get_by_role("link", name="Dead letters")
    link.focus()
    expect(link).to_be_focused()
    g1 = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name="g1"))
    lag = g1.get_by_role("cell").nth(3)
    expect(lag).to_have_text("1")
    api.produce("focus", {"data": 3}, {"data": 4})
    # The refresh shows the new lag in the same row, and the link keeps keyboard focus.
    expect(lag).to_have_text("3", timeout=6000)
    for _ in range(2):
        with page.expect_response(re.compile(r"/api/stations/focus/groups\?limit=100$")):
            pass
        expect(link).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Delete group g1")).to_be_focused()


# -- 6: failures are reported -----------------------------------------------------------------


def test_overview_and_groups_say_when_the_server_is_gone(
    browser: Browser,  # noqa: F811
    server: Server,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("down")
    api.produce("down", {"data": 1})
    api.call("PUT", "/api/stations/down/groups/g", {})
    with open_console(browser, server) as tab:
        overview = tab.open("#/s/down")
        expect(overview.get_by_role("tabpanel")).to_contain_text("Live stats")
        groups = tab.page.context.new_page()
        groups.goto(f"{server.url}/ui/#/s/down/groups")
        expect(groups.get_by_role("rowheader", name="g")).to_be_visible()
        expect(overview.get_by_role("alert")).to_have_count(0)
        server.kill()
        for page in (overview, groups):
            expect(page.get_by_role("alert").first).to_contain_text(
                "cannot be reached", timeout=8000
            )
        # The server is back: the next refresh clears the alert.
        server.start()
        for page in (overview, groups):
            expect(page.get_by_role("alert")).to_have_count(0, timeout=8000)


def test_sse_live_tail_says_when_its_station_is_deleted(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("gone")
    api.produce("gone", {"data": 1})
    page = console.open("#/s/gone/messages")
    expect(messages_list(page)).to_have_count(1)
    sse: list[str] = []
    page.on("request", lambda r: sse.append(r.url) if "live=sse" in r.url else None)
    page.get_by_label("Live tail").check()
    status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
    expect(status).to_contain_text("Live")
    deadline = time.monotonic() + 7
    while not sse:
        assert time.monotonic() < deadline
        page.wait_for_timeout(50)
    api.call("DELETE", "/api/stations/gone", expect=204)
    expect(page.get_by_role("alert")).to_contain_text("no longer exists", timeout=10_000)
    expect(status).not_to_contain_text("Live")
    expect(page.get_by_label("Live tail")).not_to_be_checked()


# -- 7, 8: the DLS tab ------------------------------------------------------------------------


def test_dls_badge_follows_replay_drop_and_the_overview(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("badge")
    api.produce("badge", *({"id": f"m{n}", "data": n} for n in range(4)))
    entries = api.dead_letter("badge", "g", 3)
    page = console.open("#/s/badge/dls")
    tab = page.get_by_role("tab", name="DLS")
    expect(tab).to_contain_text("3")
    dialog = page.get_by_role("dialog")
    page.get_by_label(f"Select Entry {entries[0]['id']}", exact=True).check()
    page.get_by_role("button", name="Replay", exact=True).click()
    dialog.get_by_role("button", name="Confirm").click()
    expect(tab).to_contain_text("2")
    page.get_by_label(f"Select Entry {entries[1]['id']}", exact=True).check()
    page.get_by_role("button", name="Drop", exact=True).click()
    dialog.get_by_role("button", name="Drop").click()
    expect(tab).to_contain_text("1")
    page.get_by_role("button", name="Replay all").click()
    dialog.get_by_role("button", name="Confirm").click()
    expect(page.get_by_text("The dead-letter store is empty.")).to_be_visible()
    expect(tab.locator(".badge")).to_have_count(0)

    # On the Overview, the badge follows the refreshed figures.
    page.get_by_role("tab", name="Overview").click()
    expect(page.get_by_role("tabpanel")).to_contain_text("Live stats")
    expect(tab.locator(".badge")).to_have_count(0)
    fetched = api.call("POST", "/api/stations/badge/groups/g/fetch", {"max": 10, "waitMs": 0})
    api.call(
        "POST",
        "/api/stations/badge/groups/g/dead-letter",
        {"offsets": [m["offset"] for m in fetched["messages"]]},
    )
    expect(tab.locator(".badge")).to_have_text(str(len(fetched["messages"])), timeout=6000)


def test_dls_load_more_twice_loads_each_entry_once(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("more")
    api.produce("more", *({"data": n} for n in range(150)))
    base = "/api/stations/more/groups/g"
    api.call("PUT", base, {})
    leased = api.call("POST", base + "/fetch", {"max": 150, "waitMs": 0})["messages"]
    api.call("POST", base + "/dead-letter", {"offsets": [m["offset"] for m in leased]})
    page = console.open("#/s/more/dls")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(100)
    pages: list[str] = []
    page.on(
        "request", lambda r: pages.append(r.url) if "/dls?" in r.url and "after=" in r.url else None
    )
    more = page.get_by_role("button", name="Load more")
    more.dblclick()
    expect(more).to_be_hidden()
    expect(rows).to_have_count(150)
    ids = page.evaluate(
        "[...document.querySelectorAll('table.dls tbody input[type=checkbox]')].map(b => b.value)"
    )
    assert len(ids) == len(set(ids)) == 150
    assert len(pages) == 1, pages


# -- 9: long values wrap ----------------------------------------------------------------------


@pytest.mark.parametrize("width", [390, 1280])
def test_long_ids_headers_and_errors_do_not_widen_the_page(
    browser: Browser,  # noqa: F811
    server: Server,  # noqa: F811
    api: Api,  # noqa: F811
    width: int,
) -> None:
    api.create("long", contentType="text/plain")
    api.produce("long", {"id": "i" * 256, "data": "x", "headers": {"k" * 300: "v" * 300}})
    api.call("PUT", "/api/stations/long/groups/g", {})
    fetched = api.call("POST", "/api/stations/long/groups/g/fetch", {"max": 1, "waitMs": 0})
    api.call(
        "POST",
        "/api/stations/long/groups/g/dead-letter",
        {"offsets": [fetched["messages"][0]["offset"]], "reason": "E" * 400},
    )
    with open_console(browser, server, width) as tab:
        for route, shown in (("messages", "i" * 256), ("dls", "E" * 400)):
            page = tab.open(f"#/s/long/{route}")
            expect(page.get_by_text(shown, exact=True)).to_be_visible()
            sizes = page.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert sizes[0] <= sizes[1], (route, sizes)


# -- 10: JSON payload types -------------------------------------------------------------------


def test_json_station_shows_strings_and_numbers_apart(console: Console, api: Api) -> None:  # noqa: F811
    api.create("types")
    values = ["123", 123, "null", None, '{"a": 1}', {"a": 1}]
    api.produce("types", *({"data": v} for v in values))
    page = console.open("#/s/types/messages")
    expect(messages_list(page)).to_have_count(len(values))
    shown = page.locator("pre.payload").all_text_contents()
    assert shown == ['"123"', "123", '"null"', "null", '"{\\"a\\": 1}"', '{\n  "a": 1\n}']
    # The DLS tab shows the same JSON text.
    api.dead_letter("types", "g", 1)
    page.get_by_role("tab", name="DLS").click()
    expect(page.locator("td.payload-cell pre")).to_have_text('"123"')


# -- 11: the token field ----------------------------------------------------------------------


def test_token_field_is_masked_and_not_offered_to_the_password_manager(
    browser: Browser,  # noqa: F811
    token_server: Server,
) -> None:
    with open_console(browser, token_server) as tab:
        page = tab.open()
        token = page.get_by_label("Token")
        expect(token).to_have_attribute("type", "password")
        expect(token).to_have_attribute("autocomplete", "off")


# -- live tails in hidden tabs let go of their connections ------------------------------------

_SET_HIDDEN = """(hidden) => {
    for (const [key, value] of [['hidden', hidden], ['visibilityState', hidden ? 'hidden' : 'visible']])
        Object.defineProperty(document, key, { value, configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_live_tails_in_hidden_tabs_leave_connections_to_the_others(
    browser: Browser,  # noqa: F811
    make_server: MakeServer,
    sqlite_url: str,  # noqa: F811
) -> None:
    """A browser opens at most six HTTP/1.1 connections to a server, for all its tabs: six
    tabs tailing a station each held one for the SSE's whole lifetime (a minute), and a
    seventh tab, like every catch-up read of the six, waited that long for anything. A hidden
    tab's tail now lets go of its connection, and catches up when shown again."""
    slow = make_server(sqlite_url)  # SSE responses last their default minute
    client = Api(slow.url)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(7000)
    try:
        client.create("busy")
        tabs = []
        for _ in range(6):
            tab = Console(context.new_page(), slow.url)
            page = tab.open("#/s/busy/messages")
            expect(messages_list(page)).to_have_count(0)
            page.get_by_label("Live tail").check()
            status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
            expect(status).to_contain_text("Live")
            tabs.append(tab)
        for tab in tabs:
            tab.page.evaluate(_SET_HIDDEN, True)
        client.produce("busy", {"id": "while-hidden", "data": {"n": 1}})

        seventh = Console(context.new_page(), slow.url)
        page = seventh.open("")
        expect(page.get_by_role("link", name="busy")).to_be_visible()

        shown = tabs[0].page
        shown.evaluate(_SET_HIDDEN, False)
        expect(messages_list(shown).filter(has_text="while-hidden")).to_have_count(1)
        client.produce("busy", {"id": "while-shown", "data": {"n": 2}})
        expect(messages_list(shown).filter(has_text="while-shown")).to_have_count(1)
        for tab in [*tabs, seventh]:
            assert tab.errors == [] and tab.dialogs == [], (tab.errors, tab.dialogs)
    finally:
        context.close()
        client.close()


def test_a_long_payload_shows_its_start_and_the_rest_on_demand(console: Console, api: Api) -> None:  # noqa: F811
    """A 20 MB payload was laid out whole, holding the tab for seconds (a page of such ones
    for much longer): the first 64 Ki characters are shown, the rest on demand."""
    api.create("big", contentType="text/plain")
    api.produce("big", {"data": "a" * 200_000 + "THE-END"}, {"data": "short"})
    page = console.open("#/s/big/messages")
    items = messages_list(page)
    expect(items).to_have_count(2)
    long, short = items.nth(0), items.nth(1)
    assert len(long.locator("pre").inner_text()) == 64 * 1024
    expect(short.locator("pre")).to_have_text("short")
    expect(short.get_by_role("button")).to_have_count(0)
    long.get_by_role("button", name="Show all 200,007 characters").click()
    expect(long.locator("pre")).to_contain_text("THE-END")
    assert len(long.locator("pre").inner_text()) == 200_007
    expect(long.get_by_role("button")).to_have_count(0)


def test_bidirectional_controls_in_a_payload_are_shown_as_marks(console: Console, api: Api) -> None:  # noqa: F811
    """A U+202E in a payload showed the rest of its line reversed, as it was not."""
    api.create("bidi", contentType="text/plain")
    api.produce("bidi", {"data": "pay \u202eabc\u202c to x"})
    page = console.open("#/s/bidi/messages")
    shown = messages_list(page).first.locator("pre")
    expect(shown).to_have_text("pay \u27e8U+202E\u27e9abc\u27e8U+202C\u27e9 to x")
