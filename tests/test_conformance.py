"""The official Durable Streams conformance suite (@durable-streams/server-conformance-tests
0.3.6, pinned in tests/node/package-lock.json) against a live ``stations serve``, on both
engines, with the subscriptions option on: all 338 tests must pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.nodekit import NODE_DIR, require_node

EXPECTED_TESTS = 338


def test_conformance_suite(db_url: str, make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_node("npx", "vitest")
    server = make_server(db_url, "--long-poll-timeout-ms", "500", "--webhooks-allow-loopback")
    report = tmp_path / "conformance.json"
    proc = subprocess.run(
        ["npx", "vitest", "run", "--reporter=json", f"--outputFile={report}"],
        cwd=NODE_DIR,
        env={
            **__import__("os").environ,
            "CONFORMANCE_BASE_URL": server.url,
            "CONFORMANCE_SUBSCRIPTIONS": "true",
            # vitest's 5 s per test (upstream's runner's too) holds on a quiet box; here two
            # workers, a JVM and PostgreSQL share 2 cores, and a webhook test that waits for
            # three transactions and two HTTP round trips once ran past it (a timeout, not a
            # wrong answer: the suite's own assertions decide those).
            "CONFORMANCE_TEST_TIMEOUT_MS": "15000",
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    failures = [
        f"{' > '.join(a['ancestorTitles'])} :: {a['title']}: "
        f"{' / '.join((a['failureMessages'] or [''])[0].splitlines()[:3])[:400]}"
        for f in result["testResults"]
        for a in f["assertionResults"]
        if a["status"] == "failed"
    ]
    assert failures == [], "\n".join(failures)
    assert result["numPassedTests"] >= EXPECTED_TESTS, result["numPassedTests"]
