"""The ``stations`` command as the CLI tests run it: a subprocess of this Python with no
``STATIONS_*`` variable of the caller's environment, and checks of what it said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import zygote


def run(
    *args: str,
    url: str | None = None,
    token: str | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STATIONS_")}
    if url is not None:
        environment["STATIONS_URL"] = url
    if token is not None:
        environment["STATIONS_TOKEN"] = token
    environment.update(env or {})
    if zygote.enabled() and args[:1] != ("pipeline",):  # see tests/zygote.py
        return zygote.run(list(args), cwd, environment, stdin, timeout)
    return subprocess.run(
        [sys.executable, "-m", "stations", *args],
        input=stdin,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """Its standard output, after checking it succeeded and said nothing on stderr."""
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr == ""
    return proc.stdout


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc))


def failed(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """Its one error line, after checking the exit code and that the line holds each of
    ``fragments``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    return one_line_error(proc, *fragments)


def one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A failure said in one ``stations: error:`` line, without a traceback."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode != 0, output
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stations: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
