"""The management API for stations (CONTRACT.md §4), over HTTP against live servers on SQLite and
PostgreSQL: create (two doors, one resource), list, read with live stats, patch, delete,
retention, names with ``/`` (``%2F``), and every validation error with its field. Nothing may
answer 500 to bad input.

One server per engine serves the module; each case makes its own stations.
"""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server

JSON = {"Content-Type": "application/json"}
DEFAULTS: dict[str, Any] = {
    "contentType": "application/json",
    "idempotencyWindowMs": 120000,
    "retention": {"maxAgeMs": None, "maxMessages": None, "maxBytes": None},
    "dls": {"poison": True, "forwardTo": None, "retentionMs": None},
    "consumerDefaults": {"maxAckTimeMs": 30000, "maxMsgDeliveries": 2},
}
STATS = {"messages", "bytes", "tailOffset", "idsInWindow", "groups", "deadLettered"}


def offset(position: int) -> str:
    return f"{position:016d}_{0:016d}"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory, "--long-poll-timeout-ms", "300")


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


@pytest.fixture
def name() -> str:
    return f"st-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def station(client: httpx.Client, name: str) -> str:
    """A fresh JSON station with default settings."""
    r = client.post("/api/stations", json={"name": name})
    assert r.status_code == 201, r.text
    return name


@pytest.fixture(scope="module")
def untouched(client: httpx.Client) -> str:
    """One JSON station with default settings, no messages and no ids, shared by the cases
    that must leave it so: every one of them is rejected and checks that nothing changed."""
    name = f"untouched-{uuid.uuid4().hex[:8]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    return name


@pytest.fixture(scope="module")
def one_message(client: httpx.Client) -> str:
    """A shared station holding one message, for the cases that only read."""
    name = f"one-{uuid.uuid4().hex[:8]}"
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    produce(client, name, {"data": 1})
    return name


# -- helpers ----------------------------------------------------------------------------------


