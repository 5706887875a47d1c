"""Station scopes that hold (CONTRACT.md §5, issue 11): every route class × role × scope, and the
ways a request could name a station outside its path (a create body, a fork source, a
``dls.forwardTo`` target, a station whose encoded name looks like another route). One SQLite
server with six tokens serves the module."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import Server

ROLES = ("admin", "producer", "consumer")
# Each role unscoped ("all") and limited to the stations matching a* ("a*").
SCOPES = ("all", "a*")
TOKENS = {
    (role, scope): f"{role}-{'all' if scope == 'all' else 'a'}-secret"
    for role in ROLES
    for scope in SCOPES
}
MAY = {
    "admin": {"admin", "produce", "consume", "read"},
    "producer": {"produce", "read"},
    "consumer": {"consume", "read"},
}
OFFSET0 = "0000000000000000_0000000000000000"
IN, OUT = "a1", "b1"


def bearer(role: str, scope: str = "all") -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[(role, scope)]}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir: Path = tmp_path_factory.mktemp("auth-matrix")
    entries = []
    for (role, scope), secret in TOKENS.items():
        entry: dict[str, Any] = {"token": secret, "role": role}
        if scope != "all":
            entry["stations"] = [scope]
        entries.append(entry)
    tokens = workdir / "tokens.json"
    tokens.write_text(json.dumps({"tokens": entries}))
    url = f"sqlite:///{workdir / 'stations-data' / 'stations.db'}"
    server = Server(url, workdir, ["--tokens", str(tokens), "--long-poll-timeout-ms", "200"])
    server.start()
    with httpx.Client(base_url=server.url, headers=bearer("admin"), timeout=10) as admin:
        for name in (IN, OUT):
            assert admin.post("/api/stations", json={"name": name}).status_code == 201
            body = {"messages": [{"id": "m1", "data": {"n": 1}}]}
            assert admin.post(f"/api/stations/{name}/messages", json=body).status_code == 200
            assert admin.put(f"/api/stations/{name}/groups/g", json={}).status_code == 201
        # Stations whose names hold "/groups/", each with one DLS entry.
        for name in ("a1/groups/y", "b1/groups/y"):
            _station_with_dls_entry(admin, name)
    try:
        yield server
    finally:
        server.kill()


def _station_with_dls_entry(admin: httpx.Client, name: str) -> None:
    enc = name.replace("/", "%2F")
    assert admin.post("/api/stations", json={"name": name}).status_code == 201
    group = {"maxMsgDeliveries": 1}
    assert admin.put(f"/api/stations/{enc}/groups/g", json=group).status_code == 201
    assert admin.post(f"/api/stations/{enc}/messages", json={"messages": [{"data": 1}]}).is_success
    got = admin.post(f"/api/stations/{enc}/groups/g/fetch", json={"max": 1}).json()["messages"]
    offsets = [m["offset"] for m in got]
    assert admin.post(f"/api/stations/{enc}/groups/g/nack", json={"offsets": offsets}).is_success
    assert len(admin.get(f"/api/stations/{enc}/dls").json()["entries"]) == 1


@pytest.fixture(scope="module")
def http(srv: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def call(
    http: httpx.Client,
    role: str,
    scope: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    h = {"Content-Type": "application/json", **bearer(role, scope), **(headers or {})}
    content = None if body is None else json.dumps(body).encode()
    return http.request(method, path, headers=h, content=content)


# (route class, method, path, body) with {s} for the station. Paths that do not exist answer
# 404 once auth has let them through: "allowed" is anything but 401 / 403 (and never a 5xx).
ROUTES: list[tuple[str, str, str, Any]] = [
    ("admin", "POST", "/api/stations", {"name": "{s}-new"}),
    ("admin", "PATCH", "/api/stations/{s}", {"idempotencyWindowMs": 120000}),
    ("admin", "DELETE", "/api/stations/{s}-gone", None),
    ("admin", "PUT", "/v1/stream/{s}-ds", None),
    ("admin", "DELETE", "/v1/stream/{s}-gone", None),
    ("admin", "POST", "/api/stations/{s}/dls/replay", {"ids": ["999999"]}),
    ("admin", "POST", "/api/stations/{s}/dls/drop", {"ids": ["999999"]}),
    ("admin", "DELETE", "/api/stations/{s}/groups/gone", None),
    ("produce", "POST", "/v1/stream/{s}", [{"n": 2}]),
    ("produce", "POST", "/api/stations/{s}/messages", {"messages": [{"data": 1}]}),
    ("consume", "GET", "/v1/stream/{s}?offset=-1", None),
    ("read", "HEAD", "/v1/stream/{s}", None),
    ("consume", "GET", "/api/stations/{s}/messages?offset=-1", None),
    ("consume", "PUT", "/api/stations/{s}/groups/g", {}),
    ("consume", "POST", "/api/stations/{s}/groups/g/fetch", {"max": 1}),
    ("consume", "POST", "/api/stations/{s}/groups/g/ack", {"offsets": [OFFSET0]}),
    ("consume", "POST", "/api/stations/{s}/groups/g/nack", {"offsets": [OFFSET0]}),
    ("consume", "POST", "/api/stations/{s}/groups/g/extend", {"offsets": [OFFSET0]}),
    ("consume", "POST", "/api/stations/{s}/groups/g/dead-letter", {"offsets": [OFFSET0]}),
    ("consume", "GET", "/api/stations/{s}/groups", None),
    ("consume", "GET", "/api/stations/{s}/dls", None),
    ("read", "GET", "/api/stations/{s}", None),
    ("read", "HEAD", "/api/stations/{s}", None),
    ("read", "GET", "/api/stations", None),
    ("read-all", "GET", "/metrics", None),  # per-station figures: unscoped tokens only
    # Durable Streams subscriptions (their wake-token routes and the JWKS are open).
    ("admin", "PUT", "/v1/stream/__ds/subscriptions/x1", {}),
    ("read", "GET", "/v1/stream/__ds/subscriptions/x1", None),
    ("admin", "DELETE", "/v1/stream/__ds/subscriptions/x1", None),
    ("admin", "POST", "/v1/stream/__ds/subscriptions/x1/streams", {"streams": []}),
    ("admin", "DELETE", "/v1/stream/__ds/subscriptions/x1/streams/a1", None),
    ("consume", "POST", "/v1/stream/__ds/subscriptions/x1/claim", {"worker": "w"}),
    ("consume", "POST", "/api/stations/{s}/groups/g/seek", {"to": "earliest"}),
    ("read", "GET", "/api/stations/{s}/cursors", None),
    ("read", "GET", "/api/stations/{s}/cursors/c1", None),
    ("consume", "PUT", "/api/stations/{s}/cursors/c1", {"offset": OFFSET0}),
    ("admin", "DELETE", "/api/stations/{s}/cursors/gone", None),
    ("read", "GET", "/api/stations/{s}/offsets?time=0", None),
    # A transaction is checked item by item: the role and scope of each station it names.
    ("produce", "POST", "/api/transactions", {"produce": [{"station": "{s}", "data": 1}]}),
    (
        "consume",
        "POST",
        "/api/transactions",
        {"ack": [{"station": "{s}", "group": "g", "offset": OFFSET0}]},
    ),
    ("read", "GET", "/api/openapi.yaml", None),
]


def _fill(template: Any, station: str) -> Any:
    if isinstance(template, str):
        return template.replace("{s}", station)
    if isinstance(template, dict):
        return {k: _fill(v, station) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, station) for v in template]
    return template


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("klass", "method", "path", "body"),
    ROUTES,
    ids=[f"{m} {p.split('?')[0]}" for _, m, p, _ in ROUTES],
)
def test_route_class_role_scope(
    http: httpx.Client, klass: str, method: str, path: str, body: Any, role: str, scope: str
) -> None:
    """Allowed iff the role may do the route's class and the scope covers the station."""
    for station in (IN, OUT):
        names_station = "{s}" in path or "{s}" in json.dumps(body)
        covered = scope == "all" or station == IN or not names_station
        needed = klass
        if klass == "read-all":
            needed, covered = "read", scope == "all"
        response = call(http, role, scope, method, _fill(path, station), _fill(body, station))
        assert response.status_code < 500, response.text
        if needed in MAY[role] and covered:
            assert response.status_code not in (401, 403), (role, scope, station, response.text)
        else:
            assert response.status_code == 403, (role, scope, method, path, station)
            if method != "HEAD":
                assert response.json()["error"]["code"] == "forbidden"


