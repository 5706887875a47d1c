#!/usr/bin/env bash
# Install what the test suite needs (idempotent, quick when already present), then run it all.
# Python packages go into the project's virtual environment ./.venv (created by the first run
# from the python3 first on the PATH; see scripts/venv.sh), arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh
stations_venv "server,test,spark,postgresql"
PY=.venv/bin/python

# The pinned Node packages: the Durable Streams conformance suite, reference server and client.
if ! cmp -s tests/node/package-lock.json tests/node/node_modules/.stations-installed-lock.json 2>/dev/null; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
  cp tests/node/package-lock.json tests/node/node_modules/.stations-installed-lock.json
fi

# Headless Chromium for the console tests (tests/browser.py drives /usr/bin/chromium; Playwright
# cannot download browsers here). Debian/Ubuntu's package, installed only when missing.
if [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
  else
    echo "scripts/test.sh: no apt-get; install Chromium at /usr/bin/chromium for the console tests" >&2
  fi
fi

"$PY" -m ruff check stations tests bench
"$PY" -m ruff format --check stations tests bench
# Strict types (config in pyproject.toml), on the paths that pass so far.
"$PY" -m mypy stations
# The suite is to stay under 20 minutes in CI: three workers on the 2-core box (many tests
# wait on servers, browsers, JVMs and timers: two took 22:17 on an Intel box, three 16:56;
# a slower AMD box, CPU-bound from first test to last, 23:43, then 21:17 once the CLI
# commands were forked and the JVMs ran C1 only: tests/zygote.py, harness.SHORT_LIVED_JVM;
# 18:59 once the zygote also imported what a server imports as it starts and froze its heap
# before forking, and the tests' httpx clients shared one TLS context: tests/conftest.py;
# 12:40 on the Intel box again, 2026-11-29, with 2,857 tests),
# each taking a whole file at a time so a file's module-scoped servers start once;
# tests/conftest.py hands out the longest files first. The slowest tests are listed at the
# end. Arguments come last, so `-n 0` runs everything in this process.
exec "$PY" -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