def assert_error(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """``r`` is the JSON error ``status``, naming ``field`` (``None``: any or none)."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert set(error) == {"code", "message", "field"}, error
    assert isinstance(error["code"], str) and error["code"], error
    assert isinstance(error["message"], str) and len(error["message"]) > 5, error
    if field is not None:
        assert error["field"] == field, error
    return error


def produce(client: httpx.Client, name: str, *items: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/api/stations/{name}/messages", json={"messages": list(items)})
    assert r.status_code == 200, r.text
    return r.json()


def view(client: httpx.Client, name: str) -> dict[str, Any]:
    r = client.get(f"/api/stations/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def browse(client: httpx.Client, name: str, **params: str) -> dict[str, Any]:
    r = client.get(f"/api/stations/{name}/messages", params={"offset": "-1", **params})
    assert r.status_code == 200, r.text
    return r.json()


def listed(client: httpx.Client) -> dict[str, dict[str, Any]]:
    r = client.get("/api/stations")
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json()["stations"]}


def config_of(station_view: dict[str, Any]) -> dict[str, Any]:
    return {k: station_view[k] for k in ("name", *DEFAULTS)}


def eventually(check: Callable[[], bool], timeout: float = 6.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(0.05)


# -- create, read, list -----------------------------------------------------------------------


def test_create_fills_in_defaults(client: httpx.Client, name: str) -> None:
    r = client.post("/api/stations", json={"name": name})
    assert r.status_code == 201, r.text
    created = r.json()
    assert config_of(created) == {"name": name, **DEFAULTS}
    assert created["stats"] == {
        "messages": 0,
        "bytes": 0,
        "tailOffset": offset(0),
        "idsInWindow": 0,
        "groups": 0,
        "deadLettered": 0,
    }
    assert created["createdAt"].endswith("Z") and created["createdAt"][:2] == "20"
    assert view(client, name) == created
    assert listed(client)[name] == created


def test_create_is_idempotent_on_the_full_config(client: httpx.Client, name: str) -> None:
    config = {
        "name": name,
        "contentType": "text/plain",
        "idempotencyWindowMs": 5000,
        "retention": {"maxAgeMs": 86_400_000, "maxMessages": None, "maxBytes": 1 << 40},
        "dls": {"poison": False, "forwardTo": "elsewhere/dls", "retentionMs": 1000},
        "consumerDefaults": {"maxAckTimeMs": 100, "maxMsgDeliveries": 1000},
    }
    first = client.post("/api/stations", json=config)
    assert first.status_code == 201, first.text
    assert config_of(first.json()) == config

    again = client.post("/api/stations", json=config)
    assert again.status_code == 200, again.text
    assert again.json()["createdAt"] == first.json()["createdAt"]

    # Compared with the defaults filled in: leaving out a default value is the same config.
    short = {k: v for k, v in config.items() if k != "retention"}
    short["retention"] = {"maxAgeMs": 86_400_000, "maxBytes": 1 << 40}
    assert client.post("/api/stations", json=short).status_code == 200

    for change in (
        {"idempotencyWindowMs": 5001},
        {"contentType": "application/json"},
        {"dls": {"poison": True}},
        {"retention": {"maxMessages": 1}},
    ):
        r = client.post("/api/stations", json={**config, **change})
        assert_error(r, 409)
    assert config_of(view(client, name)) == config


def test_default_config_with_explicit_defaults_is_the_same(
    client: httpx.Client, station: str
) -> None:
    r = client.post("/api/stations", json={"name": station, **DEFAULTS})
    assert r.status_code == 200, r.text


def test_list_holds_every_station(client: httpx.Client) -> None:
    names = [f"list-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for n in names:
        assert client.post("/api/stations", json={"name": n}).status_code == 201
    everything = listed(client)
    for n in names:
        assert config_of(everything[n]) == {"name": n, **DEFAULTS}
        assert set(everything[n]["stats"]) >= STATS


def test_station_created_by_put_appears_with_defaults(client: httpx.Client, name: str) -> None:
    r = client.put(f"/v1/stream/{name}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 201, r.text
    put_view = listed(client)[name]
    assert config_of(put_view) == {"name": name, **DEFAULTS, "contentType": "text/plain"}
    assert view(client, name) == put_view
    # One resource: the management API sees the same station and its data.
    client.post(f"/v1/stream/{name}", headers={"Content-Type": "text/plain"}, content=b"hi")
    assert view(client, name)["stats"]["messages"] == 1
    assert browse(client, name)["messages"][0]["data"] == "hi"
    # Creating it again through the other door with the same settings finds it.
    same = client.post("/api/stations", json={"name": name, "contentType": "text/plain"})
    assert same.status_code == 200, same.text
    other = client.post("/api/stations", json={"name": name, "idempotencyWindowMs": 1000})
    assert_error(other, 409)


def test_station_created_by_api_is_a_stream(client: httpx.Client, name: str) -> None:
    r = client.post(
        "/api/stations",
        json={"name": name, "contentType": "text/plain", "idempotencyWindowMs": 900},
    )
    assert r.status_code == 201
    head = client.head(f"/v1/stream/{name}")
    assert head.status_code == 200
    assert head.headers["Content-Type"].startswith("text/plain")
    # A plain PUT of the same type ensures it (200), keeping the station's settings.
    put = client.put(f"/v1/stream/{name}", headers={"Content-Type": "text/plain"})
    assert put.status_code == 200, put.text
    assert view(client, name)["idempotencyWindowMs"] == 900
    put = client.put(f"/v1/stream/{name}", headers=JSON)
    assert put.status_code == 409


def test_unknown_station_is_404(client: httpx.Client) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    for method, path, body in (
        ("GET", f"/api/stations/{missing}", None),
        ("PATCH", f"/api/stations/{missing}", {"idempotencyWindowMs": 1000}),
        ("DELETE", f"/api/stations/{missing}", None),
        ("GET", f"/api/stations/{missing}/messages", None),
        ("POST", f"/api/stations/{missing}/messages", {"messages": [{"data": 1}]}),
        ("GET", "/api/stations/team%2Fmissing", None),
    ):
        r = client.request(method, path, json=body)
        assert_error(r, 404)
    assert missing not in listed(client)


# -- names with slashes -----------------------------------------------------------------------


def test_names_with_slashes_are_url_encoded(client: httpx.Client) -> None:
    name = f"team-{uuid.uuid4().hex[:6]}/orders/eu"
    encoded = name.replace("/", "%2F")
    r = client.post("/api/stations", json={"name": name})
    assert r.status_code == 201, r.text
    assert view(client, encoded)["name"] == name
    results = produce(client, encoded, {"id": "a", "data": 1})["results"]
    assert results == [{"offset": offset(0), "duplicate": False}]
    assert [m["data"] for m in browse(client, encoded)["messages"]] == [1]
    r = client.patch(f"/api/stations/{encoded}", json={"idempotencyWindowMs": 1000})
    assert r.status_code == 200 and r.json()["name"] == name
    assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == [1]
    assert client.delete(f"/api/stations/{encoded}").status_code == 204
    assert_error(client.get(f"/api/stations/{encoded}"), 404)


def test_a_station_named_like_a_subresource(client: httpx.Client) -> None:
    """``x/messages`` is a station of its own: ``%2F`` keeps it apart from ``x``'s messages."""
    base = f"sub-{uuid.uuid4().hex[:6]}"
    tricky = f"{base}/messages"
    for n in (base, tricky):
        assert client.post("/api/stations", json={"name": n}).status_code == 201
    assert view(client, f"{base}%2Fmessages")["name"] == tricky
    produce(client, f"{base}%2Fmessages", {"data": "tricky"})
    produce(client, base, {"data": "base"})
    assert [m["data"] for m in browse(client, f"{base}%2Fmessages")["messages"]] == ["tricky"]
    assert [m["data"] for m in browse(client, base)["messages"]] == ["base"]
    assert client.delete(f"/api/stations/{base}%2Fmessages").status_code == 204
    assert view(client, base)["stats"]["messages"] == 1


# -- stats ------------------------------------------------------------------------------------


def test_stats_reflect_what_is_stored(client: httpx.Client, station: str) -> None:
    items: list[dict[str, Any]] = [{"id": f"i{n}", "data": {"n": n}} for n in range(4)]
    items += [{"data": [n, "x"]} for n in range(3)]
    items += [{"id": "i0", "data": "duplicate"}]
    body = produce(client, station, *items)
    stored = [json.dumps(i["data"], separators=(",", ":")) for i in items[:7]]
    s = view(client, station)["stats"]
    assert s["messages"] == 7
    assert s["bytes"] == sum(len(d) for d in stored)
    assert s["tailOffset"] == body["nextOffset"] == offset(7)
    assert s["idsInWindow"] == 4
    assert (s["groups"], s["deadLettered"]) == (0, 0)
    assert listed(client)[station]["stats"] == s


def test_headers_and_binary_data_round_trip(client: httpx.Client, name: str) -> None:
    r = client.post("/api/stations", json={"name": name, "contentType": "application/octet-stream"})
    assert r.status_code == 201
    raw = bytes(range(256))
    produce(
        client,
        name,
        {"id": "bin", "dataBase64": base64.b64encode(raw).decode(), "headers": {"k": "v"}},
        {"data": "text"},
    )
    messages = browse(client, name)["messages"]
    assert base64.b64decode(messages[0]["dataBase64"]) == raw
    assert (messages[0]["id"], messages[0]["headers"]) == ("bin", {"k": "v"})
    assert (messages[1]["data"], messages[1]["headers"], messages[1]["id"]) == ("text", {}, None)
    assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).content == raw + b"text"