def test_every_served_route_is_in_the_matrix_and_has_a_class() -> None:
    """A new route must say what class it is (else it is admin-only) and join this matrix."""
    from stations.api import auth, make_app
    from stations.domain.service import Service

    app = make_app(Service("sqlite:///:memory:"))
    pattern = set()
    for _, method, path, _ in ROUTES:
        path = re.sub(r"\{s\}[^/?]*", "{name}", path.split("?")[0])
        path = re.sub(r"/groups/[^/]+", "/groups/{group}", path)
        path = re.sub(r"/subscriptions/[^/]+", "/subscriptions/{id}", path)
        path = re.sub(r"/cursors/[^/]+", "/cursors/{cursor}", path)
        pattern.add((method, re.sub(r"/streams/[^/]+$", "/streams/{path}", path)))
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or info.get("prefix") or ""
        if path in ("/", "/ui", "/ui/") or path.startswith("/ui"):
            continue
        path = re.sub(r"\{(\w+)(:[^}]*(\{[^}]*\})?[^}]*)?\}", r"{\1}", path)
        assert auth.class_of(route.handler) is not None, f"{route.method} {path} has no class"
        if auth.class_of(route.handler) == "open":
            continue  # the health probes: tested below
        if route.method == "*":
            continue  # the catch-all under /v1/stream/__ds/: 404 whoever asks
        if route.method == "HEAD" and not path.startswith("/v1/"):
            continue
        assert (route.method, path) in pattern, f"{route.method} {path} is not in ROUTES"


