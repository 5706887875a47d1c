"""A subscription change whose index refresh fails is taken up again (a review of
2026-11-29): a PUT or ``/streams`` change commits, then the process refreshes its index of
what each subscription follows. If that read failed (a moment's database error), the request
failed but the change stood, and the index went on without it: on SQLite no notification
brings it back, so appends to the streams it named woke nothing until a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stations.domain.service import Service
from stations.domain.subscriptions import links, spec
from stations.domain.subscriptions.engine import SubscriptionEngine


async def _no_send(url: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
    return False, False


async def test_a_failed_refresh_is_taken_up_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = Service(f"sqlite:///{tmp_path / 'stations.db'}")
    await svc.start()
    engine = SubscriptionEngine(svc, _no_send)
    await engine.start()
    try:
        for name in ("wk", "a", "b"):
            await svc.create_station({"name": name})
        definition = spec.parse_spec({"type": "pull-wake", "streams": ["a"], "wake_stream": "wk"})
        await svc.write(links.create_or_confirm, "s1", definition, "http://127.0.0.1:1")
        await engine.changed("s1")
        assert engine.index.match("a") == {"s1"}

        await svc.write(links.add_streams, "s1", ["b"])
        read = svc.read_db
        failures = 1

        async def failing_once(*args: Any, **kwargs: Any) -> Any:
            nonlocal failures
            if failures:
                failures -= 1
                raise OSError("disk I/O error")
            return await read(*args, **kwargs)

        monkeypatch.setattr(svc, "read_db", failing_once)
        with pytest.raises(OSError):
            await engine.changed("s1")
        assert engine.index.match("b") == set()
        for _ in range(100):  # the drainer's next round, a second after the failure
            if engine.index.match("b") == {"s1"}:
                break
            await asyncio.sleep(0.05)
        assert engine.index.match("b") == {"s1"}, "the change was never taken up"
    finally:
        await engine.stop()
        await svc.close()