def test_browse_pages_with_limit(client: httpx.Client, station: str) -> None:
    produce(client, station, *({"data": n} for n in range(5)))
    page = browse(client, station, limit="2")
    assert [m["data"] for m in page["messages"]] == [0, 1]
    assert (page["nextOffset"], page["upToDate"]) == (offset(2), False)
    page = browse(client, station, offset=page["nextOffset"], limit="10")
    assert [m["offset"] for m in page["messages"]] == [offset(2), offset(3), offset(4)]
    assert (page["nextOffset"], page["upToDate"]) == (offset(5), True)
    page = browse(client, station, offset=offset(5))
    assert (page["messages"], page["upToDate"]) == ([], True)


# -- patch ------------------------------------------------------------------------------------


def test_patch_merges_mutable_fields(client: httpx.Client, station: str) -> None:
    r = client.patch(
        f"/api/stations/{station}",
        json={
            "idempotencyWindowMs": 100,
            "retention": {"maxMessages": 10},
            "consumerDefaults": {"maxMsgDeliveries": 5},
        },
    )
    assert r.status_code == 200, r.text
    patched = r.json()
    assert patched["idempotencyWindowMs"] == 100
    assert patched["retention"] == {"maxAgeMs": None, "maxMessages": 10, "maxBytes": None}
    assert patched["consumerDefaults"] == {"maxAckTimeMs": 30000, "maxMsgDeliveries": 5}
    assert patched["dls"] == DEFAULTS["dls"]
    assert set(patched["stats"]) >= STATS
    assert view(client, station) == patched

    r = client.patch(
        f"/api/stations/{station}",
        json={"retention": {"maxMessages": None}, "dls": {"forwardTo": "dead/letters"}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["retention"] == DEFAULTS["retention"]
    assert r.json()["dls"]["forwardTo"] == "dead/letters"
    assert r.json()["idempotencyWindowMs"] == 100
    # The same name and content type may be repeated; an empty patch changes nothing.
    same = client.patch(
        f"/api/stations/{station}", json={"name": station, "contentType": "application/json"}
    )
    assert same.status_code == 200
    assert client.patch(f"/api/stations/{station}", json={}).json() == view(client, station)


def test_patch_cannot_rename_or_retype(client: httpx.Client, station: str) -> None:
    assert_error(client.patch(f"/api/stations/{station}", json={"name": "other"}), 400, "name")
    r = client.patch(f"/api/stations/{station}", json={"contentType": "text/plain"})
    assert_error(r, 400, "contentType")
    assert config_of(view(client, station)) == {"name": station, **DEFAULTS}


def test_rejected_patch_changes_nothing(client: httpx.Client, station: str) -> None:
    r = client.patch(
        f"/api/stations/{station}",
        json={"idempotencyWindowMs": 1000, "consumerDefaults": {"maxMsgDeliveries": 0}},
    )
    assert_error(r, 400, "consumerDefaults.maxMsgDeliveries")
    assert view(client, station)["idempotencyWindowMs"] == DEFAULTS["idempotencyWindowMs"]


# -- delete -----------------------------------------------------------------------------------


def test_delete_removes_the_station_and_its_ids(client: httpx.Client, station: str) -> None:
    produce(client, station, {"id": "a", "data": 1}, {"id": "b", "data": 2})
    assert client.delete(f"/api/stations/{station}").status_code == 204
    assert_error(client.get(f"/api/stations/{station}"), 404)
    assert station not in listed(client)
    assert client.get(f"/v1/stream/{station}", params={"offset": "-1"}).status_code == 404
    assert_error(client.delete(f"/api/stations/{station}"), 404)

    # Re-created, it starts empty and its old ids are unknown.
    assert client.post("/api/stations", json={"name": station}).status_code == 201
    assert view(client, station)["stats"]["idsInWindow"] == 0
    results = produce(client, station, {"id": "b", "data": 3}, {"id": "a", "data": 4})["results"]
    assert results == [
        {"offset": offset(0), "duplicate": False},
        {"offset": offset(1), "duplicate": False},
    ]


def test_delete_removes_groups_and_dead_letters(client: httpx.Client, station: str) -> None:
    base = f"/api/stations/{station}"
    assert client.put(f"{base}/groups/g", json={}).status_code == 201
    produce(client, station, {"id": "a", "data": 1})
    fetched = client.post(f"{base}/groups/g/fetch", json={"max": 1, "waitMs": 1000})
    assert fetched.status_code == 200, fetched.text
    offsets = [m["offset"] for m in fetched.json()["messages"]]
    assert offsets == [offset(0)]
    r = client.post(f"{base}/groups/g/dead-letter", json={"offsets": offsets, "reason": "bad"})
    assert r.status_code == 200, r.text
    s = view(client, station)["stats"]
    assert (s["groups"], s["deadLettered"]) == (1, 1)

    assert client.delete(base).status_code == 204
    assert client.post("/api/stations", json={"name": station}).status_code == 201
    s = view(client, station)["stats"]
    assert (s["groups"], s["deadLettered"], s["messages"]) == (0, 0, 0)
    assert client.get(f"{base}/groups").json()["groups"] == []
    assert client.get(f"{base}/dls").json()["entries"] == []


def test_delete_through_durable_streams_removes_ids(client: httpx.Client, station: str) -> None:
    produce(client, station, {"id": "a", "data": 1})
    assert client.delete(f"/v1/stream/{station}").status_code == 204
    assert_error(client.get(f"/api/stations/{station}"), 404)
    assert client.put(f"/v1/stream/{station}", headers=JSON).status_code == 201
    r = client.post(f"/v1/stream/{station}", headers={**JSON, "Msg-Id": "a"}, content=b"2")
    assert (r.headers["Msg-Duplicate"], r.headers["Msg-Offset"]) == ("false", offset(0))


# -- retention --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retained(client: httpx.Client) -> dict[str, str]:
    """Stations under each retention rule, filled past it, once the scheduler (about every
    second) has enforced them all; the cases below share the one wait."""
    names = {rule: f"ret-{rule}-{uuid.uuid4().hex[:6]}" for rule in ("count", "bytes", "age")}
    rules = {
        "count": {"maxMessages": 2},
        "bytes": {"maxBytes": 10},
        "age": {"maxAgeMs": 200},
    }
    for rule, n in names.items():
        config = {"name": n, "retention": rules[rule], "idempotencyWindowMs": 60000}
        assert client.post("/api/stations", json=config).status_code == 201
    produce(client, names["count"], *({"id": f"m{n}", "data": n} for n in range(6)))
    produce(client, names["bytes"], *({"data": 1000 + n} for n in range(5)))  # 4 bytes each
    produce(client, names["age"], {"id": "old", "data": 1})
    # Retention set later by a PATCH applies as well.
    names["patched"] = f"ret-patched-{uuid.uuid4().hex[:6]}"
    assert client.post("/api/stations", json={"name": names["patched"]}).status_code == 201
    produce(client, names["patched"], *({"data": n} for n in range(4)))
    r = client.patch(f"/api/stations/{names['patched']}", json={"retention": {"maxMessages": 1}})
    assert r.status_code == 200, r.text
    want = {"count": 2, "bytes": 2, "age": 0, "patched": 1}
    eventually(
        lambda: all(view(client, names[k])["stats"]["messages"] == n for k, n in want.items()),
        what="retention on every station",
    )
    return names


def test_retention_max_messages(client: httpx.Client, retained: dict[str, str]) -> None:
    name = retained["count"]
    assert [m["data"] for m in browse(client, name)["messages"]] == [4, 5]
    s = view(client, name)["stats"]
    assert (s["messages"], s["bytes"], s["tailOffset"], s["idsInWindow"]) == (2, 2, offset(6), 6)
    assert client.get(f"/v1/stream/{name}", params={"offset": offset(3)}).status_code == 410
    # Reading from the start begins at the oldest kept message.
    assert client.get(f"/v1/stream/{name}", params={"offset": "-1"}).json() == [4, 5]


def test_retention_max_bytes(client: httpx.Client, retained: dict[str, str]) -> None:
    name = retained["bytes"]
    assert [m["data"] for m in browse(client, name)["messages"]] == [1003, 1004]
    assert view(client, name)["stats"]["bytes"] == 8


def test_retention_max_age(client: httpx.Client, retained: dict[str, str]) -> None:
    name = retained["age"]
    assert browse(client, name)["messages"] == []
    assert view(client, name)["stats"]["tailOffset"] == offset(1)
    assert produce(client, name, {"id": "old", "data": 2})["results"][0] == {
        "offset": offset(0),
        "duplicate": True,
    }
    assert view(client, name)["stats"]["idsInWindow"] == 1


def test_retention_set_by_patch(client: httpx.Client, retained: dict[str, str]) -> None:
    assert [m["data"] for m in browse(client, retained["patched"])["messages"]] == [3]


# -- validation: StationConfig ----------------------------------------------------------------

TOO_LONG = "n" * 513
# (body fragment merged into {"name": <fresh>}, the field the error must name)
BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"idempotencyWindowMs": 99}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": 86_400_001}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": 0}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": -1000}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": "1000"}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": 1000.5}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": True}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": None}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": [1000]}, "idempotencyWindowMs"),
    ({"idempotencyWindowMs": 10**30}, "idempotencyWindowMs"),
    ({"contentType": ""}, "contentType"),
    ({"contentType": "json"}, "contentType"),
    ({"contentType": 7}, "contentType"),
    ({"contentType": "text/plain\nX: y"}, "contentType"),
    ({"contentType": "text/plain\n; x=y"}, "contentType"),
    ({"contentType": "text/plain; x=\u00e9"}, "contentType"),
    ({"contentType": "a/" + "b" * 300}, "contentType"),
    ({"retention": 5}, "retention"),
    ({"retention": []}, "retention"),
    ({"retention": {"maxAgeMs": 0}}, "retention.maxAgeMs"),
    ({"retention": {"maxAgeMs": "1h"}}, "retention.maxAgeMs"),
    ({"retention": {"maxMessages": 0}}, "retention.maxMessages"),
    ({"retention": {"maxMessages": -5}}, "retention.maxMessages"),
    ({"retention": {"maxMessages": 2.5}}, "retention.maxMessages"),
    ({"retention": {"maxBytes": 0}}, "retention.maxBytes"),
    ({"retention": {"maxBytes": False}}, "retention.maxBytes"),
    ({"retention": {"maxBytes": "10"}}, "retention.maxBytes"),
    ({"retention": {"maxCount": 1}}, "retention.maxCount"),
    ({"dls": "on"}, "dls"),
    ({"dls": {"poison": "yes"}}, "dls.poison"),
    ({"dls": {"poison": 1}}, "dls.poison"),
    ({"dls": {"poison": None}}, "dls.poison"),
    ({"dls": {"forwardTo": 5}}, "dls.forwardTo"),
    ({"dls": {"forwardTo": ""}}, "dls.forwardTo"),
    ({"dls": {"forwardTo": "has space"}}, "dls.forwardTo"),
    ({"dls": {"forwardTo": "/lead"}}, "dls.forwardTo"),
    ({"dls": {"forwardTo": "a//b"}}, "dls.forwardTo"),
    ({"dls": {"forwardTo": TOO_LONG}}, "dls.forwardTo"),
    ({"dls": {"retentionMs": 0}}, "dls.retentionMs"),
    ({"dls": {"retentionMs": "1d"}}, "dls.retentionMs"),
    ({"dls": {"station": "x"}}, "dls.station"),
    ({"consumerDefaults": 1}, "consumerDefaults"),
    ({"consumerDefaults": {"maxMsgDeliveries": 0}}, "consumerDefaults.maxMsgDeliveries"),
    ({"consumerDefaults": {"maxMsgDeliveries": 1001}}, "consumerDefaults.maxMsgDeliveries"),
    ({"consumerDefaults": {"maxMsgDeliveries": "2"}}, "consumerDefaults.maxMsgDeliveries"),
    ({"consumerDefaults": {"maxMsgDeliveries": None}}, "consumerDefaults.maxMsgDeliveries"),
    ({"consumerDefaults": {"maxAckTimeMs": 99}}, "consumerDefaults.maxAckTimeMs"),
    ({"consumerDefaults": {"maxAckTimeMs": 43_200_001}}, "consumerDefaults.maxAckTimeMs"),
    ({"consumerDefaults": {"maxAckTimeMs": 1.5e3}}, "consumerDefaults.maxAckTimeMs"),
    ({"consumerDefaults": {"ackWaitMs": 1000}}, "consumerDefaults.ackWaitMs"),
    ({"retentionPolicy": "messages"}, "retentionPolicy"),
    ({"stats": {}}, "stats"),
]
BAD_NAMES: list[Any] = [
    "",
    None,
    5,
    ["a"],
    {"a": 1},
    "has space",
    "/leading",
    "trailing/",
    "double//slash",
    "percent%2Fencoded",
    "question?",
    "hash#",
    "amp&",
    "comma,x",
    "ünïcode",
    "tab\there",
    "line\n",
    "__ds",
    "__ds/internal",
    "a/../b",
    "..",
    "x/.",
    TOO_LONG,
]