def test_open_paths_need_no_token(http: httpx.Client) -> None:
    for probe in ("/healthz", "/livez", "/readyz"):
        assert http.get(probe).status_code == 200, probe
    assert http.get("/api/stations").status_code == 401
    assert http.get("/nowhere").status_code == 401  # unmatched paths still need a token


# -- the four escapes of issue 11, and their kin ------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [f"/v1/stream/{OUT}", OUT, f"/{OUT}", "/v1/stream/b%31", f"/v1/stream/{OUT}?offset=-1"],
)
def test_fork_of_a_station_outside_the_scope(http: httpx.Client, source: str) -> None:
    headers = {"Stream-Forked-From": source, "Content-Type": "application/json"}
    response = call(http, "admin", "a*", "PUT", "/v1/stream/a-fork", headers=headers)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["field"] == "Stream-Forked-From"
    # Nothing was made: the scoped consumer cannot read b1 through a fork.
    assert call(http, "consumer", "a*", "GET", "/v1/stream/a-fork?offset=-1").status_code == 404
    # A fork inside the scope is still allowed.
    headers["Stream-Forked-From"] = f"/v1/stream/{IN}"
    ok = call(http, "admin", "a*", "PUT", "/v1/stream/a-fork-ok", headers=headers)
    assert ok.status_code in (200, 201), ok.text


@pytest.mark.parametrize("name", ["b-new", "b1", "zz/a1"])
def test_create_body_names_a_station_outside_the_scope(http: httpx.Client, name: str) -> None:
    response = call(http, "admin", "a*", "POST", "/api/stations", {"name": name})
    assert response.status_code == 403, response.text
    assert response.json()["error"]["field"] == "name"
    existed = name == OUT
    view = call(http, "admin", "all", "GET", f"/api/stations/{name.replace('/', '%2F')}")
    assert view.status_code == (200 if existed else 404)


