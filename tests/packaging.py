"""Helpers for the packaging tests: a copy of the checkout's files, a wheel, a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


# What an unpacked sdist may hold beside its files once it was used: never copied.
_NOT_SOURCE = {".venv", "__pycache__", "node_modules", "stations-data", "build", "dist"}


def _files() -> list[str]:
    """The checkout's files: those git knows of (tracked, or new and not ignored), what a
    fresh clone holds; in an unpacked sdist, which is not a git checkout, all of its files
    but what using it made."""
    if not (ROOT / ".git").exists():
        rels = (p.relative_to(ROOT) for p in sorted(ROOT.rglob("*")))
        return [
            str(rel)
            for rel in rels
            if not _NOT_SOURCE.intersection(rel.parts)
            and not any(part.endswith(".egg-info") for part in rel.parts)
        ]
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return [raw.decode() for raw in listed if raw]


def copy_checkout(dest: Path) -> Path:
    """A copy of the checkout's files (``_files``)."""
    for rel in _files():
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


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    log: str  # the builds' output (setuptools' warnings are in it)


def build(dest: Path) -> Built:
    """The sdist of a copy of the checkout, and the wheel built from that sdist, as pip builds
    it for a user who installs from the sdist. One build serves every packaging test: each
    build makes an isolated environment with setuptools, seconds of CPU on a box the suite
    keeps busy."""
    source = copy_checkout(dest / "src")
    dist = dest / "dist"
    logs = [run([sys.executable, "-m", "build", "--sdist", "-o", dist, source])]
    (sdist,) = dist.glob("stations_streams-*.tar.gz")
    logs.append(run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dist, sdist]))
    (wheel,) = dist.glob("stations_streams-*.whl")
    return Built(sdist, wheel, "".join(done.stdout + done.stderr for done in logs))


def venv_with(dest: Path, *requirements: str | Path) -> None:
    """A new virtual environment at ``dest`` with ``requirements`` installed by pip.

    The venv is made without its own pip and this pip installs into it (``pip --python``): what
    lands in its site-packages is the same, without seconds of CPU spent unpacking a pip into
    each venv only to run it once."""
    run([sys.executable, "-m", "venv", "--without-pip", dest])
    python = dest / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", *requirements])
