"""Console faults an eighth review found, each in a real headless Chromium against ``stations
serve``: bidirectional controls in message headers and dead-letter errors were shown raw
("\\u202e0001\\u202c USD" read "1000 USD"); Previous page went back through the pages visited
rather than to the older page; a create of a station that already existed said it was made; the
Overview's settings and the DLS tab's redrive policy stayed as the page found them; a token
beyond ASCII was said to reach no server; a producer's live tail retried its 403 for ever; a
refused delete was said in a toast only; the station list kept a re-created station's old
content type; and the form misnamed the bound of counts and rounded 100.4 ms."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
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
from tests.test_console_review import messages_list, token_server  # noqa: F401  (fixture)
from tests.test_console_review6 import PRODUCER, SCOPED, Tokens, _as, _record, tokens  # noqa: F401

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.harness import Server


def _wait_until(page: Page, done: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        page.wait_for_timeout(100)


# -- 1: bidirectional controls in headers and dead-letter errors ------------------------------

RLO, PDF = "\u202e", "\u202c"


def _mark(code: str) -> str:
    return f"\u27e8U+{code}\u27e9"


def test_1_bidirectional_controls_in_headers_and_dls_errors_are_shown_as_marks(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The payload showed U+202E as a mark, but a header "amount: \\u202e0001\\u202c USD" read
    "1000 USD", and so did a consumer's dead-letter reason in the DLS's Error column."""
    api.create("bidi")
    api.produce(
        "bidi",
        {
            "data": {"n": 1},
            "headers": {"amount": f"{RLO}0001{PDF} USD", f"x{RLO}y": "k\u200fz"},
        },
    )
    base = "/api/stations/bidi/groups/g"
    api.call("PUT", base, {"maxMsgDeliveries": 1})
    leased = api.call("POST", base + "/fetch", {"max": 1, "waitMs": 2000})["messages"]
    api.call(
        "POST",
        base + "/dead-letter",
        {"offsets": [leased[0]["offset"]], "reason": f"refund {RLO}00.001${PDF} approved"},
    )

    page = console.open("#/s/bidi/messages")
    headers = messages_list(page).first.locator("dl.headers")
    expect(headers.locator("dd").first).to_have_text(f"{_mark('202E')}0001{_mark('202C')} USD")
    expect(headers.locator("dt").nth(1)).to_have_text(f"x{_mark('202E')}y")
    expect(headers.locator("dd").nth(1)).to_have_text(f"k{_mark('200F')}z")
    assert RLO not in headers.inner_text()

    page.goto(f"{console.base}/ui/#/s/bidi/dls")
    error = page.locator("table.dls td[data-label=Error]")
    expect(error).to_have_text(f"refund {_mark('202E')}00.001${_mark('202C')} approved")


# -- 2: Previous page is the older page -------------------------------------------------------


def _offset(n: int) -> str:
    return f"{n:016d}_{0:016d}"