def test_forward_to_outside_the_scope_on_create_and_patch(http: httpx.Client) -> None:
    body = {"name": "a-fw", "dls": {"forwardTo": OUT}}
    response = call(http, "admin", "a*", "POST", "/api/stations", body)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["field"] == "dls.forwardTo"
    assert call(http, "admin", "all", "GET", "/api/stations/a-fw").status_code == 404

    patch = {"dls": {"forwardTo": OUT}}
    response = call(http, "admin", "a*", "PATCH", f"/api/stations/{IN}", patch)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["field"] == "dls.forwardTo"
    view = call(http, "admin", "all", "GET", f"/api/stations/{IN}").json()
    assert view["dls"]["forwardTo"] is None

    # Inside the scope both work.
    body["dls"]["forwardTo"] = IN
    assert call(http, "admin", "a*", "POST", "/api/stations", body).status_code == 201
    patch["dls"]["forwardTo"] = "a-fw"
    assert call(http, "admin", "a*", "PATCH", f"/api/stations/{IN}", patch).status_code == 200
    patch["dls"]["forwardTo"] = None
    assert call(http, "admin", "a*", "PATCH", f"/api/stations/{IN}", patch).status_code == 200


@pytest.mark.parametrize(("scope", "name"), [("all", "b1/groups/y"), ("a*", "a1/groups/y")])
@pytest.mark.parametrize("action", ["replay", "drop"])
def test_encoded_station_name_does_not_change_the_route_class(
    http: httpx.Client, scope: str, name: str, action: str
) -> None:
    """``b1%2Fgroups%2Fy/dls/replay`` is a DLS replay (admin) on station ``b1/groups/y``, not
    group work on station ``b1``."""
    enc = name.replace("/", "%2F")
    body = {"all": True}
    response = call(http, "consumer", scope, "POST", f"/api/stations/{enc}/dls/{action}", body)
    assert response.status_code == 403, response.text
    entries = call(http, "admin", "all", "GET", f"/api/stations/{enc}/dls").json()["entries"]
    assert len(entries) == 1
    # The consumer still does consumer work on that station.
    listed = call(http, "consumer", scope, "GET", f"/api/stations/{enc}/dls")
    assert listed.status_code == 200


def test_scope_is_matched_on_names_not_path_text(http: httpx.Client) -> None:
    """A path naming an in-scope station by text but another by the router's match."""
    # "a1/../b1" is one (nonexistent, invalid) name, not b1: never resolves to b1's data.
    response = call(http, "consumer", "a*", "GET", "/api/stations/a1%2F..%2Fb1/messages")
    assert response.status_code in (400, 403, 404)
    # b1 with a trailing encoded slash is not a1.
    response = call(http, "consumer", "a*", "GET", "/v1/stream/b1%2F?offset=-1")
    assert response.status_code == 403


def test_requests_that_may_forward_dead_letters_need_the_target_in_scope(
    http: httpx.Client,
) -> None:
    """A station that an unscoped admin set to forward its dead letters to b1: a fetch (which
    settles expired leases), nack or dead-letter by an a* consumer could write into b1."""
    name = "a-forwards"
    body = {"name": name, "dls": {"forwardTo": OUT}, "consumerDefaults": {"maxMsgDeliveries": 1}}
    assert call(http, "admin", "all", "POST", "/api/stations", body).status_code == 201
    assert call(http, "admin", "all", "PUT", f"/api/stations/{name}/groups/g", {}).is_success
    produced = {"messages": [{"data": 1}]}
    assert call(http, "admin", "all", "POST", f"/api/stations/{name}/messages", produced).is_success
    before = call(http, "admin", "all", "GET", f"/api/stations/{OUT}").json()["stats"]["messages"]

    group = f"/api/stations/{name}/groups/g"
    response = call(http, "consumer", "a*", "POST", f"{group}/fetch", {"max": 1})
    assert response.status_code == 403, response.text
    assert response.json()["error"]["field"] == "dls.forwardTo"
    got = call(http, "consumer", "all", "POST", f"{group}/fetch", {"max": 1}).json()["messages"]
    offsets = [m["offset"] for m in got]
    assert len(offsets) == 1
    for verb in ("nack", "dead-letter"):
        response = call(http, "consumer", "a*", "POST", f"{group}/{verb}", {"offsets": offsets})
        assert response.status_code == 403, (verb, response.text)
    # Nothing reached b1 through the scoped token; ack (which forwards nothing) is allowed.
    after = call(http, "admin", "all", "GET", f"/api/stations/{OUT}").json()["stats"]["messages"]
    assert after == before
    response = call(http, "consumer", "a*", "POST", f"{group}/ack", {"offsets": offsets})
    assert response.json() == {"acked": 1, "unknown": []}