def short_id(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)})"


@pytest.mark.parametrize(("fragment", "field"), BAD_CONFIGS, ids=short_id)
def test_bad_config_on_create(
    client: httpx.Client, name: str, fragment: dict[str, Any], field: str
) -> None:
    error = assert_error(client.post("/api/stations", json={"name": name, **fragment}), 400, field)
    assert field.split(".")[-1] in error["message"] or field in error["message"], error
    assert_error(client.get(f"/api/stations/{name}"), 404)


@pytest.mark.parametrize(("fragment", "field"), BAD_CONFIGS, ids=short_id)
def test_bad_config_on_patch(
    client: httpx.Client, untouched: str, fragment: dict[str, Any], field: str
) -> None:
    station = untouched
    # (contentType is fixed at creation: any other value is refused on that field too.)
    assert_error(client.patch(f"/api/stations/{station}", json=fragment), 400, field)
    assert config_of(view(client, station)) == {"name": station, **DEFAULTS}


@pytest.mark.parametrize("bad", BAD_NAMES, ids=short_id)
def test_bad_station_name(client: httpx.Client, bad: Any) -> None:
    assert_error(client.post("/api/stations", json={"name": bad}), 400, "name")


def test_missing_name(client: httpx.Client) -> None:
    assert_error(client.post("/api/stations", json={"idempotencyWindowMs": 1000}), 400, "name")


