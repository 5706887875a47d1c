"""The ```python blocks of the README's "Python SDK" section run, unchanged, against a fresh
``stations serve`` (each in its own interpreter, in order, with ``STATIONS_URL`` set)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import Server

ROOT = Path(__file__).parent.parent
SECTION = "## Python SDK"


def sdk_examples(title: str = SECTION) -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(title) + len(title)
    end = text.find("\n## ", start)
    section = text[start : end if end >= 0 else len(text)]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)


def test_readme_has_sdk_examples() -> None:
    assert len(sdk_examples()) >= 4


def test_readme_examples_run(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(
        f"sqlite:///{tmp_path / 'readme.db'}", "--long-poll-timeout-ms", "1000"
    )
    env = {**os.environ, "STATIONS_URL": server.url, "PYTHONPATH": str(ROOT)}
    for number, code in enumerate(sdk_examples(), 1):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        if proc.returncode != 0:
            pytest.fail(f"README example {number} failed:\n{code}\n{proc.stdout}\n{proc.stderr}")


def test_readme_pipeline_example_runs(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The "Exactly-once pipeline" section's example, against a server of its own."""
    (code,) = sdk_examples("## Exactly-once pipeline")
    server: Server = make_server(f"sqlite:///{tmp_path / 'pipeline.db'}")
    env = {**os.environ, "STATIONS_URL": server.url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "'amount': 50" in proc.stdout
