"""The web console in a real headless Chromium against a live ``stations serve`` (SQLite).

Controls are found as a person finds them: by their label and role. Every page also fails its
test on any script error or Content-Security-Policy violation in the browser console.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.browser import Api, chromium, require_browser
from tests.harness import Server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

MakeServer = Callable[..., Server]
ADMIN = "admin-secret-1"
CONSUMER = "consumer-secret-1"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_browser()
    with chromium() as b:
        yield b


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}"


@pytest.fixture
def server(make_server: MakeServer, sqlite_url: str) -> Server:
    return make_server(sqlite_url, "--long-poll-timeout-ms", "1000", "--sse-lifetime-ms", "5000")


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    client = Api(server.url)
    yield client
    client.close()


class Console:
    """A browser tab on the console that records script errors and dialogs."""

    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", self._console)
        page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        text = message.text
        # A 401 / 403 / 404 the console handles shows up as a failed-resource line; not an error.
        if message.type == "error" and "Failed to load resource" not in text:
            self.errors.append(f"console: {text}")
        if "Content Security Policy" in text:
            self.errors.append(f"csp: {text}")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, route: str = "") -> Page:
        self.page.goto(f"{self.base}/ui/{route}")
        return self.page


@pytest.fixture
def console(browser: Browser, server: Server) -> Iterator[Console]:
    with open_console(browser, server) as tab:
        yield tab


@contextmanager
def open_console(browser: Browser, server: Server, width: int = 1280) -> Iterator[Console]:
    """A fresh browser context; on leaving, no script error and no dialog may have happened."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.set_default_timeout(7000)
    tab = Console(context.new_page(), server.url)
    try:
        yield tab
    finally:
        context.close()
    assert tab.errors == [], tab.errors
    assert tab.dialogs == [], tab.dialogs


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(target)


# -- station form -----------------------------------------------------------------------------


def test_create_station_through_the_form(console: Console, api: Api) -> None:
    page = console.open()
    expect(page.get_by_role("heading", name="Stations")).to_be_visible()
    page.get_by_role("link", name="New station").click()
    expect(page.get_by_role("heading", name="New station")).to_be_visible()

    # Checked in the browser: a bad name and a 50 ms window never reach the server.
    page.get_by_label("Name").fill("shop//orders")
    page.get_by_label("Idempotency window").fill("50")
    page.get_by_label("Unit").select_option("ms")
    page.get_by_role("button", name="Create station").click()
    window = page.get_by_label("Idempotency window")
    expect(window).to_have_attribute("aria-invalid", "true")
    expect(window).to_have_accessible_description(
        re.compile("Idempotency window must be between 100 ms and 24 h")
    )
    expect(page.get_by_text("Idempotency window must be between 100 ms and 24 h.")).to_be_visible()
    expect(page.get_by_label("Name")).to_have_accessible_description(
        re.compile("single “/” between segments")
    )
    expect(page.get_by_role("alert")).to_contain_text(
        "Fix these 2 fields: Name, Idempotency window."
    )
    api.call("GET", "/api/stations/shop%2Forders", expect=404)

    # Checked by the server: its error lands at the field it names (dls.forwardTo).
    page.get_by_label("Name").fill("shop/orders")
    page.get_by_label("Idempotency window").fill("90")
    page.get_by_label("Unit").select_option("s")
    page.get_by_label("Forward dead letters to").fill("shop/orders")
    page.get_by_role("button", name="Create station").click()
    forward = page.get_by_label("Forward dead letters to")
    expect(forward).to_have_attribute("aria-invalid", "true")
    expect(forward).to_have_accessible_description(re.compile("must name another station"))
    expect(page.get_by_label("Idempotency window")).not_to_have_attribute("aria-invalid", "true")
    api.call("GET", "/api/stations/shop%2Forders", expect=404)

    page.get_by_label("Forward dead letters to").fill("")
    page.get_by_label("Max message deliveries").fill("5")
    page.get_by_label("Max ack time").fill("45s")
    page.get_by_label("Max messages").fill("1000")
    page.get_by_role("button", name="Create station").click()
    expect(page.get_by_role("heading", name="shop/orders")).to_be_visible()
    expect(page).to_have_url(re.compile(r"#/s/shop%2Forders$"))
    view = api.call("GET", "/api/stations/shop%2Forders")
    assert view["idempotencyWindowMs"] == 90_000
    assert view["consumerDefaults"] == {"maxAckTimeMs": 45_000, "maxMsgDeliveries": 5}
    assert view["retention"]["maxMessages"] == 1000
    assert view["dls"]["forwardTo"] is None

    # Edit: the window is mutable; the form starts from the current settings.
    page.get_by_role("tab", name="Settings").click()
    expect(page.get_by_label("Idempotency window")).to_have_value("90")
    expect(page.get_by_label("Unit")).to_have_value("s")
    expect(page.get_by_label("Name")).to_have_attribute("readonly", "")
    page.get_by_label("Idempotency window").fill("2")
    page.get_by_label("Unit").select_option("h")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("tab", name="Overview")).to_have_attribute("aria-selected", "true")
    assert api.call("GET", "/api/stations/shop%2Forders")["idempotencyWindowMs"] == 7_200_000


