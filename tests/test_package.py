"""The package as a user installs it: the built wheel, in a fresh virtual environment, serves
the console, the OpenAPI document and its migrations from any working directory, installs
nothing under a generic top-level name, and needs PostgreSQL's driver only for PostgreSQL.
Its base install is the SDK and the management commands, without the server's packages; the
sdist holds what a clone holds (scripts, tests, lockfiles) and the wheel is built from it; the
wheel is typed, so mypy in a user's project checks calls into the SDK."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest

from stations import __version__
from tests.harness import Server, free_port
from tests.packaging import Built, build, clean_env, run, venv_with


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist of a copy of the checkout and the wheel built from it, once for the module."""
    return build(tmp_path_factory.mktemp("built"))


@pytest.fixture(scope="module")
def wheel(built: Built) -> Path:
    return built.wheel


def test_wheel_in_a_fresh_venv_serves_everything_from_another_directory(
    tmp_path: Path, wheel: Path
) -> None:
    assert _top_level(wheel) == {"stations", f"stations_streams-{__version__}.dist-info"}
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
    venv_with(venv, f"{wheel}[server]")
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


SERVER_ONLY = ("sqlalchemy", "alembic", "apscheduler", "rbloom", "msgspec", "cryptography")


def test_base_install_is_the_sdk_and_the_commands_without_the_server(
    tmp_path: Path, wheel: Path
) -> None:
    """``pip install stations-streams`` is what an application or a Spark worker needs to talk
    to a server; ``serve`` and ``backup`` then name the extra in one line."""
    venv = tmp_path / "venv"
    venv_with(venv, wheel)
    site = next((venv / "lib").glob("python3*/site-packages"))
    present = {p.name.lower() for p in site.iterdir()}
    assert not present & set(SERVER_ONLY), sorted(present & set(SERVER_ONLY))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for argv in (["serve"], ["backup", "copy.db"]):
        refused = subprocess.run(
            [venv / "bin" / "stations", *argv],
            cwd=elsewhere,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith(f"stations: error: stations {argv[0]} needs the server's packages")
        assert line.endswith("install them with: pip install 'stations-streams[server]'"), line
    assert not (elsewhere / "stations-data").exists()
    # Tokens are made without the server too (the standard library only).
    made = run([venv / "bin" / "stations", "token", "new", "--role", "admin", "--json"])
    assert json.loads(made.stdout)["entry"]["role"] == "admin"

    # The SDK and the management commands of that install, against a server of this checkout.
    served = tmp_path / "served"
    served.mkdir()
    server = Server(db_url=f"sqlite:///{served}/stations.db", workdir=served).start()
    try:
        cli = [venv / "bin" / "stations"]
        run([*cli, "station", "create", "light", "--url", server.url], cwd=elsewhere)
        run([*cli, "produce", "--url", server.url, "light", '{"n": 1}'], cwd=elsewhere)
        script = (
            "import asyncio, sys\n"
            "from stations.client import Client\n"
            "async def main():\n"
            "    async with Client(sys.argv[1]) as c:\n"
            "        st = c.station('light')\n"
            "        await st.produce({'n': 2}, msg_id='two')\n"
            "        print([m.data for m in (await st.browse()).messages])\n"
            "    assert not {'sqlalchemy', 'msgspec'} & set(sys.modules), sorted(sys.modules)\n"
            "asyncio.run(main())\n"
        )
        out = run([venv / "bin" / "python", "-c", script, server.url], cwd=elsewhere).stdout
    finally:
        server.stop()
    assert out.strip() == "[{'n': 1}, {'n': 2}]", out


def test_sdist_holds_the_checkout_and_builds_the_wheel(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for required in (
        "scripts/serve.sh",
        "scripts/test.sh",
        "scripts/venv.sh",
        ".ci/run",
        "docs/CONTRACT.md",
        "tests/node/package-lock.json",
        "vendor/package-lock.json",
        "bench/consumers.py",
        "tests/test_package.py",
        "stations/web/index.html",
    ):
        assert required in names, required
    assert not any("node_modules" in n or "__pycache__" in n for n in names)
    # The wheel the other tests install is the one pip built from this sdist.
    with zipfile.ZipFile(built.wheel) as z:
        assert "stations/store/migrations/alembic.ini" in z.namelist()


def test_the_wheel_is_typed_and_builds_without_deprecated_metadata(
    tmp_path: Path, built: Built
) -> None:
    """The SDK is typed, but without ``py.typed`` mypy ignored its types in users' code; a
    license given as a TOML table is deprecated by setuptools, to fail in 2027."""
    assert "SetuptoolsDeprecationWarning" not in built.log
    with zipfile.ZipFile(built.wheel) as z:
        assert "stations/py.typed" in z.namelist()
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith("/licenses/LICENSE") for n in z.namelist())

    # mypy in a user's project sees the SDK's types (and so finds a wrong call).
    user = tmp_path / "user"
    user.mkdir()
    (user / "app.py").write_text(
        "from stations.client import Client\n\n\n"
        "async def main() -> None:\n"
        "    async with Client('http://127.0.0.1:4437') as client:\n"
        "        client.station(42)\n"
    )
    venv = tmp_path / "venv"
    venv_with(venv, "--no-deps", built.wheel)
    mypy = [sys.executable, "-m", "mypy", "--python-executable", venv / "bin" / "python"]
    checked = subprocess.run(
        [*map(str, mypy), "--strict", "--no-incremental", "app.py"],
        cwd=user,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Argument 1 to "station"' in checked.stdout, checked.stdout