def test_dls_cannot_forward_to_itself(client: httpx.Client, name: str) -> None:
    r = client.post("/api/stations", json={"name": name, "dls": {"forwardTo": name}})
    assert_error(r, 400, "dls.forwardTo")
    assert client.post("/api/stations", json={"name": name}).status_code == 201
    r = client.patch(f"/api/stations/{name}", json={"dls": {"forwardTo": name}})
    assert_error(r, 400, "dls.forwardTo")


def test_boundary_values_are_accepted(client: httpx.Client) -> None:
    for fragment in (
        {"idempotencyWindowMs": 100},
        {"idempotencyWindowMs": 86_400_000},
        {"consumerDefaults": {"maxMsgDeliveries": 1, "maxAckTimeMs": 100}},
        {"consumerDefaults": {"maxMsgDeliveries": 1000, "maxAckTimeMs": 43_200_000}},
        {"retention": {"maxAgeMs": 1, "maxMessages": 1, "maxBytes": 1}},
        {"dls": {"poison": False, "forwardTo": None, "retentionMs": None}},
        {"retention": None, "dls": None, "consumerDefaults": None},
    ):
        n = f"edge-{uuid.uuid4().hex[:8]}"
        r = client.post("/api/stations", json={"name": n, **fragment})
        assert r.status_code == 201, (fragment, r.text)
    longest = "n" * 512
    r = client.post("/api/stations", json={"name": longest})
    assert r.status_code in (200, 201), r.text


