"""Console faults a second review found, each in a real headless Chromium against ``stations
serve``: a revoked token (SIGHUP) that threw the page and its unsaved input away, a frozen
server whose figures stayed on screen as if current, a live tail bounded by count but not by
size, and messages the live tail skipped without a word because retention removed them first."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
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
from tests.test_console_review import _SET_HIDDEN, messages_list, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from tests.harness import Server

SECOND = "admin-secret-2"


# -- a revoked token --------------------------------------------------------------------------


class Tokens:
    """A server with a tokens file, and an operator's way to revoke a token: rewrite the file
    and send SIGHUP."""

    def __init__(self, running: Server, path: Path) -> None:
        self.server = running
        self.path = path
        self.admin = Api(running.url, SECOND)

    def write(self, *secrets: str) -> None:
        body = {"tokens": [{"token": s, "role": "admin"} for s in secrets]}
        self.path.write_text(json.dumps(body))

    def revoke_first(self) -> None:
        self.write(SECOND)
        assert self.server.proc is not None
        self.server.proc.send_signal(signal.SIGHUP)
        revoked = Api(self.server.url, ADMIN)
        try:
            deadline = time.monotonic() + 10
            while revoked.http.get("/api/stations").status_code != 401:
                assert time.monotonic() < deadline, "the server still takes the revoked token"
                time.sleep(0.05)
        finally:
            revoked.close()


@pytest.fixture
def tokens(make_server: MakeServer, sqlite_url: str, tmp_path: Path) -> Iterator[Tokens]:  # noqa: F811
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps({"tokens": [{"token": s, "role": "admin"} for s in (ADMIN, SECOND)]})
    )
    flags = ["--tokens", str(path), "--long-poll-timeout-ms", "1000", "--sse-lifetime-ms", "5000"]
    t = Tokens(make_server(sqlite_url, *flags), path)
    yield t
    t.admin.close()


def sign_in_again(page: Page, secret: str) -> None:
    dialog = page.get_by_role("dialog", name="Sign in again")
    dialog.get_by_label("Token").fill(secret)
    dialog.get_by_role("button", name="Sign in").click()
    expect(dialog).to_be_hidden()


def test_a_revoked_token_asks_over_the_page_and_keeps_unsaved_settings(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """A 401 (the token revoked by a SIGHUP reload) replaced the page with the login form: the
    settings typed but not saved were gone after signing in again. The sign-in now comes in a
    dialog over the page; the form keeps its input, says it was not saved, and saves when
    submitted again."""
    tokens.admin.create("shop-a", retention={"maxMessages": 1000})
    with open_console(browser, tokens.server) as tab:
        page = sign_in(tab, ADMIN, "#/s/shop-a/settings")
        page.get_by_label("Max messages").fill("777")
        page.get_by_label("Max age").fill("3d")
        tokens.revoke_first()
        page.get_by_role("button", name="Save changes").click()

        dialog = page.get_by_role("dialog", name="Sign in again")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("no longer accepts this tab’s token")
        expect(dialog.get_by_label("Token")).to_be_focused()
        # A wrong token is refused at the field, and the dialog stays.
        dialog.get_by_label("Token").fill("not-a-token")
        dialog.get_by_role("button", name="Sign in").click()
        expect(dialog.get_by_label("Token")).to_have_accessible_description(
            re.compile("not accepted")
        )
        sign_in_again(page, SECOND)

        # The same page, its input as typed, and why nothing changed yet.
        expect(page.get_by_label("Max messages")).to_have_value("777")
        expect(page.get_by_label("Max age")).to_have_value("3d")
        expect(page.get_by_role("alert")).to_contain_text("Not saved")
        assert tokens.admin.call("GET", "/api/stations/shop-a")["retention"]["maxMessages"] == 1000
        page.get_by_role("button", name="Save changes").click()
        expect(page.get_by_role("tab", name="Overview")).to_have_attribute("aria-selected", "true")
        retention = tokens.admin.call("GET", "/api/stations/shop-a")["retention"]
        assert retention["maxMessages"] == 777
        assert retention["maxAgeMs"] == 3 * 86_400_000


def test_a_revoked_token_keeps_the_produce_form_and_the_live_tail(
    browser: Browser,  # noqa: F811
    tokens: Tokens,
) -> None:
    """The live tail's long-poll met the revoked token and threw the person to the login page
    in the middle of typing: the message id and payload were lost and the tail was off. Now a
    dialog asks for a token over the page, nothing asks the server meanwhile, and afterwards
    the form holds what was typed and the tail goes on."""
    tokens.admin.create("shop-b")
    with open_console(browser, tokens.server) as tab:
        page = sign_in(tab, ADMIN, "#/s/shop-b/messages")
        page.get_by_label("Message id").fill("order-42")
        page.get_by_label("Payload (JSON)").fill('{"total": 42}')
        page.get_by_label("Live tail").check()
        status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
        expect(status).to_contain_text("Live")
        tokens.revoke_first()

        dialog = page.get_by_role("dialog", name="Sign in again")
        expect(dialog).to_be_visible(timeout=8000)
        # Polls and the tail wait while the dialog is open, rather than asking again and again.
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/ui/" not in r.url else None)
        page.wait_for_timeout(2500)
        assert asked == [], asked
        # Put aside (Escape), the page says it waits for a sign-in, and offers it again.
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        notice = page.get_by_role("status").filter(has_text="no longer accepts")
        expect(notice).to_be_visible()
        expect(page.get_by_label("Message id")).to_have_value("order-42")
        notice.get_by_role("button", name="Sign in").click()
        expect(dialog).to_be_visible()
        sign_in_again(page, SECOND)
        expect(notice).to_be_hidden()

        expect(page.get_by_label("Message id")).to_have_value("order-42")
        expect(page.get_by_label("Payload (JSON)")).to_have_value('{"total": 42}')
        expect(page.get_by_label("Live tail")).to_be_checked()
        tokens.admin.produce("shop-b", {"id": "after-sign-in", "data": {"n": 1}})
        expect(messages_list(page).filter(has_text="after-sign-in")).to_have_count(1)
        page.get_by_role("button", name="Produce").click()
        expect(page.get_by_role("status").filter(has_text="offset")).to_contain_text("Stored.")
        expect(messages_list(page).filter(has_text="order-42")).to_have_count(1)


# -- a frozen server --------------------------------------------------------------------------


def test_a_frozen_server_is_reported_as_not_answering(
    browser: Browser,  # noqa: F811
    server: Server,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """With the server stopped (SIGSTOP: a hung process, or a half-open connection after a
    network change), no request ever ended: the list, the overview and the live tail went on
    showing their last figures as current, without a word. Calls now time out, each view says
    the server is not answering, and all recover when it answers again."""
    api.create("frozen")
    api.produce("frozen", {"data": 1})
    with ExitStack() as stack:
        pages: dict[str, Page] = {}
        for key, route in (
            ("list", ""),
            ("overview", "#/s/frozen"),
            ("tail", "#/s/frozen/messages"),
        ):
            tab = stack.enter_context(open_console(browser, server))
            pages[key] = tab.open(route)
        expect(pages["list"].get_by_role("link", name="frozen")).to_be_visible()
        expect(pages["overview"].get_by_role("tabpanel")).to_contain_text("Live stats")
        tail = pages["tail"]
        expect(messages_list(tail)).to_have_count(1)
        tail.get_by_label("Live tail").check()
        status = tail.get_by_role("tabpanel").locator("p.hint[aria-live]").first
        expect(status).to_contain_text("Live")
        tail.wait_for_timeout(500)

        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            for key in ("list", "overview"):
                expect(pages[key].get_by_role("alert").first).to_contain_text(
                    "not answering", timeout=30_000
                )
            expect(status).to_contain_text("not answering", timeout=30_000)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        for key in ("list", "overview"):
            expect(pages[key].get_by_role("alert")).to_have_count(0, timeout=15_000)
        expect(status).to_contain_text("Live:", timeout=15_000)
        api.produce("frozen", {"id": "after-thaw", "data": 2})
        expect(messages_list(tail).filter(has_text="after-thaw")).to_have_count(1, timeout=10_000)


# -- the live tail ----------------------------------------------------------------------------


def test_live_tail_is_bounded_by_payload_size(console: Console, api: Api) -> None:  # noqa: F811
    """The live tail kept its last 500 messages whatever their size: with 1 MB messages the
    tab's heap reached 500 MB (8 MiB ones would crash it). It now keeps at most 8 Mi
    characters of payload as well, and says that older messages left the view."""
    api.create("heavy", contentType="text/plain")
    page = console.open("#/s/heavy/messages")
    page.get_by_label("Live tail").check()
    status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
    expect(status).to_contain_text("Live")
    for n in range(12):
        api.produce("heavy", {"id": f"big-{n}", "data": f"{n:02d}" + "x" * 999_998})
    items = messages_list(page)
    expect(items.filter(has_text="big-11")).to_have_count(1, timeout=20_000)
    # 8 of 1,000,000 characters fit in 8 Mi (8,388,608), 9 do not.
    expect(items).to_have_count(8)
    expect(items.first).to_contain_text("big-4")
    note = page.get_by_role("tabpanel").get_by_text(re.compile("4 older messages"))
    expect(note).to_be_visible()
    expect(note).to_contain_text("8 MiB")


def test_live_tail_marks_messages_removed_by_retention(console: Console, api: Api) -> None:  # noqa: F811
    """A live tail that fell behind retention (its tab hidden, or a slow reader) went on from
    the earliest message still kept without a word: the list read early-2, mid-15 as if
    mid-0..14 had never existed. Where messages are missing, the list now says how many
    retention removed before they were shown, and so does the status line."""
    api.create("kept5", contentType="text/plain", retention={"maxMessages": 5})
    api.produce("kept5", *({"id": f"early-{n}", "data": f"early-{n}"} for n in range(3)))
    page = console.open("#/s/kept5/messages")
    items = messages_list(page)
    expect(items).to_have_count(3)
    page.get_by_label("Live tail").check()
    status = page.get_by_role("tabpanel").locator("p.hint[aria-live]").first
    expect(status).to_contain_text("Live")
    page.evaluate(_SET_HIDDEN, True)
    api.produce("kept5", *({"id": f"mid-{n}", "data": f"mid-{n}"} for n in range(20)))
    deadline = time.monotonic() + 20
    while api.call("GET", "/api/stations/kept5/messages?limit=1")["messages"][0]["id"] != "mid-15":
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.2)

    page.evaluate(_SET_HIDDEN, False)
    expect(items.filter(has_text="mid-19")).to_have_count(1)
    texts = [t.strip() for t in items.all_inner_texts()]
    assert len(texts) == 9, texts
    assert "early-2" in texts[2] and "mid-15" in texts[4], texts
    assert "15 messages were removed by retention before they were shown" in texts[3], texts
    expect(status).to_contain_text("15 removed by retention")


# -- DLS results ------------------------------------------------------------------------------


def test_dls_says_why_fewer_entries_were_replayed_or_dropped(console: Console, api: Api) -> None:  # noqa: F811
    """A replay of entries whose messages retention had removed said "Replayed 0 entries." and
    left them listed, with no reason; a drop of entries someone else had replayed meanwhile said
    "Dropped 0 entries."; "Replay all" did not say how many (the page shows 100 at most). Each
    now says how many and why, and stays on screen."""
    api.create("dl", contentType="text/plain", retention={"maxMessages": 5})
    api.produce("dl", *({"id": f"m{n}", "data": f"m{n}"} for n in range(3)))
    api.dead_letter("dl", "g", 3)
    api.produce("dl", *({"data": f"later-{n}"} for n in range(10)))
    deadline = time.monotonic() + 20
    while api.call("GET", "/api/stations/dl/messages?limit=1")["messages"][0]["data"] != "later-5":
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.2)

    page = console.open("#/s/dl/dls")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(3)
    dialog = page.get_by_role("dialog")
    page.get_by_role("button", name="Replay all").click()
    expect(dialog.get_by_role("heading")).to_have_text("Replay all 3 dead letters?")
    dialog.get_by_role("button", name="Cancel").click()

    page.get_by_label("Select all").check()
    page.get_by_role("button", name="Replay", exact=True).click()
    dialog.get_by_role("button", name="Confirm").click()
    outcome = page.get_by_role("status").filter(has_text="Replayed")
    expect(outcome).to_contain_text("Replayed 0 entries. 3 entries stay in the DLS")
    expect(outcome).to_contain_text("removed by retention")
    expect(rows).to_have_count(3)

    # Someone else handles two of them while this page shows them.
    ids = [e["id"] for e in api.call("GET", "/api/stations/dl/dls")["entries"]]
    api.call("POST", "/api/stations/dl/dls/drop", {"ids": ids[:2]})
    page.get_by_label("Select all").check()
    page.get_by_role("button", name="Drop", exact=True).click()
    dialog.get_by_role("button", name="Drop").click()
    outcome = page.get_by_role("status").filter(has_text="Dropped")
    expect(outcome).to_contain_text("Dropped 1 entry.")
    expect(outcome).to_contain_text("2 of the selected entries were no longer in the DLS")
    expect(page.get_by_text("The dead-letter store is empty.")).to_be_visible()
