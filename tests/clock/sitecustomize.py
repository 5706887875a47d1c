"""Test-only clock for ``stations serve`` subprocesses: with ``STATIONS_TEST_CLOCK`` naming a
file, ``time.time()`` runs that many seconds ahead (the file is read again whenever it changes),
so a test moves the server past an idempotency window without sleeping.

Loaded by Python at start-up when this directory is on the server's PYTHONPATH."""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("STATIONS_TEST_CLOCK")

if _PATH:
    _real_time = time.time
    _state = {"mtime": -1, "offset": 0.0}

    def _shifted_time() -> float:
        try:
            mtime = os.stat(_PATH).st_mtime_ns
            if mtime != _state["mtime"]:
                with open(_PATH) as f:
                    _state["offset"] = float(f.read().strip() or 0)
                _state["mtime"] = mtime
        except (OSError, ValueError):
            pass
        return _real_time() + _state["offset"]

    time.time = _shifted_time
