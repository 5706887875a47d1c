"""The package as a user installs it: the built wheel, in a fresh virtual environment, serves
the console, the OpenAPI document and its migrations from any working directory, installs
nothing under a generic top-level name, and needs PostgreSQL's driver only for PostgreSQL."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx

from stations import __version__
from tests.harness import free_port
from tests.packaging import build_wheel, clean_env, copy_checkout, run


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist()}


def test_wheel_in_a_fresh_venv_serves_everything_from_another_directory(tmp_path: Path) -> None:
    source = copy_checkout(tmp_path / "src")
    wheel = build_wheel(source, tmp_path / "dist")
    assert _top_level(wheel) == {"stations", f"stations-{__version__}.dist-info"}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for required in (
        "stations/web/index.html",
        "stations/web/app.js",
        "stations/web/charts.js",
        "stations/web/vendor/uPlot.esm.js",
        "stations/web/vendor/uPlot.min.css",
        "stations/api/openapi.yaml",
        "stations/store/migrations/env.py",
        "stations/store/migrations/alembic.ini",
        "stations/store/migrations/script.py.mako",
        "stations/store/migrations/versions/0001_streams.py",
    ):
        assert required in names, required

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel])
    version = run([venv / "bin" / "stations", "--version"]).stdout.strip()
    assert version == f"stations {__version__}"

    # Without the extra, a PostgreSQL URL is one clear line, not a traceback, in either spelling.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for scheme in ("postgresql", "postgres"):
        refused = subprocess.run(
            [venv / "bin" / "stations", "serve", "--db", f"{scheme}://u@127.0.0.1:5432/db"],
            cwd=elsewhere,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines() == [
            "stations: error: --db is a PostgreSQL URL but the psycopg driver is not installed; "
            "install it with: pip install 'psycopg[binary]>=3.2.4' (this package's "
            "postgresql extra)"
        ], scheme

    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [venv / "bin" / "stations", "serve", "--port", str(port)],
        cwd=elsewhere,
        env=clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as http:
            _wait_up(http, proc, tmp_path / "serve.log")
            ui = http.get("/ui/")
            assert ui.status_code == 200 and "<title>" in ui.text, ui.text[:200]
            assert http.get("/ui/app.js").status_code == 200
            assert http.get("/ui/vendor/uPlot.esm.js").status_code == 200
            assert http.get("/", follow_redirects=True).url.path == "/ui/"
            spec = http.get("/api/openapi.yaml")
            assert spec.status_code == 200 and spec.text.startswith("openapi:"), spec.text[:80]
            assert http.post("/api/stations", json={"name": "wheel"}).status_code == 201
            produced = http.post(
                "/api/stations/wheel/messages",
                json={"messages": [{"id": "a", "data": {"n": 1}}, {"data": {"n": 2}}]},
            )
            assert [r["duplicate"] for r in produced.json()["results"]] == [False, False]
            read = http.get("/api/stations/wheel/messages", params={"offset": "-1"}).json()
            assert [(m.get("id"), m["data"]) for m in read["messages"]] == [
                ("a", {"n": 1}),
                (None, {"n": 2}),
            ]
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    # The service ran the packaged Alembic migrations on the SQLite file in its working dir.
    with sqlite3.connect(elsewhere / "stations-data" / "stations.db") as db:
        (head,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert head

    site = next((venv / "lib").glob("python3*/site-packages"))
    generic = {"api", "web", "migrations", "domain", "store", "client"}
    assert not generic & {p.name for p in site.iterdir()}
    assert not (site / "psycopg").exists()  # PostgreSQL's driver is the extra, not a dependency


def _wait_up(http: httpx.Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if http.get("/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"stations serve did not come up: {log.read_text()}")
