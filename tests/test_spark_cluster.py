"""``stations pipeline`` and a streaming query on a real Spark standalone cluster: a master and one
worker from the PySpark install, on loopback, with the commands as the README gives them.

Slow (three Spark drivers, each with an executor JVM), so it does the least that shows the
cluster path: ingest, export, and a streaming mirror resumed from its checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import IN_CI, SHORT_LIVED_JVM, Server, free_port

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyspark
except ImportError:
    if IN_CI:
        raise
    pytest.skip(
        "PySpark / pyarrow not installed: pip install -e '.[spark]'", allow_module_level=True
    )

ROOT = Path(__file__).resolve().parent.parent
SPARK_HOME = Path(pyspark.__file__).parent


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open: {log.read_text()[-3000:]}")


def spark_home(where: Path) -> Path:
    """A Spark home for the standalone daemons made of the PySpark install: its jars and bin,
    plus the RELEASE marker that makes a worker take ``jars/`` for its executors' classpath
    (without it Spark looks for a source build)."""
    home = where / "spark-home"
    home.mkdir()
    for part in ("jars", "bin"):
        (home / part).symlink_to(SPARK_HOME / part)
    (home / "RELEASE").write_text("PySpark install\n")
    return home


def _env(home: Path | None = None) -> dict[str, str]:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": os.pathsep.join(paths)}
    # Spark's Python workers run PYSPARK_PYTHON, else whatever python3 PATH finds first: with
    # the venv not on PATH that one has no pyspark ("Python worker failed to connect back").
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if home is not None:
        env.update(SPARK_HOME=str(home), SPARK_SCALA_VERSION="2.13")
        # The daemons' JVMs and the executors the worker starts (they inherit its
        # environment); the drivers take SPARK_SUBMIT_OPTS (tests/conftest.py).
        env["JAVA_TOOL_OPTIONS"] = SHORT_LIVED_JVM
    return env


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a standalone master with one worker (1 core, 1 GiB)."""
    java = shutil.which("java")
    if java is None:
        if IN_CI:
            pytest.fail("no java on the PATH (the Spark extra needs a JDK 17+)")
        pytest.skip("no java on the PATH")
    workdir = tmp_path_factory.mktemp("cluster")
    home = spark_home(workdir)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    # Small: the master and worker daemons get 256 MB each, the one executor 1 core.
    classpath = str(SPARK_HOME / "jars" / "*")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for role, args, log_name in (
            (
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                "master.log",
            ),
            (
                "org.apache.spark.deploy.worker.Worker",
                ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
                + ["--webui-port", str(worker_ui), "--work-dir", str(workdir / "work")]
                + [f"spark://127.0.0.1:{port}"],
                "worker.log",
            ),
        ):
            log = workdir / log_name
            with open(log, "wb") as out:
                command = [java, "-Xmx256m", "-cp", classpath, role, *args]
                procs.append(
                    subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_env(home))
                )
            _wait_port(port if role.endswith("Master") else worker_ui, procs[-1], log)
        # The worker is up; wait until it says the master took it (bounded).
        deadline = time.monotonic() + 120
        while "Successfully registered with master" not in (workdir / "worker.log").read_text():
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise RuntimeError(f"no worker: {(workdir / 'worker.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("cluster-srv")
    server = Server(f"sqlite:///{workdir / 'stations.db'}", workdir).start()
    yield server
    server.kill()


def stations_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``stations`` command as a user types it (the console script, else ``-m``)."""
    script = shutil.which("stations")
    command = [script] if script else [sys.executable, "-m", "stations"]
    return subprocess.run(
        [*command, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )


def count(api: httpx.Client, name: str) -> int:
    return int(api.get(f"/api/stations/{name}").json()["stats"]["messages"])


STREAM_SCRIPT = """
import json, sys, urllib.request
from pyspark.sql import SparkSession
import stations.spark

master, url, src, dst, checkpoint = sys.argv[1:6]
spark = (SparkSession.builder.master(master).appName("stations mirror")
         .config("spark.ui.enabled", "false").getOrCreate())
stations.spark.register(spark)

def mirror():
    query = (spark.readStream.format("stations").option("url", url).option("station", src).load()
             .select("data").writeStream.format("stations").option("url", url)
             .option("station", dst).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    return [p["numInputRows"] for p in query.recentProgress]

first = mirror()
body = json.dumps({"messages": [{"data": {"late": i}} for i in range(100)]}).encode()
request = urllib.request.Request(f"{url}/api/stations/{src}/messages", data=body,
                                 headers={"Content-Type": "application/json"})
urllib.request.urlopen(request).read()
second = mirror()  # the same checkpoint: resumes after the first run
print(json.dumps({"first": first, "second": second}))
spark.stop()
"""


def test_pipeline_and_a_resumed_stream_on_a_standalone_cluster(
    master: str, srv: Server, tmp_path: Path
) -> None:
    ids = [f"order-{i}" for i in range(1800)] + [f"order-{i * 9}" for i in range(200)]
    pq.write_table(pa.table({"order_id": ids, "n": list(range(2000))}), tmp_path / "orders.parquet")
    name = f"orders-{uuid.uuid4().hex[:6]}"
    ingest = ["pipeline", "ingest", "--from", "orders.parquet", "--format", "parquet"]
    ingest += ["--station", name, "--msg-id-column", "order_id", "--url", srv.url]
    ingest += ["--master", master]

    done = stations_cli(*ingest, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2,000 rows read, 1,800 stored, 200 duplicates" in done.stdout
    assert f"Spark's Python workers run {sys.executable}" in done.stderr  # and it says so
    # Its re-run storing none again is test_spark's (local mode): the same code on the
    # driver and the server; here each run costs a driver and an executor JVM (~40 s).

    export = ["pipeline", "export", "--station", name, "--to", "exports/orders"]
    export += ["--format", "parquet", "--url", srv.url, "--master", master]
    done = stations_cli(*export, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1,800 messages read, 1,800 rows written" in done.stdout
    exported = pq.read_table(tmp_path / "exports" / "orders").to_pylist()
    assert sorted(r["msgId"] for r in exported) == sorted(set(ids))

    with httpx.Client(base_url=srv.url, timeout=30) as api:
        mirror = f"{name}-mirror"
        assert api.post("/api/stations", json={"name": mirror}).status_code == 201
        run = subprocess.run(
            [sys.executable, "-c", STREAM_SCRIPT, master, srv.url, name, mirror,
             str(tmp_path / "checkpoint")],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        progress: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
        assert sum(progress["first"]) == 1800
        assert sum(progress["second"]) == 100  # resumed: exactly the 100 new ones
        assert count(api, mirror) == 1900
