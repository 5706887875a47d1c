"""The console's Settings tab saved its form onto whatever station had the name: one deleted
and created again elsewhere since the form was loaded took the old station's settings. The
save now names the ``createdAt`` the form was filled from; the server refuses (409) and the
form says nothing was changed, keeping what was typed."""

from __future__ import annotations

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
from tests.test_console_review import _SET_HIDDEN


def test_settings_saved_after_the_station_was_created_again_change_nothing(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    api.create("orders")
    page = console.open("#/s/orders/settings")
    expect(page.get_by_label("Idempotency window")).to_be_visible()
    page.evaluate(_SET_HIDDEN, True)  # its polls wait: the save is what meets the new station
    api.call("DELETE", "/api/stations/orders", expect=204)
    page.wait_for_timeout(5)  # createdAt is to the millisecond
    new = api.create("orders")["createdAt"]
    page.get_by_label("Idempotency window").fill("7")
    page.get_by_label("Unit").select_option("h")
    page.get_by_role("button", name="Save changes").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("Not saved")
    expect(alert).to_contain_text("was deleted and created again")
    view = api.call("GET", "/api/stations/orders")
    assert view["createdAt"] == new
    assert view["idempotencyWindowMs"] == 120_000
    expect(page.get_by_label("Idempotency window")).to_have_value("7")  # what was typed stays
    # the same save would meet the same 409: it is not offered again
    expect(page.get_by_role("button", name="Save changes")).to_be_disabled()


def test_settings_saved_name_the_station_they_were_loaded_from(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    created = api.create("orders")["createdAt"]
    page = console.open("#/s/orders/settings")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "PATCH" else None)
    page.get_by_label("Idempotency window").fill("3")
    page.get_by_label("Unit").select_option("h")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("tab", name="Overview")).to_have_attribute("aria-selected", "true")
    assert api.call("GET", "/api/stations/orders")["idempotencyWindowMs"] == 3 * 3_600_000
    assert len(sent) == 1, sent
    assert sent[0].endswith("/api/stations/orders?createdAt=" + created.replace(":", "%3A"))
