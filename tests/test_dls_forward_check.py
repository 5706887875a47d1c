"""A ``dls.forwardTo`` naming a station of another content type is refused when it is set (a
review of 2026-11-29): the copies of dead letters could never be appended there, and only a
line in the server's log said so, while the create or PATCH was answered 200."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Server
from tests.module_server import ENGINES, module_server


@pytest.fixture(scope="module", params=ENGINES)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from module_server(request.param, tmp_path_factory)


def test_a_forward_target_of_another_content_type_is_refused(srv: Server) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        made = http.post("/api/stations", json={"name": "fwtext", "contentType": "text/plain"})
        assert made.status_code == 201, made.text
        refused = http.post("/api/stations", json={"name": "fwa", "dls": {"forwardTo": "fwtext"}})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["field"] == "dls.forwardTo"
        # A target not there yet may be made later; one of the same type is taken.
        later = http.post("/api/stations", json={"name": "fwa", "dls": {"forwardTo": "fwlater"}})
        assert later.status_code == 201, later.text
        patched = http.patch("/api/stations/fwa", json={"dls": {"forwardTo": "fwtext"}})
        assert patched.status_code == 400, patched.text
        assert patched.json()["error"]["field"] == "dls.forwardTo"
        shown = http.get("/api/stations/fwa").json()
        assert shown["dls"]["forwardTo"] == "fwlater"  # the refused PATCH changed nothing
