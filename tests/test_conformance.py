"""The official Durable Streams conformance suite (@durable-streams/server-conformance-tests
0.3.6, pinned in tests/node/package-lock.json) against a live ``stations serve``, on both
engines, with the subscriptions option on: all 338 tests must pass on each.

The two runs go side by side: the suite spends most of its 40 s waiting out its own TTLs and
expiries (about 9 s of CPU), so one after the other they held a test worker for 80 s."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import IN_CI, drop_pg_database, new_pg_database, pg_available
from tests.nodekit import NODE_DIR, require_node

EXPECTED_TESTS = 338
TIMEOUT_S = 900


def _start_suite(base_url: str, report: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["npx", "vitest", "run", "--reporter=json", f"--outputFile={report}"],
            cwd=NODE_DIR,
            env={
                **os.environ,
                "CONFORMANCE_BASE_URL": base_url,
                "CONFORMANCE_SUBSCRIPTIONS": "true",
                # vitest's 5 s per test (upstream's runner's too) holds on a quiet box; here
                # three test workers, a JVM and PostgreSQL share 2 cores, and a webhook test
                # that waits for three transactions and two HTTP round trips once ran past it
                # (a timeout, not a wrong answer: the suite's own assertions decide those).
                "CONFORMANCE_TEST_TIMEOUT_MS": "15000",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # npx's node and vitest's workers go with it (killpg)
        )


def _failures(engine: str, report: Path, log: Path) -> list[str]:
    if not report.exists():
        return [f"{engine}: no report: {log.read_text(errors='replace')[-3000:]}"]
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
    if not failures and not result["success"]:  # errors outside the tests (unhandled ones)
        failures.append(f"{engine}: vitest failed: {log.read_text(errors='replace')[-3000:]}")
    return failures


def test_conformance_suite_on_both_engines(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_node("npx", "vitest")
    urls = {"sqlite": f"sqlite:///{tmp_path / 'sqlite' / 'stations.db'}"}
    if pg_available():
        urls["postgresql"] = new_pg_database()
    elif IN_CI:
        pytest.fail("PostgreSQL is not reachable at 127.0.0.1:5432 (required in CI)")
    options = ("--long-poll-timeout-ms", "500", "--webhooks-allow-loopback")
    servers, suites = [], {}
    try:
        for engine, url in urls.items():
            servers.append(make_server(url, *options))
            report, log = tmp_path / f"{engine}.json", tmp_path / f"{engine}.log"
            suites[engine] = (report, log, _start_suite(servers[-1].url, report, log))
        failures: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        for engine, (report, log, proc) in suites.items():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failures.append(f"{engine}: not done in {TIMEOUT_S} s: {log.read_text()[-3000:]}")
                continue
            failures += _failures(engine, report, log)
    finally:
        for _, _, proc in suites.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for server in servers:
            server.kill()
        if "postgresql" in urls:
            drop_pg_database(urls["postgresql"])
    assert failures == [], "\n".join(failures)
    if "postgresql" not in urls:
        pytest.skip("PostgreSQL is not reachable: the suite passed on SQLite only")
