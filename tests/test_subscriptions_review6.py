"""Subscriptions, fixes from a sixth review: an ack of a stream deleted and created again since
the wake was announced no longer skips the new stream's first messages, and an ack's fields of
the wrong type are a 400 naming the field."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.test_subscriptions import LOOPBACK, ZERO, append

SUB = "/v1/stream/__ds/subscriptions/s1"


async def _claimed(client: httpx.AsyncClient) -> dict[str, Any]:
    for path in ("wk", "a"):
        assert (await client.put(f"/v1/stream/{path}", json=[])).status_code == 201
    r = await client.put(SUB, json={"type": "pull-wake", "streams": ["a"], "wake_stream": "wk"})
    assert r.status_code == 201, r.text
    await append(client, "a", [{"old": 1}, {"old": 2}])
    for _ in range(100):  # the append's wake is announced after its commit
        r = await client.post(f"{SUB}/claim", json={"worker": "w"})
        if r.status_code == 200:
            claim: dict[str, Any] = r.json()
            return claim
        await asyncio.sleep(0.05)
    raise AssertionError(f"no wake to claim: {r.status_code} {r.text}")


async def test_an_ack_of_a_stream_created_again_does_not_skip_its_messages(
    db_url: str, make_server: Any
) -> None:
    """The worker read the old stream up to its tail (offset 2); meanwhile the stream was
    deleted and created again with three messages. Its ack of offset 2 was applied to the new
    stream, and the next wake announced only the third message: two were never delivered."""
    server = make_server(db_url)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        claim = await _claimed(client)
        (stream,) = claim["streams"]
        old_tail = stream["tail_offset"]
        assert old_tail != ZERO
        assert (await client.delete("/v1/stream/a")).status_code == 204
        again = await client.put("/v1/stream/a", json=[{"new": 1}, {"new": 2}, {"new": 3}])
        assert again.status_code == 201, again.text
        r = await client.post(
            f"{SUB}/ack",
            json={
                "wake_id": claim["wake_id"],
                "generation": claim["generation"],
                "acks": [{"stream": "a", "offset": old_tail}],
                "done": True,
            },
            headers={"Authorization": f"Bearer {claim['token']}"},
        )
        assert r.status_code == 200, r.text
        view = (await client.get(SUB)).json()
        assert [s["acked_offset"] for s in view["streams"]] == [ZERO]
        r = await client.post(f"{SUB}/claim", json={"worker": "w"})
        assert r.status_code == 200, r.text
        assert r.json()["streams"][0]["acked_offset"] == ZERO


async def test_an_acks_fields_of_the_wrong_type_are_a_bad_request(
    db_url: str, make_server: Any
) -> None:
    server = make_server(db_url)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        claim = await _claimed(client)
        offset = claim["streams"][0]["tail_offset"]
        for ack, field in (
            ({"stream": 5, "offset": offset}, "acks[0].stream"),
            ({"stream": "a", "offset": 5}, "acks[0].offset"),
        ):
            r = await client.post(
                f"{SUB}/ack",
                json={
                    "wake_id": claim["wake_id"],
                    "generation": claim["generation"],
                    "acks": [ack],
                },
                headers={"Authorization": f"Bearer {claim['token']}"},
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["field"] == field, r.text


async def test_a_failing_webhook_is_logged_without_its_address_or_signature(
    tmp_path: Any, make_server: Any
) -> None:
    """A webhook's URL may be its secret (the README shows it to admin tokens only): each
    failed delivery logged the whole URL, query included, and the request's signature header,
    one line a retry. Now a line names the endpoint's origin, then one a minute."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    endpoint = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = endpoint.sockets[0].getsockname()[1]
    server = make_server(f"sqlite:///{tmp_path / 'stations-data' / 'stations.db'}", LOOPBACK)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            assert (await client.put("/v1/stream/a", json=[])).status_code == 201
            url = f"http://127.0.0.1:{port}/hook?apikey=SUPERSECRET3"
            r = await client.put(
                SUB, json={"type": "webhook", "streams": ["a"], "webhook": {"url": url}}
            )
            assert r.status_code == 201, r.text
            await append(client, "a", [{"n": 1}])
            deadline = time.monotonic() + 10
            while "webhook delivery" not in server.log():  # the first attempt
                assert time.monotonic() < deadline, server.log()
                await asyncio.sleep(0.05)
            await asyncio.sleep(3.5)  # its retries, after about 1 s and 2 s more
    finally:
        endpoint.close()
    log = server.log()
    assert f"webhook delivery to http://127.0.0.1:{port} failed" in log, log
    assert "SUPERSECRET3" not in log and "Webhook-Signature" not in log, log
    assert log.count("webhook delivery") == 1, log
