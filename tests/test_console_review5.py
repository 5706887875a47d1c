"""Console faults a fifth review found (a station deleted elsewhere, the DLS tab's polls), each in
a real headless Chromium against ``stations serve``: a confirmation open when the station was
deleted and created again acted on the new station, a poll threw a replay's reload away, the
Messages and Settings tabs of a deleted station were wiped, a proxy's 404 was taken for a
deletion, and the DLS tab read more than it needed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

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

if TYPE_CHECKING:
    from playwright.sync_api import APIResponse, Page, Route

# -- W1: a confirmation open when the station is deleted and created again --------------------

_RECREATED = "was deleted and created again"


def _recreate(client: Api, name: str, dead: int) -> None:
    """Delete ``name`` and create it again, with a group ``billing`` and ``dead`` dead letters."""
    client.call("DELETE", f"/api/stations/{name}", expect=204)
    client.create(name)
    client.produce(name, *({"data": {"new": n}} for n in range(3)))
    client.dead_letter(name, "billing", dead)


def _dialog_open(page: Page) -> bool:
    return bool(page.locator("#confirm").evaluate("d => d.open"))


def _wait_closed(page: Page, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _dialog_open(page):
        assert time.monotonic() < deadline, "the confirmation is still open over the notice"
        page.wait_for_timeout(100)


def test_w1a_delete_group_and_seek_dialogs_close_when_the_station_is_created_again(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """Delete group (and Move a group) asked, the station was deleted and created again
    elsewhere, the page said so, but its dialog stayed open: confirming deleted (or moved) the
    NEW station's group of that name, and the toast read "signal is aborted without reason".
    The dialog now closes as cancelled, and nothing is done."""
    page = console.page
    for action in ("delete", "seek"):
        api.create("orders")
        api.produce("orders", *({"data": {"n": n}} for n in range(3)))
        api.dead_letter("orders", "billing", 1)
        console.open("#/")
        console.open("#/s/orders/groups")
        expect(page.locator("table.groups tbody tr")).to_have_count(1)
        dialog = page.locator("#confirm")
        if action == "delete":
            page.get_by_role("button", name="Delete group billing").click()
            expect(dialog).to_contain_text("Delete group billing?")
        else:
            page.get_by_label("To", exact=True).select_option("earliest")
            page.get_by_role("button", name="Seek").click()
            expect(dialog).to_contain_text("Move group billing to earliest")
        _recreate(api, "orders", 2)
        # A consumer of the new station leaves its group behind the tail: a seek would move it.
        api.call("PUT", "/api/stations/orders/groups/billing", {})
        expect(page.locator("#panel")).to_contain_text(_RECREATED, timeout=15_000)
        _wait_closed(page)
        groups = api.call("GET", "/api/stations/orders/groups")["groups"]
        assert [g["name"] for g in groups] == ["billing"], (action, groups)
        assert groups[0]["deadLettered"] == 2, (action, groups)
        assert groups[0]["lag"] == 1, (action, groups)
        assert len(api.call("GET", "/api/stations/orders/dls")["entries"]) == 2, action
        assert "abort" not in (page.locator("#toast").text_content() or ""), action
        api.call("DELETE", "/api/stations/orders", expect=204)


def test_w1b_replay_all_asked_before_the_station_is_created_again_replays_nothing(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """A Replay-all dialog open while the station was deleted and created again stayed over
    the notice; confirming replayed every dead letter of the NEW station, silently."""
    api.create("orders")
    api.produce("orders", *({"data": {"n": n}} for n in range(3)))
    api.dead_letter("orders", "billing", 1)
    page = console.open("#/s/orders/dls")
    expect(page.get_by_role("checkbox", name="Entry")).to_have_count(1)
    page.get_by_role("button", name="Replay all").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_contain_text("Replay all 1 dead letter?")
    _recreate(api, "orders", 2)
    expect(page.locator("#panel")).to_contain_text(_RECREATED, timeout=15_000)
    _wait_closed(page)
    assert len(api.call("GET", "/api/stations/orders/dls")["entries"]) == 2


def test_w1c_a_replay_all_click_that_finds_the_station_created_again_asks_nothing(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The Replay-all click reads the station (to count its dead letters): when it found it
    created again, the page said so, then opened the dialog anyway over the notice, counting
    the NEW station's dead letters, and confirming replayed them."""
    api.create("orders")
    api.produce("orders", *({"data": {"n": n}} for n in range(3)))
    api.dead_letter("orders", "billing", 1)
    page = console.open("#/s/orders/dls")
    expect(page.get_by_role("checkbox", name="Entry")).to_have_count(1)
    # A background tab's polls wait: only the click reads the station.
    page.evaluate(_SET_HIDDEN, True)
    _recreate(api, "orders", 2)
    page.get_by_role("button", name="Replay all").click()
    expect(page.locator("#panel")).to_contain_text(_RECREATED, timeout=15_000)
    page.wait_for_timeout(500)
    assert not _dialog_open(page), page.locator("#confirm").inner_text()
    assert len(api.call("GET", "/api/stations/orders/dls")["entries"]) == 2


