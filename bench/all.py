"""Every benchmark, one after another: ``python3 -m bench.all`` (``--quick`` for smaller sizes).

Each part starts its own servers and prints its figures beside its anchor's from the same run:
the Durable Streams protocol against the reference server (``bench``), message ids against NATS
JetStream (``bench.ids``), consumer groups against JetStream pull consumers
(``bench.consumers``), the Python SDK producer against the TypeScript client (``bench.sdk``) and
the Spark pipeline (``bench.spark``, rows/s; it has no anchor), consume-transform-produce
through transactions against the same work without them (``bench.transactions``) and
10,000 idle stations against one (``bench.idle``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

PARTS: dict[str, tuple[list[str], list[str]]] = {
    # name: (full arguments, --quick arguments)
    "protocol": (["bench"], ["bench", "--rounds", "1", "--read-messages", "200000"]),
    "ids": (["bench.ids"], ["bench.ids", "--quick", "--rounds", "1"]),
    "consumers": (["bench.consumers"], ["bench.consumers", "--messages", "50000"]),
    "sdk": (["bench.sdk"], ["bench.sdk", "--messages", "200000"]),
    "spark": (["bench.spark"], ["bench.spark", "--rows", "100000"]),
    "transactions": (
        ["bench.transactions"],
        ["bench.transactions", "--messages", "5000", "--rounds", "2"],
    ),
    "idle": (["bench.idle"], ["bench.idle", "--stations", "2000", "--idle-seconds", "10"]),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.all", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes in all")
    p.add_argument("--only", default=",".join(PARTS), help="comma list of: %(default)s")
    args = p.parse_args(argv)
    failed = []
    for name in args.only.split(","):
        full, quick = PARTS[name]
        command = [sys.executable, "-m", *(quick if args.quick else full)]
        print(f"\n######## {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        if subprocess.run(command).returncode != 0:
            failed.append(name)
        print(f"######## {name} took {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
