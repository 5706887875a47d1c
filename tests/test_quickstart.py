"""The README's Quick start on a stock Debian/Ubuntu Python: with /usr/bin/python3 first on the
PATH (an "externally managed" interpreter, PEP 668, that refuses pip installs), the first
command makes the project's ./.venv itself, installs into it and serves; run again it finds
everything in place and does not call pip. (CI runs the second command, scripts/test.sh, this
way too: see .ci/run.)"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.harness import free_port
from tests.packaging import clean_env, copy_checkout, run

DEBIAN_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(not DEBIAN_PYTHON.exists(), reason="no /usr/bin/python3 on this machine")
def test_quick_start_with_the_system_python_first_on_the_path(tmp_path: Path) -> None:
    src = copy_checkout(tmp_path / "src")
    env = clean_env(PATH=f"/usr/bin:{os.environ['PATH']}")
    assert run(["bash", "-c", "command -v python3"], env=env).stdout.strip() == "/usr/bin/python3"
    trap = subprocess.run(
        ["python3", "-m", "pip", "install", "--dry-run", "-e", "."],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if trap.returncode != 0:  # what the old Quick start ran into on a stock Debian Python
        assert "externally-managed-environment" in trap.stderr, trap.stderr

    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", "scripts/serve.sh", "--port", str(port)],
            cwd=src,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 300  # a first install into an empty venv
            while True:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert http.post("/api/stations", json={"name": "quick"}).status_code == 201
            assert http.get("/ui/").status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)

    cfg = (src / ".venv" / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg, cfg
    assert (src / "stations-data" / "stations.db").exists()

    # Again: the venv and the install are in place, so pip is not called (the stamp stays).
    stamp = src / ".venv" / ".stations-installed-server"
    before = stamp.stat().st_mtime_ns
    again = run(
        ["bash", "-c", '. scripts/venv.sh && stations_venv "server" && command -v stations'],
        cwd=src,
        env=env,
    )
    assert again.stdout.strip() == str(src.resolve() / ".venv" / "bin" / "stations")
    assert stamp.stat().st_mtime_ns == before