# -- messages ---------------------------------------------------------------------------------


def test_produce_twice_with_one_msg_id_shows_the_duplicate(console: Console, api: Api) -> None:
    api.create("orders")
    page = console.open("#/s/orders/messages")
    page.get_by_label("Message id").fill("order-17")
    page.get_by_label("Payload").fill('{"total": 12}')
    page.get_by_role("button", name="Produce").click()
    result = page.get_by_role("status").filter(has_text="offset")
    expect(result).to_contain_text("Stored.")
    first = api.call("GET", "/api/stations/orders/messages")["messages"]
    assert [(m["id"], m["data"]) for m in first] == [("order-17", {"total": 12})]
    expect(result).to_contain_text(first[0]["offset"])

    page.get_by_label("Payload").fill('{"total": 13}')
    page.get_by_role("button", name="Produce").click()
    expect(result).to_contain_text("Duplicate: not stored.")
    expect(result).to_contain_text(first[0]["offset"])
    after = api.call("GET", "/api/stations/orders/messages")["messages"]
    assert after == first
    # The browser shows the one stored message, pretty-printed.
    expect(page.get_by_role("list", name="Messages").get_by_role("listitem")).to_have_count(1)
    expect(page.locator("pre.payload")).to_have_text('{\n  "total": 12\n}')


def test_produce_on_a_station_whose_type_only_mentions_json(console: Console, api: Api) -> None:
    """The server takes only application/json as JSON; the form took any type with "json" in
    it and sent an object to an application/x-ndjson station, which refused it (review)."""
    api.create("lines", contentType="application/x-ndjson")
    page = console.open("#/s/lines/messages")
    page.get_by_label("Payload").fill('{"a": 1}')
    page.get_by_role("button", name="Produce").click()
    expect(page.get_by_role("status").filter(has_text="offset")).to_contain_text("Stored.")
    stored = api.call("GET", "/api/stations/lines/messages")["messages"]
    assert [m["data"] for m in stored] == ['{"a": 1}']


def test_latest_on_a_station_retention_trimmed(console: Console, api: Api) -> None:
    """Latest asks for the tail minus a page; where retention dropped that offset it showed
    "offset is before the earliest retained message" instead of the messages kept (review)."""
    api.create("trimmed", retention={"maxMessages": 5})
    api.produce("trimmed", *({"data": k} for k in range(100)))
    deadline = time.monotonic() + 10
    while api.call("GET", "/api/stations/trimmed")["stats"]["messages"] > 5:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    page = console.open("#/s/trimmed/messages")
    page.get_by_role("button", name="Latest").click()
    items = page.get_by_role("list", name="Messages").get_by_role("listitem")
    expect(items).to_have_count(5)
    expect(page.get_by_role("alert")).to_have_count(0)


