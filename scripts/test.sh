#!/usr/bin/env bash
# Install what the test suite needs (idempotent, quick when already present), then run it all.
# Python packages go into the interpreter that runs this (activate a venv first if you want one).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
"$PY" -m pip install --disable-pip-version-check -q -e '.[test]'

# The pinned Node packages: the Durable Streams conformance suite, reference server and client.
if ! cmp -s tests/node/package-lock.json tests/node/node_modules/.stations-installed-lock.json 2>/dev/null; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
  cp tests/node/package-lock.json tests/node/node_modules/.stations-installed-lock.json
fi

"$PY" -m ruff check stations api migrations tests bench
exec "$PY" -m pytest -q "$@"
