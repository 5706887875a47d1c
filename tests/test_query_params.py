"""A management route refuses a query parameter it does not take with a 400 naming it: a typo
answered as if the parameter were absent read the wrong page (``?limt=``) or from the start
(``?ofset=``) without a word. What each route takes is what ``openapi.yaml`` documents."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from stations.api import params
from tests.harness import Server
from tests.module_server import module_server

STATION = "qp"
GROUP = "g"
CURSOR = "c"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    for server in module_server("sqlite", tmp_path_factory):
        assert isinstance(server, Server)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.post("/api/stations", json={"name": STATION}).status_code == 201
            produced = client.post(
                f"/api/stations/{STATION}/messages",
                json={"messages": [{"data": {"n": n}} for n in range(5)]},
            )
            assert produced.status_code == 200, produced.text
            assert client.put(f"/api/stations/{STATION}/groups/{GROUP}", json={}).status_code == 201
            yield client


def _path(template: str) -> str:
    return template.replace("{name}", STATION).replace("{group}", GROUP).replace("{cursor}", CURSOR)


OPERATIONS = sorted(params.table())


@pytest.mark.parametrize(("method", "template"), OPERATIONS)
def test_every_route_refuses_a_parameter_it_does_not_take(
    http: httpx.Client, method: str, template: str
) -> None:
    answer = http.request(method, _path(template), params={"bogus": "1"}, json={})
    assert answer.status_code == 400, (method, template, answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["field"] == "bogus", error
    assert error["message"].startswith("unknown query parameter 'bogus' (this route takes"), error


def test_typos_are_refused_not_read_as_absent(http: httpx.Client) -> None:
    base = f"/api/stations/{STATION}"
    ofset = http.get(f"{base}/messages", params={"ofset": "0000000000000003_0000000000000000"})
    assert ofset.status_code == 400 and ofset.json()["error"]["field"] == "ofset", ofset.text
    assert "(this route takes: limit, offset)" in ofset.json()["error"]["message"]
    limt = http.get("/api/stations", params={"limt": "1"})
    assert limt.status_code == 400 and limt.json()["error"]["field"] == "limt", limt.text
    # nothing was deleted by a DELETE whose precondition was misspelt
    gone = http.delete(f"{base}/groups/{GROUP}", params={"createdat": "x"})
    assert gone.status_code == 400, gone.text
    assert http.get(f"{base}/groups").json()["groups"][0]["name"] == GROUP


def test_documented_parameters_still_work(http: httpx.Client) -> None:
    base = f"/api/stations/{STATION}"
    page = http.get(f"{base}/messages", params={"offset": "-1", "limit": "2"})
    assert page.status_code == 200 and len(page.json()["messages"]) == 2, page.text
    listed = http.get("/api/stations", params={"limit": "1", "prefix": "q", "contains": "p"})
    assert listed.status_code == 200, listed.text
    assert [s["name"] for s in listed.json()["stations"]] == [STATION]
    dls = http.get(f"{base}/dls", params={"group": GROUP, "limit": "5"})
    assert dls.status_code == 200, dls.text
    at = http.get(f"{base}/offsets", params={"time": "0"})
    assert at.status_code == 200, at.text
    # HEAD is checked as its GET, and routes outside /api/ are left to their protocol
    assert http.head(f"{base}/messages", params={"offset": "-1"}).status_code == 200
    assert http.get(f"/v1/stream/{STATION}", params={"offset": "-1", "_": "1"}).status_code == 200


def test_the_table_holds_what_the_handlers_read() -> None:
    table = params.table()
    assert table["GET", "/api/stations/{name}/messages"] == {"offset", "limit"}
    assert table["GET", "/api/stations"] == {"limit", "after", "prefix", "contains"}
    assert table["GET", "/api/stations/{name}/dls"] == {"group", "limit", "after"}
    assert table["GET", "/api/stations/{name}/offsets"] == {"time"}
    assert not any(path.startswith("/v1/") for _, path in table)


def test_the_document_says_every_route_may_answer_400() -> None:
    """An undocumented parameter is a 400 on every route: the document lists that answer."""
    import yaml

    spec = yaml.safe_load(params.SPEC.read_text())
    missing = [
        (method, path)
        for method, path in params.table()
        if "400" not in spec["paths"][path][method.lower()]["responses"]
    ]
    assert not missing, missing
