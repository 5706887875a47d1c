"""The pinned Node side of the tests (tests/node, installed by scripts/test.sh): a check that it
is there, and the Durable Streams reference server as a module fixture's generator."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import IN_CI, free_port

NODE_DIR = Path(__file__).parent / "node"


def require_node(command: str = "node", package: str = "@durable-streams") -> None:
    """Fail in CI, skip elsewhere, when Node or the pinned npm packages are missing."""
    if shutil.which(command) is None or not (NODE_DIR / "node_modules" / package).exists():
        message = "Node and the pinned npm packages are needed (run scripts/test.sh)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def reference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The reference server (``@durable-streams/server``, file-backed store) on a free port;
    yields its base URL. Use from a fixture: ``yield from reference_server(...)``."""
    require_node()
    port = free_port()
    data = tmp_path_factory.mktemp("reference")
    log_path = data / "reference.log"
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            ["node", "reference-server.mjs", "--port", str(port), "--data-dir", str(data)]
            + ["--long-poll-timeout", "1000"],
            cwd=NODE_DIR,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "READY" not in log_path.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"reference server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