# -- W2: a poll during a replay's reload ------------------------------------------------------


def test_w2_a_poll_during_a_replay_does_not_explain_it_from_the_rows_of_before(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """A poll whose count came back while a Replay re-read the entries threw the replay's read
    away: the outcome was worked out from the rows of before ("1 entry stays in the DLS: its
    message was removed by retention", for the entry just replayed) and the row stayed."""
    api.create("race")
    api.produce("race", *({"data": {"n": n}} for n in range(3)))
    entries = api.dead_letter("race", "g", 2)
    page = console.open("#/s/race/dls")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(2)
    held_station: list[tuple[Route, APIResponse]] = []
    held_dls: list[Route] = []
    state = {"hold_station": True, "hold_dls": False}

    def on_station(route: Route) -> None:
        if route.request.method == "GET" and state["hold_station"]:
            state["hold_station"] = False
            held_station.append((route, route.fetch()))  # the count of before the replay
            return
        route.continue_()

    def on_dls(route: Route) -> None:
        if state["hold_dls"] and "after=" not in route.request.url:
            state["hold_dls"] = False
            held_dls.append(route)
            return
        route.continue_()

    page.route(lambda url: url.endswith("/api/stations/race"), on_station)
    page.route(lambda url: "/api/stations/race/dls?" in url, on_dls)
    # A poll reads the count (2), held on its way back...
    deadline = time.monotonic() + 15
    while not held_station:
        assert time.monotonic() < deadline
        page.wait_for_timeout(50)
    # ...while entry 1 is replayed, whose reload is slow.
    state["hold_dls"] = True
    page.get_by_label(f"Select Entry {entries[0]['id']}", exact=True).check()
    page.get_by_role("button", name="Replay", exact=True).click()
    page.locator("#confirm").get_by_role("button", name="Confirm").click()
    deadline = time.monotonic() + 15
    while not held_dls:
        assert time.monotonic() < deadline
        page.wait_for_timeout(50)
    # The poll's answer comes first (and whatever it reads next), then the replay's reload.
    route, response = held_station.pop()
    with page.expect_response(lambda r: r.url.endswith("/api/stations/race")):
        route.fulfill(response=response)
    page.wait_for_timeout(500)
    held_dls.pop().continue_()
    outcome = page.locator("p.result")
    expect(outcome).to_have_text("Replayed 1 entry.", timeout=10_000)
    expect(rows).to_have_count(1)
    page.unroute_all()


# -- W3: the Messages and Settings tabs of a deleted station keep what they show --------------


def test_w3_messages_and_settings_of_a_deleted_station_are_kept(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The badge poll's notice of a station deleted elsewhere replaced the whole panel of the
    Messages and Settings tabs too: the messages read (perhaps the last copy) and an edit being
    typed vanished within 5 s. Both tabs now say the station is gone above what they show."""
    page = console.page
    api.create("gone")
    api.produce("gone", *({"id": f"keep-{n}", "data": {"n": n}} for n in range(3)))
    console.open("#/s/gone/messages")
    expect(page.get_by_text("keep-2")).to_be_visible()
    api.call("DELETE", "/api/stations/gone", expect=204)
    panel = page.get_by_role("tabpanel")
    notice = panel.get_by_text("Station “gone” no longer exists: it was deleted.")
    expect(notice).to_be_visible(timeout=15_000)
    for n in range(3):
        expect(page.get_by_text(f"keep-{n}")).to_be_visible()

    api.create("gone")
    console.open("#/")
    console.open("#/s/gone/settings")
    max_age = page.get_by_label("Max age")
    max_age.fill("3d")
    api.call("DELETE", "/api/stations/gone", expect=204)
    expect(notice).to_be_visible(timeout=15_000)
    expect(max_age).to_have_value("3d")
    # Saving would answer "not found" (or change a station created again under the name).
    expect(page.get_by_role("button", name="Save changes")).to_be_disabled()


# -- W5: a 404 that is not the server's -------------------------------------------------------


def test_w5_a_proxys_404_is_not_taken_for_a_deleted_station(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """A 404 without the server's JSON error (a reverse proxy's page while the server is
    replaced) made every tab say the station was deleted, and stop asking for good. Only the
    server's own ``not_found`` means deleted; any other 404 is a failure the polls get over."""
    page = console.page
    api.create("p")
    api.produce("p", {"data": 1})
    api.dead_letter("p", "billing", 1)
    answered: list[str] = []

    def proxy(route: Route) -> None:
        answered.append(route.request.url)
        route.fulfill(status=404, content_type="text/html", body="<h1>404 Not Found</h1>")

    for tab in ("groups", "dls", "overview"):
        console.open("#/")
        console.open(f"#/s/p/{tab}")
        panel = page.get_by_role("tabpanel")
        if tab == "groups":
            expect(panel.locator("table.groups tbody tr")).to_have_count(1)
        elif tab == "dls":
            expect(panel.get_by_role("checkbox", name="Entry")).to_have_count(1)
        else:
            expect(panel.get_by_role("heading", name="Live stats")).to_be_visible()
        answered.clear()
        page.route("**/api/**", proxy)
        # Until the station itself has been read through the proxy (what decides "deleted").
        deadline = time.monotonic() + 20
        while not any(url.endswith("/api/stations/p") for url in answered):
            assert time.monotonic() < deadline, answered
            page.wait_for_timeout(100)
        expect(panel.get_by_role("alert").first).to_contain_text("404", timeout=10_000)
        page.unroute("**/api/**", proxy)
        expect(panel.get_by_role("alert")).to_have_count(0, timeout=15_000)
        assert "no longer exists" not in panel.inner_text(), tab
        if tab == "groups":
            expect(panel.locator("table.groups tbody tr")).to_have_count(1)
        elif tab == "dls":
            expect(panel.get_by_role("checkbox", name="Entry")).to_have_count(1)


# -- W4: what an idle DLS tab reads -----------------------------------------------------------


def test_w4b_a_dls_tab_with_more_to_load_does_not_read_its_rows_again_for_nothing(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """With a "Load more" page left, the DLS tab read the whole window again ~30 s after every
    load (the count when the rows were read was unknown, so always "changed"), nothing having
    changed: up to 1000 rows and several 8 MiB pages, after every Refresh, replay or drop."""
    api.create("many")
    api.produce("many", *({"data": {"n": n}} for n in range(150)))
    api.dead_letter("many", "g", 60)
    api.dead_letter("many", "h", 60)  # 120: 100 shown, "Load more" left
    page = console.page
    polls: list[str] = []
    reads: list[str] = []

    def answered(url: str) -> None:
        if url.endswith("/api/stations/many"):
            polls.append(url)
        elif "/api/stations/many/dls?" in url:
            reads.append(url)

    page.on("requestfinished", lambda request: answered(request.url))
    console.open("#/s/many/dls")
    expect(page.get_by_role("checkbox", name="Entry")).to_have_count(100)
    expect(page.get_by_role("button", name="Load more")).to_be_visible()
    page.wait_for_timeout(500)
    reads.clear()
    polls.clear()
    # The window is checked again after 15 polls (2 s apart): wait for 18 of them.
    deadline = time.monotonic() + 90
    while len(polls) < 18:
        assert time.monotonic() < deadline, len(polls)
        page.wait_for_timeout(500)
    assert reads == [], reads


def test_w4a_an_idle_dls_tab_reads_the_groups_now_and_then(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """An idle DLS tab read every group's figures every 2 s, for the Group filter only. It
    reads the filter's page of groups when the count of dead letters moves, else every ~10 s;
    a group that came later is still offered."""
    api.create("idle")
    api.produce("idle", *({"data": {"n": n}} for n in range(3)))
    api.dead_letter("idle", "g", 2)
    page = console.page
    polls: list[str] = []
    groups: list[str] = []

    def answered(url: str) -> None:
        if url.endswith("/api/stations/idle"):
            polls.append(url)
        elif urlsplit(url).path == "/api/stations/idle/groups":  # the filter's page of groups
            groups.append(url)

    page.on("requestfinished", lambda request: answered(request.url))
    console.open("#/s/idle/dls")
    expect(page.get_by_role("checkbox", name="Entry")).to_have_count(2)
    page.wait_for_timeout(500)
    polls.clear()
    groups.clear()
    deadline = time.monotonic() + 60
    while len(polls) < 10:
        assert time.monotonic() < deadline, len(polls)
        page.wait_for_timeout(200)
    assert len(groups) <= 3, (len(polls), len(groups))
    # A new group's dead letters move the count: the filter offers it at the next poll.
    api.dead_letter("idle", "h", 1)
    options = page.get_by_label("Group", exact=True).locator("option")
    expect(options).to_have_text(["All groups", "g", "h"], timeout=10_000)