def test_message_browser_pages_from_any_offset_and_tails_live(console: Console, api: Api) -> None:
    api.create("events")
    api.produce("events", *({"data": {"n": n}} for n in range(60)))
    page = console.open("#/s/events/messages")
    items = page.get_by_role("list", name="Messages").get_by_role("listitem")
    expect(items).to_have_count(50)
    page.get_by_role("button", name="Next page").click()
    expect(items).to_have_count(10)
    expect(items.first).to_contain_text('"n": 50')
    page.get_by_role("button", name="Previous page").click()
    expect(items).to_have_count(50)
    page.get_by_label("From offset").fill("57")
    page.get_by_role("button", name="Go").click()
    expect(items).to_have_count(3)
    expect(items.first).to_contain_text('"n": 57')

    # Live tail over Server-Sent Events (no token in use).
    sse: list[str] = []
    page.on("request", lambda r: sse.append(r.url) if "live=sse" in r.url else None)
    page.get_by_label("Live tail").check()
    page.wait_for_timeout(300)
    api.produce("events", {"id": "late", "data": {"n": "live"}})
    expect(items).to_have_count(4)
    expect(items.last).to_contain_text('"n": "live"')
    assert any("/v1/stream/events?offset=" in url for url in sse), sse


def test_payloads_headers_and_ids_render_as_text(console: Console, api: Api) -> None:
    attack = "<img src=x onerror=alert(1)>"
    api.create("plain", contentType="text/plain")
    api.produce(
        "plain",
        {
            "id": "<script>alert(2)</script>",
            "data": attack,
            "headers": {"<b>": "<svg onload=alert(3)>"},
        },
    )
    api.create("json-x")
    api.produce("json-x", {"data": {"html": attack}})
    api.dead_letter("plain", "g", 1)

    page = console.open("#/s/plain/messages")
    expect(page.get_by_text(attack, exact=True)).to_be_visible()
    expect(page.get_by_text("<script>alert(2)</script>", exact=True)).to_be_visible()
    expect(page.get_by_text("<svg onload=alert(3)>", exact=True)).to_be_visible()
    page.get_by_role("tab", name="DLS").click()
    expect(page.get_by_role("cell", name=attack)).to_be_visible()
    page.goto(f"{console.base}/ui/#/s/json-x/messages")
    expect(page.locator("pre.payload")).to_have_text('{\n  "html": "' + attack + '"\n}')
    page.wait_for_timeout(300)
    assert page.locator("img, script:not([src]), svg, b").count() == 0
    assert console.dialogs == []


# -- dead-letter store ------------------------------------------------------------------------


def test_replay_and_drop_from_the_dls_tab(console: Console, api: Api) -> None:
    api.create("payments")
    api.produce("payments", *({"id": f"p{n}", "data": {"n": n}} for n in range(3)))
    entries = api.dead_letter("payments", "billing", 3)
    first, second, third = (e["id"] for e in entries)

    page = console.open("#/s/payments")
    expect(page.get_by_role("tab", name="DLS")).to_contain_text("3")
    page.get_by_role("tab", name="DLS").click()
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("Max deliveries reached")
    expect(rows.first).to_contain_text("nacked")

    replay = page.get_by_role("button", name="Replay", exact=True)
    expect(replay).to_be_disabled()
    page.get_by_label(f"Select Entry {first}", exact=True).check()
    replay.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Replay 1 entry?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert len(api.call("GET", "/api/stations/payments/dls")["entries"]) == 3

    replay.click()
    dialog.get_by_role("button", name="Confirm").click()
    expect(rows).to_have_count(2)
    assert [e["id"] for e in api.call("GET", "/api/stations/payments/dls")["entries"]] == [
        second,
        third,
    ]
    # Back in its group's queue with a fresh delivery count.
    group = api.call("GET", "/api/stations/payments/groups")["groups"][0]
    assert (group["pending"], group["deadLettered"]) == (1, 2)
    fetched = api.call(
        "POST", "/api/stations/payments/groups/billing/fetch", {"max": 10, "waitMs": 0}
    )["messages"]
    assert [(m["id"], m["deliveryCount"]) for m in fetched] == [("p0", 1)]

    page.get_by_label(f"Select Entry {third}", exact=True).check()
    page.get_by_role("button", name="Drop", exact=True).click()
    expect(dialog).to_contain_text("Drop 1 entry?")
    dialog.get_by_role("button", name="Drop").click()
    expect(rows).to_have_count(1)

    page.get_by_role("button", name="Replay all").click()
    # It says how many (the table shows 100 at most).
    expect(dialog).to_contain_text("Replay all 1 dead letter?")
    dialog.get_by_role("button", name="Confirm").click()
    expect(page.get_by_text("The dead-letter store is empty.")).to_be_visible()
    assert api.call("GET", "/api/stations/payments/dls")["entries"] == []
    fetched = api.call(
        "POST", "/api/stations/payments/groups/billing/fetch", {"max": 10, "waitMs": 0}
    )["messages"]
    assert [m["id"] for m in fetched] == ["p1"]  # p2 was dropped


