"""Dead-lettering on a fork whose fork offset falls inside one of its source's rows (a JSON
batch append stores its messages in one row): the source row also holds positions past the
fork offset, which are the fork's own messages, not the source's."""

from __future__ import annotations

import asyncio
from typing import Any

from stations.domain.lifecycle import CreateRequest
from stations.domain.log import AppendRequest
from stations.domain.offsets import decode
from stations.domain.service import Service


async def _lease(svc: Service, station: str, count: int) -> list[int]:
    seqs: list[int] = []
    while len(seqs) < count:
        got = await svc.fetch(station, "g", count - len(seqs), 0, "c")
        assert got.messages
        seqs += [m.seq for m in got.messages]
    return seqs


def test_fork_inside_a_source_row_keeps_one_entry_per_message(db_url: str) -> None:
    async def run() -> None:
        svc = Service(db_url)
        await svc.start()
        try:
            ct = "application/json"
            await svc.create_station({"name": "src", "contentType": ct})
            # One row holding positions 1..10.
            await svc.append(AppendRequest("src", ct, [b'{"s":%d}' % k for k in range(1, 11)]))
            await svc.create(CreateRequest("fk", ct, {}, fork_from="src", fork_offset=4))
            await svc.append(AppendRequest("fk", ct, [b'{"f":%d}' % k for k in range(5, 11)]))
            await svc.ensure_group("fk", "g", {})
            seqs = await _lease(svc, "fk", 10)
            assert sorted(seqs) == list(range(1, 11))
            assert (await svc.dead_letter("fk", "g", seqs, None))[0] == 10
            entries: list[dict[str, Any]]
            entries, _ = await svc.dls_entries("fk", None, 1000, None)
            assert [(decode(e["offset"]) + 1, e["data"]) for e in entries] == [
                (s, {"s": s} if s <= 4 else {"f": s}) for s in range(1, 11)
            ]
        finally:
            await svc.close()

    asyncio.run(run())
