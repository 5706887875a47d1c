"""The subscription engine's timers in process, on the real service: a timer whose work fails
(the database refused the writer's transaction) must come back, or a webhook whose delivery
failed is never retried until the next append or a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from stations.domain.service import Service
from stations.domain.subscriptions import links, spec, wakes
from stations.domain.subscriptions.engine import SubscriptionEngine


def test_a_timer_whose_work_failed_is_armed_again(tmp_path: Path) -> None:
    async def run() -> None:
        svc = Service(f"sqlite:///{tmp_path / 's.db'}")
        await svc.start()
        sent: list[float] = []
        loop = asyncio.get_running_loop()

        async def send(url: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
            sent.append(loop.time())
            return True, False

        engine = SubscriptionEngine(svc, send)
        await engine.start()
        try:
            await svc.create_station({"name": "a"})
            definition = spec.parse_spec(
                {"type": "webhook", "streams": ["a"], "webhook": {"url": "https://h.example/x"}}
            )
            await svc.write(links.create_or_confirm, "s1", definition, "http://127.0.0.1:1")
            await engine.refresh({"s1"})
            write = svc.write
            failed: list[Any] = []

            async def failing_once(fn: Any, *args: Any) -> Any:
                if fn is wakes.due and not failed:
                    failed.append(fn)
                    raise RuntimeError("the database refused the transaction")
                return await write(fn, *args)

            svc.write = failing_once  # type: ignore[method-assign]
            await svc.produce("a", {"messages": [{"data": 1}]})
            for _ in range(100):  # the wake's delivery: its timer fails, and runs again
                if sent:
                    break
                await asyncio.sleep(0.05)
            assert failed, "the wake's timer never ran"
            assert len(sent) == 1, "the failed timer was never armed again"
        finally:
            await engine.stop()
            await svc.close()

    asyncio.run(run())