# -- list, keyboard, phone width --------------------------------------------------------------


def test_list_searches_and_stats_stay_live(console: Console, api: Api) -> None:
    for name in ("alpha", "beta", "team/alpha.events"):
        api.create(name)
    page = console.open()
    rows = page.get_by_role("table").get_by_role("row").filter(has=page.get_by_role("link"))
    expect(rows).to_have_count(3)
    page.get_by_label("Search stations").fill("alpha")
    expect(rows.filter(visible=True)).to_have_count(2)
    page.get_by_label("Search stations").fill("")
    beta = page.get_by_role("row").filter(has=page.get_by_role("link", name="beta", exact=True))
    expect(beta.get_by_role("cell").nth(1)).to_have_text("0")
    api.produce("beta", {"id": "x", "data": 1}, {"id": "y", "data": 2})
    expect(beta.get_by_role("cell").nth(1)).to_have_text("2")  # messages
    expect(beta.get_by_role("cell").nth(2)).to_have_text("2")  # ids in window
    page.get_by_role("link", name="team/alpha.events").click()
    expect(page.get_by_role("heading", name="team/alpha.events")).to_be_visible()


def test_tabs_work_from_the_keyboard(console: Console, api: Api) -> None:
    api.create("kb")
    page = console.open("#/s/kb")
    page.get_by_role("tab", name="Overview").focus()
    page.keyboard.press("ArrowRight")
    messages = page.get_by_role("tab", name="Messages")
    expect(messages).to_have_attribute("aria-selected", "true")
    expect(messages).to_be_focused()
    expect(page.get_by_role("tabpanel")).to_contain_text("Browse messages")
    page.keyboard.press("End")
    expect(page.get_by_role("tab", name="Settings")).to_be_focused()
    expect(page.get_by_role("button", name="Save changes")).to_be_visible()


def test_delete_station_asks_first(console: Console, api: Api) -> None:
    api.create("doomed")
    page = console.open("#/s/doomed")
    delete = page.get_by_role("button", name="Delete station")
    delete.click()
    dialog = page.get_by_role("dialog", name="Delete station doomed?")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(delete).to_be_focused()
    api.call("GET", "/api/stations/doomed")
    delete.click()
    dialog.get_by_role("button", name="Delete").click()
    expect(page.get_by_role("heading", name="Stations", exact=True)).to_be_visible()
    expect(page.get_by_role("status")).to_have_text("Station doomed deleted.")
    api.call("GET", "/api/stations/doomed", expect=404)


def test_a_station_deleted_elsewhere_says_so_on_its_overview(console: Console, api: Api) -> None:
    api.create("elsewhere")
    api.produce("elsewhere", {"id": "a", "data": 1})
    page = console.open("#/s/elsewhere")
    expect(page.get_by_role("tabpanel")).to_contain_text("Live stats")
    api.call("DELETE", "/api/stations/elsewhere", expect=204)
    # The next refresh (every 2 s) finds it gone: the figures of a deleted station must not
    # stay on screen as if it were live.
    expect(page.get_by_role("alert")).to_contain_text("no longer exists", timeout=6000)
    expect(page.get_by_text("Live stats")).to_be_hidden()
    expect(page.get_by_role("link", name="All stations").first).to_be_visible()


