"""``python3 -m bench.spark``: the Spark pipeline's throughput, in rows per second.

Starts ``stations serve`` on a fresh SQLite database, writes a Parquet file of ``--rows`` rows,
then times the two pipeline jobs on one SparkSession (``--master``, default ``local[2]``):

- **ingest**: ``stations pipeline ingest`` of the file, every row with its own message id;
- **export**: ``stations pipeline export`` of the whole station to Parquet.

Each figure is rows / wall-clock seconds of the Spark job (planning included, session start-up
not). Needs the ``stations-streams[spark]`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(workdir: Path, durability: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    db = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "stations", "serve", "--port", str(port), "--db", db]
        + ["--durability", durability],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stations serve exited: {(workdir / 'server.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("stations serve did not come up")


def _write_parquet(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    step = 100_000
    schema = pa.schema(
        [("order_id", pa.string()), ("customer", pa.string()), ("amount", pa.float64())]
    )
    with pq.ParquetWriter(path, schema) as out:
        for lo in range(0, rows, step):
            ids = range(lo, min(rows, lo + step))
            out.write_table(
                pa.table(
                    {
                        "order_id": [f"order-{i:08d}" for i in ids],
                        "customer": [f"customer-{i % 5000}" for i in ids],
                        "amount": [round(i * 0.37 % 1000, 2) for i in ids],
                    },
                    schema=schema,
                )
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.spark", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--durability", choices=["fsync", "process"], default="fsync")
    p.add_argument("--partitions", type=int, default=4, help="Spark tasks per job")
    p.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import stations.spark
    from stations.spark import pipeline

    workdir = Path(tempfile.mkdtemp(prefix="stations-bench-spark-"))
    server, url = _start_server(workdir, args.durability)
    spark = None
    try:
        source = workdir / "orders.parquet"
        t = time.monotonic()
        _write_parquet(source, args.rows)
        generate_s = time.monotonic() - t
        spark = (
            SparkSession.builder.master(args.master)
            .appName("bench.spark")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        common = ["--url", url, "--partitions", str(args.partitions), "--no-progress"]

        stations.spark.register(spark)

        def job(argv: list[str]) -> pipeline.Summary:
            return pipeline.execute(spark, pipeline.parse_args(argv))

        ingest = job(
            ["ingest", "--from", str(source), "--station", "orders"]
            + ["--msg-id-column", "order_id", *common]
        )
        export = job(["export", "--station", "orders", "--to", str(workdir / "export"), *common])
        results: dict[str, Any] = {
            "rows": args.rows,
            "master": args.master,
            "partitions": args.partitions,
            "durability": args.durability,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyspark": spark.version,
            "ingest": {
                "rows": ingest.rows_read,
                "stored": ingest.stored,
                "duplicates": ingest.duplicates,
                "seconds": round(ingest.seconds, 2),
                "rows_per_s": round(ingest.rows_read / ingest.seconds),
            },
            "export": {
                "rows": export.rows_read,
                "seconds": round(export.seconds, 2),
                "rows_per_s": round(export.rows_read / export.seconds),
            },
            "generate_parquet_s": round(generate_s, 2),
        }
    finally:
        if spark is not None:
            spark.stop()
        server.kill()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
        return 0
    print(
        f"Spark pipeline, {args.rows:,} rows, {args.master}, {args.partitions} tasks, "
        f"SQLite durability={args.durability}, {os.cpu_count()} CPUs"
    )
    for name in ("ingest", "export"):
        r = results[name]
        print(
            f"  {name:<7} {r['rows']:>10,} rows {r['seconds']:>8.1f} s {r['rows_per_s']:>9,} rows/s"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
