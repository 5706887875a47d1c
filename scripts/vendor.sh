#!/usr/bin/env bash
# Copy the console's third-party browser code into the package (stations/web/vendor/) from the
# versions vendor/package-lock.json pins. Run it after changing vendor/package.json; the copies
# are committed, so neither installing nor serving Stations needs npm or a CDN.
# tests/test_vendor.py checks that the committed copies are exactly the pinned ones.
set -euo pipefail
cd "$(dirname "$0")/../vendor"
npm ci --no-audit --no-fund --loglevel=error
out=../stations/web/vendor
mkdir -p "$out"
cp node_modules/uplot/dist/uPlot.esm.js node_modules/uplot/dist/uPlot.min.css "$out/"
cp node_modules/uplot/LICENSE "$out/uPlot.LICENSE"
