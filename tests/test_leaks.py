"""What a long-running server must let go of (the soak of 2026-11-29): a shared read's
generation for a name whose read failed, and the results of a writer batch in which one
request failed."""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path

import pytest

from stations.domain.service import Service
from stations.errors import NotFound, StationsError
from stations.store.writer import Batch


def _service(db_url: str) -> Service:
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return Service(db_url)


def test_a_long_poll_of_a_missing_name_leaves_nothing_behind(db_url: str) -> None:
    """Each long-poll or SSE read of a name that does not exist (or no longer does) left its
    shared-read generation for good: 120,000 random names took 48 MB that never came back."""

    async def run() -> set[str]:
        svc = _service(db_url)
        await svc.start()
        try:
            await svc.create_station({"name": "kept"})
            await svc.create_station({"name": "gone"})
            waiting = asyncio.create_task(svc.read_or_wait("gone", None, 10, max_bytes=1 << 20))
            await asyncio.sleep(0.3)
            await svc.delete("gone")  # deleted while a reader waits on it
            with pytest.raises(StationsError):
                await waiting
            for i in range(50):
                with pytest.raises(NotFound):
                    await svc.read_or_wait(f"never-{i}", None, 0.01, max_bytes=1 << 20)
            return set(svc.notifier._generations)
        finally:
            await svc.close()

    left = asyncio.run(run())
    assert not {name for name in left if name.startswith("never-") or name == "gone"}, left


class _Result:
    """What an op answers (a fetched page, say), to see when it is let go of."""


def test_a_failed_request_does_not_keep_its_batchs_results(db_url: str, no_gc: None) -> None:
    """A 4xx raised by one op of a batch kept its traceback, which held the writer's frame,
    which held every outcome of the batch: a cycle, so every result of the batch (fetched
    pages counted in the read budget) lived on until a full garbage collection."""
    refs: list[weakref.ref[_Result]] = []

    def ok(batch: Batch) -> _Result:
        result = _Result()
        refs.append(weakref.ref(result))
        return result

    def refused(batch: Batch) -> None:
        raise NotFound("no such thing", "name")

    async def run() -> None:
        svc = _service(db_url)
        await svc.start()
        try:
            answers = await asyncio.gather(
                svc.write(ok), svc.write(refused), return_exceptions=True
            )
            assert isinstance(answers[0], _Result) and isinstance(answers[1], NotFound)
            del answers
            for _ in range(2):  # the writer's loop holds on to its last batch's outcomes
                await svc.write(lambda batch: None)
            assert refs and refs[0]() is None, "the batch's result outlived its answer"
        finally:
            await svc.close()

    asyncio.run(run())
