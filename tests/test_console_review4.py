"""Console faults a fourth review found (consumer groups and the DLS tab), each in a real
headless Chromium against ``stations serve``: a seek moved another group than the one the
dialog named, the DLS tab missed entries that changed while their count did not, said the store
was empty when it could not read it, and slow actions could be sent twice."""

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

# -- Move a group: the group the dialog named, or none ----------------------------------------


def test_a_seek_moves_the_group_the_dialog_named_or_none(
    console: Console,  # noqa: F811
    api: Api,  # noqa: F811
) -> None:
    """The form read the chosen group after the confirmation: a refresh under the open dialog
    (group ``beta`` deleted elsewhere) rebuilt the options, the select fell back to ``alpha``
    and the seek moved ``alpha`` to now, skipping its 5 messages for good. The group chosen
    when the dialog opened is the one moved; gone, the form says so and moves nothing."""
    api.create("ledger")
    api.produce("ledger", *({"data": {"n": n}} for n in range(5)))
    api.call("PUT", "/api/stations/ledger/groups/alpha", {})
    api.call("PUT", "/api/stations/ledger/groups/beta", {})
    page = console.open("#/s/ledger/groups")
    expect(page.get_by_role("heading", name="Move a group")).to_be_visible()
    page.get_by_label("Group", exact=True).select_option("beta")
    page.get_by_label("To", exact=True).select_option("now")
    page.get_by_role("button", name="Seek").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Move group beta to now")
    api.call("DELETE", "/api/stations/ledger/groups/beta", expect=204)
    # The page refreshes under the dialog: beta's row goes.
    expect(page.locator("table.groups tbody tr")).to_have_count(1, timeout=10_000)
    dialog.get_by_role("button", name="Seek").click()
    result = page.locator("#seek-result")
    expect(result).to_contain_text("Group beta no longer exists", timeout=10_000)
    expect(result).to_contain_text("nothing was moved")
    (alpha,) = api.call("GET", "/api/stations/ledger/groups")["groups"]
    assert alpha["name"] == "alpha" and alpha["lag"] == 5, alpha
    # The select does not slip to another group by itself either.
    expect(page.get_by_label("Group", exact=True)).to_have_value("beta")
    page.get_by_label("Group", exact=True).select_option("alpha")
    page.get_by_role("button", name="Seek").click()
    expect(dialog).to_contain_text("Move group alpha to now")
    dialog.get_by_role("button", name="Seek").click()
    expect(result).to_contain_text("Group alpha now continues after")
    (alpha,) = api.call("GET", "/api/stations/ledger/groups")["groups"]
    assert alpha["lag"] == 0, alpha