def test_2_previous_page_shows_the_older_page_before_the_one_shown(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """Previous went Back through the pages visited: after Latest (messages 451-500 of 500) it
    showed the first page. It now shows the page of older messages right before the one shown,
    after Latest, Go and Next alike, and is disabled at the start of the station only."""
    api.create("paged")
    for start in range(0, 500, 100):
        api.produce("paged", *({"data": {"n": n}} for n in range(start, start + 100)))
    page = console.open("#/s/paged/messages")
    items = messages_list(page)
    first_offset = items.first.locator(".meta code").first
    previous = page.get_by_role("button", name="Previous page")
    expect(items).to_have_count(50)
    expect(previous).to_be_disabled()

    page.get_by_role("button", name="Latest").click()
    expect(first_offset).to_have_text(_offset(450))
    previous.click()
    expect(first_offset).to_have_text(_offset(400))
    expect(items).to_have_count(50)
    expect(items.last.locator(".meta code").first).to_have_text(_offset(449))
    previous.click()
    expect(first_offset).to_have_text(_offset(350))

    page.get_by_label("From offset").fill("120")
    page.get_by_role("button", name="Go").click()
    expect(first_offset).to_have_text(_offset(120))
    previous.click()
    expect(first_offset).to_have_text(_offset(70))
    previous.click()
    expect(first_offset).to_have_text(_offset(20))
    expect(previous).to_be_enabled()
    previous.click()
    # Fewer than a page before it: the start of the station, and nothing before that.
    expect(first_offset).to_have_text(_offset(0))
    expect(previous).to_be_disabled()

    page.get_by_role("button", name="Next page").click()
    expect(first_offset).to_have_text(_offset(50))
    page.get_by_role("button", name="Next page").click()
    expect(first_offset).to_have_text(_offset(100))
    previous.click()
    expect(first_offset).to_have_text(_offset(50))
    expect(previous).to_be_enabled()


# -- 3: creating a station that already exists ------------------------------------------------


def test_3_new_station_with_the_name_of_one_that_exists_says_so(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The server answers 200 (not 201) to a create of a station that exists with the same
    settings: the console said "Station X is ready." and opened it, as if it had made it."""
    created = api.create("exists")["createdAt"]
    api.produce("exists", *({"data": {"n": n}} for n in range(5)))
    page = console.open("#/new")
    page.get_by_label("Name").fill("exists")
    page.get_by_role("button", name="Create station").click()
    name = page.get_by_label("Name")
    expect(name).to_have_attribute("aria-invalid", "true")
    expect(name).to_have_accessible_description(
        re.compile("Station “exists” already exists .*nothing was created")
    )
    expect(page.get_by_role("link", name="Open station exists")).to_be_visible()
    assert page.url.endswith("#/new"), page.url
    assert "ready" not in page.locator("#announce").inner_text()
    view = api.call("GET", "/api/stations/exists")
    assert view["createdAt"] == created and view["stats"]["messages"] == 5

    # A new name is still created, and said so.
    name.fill("fresh")
    page.get_by_role("button", name="Create station").click()
    expect(page.get_by_role("heading", name="fresh")).to_be_visible()
    expect(page.locator("#announce")).to_have_text("Station fresh is ready.")


# -- 4: the settings shown follow the station -------------------------------------------------


def test_4_overview_settings_and_dls_policy_follow_a_change_made_elsewhere(
    browser: Browser,  # noqa: F811
    server: Server,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The Overview's Settings list and the DLS tab's redrive policy were built once, while
    the figures beside them refreshed every 2 s from the same reads."""
    api.create("drift")
    with open_console(browser, server) as overview, open_console(browser, server) as dls:
        page = overview.open("#/s/drift")
        config = page.locator("dl.config")
        expect(config).to_contain_text("Max messagesno limit")
        expect(config).to_contain_text("Redrive dead lettersoff")
        policy = dls.open("#/s/drift/dls").locator("#dls-policy")
        expect(policy).to_have_text(
            "Redrive policy: off (set one under Settings to resend dead letters by themselves)."
        )
        api.call(
            "PATCH",
            "/api/stations/drift",
            {
                "retention": {"maxMessages": 5},
                "dls": {"poison": False, "redrive": {"maxRedrives": 3, "delayMs": 1000}},
            },
        )
        expect(config).to_contain_text("Max messages5", timeout=10_000)
        expect(config).to_contain_text("Poison messages to the DLSoff")
        expect(config).to_contain_text(
            "Redrive dead lettersup to 3 times, 1 s after dead-lettering"
        )
        expect(policy).to_have_text(
            "Redrive policy: up to 3 times, 1 s after dead-lettering", timeout=10_000
        )


# -- 5: a token beyond printable ASCII --------------------------------------------------------


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        # fetch throws on a header beyond Latin-1: "The server cannot be reached."
        ("token\u20acsecret-22", "character 6 is U+20AC"),
        # sent as its Latin-1 byte, not UTF-8: "That token was not accepted."
        ("p\u00e4sswort-geheim-1", "character 2 is U+00E4"),
        # pasted with an invisible character
        (ADMIN + "\u200b", f"character {len(ADMIN) + 1} is U+200B"),
    ],
    ids=["euro", "umlaut", "zero-width"],
)
def test_5_a_token_beyond_printable_ascii_is_said_to_be_one_before_it_is_sent(
    browser: Browser,  # noqa: F811
    token_server: Server,  # noqa: F811
    secret: str,
    said: str,
) -> None:
    """A token with a character beyond printable ASCII was said to be unreachable server or
    not accepted: no Authorization header carries it as written, and the console now says so."""
    with open_console(browser, token_server) as tab:
        page = tab.open()
        field = page.get_by_label("Token")
        field.fill(secret)  # the sign-in is shown: the list's 401 that asked for it is in
        sent = _record(page)
        page.get_by_role("button", name="Sign in").click()
        expect(field).to_have_accessible_description(
            re.compile("A token is printable ASCII only .*" + re.escape(said))
        )
        assert sent == [], sent
        # The same field takes a good token afterwards.
        field.fill(ADMIN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Stations")).to_be_visible()


# -- 6: the live tail of a token that may not read --------------------------------------------


def test_6_the_live_tail_of_a_producer_token_stops_at_the_refusal(
    browser: Browser,  # noqa: F811
    tokens: Tokens,  # noqa: F811
) -> None:
    """A producer may not read messages: its live tail said "Live tail interrupted (...);
    retrying…" and asked again every 2 s for ever, for the same 403. It now stops, says why
    once, and asks nothing more."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, PRODUCER)
        seen = _record(page)
        tab.open("#/s/orders/messages")
        expect(page.locator("section.browse").get_by_role("alert")).to_contain_text(
            "Not allowed with this token"
        )
        live = page.get_by_label("Live tail")
        live.check()
        status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
        expect(status).to_have_text(
            "Stopped following: this token may not read the messages of this station."
        )
        expect(live).not_to_be_checked()
        reads = lambda: [s for s in seen if "messages" in s[0] or "stream" in s[0]]  # noqa: E731
        asked = reads()
        assert asked and all(code == 403 for _, code in asked), asked
        # Where it went on, it asked again within 2 s: 5 s of nothing more.
        page.wait_for_timeout(5000)
        assert reads() == asked, reads()[len(asked) :]
        expect(status).not_to_contain_text("retrying")


# -- 7: a refused delete stays said on the page -----------------------------------------------


def test_7_a_refused_delete_of_a_station_or_a_group_stays_on_the_page(
    browser: Browser,  # noqa: F811
    tokens: Tokens,  # noqa: F811
) -> None:
    """A consumer may not delete a station or a group: the refusal was said in a toast only,
    gone after 5 s. It now stays on the page, as a DLS replay's or drop's does."""
    with open_console(browser, tokens.server) as tab:
        page = tab.page
        _as(page, SCOPED)
        tab.open("#/s/orders")
        page.get_by_role("button", name="Delete station").click()
        page.locator("#confirm").get_by_role("button", name="Delete").click()
        refused = page.locator("#panel").get_by_role("alert").filter(has_text="Not deleted")
        expect(refused).to_contain_text("Not allowed with this token")
        # The toast goes (5 s); what was refused stays.
        expect(page.locator("#toast")).to_be_hidden(timeout=10_000)
        expect(refused).to_be_visible()
        tokens.admin.call("GET", "/api/stations/orders")

        seen = _record(page)
        tab.open("#/s/orders/groups")
        page.get_by_role("button", name="Delete group billing").click()
        page.locator("#confirm").get_by_role("button", name="Delete").click()
        group = page.locator("#panel").get_by_role("alert").filter(has_text="was not deleted")
        expect(group).to_contain_text("Group billing was not deleted: Not allowed with this token")
        # The refreshes of the groups (every 2 s) leave it; so does the toast's going.
        reads = lambda: len([s for s in seen if s[0].startswith("stations/orders/groups?")])  # noqa: E731
        refreshed = reads()
        expect(page.locator("#toast")).to_be_hidden(timeout=10_000)
        _wait_until(page, lambda: reads() >= refreshed + 2, "the groups were not read again")
        expect(group).to_be_visible()
        expect(page.locator("table.groups")).to_contain_text("billing")


# -- 8: the station list follows a station created again --------------------------------------


def test_8_the_station_lists_content_type_follows_a_station_created_again(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("again")
    page = console.open()
    cell = page.locator("table.stations tbody tr", has_text="again").locator(
        "td[data-label='Content type']"
    )
    expect(cell).to_have_text("application/json")
    api.call("DELETE", "/api/stations/again", expect=204)
    api.create("again", contentType="application/octet-stream")
    expect(cell).to_have_text("application/octet-stream", timeout=10_000)


# -- 10: the form's bounds and whole numbers --------------------------------------------------


def test_10_the_form_names_the_bound_of_counts_and_refuses_a_fraction_of_a_ms(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """Max bytes beyond 2^53 - 1 was "not a whole number of at least 1", and an idempotency
    window of 100.4 ms was sent as 100 without a word."""
    page = console.open("#/new")
    page.get_by_label("Name").fill("bounded")
    page.get_by_label("Max bytes").fill("99999999999999999999")
    page.get_by_label("Max messages").fill("9007199254740992")
    page.get_by_label("Idempotency window").fill("100.4")
    page.get_by_label("Unit").select_option("ms")
    page.get_by_role("button", name="Create station").click()
    bound = "must be a whole number from 1 to 9,007,199,254,740,991, or empty."
    expect(page.get_by_label("Max bytes")).to_have_accessible_description(
        re.compile(re.escape("Max bytes " + bound))
    )
    expect(page.get_by_label("Max messages")).to_have_accessible_description(
        re.compile(re.escape("Max messages " + bound))
    )
    expect(page.get_by_label("Idempotency window")).to_have_accessible_description(
        re.compile("Idempotency window must be a whole number of milliseconds")
    )
    api.call("GET", "/api/stations/bounded", expect=404)

    # The largest count is taken; so are 1.1 s (1100.0000000000002 ms in binary) and 0.1005 min.
    page.get_by_label("Max bytes").fill("9007199254740991")
    page.get_by_label("Max messages").fill("")
    page.get_by_label("Idempotency window").fill("1.1")
    page.get_by_label("Unit").select_option("s")
    page.get_by_label("Max ack time").fill("1.1s")
    page.get_by_role("button", name="Create station").click()
    expect(page.get_by_role("heading", name="bounded")).to_be_visible()
    view = api.call("GET", "/api/stations/bounded")
    assert view["retention"]["maxBytes"] == 9_007_199_254_740_991
    assert view["idempotencyWindowMs"] == 1100
    assert view["consumerDefaults"]["maxAckTimeMs"] == 1100
