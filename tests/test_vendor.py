"""The console's third-party code (stations/web/vendor/) is exactly what vendor/package-lock.json
pins: a fresh ``npm ci`` of the lockfile gives the same bytes (scripts/vendor.sh copies them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import IN_CI

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "uPlot.esm.js": "uplot/dist/uPlot.esm.js",
    "uPlot.min.css": "uplot/dist/uPlot.min.css",
    "uPlot.LICENSE": "uplot/LICENSE",
}


def test_shipped_files_are_the_pinned_versions(tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        if IN_CI:
            pytest.fail("npm is needed (Node and npm: see README)")
        pytest.skip("npm is not installed")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "vendor" / name, tmp_path / name)
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
    )
    lock = json.loads((ROOT / "vendor" / "package-lock.json").read_text())
    version = lock["packages"]["node_modules/uplot"]["version"]
    shipped = ROOT / "stations" / "web" / "vendor"
    for name, source in SHIPPED.items():
        assert (shipped / name).read_bytes() == (tmp_path / "node_modules" / source).read_bytes()
    assert f"(v{version})" in (shipped / "uPlot.esm.js").read_text(encoding="utf-8")[:400]
