"""The official Durable Streams conformance suite (@durable-streams/server-conformance-tests
0.3.6, pinned in tests/node/package-lock.json) against a live ``stations serve``, on both
engines, with the subscriptions option on: all 338 tests must pass on each.

The two runs go side by side: the suite spends most of its 40 s waiting out its own TTLs and
expiries (about 9 s of CPU), so one after the other they held a test worker for 80 s."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.harness import Server
from tests.nodekit import NODE_DIR, require_node

EXPECTED_TESTS = 338


def _start_suite(server: Server, report: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["npx", "vitest", "run", "--reporter=json", f"--outputFile={report}"],
        cwd=NODE_DIR,
        env={
            **os.environ,
            "CONFORMANCE_BASE_URL": server.url,
            "CONFORMANCE_SUBSCRIPTIONS": "true",
            # vitest's 5 s per test (upstream's runner's too) holds on a quiet box; here two
            # workers, a JVM and PostgreSQL share 2 cores, and a webhook test that waits for
            # three transactions and two HTTP round trips once ran past it (a timeout, not a
            # wrong answer: the suite's own assertions decide those).
            "CONFORMANCE_TEST_TIMEOUT_MS": "15000",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _failures(engine: str, report: Path, output: str) -> list[str]:
    if not report.exists():
        return [f"{engine}: no report: {output[-3000:]}"]
    result = json.loads(report.read_text())
    failures = [
        f"{engine}: {' > '.join(a['ancestorTitles'])} :: {a['title']}: "
        f"{' / '.join((a['failureMessages'] or [''])[0].splitlines()[:3])[:400]}"
        for f in result["testResults"]
        for a in f["assertionResults"]
        if a["status"] == "failed"
    ]
    if result["numPassedTests"] < EXPECTED_TESTS:
        failures.append(f"{engine}: {result['numPassedTests']} passed of {EXPECTED_TESTS}")
    return failures


def test_conformance_suite_on_both_engines(pg_url: str, make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_node("npx", "vitest")
    options = ("--long-poll-timeout-ms", "500", "--webhooks-allow-loopback")
    urls = {"sqlite": f"sqlite:///{tmp_path / 'sqlite' / 'stations.db'}", "postgresql": pg_url}
    runs = {}
    for engine, url in urls.items():
        report = tmp_path / f"conformance-{engine}.json"
        runs[engine] = (report, _start_suite(make_server(url, *options), report))
    failures: list[str] = []
    for engine, (report, proc) in runs.items():
        try:
            output, _ = proc.communicate(timeout=900)
        finally:
            proc.kill()
        failures += _failures(engine, report, output)
    assert failures == [], "\n".join(failures)