# -- validation: bodies that are not JSON objects ---------------------------------------------

BAD_BODIES: list[bytes] = [
    b"",
    b"nope",
    b"{",
    b'{"name": "x",}',
    b"[]",
    b'"a string"',
    b"42",
    b"null",
    b'{"name": NaN}',
    b'{"name": "x", "idempotencyWindowMs": Infinity}',
    b'{"name": "x", "idempotencyWindowMs": 1e999}',
    b"\xff\xfe{}",
    b'{"name": "\xe9"}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b'{"name": "x", "idempotencyWindowMs": ' + b"9" * 5000 + b"}",
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=short_id)
def test_bad_json_body(client: httpx.Client, untouched: str, body: bytes) -> None:
    station = untouched
    for method, path in (
        ("POST", "/api/stations"),
        ("PATCH", f"/api/stations/{station}"),
        ("POST", f"/api/stations/{station}/messages"),
    ):
        r = client.request(method, path, content=body, headers=JSON)
        assert_error(r, 400)
    assert view(client, station)["stats"]["messages"] == 0


# -- validation: the messages API -------------------------------------------------------------

BAD_MESSAGES: list[tuple[Any, str]] = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": None}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": {"data": 1}}, "messages"),
    ({"messages": [{"data": 1}] * 10_001}, "messages"),
    ({"messages": [{"data": 1}], "extra": 1}, "extra"),
    ({"messages": [1]}, "messages.0"),
    ({"messages": [None]}, "messages.0"),
    ({"messages": [{}]}, "messages.0.data"),
    ({"messages": [{"id": "a"}]}, "messages.0.data"),
    ({"messages": [{"data": 1, "dataBase64": "MQ=="}]}, "messages.0.data"),
    ({"messages": [{"data": 1, "id": 5}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": ""}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": "a b"}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": "tab\t"}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": "new\n"}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": "é"}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": "x" * 257}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "id": ["a"]}]}, "messages.0.id"),
    ({"messages": [{"data": 1, "headers": "k=v"}]}, "messages.0.headers"),
    ({"messages": [{"data": 1, "headers": ["k"]}]}, "messages.0.headers"),
    ({"messages": [{"data": 1, "headers": {"k": 1}}]}, "messages.0.headers"),
    ({"messages": [{"data": 1, "headers": {"k": None}}]}, "messages.0.headers"),
    ({"messages": [{"data": 1, "key": "k"}]}, "messages.0.key"),
    ({"messages": [{"dataBase64": "!!!"}]}, "messages.0.dataBase64"),
    ({"messages": [{"dataBase64": 5}]}, "messages.0.dataBase64"),
    ({"messages": [{"dataBase64": "é"}]}, "messages.0.dataBase64"),
    (
        {"messages": [{"dataBase64": base64.b64encode(b"not json").decode()}]},
        "messages.0.dataBase64",
    ),
    ({"messages": [{"dataBase64": base64.b64encode(b"1 2").decode()}]}, "messages.0.dataBase64"),
    ({"messages": [{"dataBase64": base64.b64encode(b"\xff").decode()}]}, "messages.0.dataBase64"),
    ({"messages": [{"dataBase64": base64.b64encode(b"NaN").decode()}]}, "messages.0.dataBase64"),
    ({"messages": [{"dataBase64": ""}]}, "messages.0.dataBase64"),
    ({"messages": [{"data": 1, "id": "ok"}, {"data": 2, "id": 3}]}, "messages.1.id"),
    ({"messages": [{"data": 1}, {"data": 2}, {"nope": 3}]}, "messages.2.nope"),
    ({"messages": [{"data": 1}, {"data": 2}, {"id": "c"}]}, "messages.2.data"),
]


