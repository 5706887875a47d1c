"""The console's redrive and seek controls in a real headless Chromium (SQLite): the DLS tab
shows each entry's redrive count and the station's policy and replays after a delay; the
settings form edits the policy; the groups tab moves a group."""

from __future__ import annotations

import re

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


def test_dls_tab_shows_redrives_and_policy(console: Console, api: Api) -> None:  # noqa: F811
    api.create("refunds", dls={"redrive": {"maxRedrives": 3, "delayMs": 600_000, "backoff": 2}})
    api.produce("refunds", {"id": "r1", "data": {"n": 1}}, {"id": "r2", "data": {"n": 2}})
    entries = api.dead_letter("refunds", "billing", 2)
    assert {e["redrives"] for e in entries} == {0}

    page = console.open("#/s/refunds")
    expect(page.get_by_text("Redrive dead letters")).to_be_visible()
    expect(page.locator("dl.config")).to_contain_text(
        "up to 3 times, 10 min after dead-lettering, ×2"
    )
    page.get_by_role("tab", name="DLS").click()
    expect(page.locator("#dls-policy")).to_contain_text("up to 3 times")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(2)
    expect(page.get_by_role("columnheader", name="Redrives")).to_be_visible()
    expect(rows.first.locator("td.redrives")).to_contain_text(re.compile(r"^0 next "))

    # Replay after a delay: the entry leaves the DLS, its message waits for the delay.
    page.get_by_label(f"Select Entry {entries[0]['id']}", exact=True).check()
    page.get_by_label("Replay after").fill("10min")
    page.get_by_role("button", name="Replay", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("fall due 10 min after the replay")
    dialog.get_by_role("button", name="Confirm").click()
    expect(rows).to_have_count(1)
    fetched = api.call(
        "POST", "/api/stations/refunds/groups/billing/fetch", {"max": 10, "waitMs": 0}
    )["messages"]
    assert fetched == []  # not due yet
    assert api.call("GET", "/api/stations/refunds/groups")["groups"][0]["pending"] == 1

    # A bad delay never reaches the server.
    page.get_by_label("Replay after").fill("soon")
    page.get_by_role("button", name="Replay all").click()
    expect(page.get_by_role("alert")).to_contain_text("Replay after must be a duration")
    assert len(api.call("GET", "/api/stations/refunds/dls")["entries"]) == 1


def test_settings_form_edits_the_redrive_policy(console: Console, api: Api) -> None:  # noqa: F811
    api.create("claims")
    page = console.open("#/s/claims")
    page.get_by_role("tab", name="Settings").click()
    page.get_by_label("Redrive at most").fill("2")
    page.get_by_label("Redrive after").fill("30s")
    page.get_by_label("Backoff").fill("3")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("dl.config")).to_contain_text(
        "up to 2 times, 30 s after dead-lettering, ×3"
    )
    view = api.call("GET", "/api/stations/claims")
    assert view["dls"]["redrive"]["maxRedrives"] == 2
    assert view["dls"]["redrive"]["delayMs"] == 30_000 and view["dls"]["redrive"]["backoff"] == 3

    page.get_by_role("tab", name="Settings").click()
    page.get_by_label("Redrive at most").fill("5000")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_label("Redrive at most")).to_have_attribute("aria-invalid", "true")
    page.get_by_label("Redrive at most").fill("")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("dl.config")).to_contain_text(re.compile(r"Redrive dead letters\s*off"))
    assert "redrive" not in api.call("GET", "/api/stations/claims")["dls"]


def test_groups_tab_seeks_a_group(console: Console, api: Api) -> None:  # noqa: F811
    api.create("ledger")
    produced = api.produce("ledger", *({"data": {"n": n}} for n in range(5)))["results"]
    base = "/api/stations/ledger/groups/audit"
    api.call("PUT", base, {})
    leased = api.call("POST", base + "/fetch", {"max": 3, "waitMs": 0})["messages"]
    assert len(leased) == 3

    page = console.open("#/s/ledger")
    page.get_by_role("tab", name="Groups").click()
    expect(page.get_by_role("heading", name="Move a group")).to_be_visible()
    page.get_by_label("To", exact=True).select_option("offset")
    page.get_by_label("Offset").fill(produced[1]["offset"])
    page.get_by_role("button", name="Seek").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Move group audit to an offset?")
    dialog.get_by_role("button", name="Seek").click()
    expect(page.locator("#seek-result")).to_contain_text("3 leases revoked, 0 redeliveries dropped")
    fetched = api.call("POST", base + "/fetch", {"max": 10, "waitMs": 0})["messages"]
    assert [m["offset"] for m in fetched] == [r["offset"] for r in produced[1:]]

    page.get_by_label("To", exact=True).select_option("earliest")
    page.get_by_role("button", name="Seek").click()
    dialog.get_by_role("button", name="Seek").click()
    expect(page.locator("#seek-result")).to_contain_text("4 leases revoked")
    # A bad offset: the server's error is shown, nothing moves.
    page.get_by_label("To", exact=True).select_option("offset")
    page.get_by_label("Offset").fill("nonsense")
    page.get_by_role("button", name="Seek").click()
    dialog.get_by_role("button", name="Seek").click()
    expect(page.locator("#seek-result")).to_contain_text("to must be earliest, now or an offset")


def test_a_number_the_browser_cannot_read_is_an_error_not_no_limit(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """A number field holding text the browser cannot read as a number ("2e", half-typed
    "1e-") has the value "": it was saved as "no limit" and "redrive off", deleting the
    station's retention limits and redrive policy, and the console said "Settings saved"."""
    api.create(
        "limits",
        retention={"maxMessages": 1000, "maxBytes": 1_048_576},
        dls={"redrive": {"maxRedrives": 5, "delayMs": 30_000, "backoff": 2}},
    )
    page = console.open("#/s/limits/settings")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.method) if r.method == "PATCH" else None)
    typos = {
        "Max messages": "2e",
        "Max bytes": "1e-",
        "Redrive at most": "3e",
        "Backoff": "1.5e",
        "Max message deliveries": "4e",
    }
    for label, text in typos.items():
        field = page.get_by_label(label, exact=True)
        field.fill("")
        field.press_sequentially(text)
    page.get_by_role("button", name="Save changes").click()
    for label in typos:
        expect(page.get_by_label(label, exact=True)).to_have_attribute("aria-invalid", "true")
    page.wait_for_timeout(300)
    assert sent == []
    view = api.call("GET", "/api/stations/limits")
    assert view["retention"]["maxMessages"] == 1000 and view["retention"]["maxBytes"] == 1_048_576
    assert view["dls"]["redrive"]["maxRedrives"] == 5
