"""Helpers for the packaging tests: a copy of the checkout's files, a wheel, a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without PYTHONPATH or STATIONS_* (nothing may leak in from the
    checkout the tests run from), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("STATIONS_")
    }
    env.update(extra)
    return env


def copy_checkout(dest: Path) -> Path:
    """The files git knows of (tracked, or new and not ignored): what a fresh clone holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if src.is_symlink() or not src.is_file():
            continue  # deleted in the work tree, or a link into node_modules
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def run(cmd: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    kwargs.setdefault("env", clean_env())
    kwargs.setdefault("timeout", 600)
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def build_wheel(source: Path, dist: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source])
    (wheel,) = dist.glob("stations_streams-*.whl")
    return wheel
