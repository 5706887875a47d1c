"""Screenshots of the web console for the README: ``python3 -m tests.screenshots``.

Starts a throwaway ``stations serve`` on SQLite, fills it with a few stations, messages, groups
and dead letters, and photographs the main pages with the test suite's headless Chromium into
``docs/screenshots/*.png`` (1280x800, one 390 px phone view). The test suite never runs this.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from tests.browser import Api, chromium, missing
from tests.harness import Server

if TYPE_CHECKING:
    from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"


def seed(api: Api) -> None:
    api.create("orders", idempotencyWindowMs=300_000, consumerDefaults={"maxMsgDeliveries": 3})
    api.create("payments", retention={"maxAgeMs": 7 * 86_400_000, "maxMessages": None})
    api.create("shop/eu/invoices", dls={"forwardTo": "dead-letters"})
    api.create("dead-letters")
    api.create("audit-log", contentType="text/plain", idempotencyWindowMs=3_600_000)
    api.produce(
        "orders",
        *(
            {
                "id": f"order-{1000 + n}",
                "data": {"order": 1000 + n, "customer": f"c-{n % 7}", "total": round(9.5 * n, 2)},
                "headers": {"source": "web" if n % 2 else "app"},
            }
            for n in range(1, 43)
        ),
    )
    api.produce("payments", *({"data": {"payment": n, "status": "settled"}} for n in range(17)))
    api.produce(
        "audit-log",
        {"id": "login-1", "data": "user alice signed in from 10.0.0.7"},
        {"id": "login-2", "data": "user bob changed the retention of payments"},
    )
    api.call("PUT", "/api/stations/orders/groups/fulfilment", {})
    api.call("PUT", "/api/stations/orders/groups/analytics", {"startFrom": "earliest"})
    api.call("POST", "/api/stations/orders/groups/fulfilment/fetch", {"max": 30, "waitMs": 0})
    leased = api.call(
        "POST", "/api/stations/orders/groups/analytics/fetch", {"max": 4, "waitMs": 0}
    )["messages"]
    api.call(
        "POST",
        "/api/stations/orders/groups/analytics/dead-letter",
        {"offsets": [m["offset"] for m in leased[:2]], "reason": "schema v1 is not supported"},
    )
    api.dead_letter("payments", "ledger", 3)


def recompress(path: Path) -> None:
    """Re-deflate a PNG's image data at level 9 (lossless; Chromium writes it fast, not small)."""
    data = path.read_bytes()
    chunks: list[tuple[bytes, bytes]] = []
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunks.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    idat = zlib.compress(zlib.decompress(b"".join(c for k, c in chunks if k == b"IDAT")), 9)
    out = [data[:8]]
    for kind, body in chunks:
        if kind == b"IDAT":
            if idat:
                body, idat = idat, b""
            else:
                continue
        elif kind not in (b"IHDR", b"PLTE", b"IEND", b"tRNS"):
            continue  # ancillary chunks: not needed for a README picture
        out.append(struct.pack(">I", len(body)) + kind + body)
        out.append(struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    path.write_bytes(b"".join(out))


def snap(page: Page, out: Path, name: str, shots: list[Path]) -> None:
    page.wait_for_timeout(400)  # let live stats settle
    path = out / f"{name}.png"
    page.screenshot(path=str(path))
    recompress(path)
    shots.append(path)


def desktop(page: Page, base: str, out: Path, shots: list[Path]) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/ui/")
    expect(page.get_by_role("link", name="shop/eu/invoices")).to_be_visible()
    snap(page, out, "stations", shots)

    page.goto(f"{base}/ui/#/new")
    page.get_by_label("Name").fill("shop/eu/returns")
    page.get_by_label("Idempotency window").fill("50")
    page.get_by_label("Unit").select_option("ms")
    page.get_by_role("button", name="Create station").click()
    expect(page.get_by_label("Idempotency window")).to_have_attribute("aria-invalid", "true")
    page.mouse.click(1, 1)
    page.evaluate("window.scrollTo(0, 0)")
    snap(page, out, "new-station", shots)

    page.goto(f"{base}/ui/#/s/orders")
    expect(page.get_by_role("heading", name="Live stats")).to_be_visible()
    # Some seconds of traffic, so the live charts (message rate, group lag) have a history.
    for n in range(12):
        batch = [{"data": {"order": 2000 + n * 10 + i}} for i in range(4 + n % 4 * 3)]
        page.request.post(f"{base}/api/stations/orders/messages", data={"messages": batch})
        page.wait_for_timeout(1000)
    snap(page, out, "station", shots)

    page.goto(f"{base}/ui/#/s/orders/messages")
    page.get_by_label("From offset").fill("38")
    page.get_by_role("button", name="Go").click()
    page.get_by_label("Message id").fill("order-1041")
    page.get_by_label("Payload").fill('{"order": 1041, "total": 389.5}')
    page.get_by_role("button", name="Produce").click()
    expect(page.get_by_text("Duplicate: not stored.")).to_be_visible()
    page.mouse.click(1, 1)
    snap(page, out, "messages", shots)

    page.goto(f"{base}/ui/#/s/orders/groups")
    expect(page.get_by_role("cell", name="fulfilment")).to_be_visible()
    snap(page, out, "groups", shots)

    page.goto(f"{base}/ui/#/s/orders/dls")
    rows = page.get_by_role("row").filter(has=page.get_by_role("checkbox"))
    expect(rows).to_have_count(2)
    rows.first.get_by_role("checkbox").check()
    page.get_by_role("button", name="Replay", exact=True).click()
    expect(page.get_by_role("dialog")).to_be_visible()
    snap(page, out, "dls-replay", shots)


def phone(page: Page, base: str, out: Path, shots: list[Path]) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/ui/#/s/payments/dls")
    expect(page.get_by_role("row").nth(1)).to_be_visible()
    snap(page, out, "phone-dls", shots)


def shoot(base: str, out: Path) -> list[Path]:
    shots: list[Path] = []
    with chromium() as browser:
        for width, height, pages in ((1280, 800, desktop), (390, 844, phone)):
            context = browser.new_context(
                viewport={"width": width, "height": height}, color_scheme="light"
            )
            pages(context.new_page(), base, out, shots)
            context.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.screenshots", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT, help=f"directory (default {OUT})")
    args = parser.parse_args(argv)
    reason = missing()
    if reason:
        print(f"screenshots: {reason}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stations-shots-") as tmp:
        workdir = Path(tmp)
        server = Server(f"sqlite:///{workdir / 'stations.db'}", workdir).start()
        api = Api(server.url)
        try:
            seed(api)
            shots = shoot(server.url, args.out)
        finally:
            api.close()
            server.kill()
    for path in shots:
        print(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {path.stat().st_size // 1024} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
