#!/usr/bin/env bash
# The Quick start: create ./.venv if needed, install Stations into it, run `stations serve`
# (arguments are passed on, e.g. `bash scripts/serve.sh --port 8080`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
stations_venv "server"
exec stations serve "$@"
