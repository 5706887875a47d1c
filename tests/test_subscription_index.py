"""Subscriptions at scale (a review): a change is matched against the patterns that can match
it, not every pattern (3,000 tenants' patterns cut every append tenfold, and a resync tried
every pattern on every stream name while the process's writes waited), and a pull-wake's
lease ends on time while hung webhook endpoints hold every delivery slot."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from stations.domain.service import Service
from stations.domain.subscriptions import engine as engine_module
from stations.domain.subscriptions import links, spec, wakes
from stations.domain.subscriptions.engine import Index, SubscriptionEngine
from stations.domain.subscriptions.spec import glob_match, matching_paths
from stations.store import subscriptions as subscription_store

SEGMENTS = ["a", "b", "ab", "a-b", "a.b", "t1", "*", "**", "?", "a*", "[ab]", "b?"]
NAMES = ["a", "b", "ab", "a-b", "a.b", "t1", "c", "a0", "a/"]


def _random_paths(rng: random.Random, n: int) -> list[str]:
    return ["/".join(rng.choice(NAMES[:-1]) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def test_pattern_lookups_agree_with_matching_every_pattern() -> None:
    rng = random.Random(7)
    patterns = sorted(
        {"/".join(rng.choice(SEGMENTS) for _ in range(rng.randint(1, 4))) for _ in range(400)}
    )
    paths = sorted(set(_random_paths(rng, 300)) | {"a", "a/b", "ab/c", "a-b/x", "a.b"})
    index = Index()
    for i, pattern in enumerate(patterns):
        index.put(f"s{i}", {"explicit": [], "pattern": pattern, "wake_stream": None})
    for path in paths:
        expected = {f"s{i}" for i, p in enumerate(patterns) if glob_match(p, path)}
        assert index.match(path) == expected, path
    for pattern in patterns:
        assert matching_paths(pattern, paths) == [p for p in paths if glob_match(pattern, p)]
    # Taking subscriptions out leaves no pattern behind.
    for i in range(len(patterns)):
        index.put(f"s{i}", None)
    assert all(not index.match(path) for path in paths)
    assert not index._patterns


def test_a_change_is_matched_against_the_patterns_that_can_match_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0

    def counted(pattern: str, path: str) -> bool:
        nonlocal calls
        calls += 1
        return glob_match(pattern, path)

    monkeypatch.setattr(engine_module, "glob_match", counted)
    index = Index()
    for i in range(1000):
        index.put(f"t{i}", {"explicit": [], "pattern": f"tenant-{i}/**", "wake_stream": None})
    index.put("all", {"explicit": [], "pattern": "**/orders", "wake_stream": None})
    assert index.match("load-0") == set()
    assert index.match("tenant-7/orders") == {"t7", "all"}
    assert calls <= 3, calls


async def _service_and_engine(db_url: str) -> tuple[Service, SubscriptionEngine]:
    """A started service, and its subscription engine (not started) with one delivery slot
    and no webhook to call."""
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    svc = Service(db_url)
    await svc.start()

    async def send(url: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
        raise AssertionError("no webhook here")

    return svc, SubscriptionEngine(svc, send, concurrency=1)


async def test_a_pull_wake_lease_ends_while_webhooks_hold_every_slot(
    db_url: str, tmp_path: Path
) -> None:
    """The engine's one delivery slot is held (a webhook endpoint that hangs): a pull-wake's
    lease still ends at its time, and the next worker can claim (it waited for the slot)."""
    svc, engine = await _service_and_engine(db_url)
    try:
        for name in ("jobs", "wk"):
            await svc.create_station({"name": name})
        definition = spec.parse_spec(
            {"type": "pull-wake", "streams": ["jobs"], "wake_stream": "wk", "lease_ttl_ms": 1000}
        )
        await svc.write(links.create_or_confirm, "pw", definition, "http://127.0.0.1:1")
        await engine.start()
        await svc.produce("jobs", {"messages": [{"data": 1}]})
        answer = None
        for _ in range(100):  # the append's wake starts (no slot needed)
            try:
                answer = await engine.run(wakes.claim, "pw", "w1")
                break
            except Exception:
                await asyncio.sleep(0.05)
        assert answer is not None
        held = await engine._outbound.acquire("")  # a hung webhook POST holds the only slot
        await asyncio.sleep(1.6)  # past the 1 s lease
        row: Any
        row, _ = await svc.read_db(links.read_view, "pw")
        assert row["holder"] is None, "the lease did not end while the slot was held"
        again = await engine.run(wakes.claim, "pw", "w2")
        assert again["generation"] > answer["generation"]
        engine._outbound.release(held)
    finally:
        await engine.stop()
        await svc.close()


async def test_an_append_reads_only_its_streams_links_while_a_wake_is_open(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of 2026-11-29: every append read every link of a pattern subscription in the
    writer's transaction, its wake open or not (3,000 streams under the pattern: 4 -> 40 ms an
    append, and every other station's appends waited in the same transactions). While a wake
    is open an append only needs its own streams' links."""
    svc, engine = await _service_and_engine(db_url)
    whole_reads: list[str] = []
    every_link = subscription_store.links

    def counted(conn: Any, sub_id: str) -> Any:
        whole_reads.append(sub_id)
        return every_link(conn, sub_id)

    try:
        for name in ["wk", *(f"many/{i}" for i in range(40))]:
            await svc.create_station({"name": name})
        definition = spec.parse_spec(
            {"type": "pull-wake", "pattern": "many/**", "wake_stream": "wk", "lease_ttl_ms": 60_000}
        )
        await svc.write(links.create_or_confirm, "pw", definition, "http://127.0.0.1:1")
        await engine.start()
        await svc.produce("many/0", {"messages": [{"data": 1}]})
        claimed = None
        for _ in range(100):  # the append's wake starts
            try:
                claimed = await engine.run(wakes.claim, "pw", "w1")
                break
            except Exception:
                await asyncio.sleep(0.05)
        assert claimed is not None
        monkeypatch.setattr(subscription_store, "links", counted)
        for i in range(1, 6):
            await svc.produce(f"many/{i}", {"messages": [{"data": i}]})
            await engine.run(wakes.on_append, {f"many/{i}": ["pw"]})
        assert whole_reads == [], whole_reads
    finally:
        await engine.stop()
        await svc.close()
