"""Every field that takes a time (a seek's and an offset lookup's ``time``, ``createdAt``, a
lease's ``ackDeadline``, ``Stream-Expires-At``) reads one set of forms with one set of
refusals. Before, five parsers disagreed: a seek or a lookup refused RFC 3339's lower-case
``t``/``z`` that ``Stream-Expires-At`` took, a seek took a time before 1970 that a lookup
refused, and only ``createdAt`` said that a query's ``+`` arrives as a space."""

from __future__ import annotations

from urllib.parse import quote

from tests.groupkit import (
    Api,
    api_fixture,  # noqa: F401 - the fixture api
    field_of,
    shared_fixture,  # noqa: F401 - the fixture shared
)


async def _lookup(api: Api, st: str, raw_query: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    r = await api.c.get(api.path(st, "offsets") + "?time=" + raw_query)
    return r.status_code, r.json()


async def test_lower_case_rfc3339_is_read_by_every_time_field(api: Api) -> None:
    st = await api.station()
    [offset] = await api.produce(st, [{"i": 1}])
    stored = (await api.browse(st))[0]["time"]  # 2026-...T...Z
    lower = stored.replace("T", "t").replace("Z", "z")

    status, found = await _lookup(api, st, quote(lower, safe=""))
    assert status == 200, found
    assert found["offset"] == offset

    await api.put_group(st, "g")
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"time": lower})
    assert r.status_code == 200, r.text
    assert r.json()["cursor"] == offset

    [got] = await api.fetch(st, "g", max=1)
    lease = {
        "offset": got["offset"],
        "deliveryCount": got["deliveryCount"],
        "ackDeadline": got["ackDeadline"].replace("T", "t").replace("Z", "z"),
    }
    r = await api.c.post(api.path(st, "groups", "g", "extend"), json={"leases": [lease]})
    assert r.status_code == 200, r.text
    assert r.json()["extended"] == 1

    created = (await api.view(st))["createdAt"].replace("T", "t").replace("Z", "z")
    r = await api.c.patch(
        api.path(st) + "?createdAt=" + quote(created, safe=""), json={"idempotencyWindowMs": 60_000}
    )
    assert r.status_code == 200, r.text


async def test_a_query_plus_read_as_a_space_is_named_for_every_time_in_a_query(api: Api) -> None:
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    # "+01:00" written raw in a query reaches the server as " 01:00".
    status, said = await _lookup(api, st, "2026-11-28T10:00:00+01:00")
    assert status == 400 and said["error"]["field"] == "time", said
    assert "%2B" in said["error"]["message"], said
    r = await api.c.delete(api.path(st) + "?createdAt=2026-11-28T10:00:00.000+01:00")
    assert r.status_code == 400 and field_of(r) == "createdAt", r.text
    assert "%2B" in r.json()["error"]["message"], r.text


async def test_times_before_1970_are_refused_alike(api: Api) -> None:
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    await api.put_group(st, "g")
    before = "1969-12-31T23:59:59Z"
    status, said = await _lookup(api, st, quote(before, safe=""))
    assert status == 400 and said["error"]["field"] == "time", said
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"time": before})
    assert r.status_code == 400 and field_of(r) == "time", r.text
    assert r.json()["error"]["message"] == said["error"]["message"]


async def test_a_time_without_its_zone_is_refused_by_every_field_in_the_same_words(
    api: Api,
) -> None:
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    await api.put_group(st, "g")
    naive = "2026-11-28T10:00:00"
    status, said = await _lookup(api, st, naive)
    seek = await api.c.post(api.path(st, "groups", "g", "seek"), json={"time": naive})
    delete = await api.c.delete(api.path(st) + "?createdAt=" + naive)
    lease = {"offset": "0000000000000000_0000000000000000", "deliveryCount": 1}
    extend = await api.c.post(
        api.path(st, "groups", "g", "extend"), json={"leases": [dict(lease, ackDeadline=naive)]}
    )
    answers = [
        (status, said["error"]["message"]),
        (seek.status_code, seek.json()["error"]["message"]),
        (delete.status_code, delete.json()["error"]["message"].replace("createdAt", "time")),
        (
            extend.status_code,
            extend.json()["error"]["message"].replace("leases.0.ackDeadline", "time"),
        ),
    ]
    assert {a[0] for a in answers} == {400}, answers
    assert len({a[1] for a in answers}) == 1, answers
    assert "zone" in answers[0][1]


async def test_a_seek_refuses_epoch_ms_past_9999_as_a_lookup_does(api: Api) -> None:
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    await api.put_group(st, "g")
    late = 253_402_300_800_000  # 10000-01-01T00:00:00Z
    status, said = await _lookup(api, st, str(late))
    assert status == 400 and said["error"]["field"] == "time", said
    r = await api.c.post(api.path(st, "groups", "g", "seek"), json={"time": late})
    assert r.status_code == 400 and field_of(r) == "time", r.text


async def test_a_point_without_fraction_digits_is_refused(api: Api) -> None:
    """Python's reader takes ``00:00:00.Z``; ISO 8601 and RFC 3339 do not."""
    st = await api.station()
    await api.produce(st, [{"i": 1}])
    await api.put_group(st, "g")
    r = await api.c.post(
        api.path(st, "groups", "g", "seek"), json={"time": "2026-01-01T00:00:00.Z"}
    )
    assert r.status_code == 400 and field_of(r) == "time", r.text
    status, said = await _lookup(api, st, "2026-01-01T00:00:00.Z")
    assert status == 400 and said["error"]["field"] == "time", said