@pytest.mark.parametrize(("body", "field"), BAD_MESSAGES, ids=short_id)
def test_bad_messages_body(client: httpx.Client, untouched: str, body: Any, field: str) -> None:
    station = untouched
    content = json.dumps(body).encode()
    r = client.post(f"/api/stations/{station}/messages", content=content, headers=JSON)
    assert_error(r, 400, field)
    # Nothing of a rejected request is stored, not even its valid messages.
    s = view(client, station)["stats"]
    assert (s["messages"], s["idsInWindow"], s["tailOffset"]) == (0, 0, offset(0))


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"data": 5}, "messages.0.data"),
        ({"data": {"a": 1}}, "messages.0.data"),
        ({"data": None}, "messages.0.data"),
        ({"data": "\ud800"}, "messages.0.data"),
        ({"dataBase64": "%%%"}, "messages.0.dataBase64"),
    ],
    ids=short_id,
)
def test_bad_messages_for_a_text_station(
    client: httpx.Client, name: str, item: dict[str, Any], field: str
) -> None:
    assert client.post("/api/stations", json={"name": name, "contentType": "text/plain"}).is_success
    content = json.dumps({"messages": [item]}).encode()
    r = client.post(f"/api/stations/{name}/messages", content=content, headers=JSON)
    assert_error(r, 400, field)