ROUTES = [
    "",
    "#/new",
    "#/s/fit%2Forders",
    "#/s/fit%2Forders/messages",
    "#/s/fit%2Forders/groups",
    "#/s/fit%2Forders/dls",
    "#/s/fit%2Forders/settings",
]


@pytest.mark.parametrize("width", [390, 1280])
def test_every_control_is_labelled_and_fits(
    browser: Browser, server: Server, api: Api, width: int
) -> None:
    api.create("fit/orders")
    api.produce("fit/orders", {"id": "a", "data": {"k": "v" * 200}})
    api.dead_letter("fit/orders", "g", 1)
    with open_console(browser, server, width) as tab:
        for route in ROUTES:
            page = tab.open(route)
            page.get_by_role("heading", level=1).wait_for()
            page.wait_for_timeout(150)
            unlabelled = page.evaluate(
                """() => [...document.querySelectorAll('input, select, textarea, button')]
                    .filter((el) => !el.closest('[hidden], dialog:not([open])'))
                    .filter((el) => !(el.labels?.length || el.getAttribute('aria-label') ||
                                      (el.tagName === 'BUTTON' && el.textContent.trim())))
                    .map((el) => el.outerHTML)"""
            )
            assert unlabelled == [], (route, unlabelled)
            overflow = page.evaluate("document.documentElement.scrollWidth")
            assert overflow <= width, (route, overflow)


# -- auth -------------------------------------------------------------------------------------


def test_sign_in_with_a_token(
    browser: Browser, make_server: MakeServer, sqlite_url: str, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"token": ADMIN, "role": "admin"},
                    {"token": CONSUMER, "role": "consumer", "stations": ["orders*"]},
                ]
            }
        )
    )
    server = make_server(sqlite_url, "--tokens", str(tokens), "--long-poll-timeout-ms", "1000")
    admin = Api(server.url, ADMIN)
    admin.create("orders")
    admin.create("secret-stuff")

    with open_console(browser, server) as tab:
        page = tab.open()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        expect(page.locator("main")).not_to_contain_text("null")  # no reason: nothing shown
        page.get_by_label("Token").fill("not-a-token")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_label("Token")).to_have_accessible_description(
            re.compile("That token was not accepted")
        )

        sent: list[str | None] = []
        page.on(
            "request",
            lambda r: sent.append(r.headers.get("authorization")) if "/api/" in r.url else None,
        )
        page.get_by_label("Token").fill(CONSUMER)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("link", name="orders", exact=True)).to_be_visible()
        # A token limited to orders* sees only those stations.
        expect(page.get_by_role("link", name="secret-stuff")).to_have_count(0)
        assert page.evaluate("sessionStorage.getItem('stations.token')") == CONSUMER
        assert page.evaluate("localStorage.length") == 0
        assert sent and all(h == f"Bearer {CONSUMER}" for h in sent), sent

        # The token survives a reload of the tab; live tail falls back to long-poll fetches.
        page.reload()
        page.get_by_role("link", name="orders", exact=True).click()
        page.get_by_role("tab", name="Messages").click()
        polls: list[str | None] = []
        page.on(
            "request",
            lambda r: (
                polls.append(r.headers.get("authorization")) if "live=long-poll" in r.url else None
            ),
        )
        page.get_by_label("Live tail").check()
        page.wait_for_timeout(300)
        admin.produce("orders", {"id": "via-admin", "data": {"hello": "tail"}})
        items = page.get_by_role("list", name="Messages").get_by_role("listitem")
        expect(items.last).to_contain_text("via-admin")
        assert polls and all(h == f"Bearer {CONSUMER}" for h in polls), polls

        # A consumer may not change settings: the API's 403 is shown, not swallowed.
        page.get_by_role("tab", name="Settings").click()
        page.get_by_role("button", name="Save changes").click()
        expect(page.get_by_role("alert")).to_contain_text("Not allowed with this token")

        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Token")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('stations.token')") is None
    admin.close()
    log = (tmp_path / f"server-{server.port}.log").read_text()
    assert ADMIN not in log and CONSUMER not in log
