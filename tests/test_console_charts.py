"""The station page's live charts (uPlot, vendored and pinned): the message rate follows
traffic, the group-lag chart follows each group, all under the console's strict CSP (any CSP
violation or script error fails the test, see tests/test_console.py's Console)."""

from __future__ import annotations

import json
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


def test_station_page_charts_rate_and_lag(console: Console, api: Api) -> None:  # noqa: F811
    api.create("charts")
    api.produce("charts", *({"data": i} for i in range(3)))
    for group in ("g1", "g2"):
        api.call("PUT", f"/api/stations/charts/groups/{group}", {"startFrom": "earliest"})
    page = console.open("#/s/charts")

    lag = page.locator("figure.chart").filter(has_text="Consumer group lag")
    rate = page.locator("figure.chart").filter(has_text="Message rate")
    expect(lag.locator(".chart-now")).to_have_text("Now: g1 3, g2 3")
    # uPlot drew a real canvas into each figure, with a legend naming both groups.
    expect(lag.locator(".uplot canvas")).to_have_count(1)
    assert lag.locator(".uplot canvas").evaluate("c => c.width") > 100
    expect(lag.locator(".u-legend")).to_contain_text("g1")
    expect(lag.locator(".u-legend")).to_contain_text("g2")

    # Traffic shows up as a rate above zero, and the lag of both groups grows with it.
    api.produce("charts", *({"data": i} for i in range(40)))
    expect(lag.locator(".chart-now")).to_have_text("Now: g1 43, g2 43", timeout=10_000)
    expect(rate.locator(".chart-now")).to_have_text(
        re.compile(r"Now: charts [1-9]"), timeout=10_000
    )
    latest = json.loads(rate.get_attribute("data-latest") or "{}")
    assert 0 < latest["charts"] <= 40 / 1.0
    expect(rate.locator(".uplot canvas")).to_have_count(1)

    # A group that consumes drops to zero lag; with no traffic the rate falls back to zero.
    fetched = api.call("POST", "/api/stations/charts/groups/g1/fetch", {"max": 43})
    assert len(fetched["messages"]) == 43
    expect(lag.locator(".chart-now")).to_have_text("Now: g1 0, g2 43", timeout=10_000)
    expect(rate.locator(".chart-now")).to_have_text("Now: charts 0/s", timeout=10_000)