def test_deeply_nested_data(client: httpx.Client, station: str) -> None:
    shallow = "[" * 100 + "]" * 100
    deep = "[" * 2500 + "]" * 2500
    r = client.post(
        f"/api/stations/{station}/messages",
        content=f'{{"messages":[{{"data":{shallow}}}]}}'.encode(),
        headers=JSON,
    )
    assert r.status_code == 200, r.text
    r = client.post(
        f"/api/stations/{station}/messages",
        content=f'{{"messages":[{{"data":{deep}}}]}}'.encode(),
        headers=JSON,
    )
    assert_error(r, 400)
    r = client.post(
        f"/api/stations/{station}/messages",
        json={"messages": [{"dataBase64": base64.b64encode(deep.encode()).decode()}]},
    )
    assert_error(r, 400, "messages.0.dataBase64")
    assert view(client, station)["stats"]["messages"] == 1
    assert browse(client, station)["messages"][0]["data"] is not None


def test_json_data_in_base64_is_one_value(client: httpx.Client, station: str) -> None:
    for text in (b' {"a": [1, 2]} ', b"[1,2]", b'"s"'):
        produce(client, station, {"dataBase64": base64.b64encode(text).decode()})
    assert [m["data"] for m in browse(client, station)["messages"]] == [{"a": [1, 2]}, [1, 2], "s"]
    read = client.get(f"/v1/stream/{station}", params={"offset": "-1"})
    assert read.json() == [{"a": [1, 2]}, [1, 2], "s"]


# -- validation: query parameters -------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"offset": "garbage"}, "offset"),
        ({"offset": "now"}, "offset"),
        ({"offset": "-2"}, "offset"),
        ({"offset": "1"}, "offset"),
        ({"offset": "0000000000000000_0000000000000001"}, "offset"),
        ({"offset": "0000000000000000_0000000000000000\n"}, "offset"),
        ({"offset": offset(99)}, "offset"),
        ({"offset": ["-1", "-1"]}, "offset"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"limit": " 5"}, "limit"),
        ({"limit": "5\n"}, "limit"),
        ({"limit": "\u00b2"}, "limit"),
        ({"limit": "\u0665"}, "limit"),
        ({"limit": "9" * 5000}, "limit"),
        ({"limit": ["5", "6"]}, "limit"),
    ],
    ids=short_id,
)
def test_bad_query_params(
    client: httpx.Client, one_message: str, params: dict[str, Any], field: str
) -> None:
    r = client.get(f"/api/stations/{one_message}/messages", params=params)
    assert_error(r, 400, field)


# -- nothing answers 500 ----------------------------------------------------------------------


def test_unknown_routes_and_methods(client: httpx.Client, station: str) -> None:
    for method, path in (
        ("PUT", "/api/stations"),
        ("DELETE", "/api/stations"),
        ("PUT", f"/api/stations/{station}"),
        ("DELETE", f"/api/stations/{station}/messages"),
        ("GET", "/api/nothing-here"),
    ):
        r = client.request(method, path)
        assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
    assert view(client, station)["name"] == station


def test_random_garbage_never_answers_5xx(client: httpx.Client, station: str) -> None:
    rng = random.Random(20261122)
    atoms: list[Any] = [
        None,
        True,
        0,
        -1,
        99,
        100,
        2**63,
        1.5,
        "",
        "x",
        "a/b",
        "\u0000",
        "\ud800",
        [],
        {},
        "2" * 300,
    ]
    keys = [
        "name",
        "contentType",
        "idempotencyWindowMs",
        "retention",
        "dls",
        "consumerDefaults",
        "maxAgeMs",
        "maxMessages",
        "maxBytes",
        "poison",
        "forwardTo",
        "retentionMs",
        "maxAckTimeMs",
        "maxMsgDeliveries",
        "messages",
        "id",
        "data",
        "dataBase64",
        "headers",
        "",
    ]

    def value(depth: int) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.5:
            return rng.choice(atoms)
        if roll < 0.75:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 4))}

    paths = [
        ("POST", "/api/stations"),
        ("PATCH", f"/api/stations/{station}"),
        ("POST", f"/api/stations/{station}/messages"),
    ]
    for _ in range(300):
        method, path = rng.choice(paths)
        body = value(0)
        if rng.random() < 0.5:
            body = {k: value(1) for k in rng.sample(keys, rng.randint(1, 4))}
        r = client.request(method, path, content=json.dumps(body).encode(), headers=JSON)
        assert r.status_code < 500, (method, path, body, r.text)
    for _ in range(100):
        params = {rng.choice(["offset", "limit"]): rng.choice(["-1", "0", "x", "1e3", "%"])}
        r = client.get(f"/api/stations/{station}/messages", params=params)
        assert r.status_code < 500, (params, r.text)
