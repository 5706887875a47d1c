"""``PUT .../groups/{group}`` with ``If-None-Match: *`` creates only and with ``If-Match: *``
updates only, decided in the write itself. Without them a client could not create without
overwriting a group another client made the moment before, nor edit without making again a
group deleted the moment before (the CLI looked the group up first and, when its PUT made
the group all the same, deleted it again)."""

from __future__ import annotations

from stations.client import Client, GroupNotFound, PreconditionFailed
from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    field_of,
    shared_fixture,  # noqa: F401 - the fixture shared
)
from tests.harness import Server


async def test_if_none_match_creates_only(api: Api) -> None:
    st = await api.station()
    path = api.path(st, "groups", "g")
    star = {"If-None-Match": "*"}
    made = await api.c.put(path, json={"maxMsgDeliveries": 3}, headers=star)
    assert made.status_code == 201, made.text
    again = await api.c.put(path, json={"maxMsgDeliveries": 7}, headers=star)
    assert again.status_code == 412, again.text
    assert again.json()["error"]["code"] == "precondition_failed"
    assert field_of(again) == "If-None-Match"
    assert (await api.groups(st))["g"]["maxMsgDeliveries"] == 3  # left as it was


async def test_if_match_updates_only(api: Api) -> None:
    st = await api.station()
    path = api.path(st, "groups", "g")
    star = {"If-Match": "*"}
    missing = await api.c.put(path, json={"maxMsgDeliveries": 3}, headers=star)
    assert missing.status_code == 412, missing.text
    assert field_of(missing) == "If-Match"
    assert await api.groups(st) == {}  # not made
    await api.put_group(st, "g")
    changed = await api.c.put(path, json={"maxMsgDeliveries": 5}, headers=star)
    assert changed.status_code == 200, changed.text
    assert (await api.groups(st))["g"]["maxMsgDeliveries"] == 5


async def test_condition_headers_other_than_a_star_are_refused(api: Api) -> None:
    st = await api.station()
    path = api.path(st, "groups", "g")
    for headers, field in [
        ({"If-Match": '"abc"'}, "If-Match"),
        ({"If-None-Match": 'W/"x"'}, "If-None-Match"),
        ({"If-Match": "*", "If-None-Match": "*"}, "If-None-Match"),
    ]:
        r = await api.c.put(path, json={}, headers=headers)
        assert r.status_code == 400, (headers, r.text)
        assert field_of(r) == field, headers
    assert await api.groups(st) == {}


async def test_the_sdk_asks_for_either(api: Api, shared: Server) -> None:
    st = await api.station()
    async with Client(shared.url) as client:
        station = client.station(st)
        try:
            await station.ensure_group("g", exists=True)
        except PreconditionFailed as exc:
            assert (exc.status, exc.field) == (412, "If-Match")
        else:
            raise AssertionError("an update-only PUT made the group")
        made = await station.ensure_group("g", exists=False, max_msg_deliveries=4)
        assert (made.created, made.max_msg_deliveries) == (True, 4)
        try:
            await station.ensure_group("g", exists=False, max_msg_deliveries=9)
        except PreconditionFailed as exc:
            assert not isinstance(exc, GroupNotFound) and exc.field == "If-None-Match"
        else:
            raise AssertionError("a create-only PUT changed a standing group")
        updated = await station.ensure_group("g", exists=True, max_msg_deliveries=6)
        assert (updated.created, updated.max_msg_deliveries) == (False, 6)
