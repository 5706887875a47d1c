"""The OpenAPI document is valid, and a bounded schema-driven fuzz run over it against a live
server gets no server error (issue 11)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from openapi_spec_validator import OpenAPIV31SpecValidator
from schemathesis.checks import not_a_server_error

from tests.harness import Server
from tests.module_server import module_server

SPEC = Path(__file__).parent.parent / "stations" / "api" / "openapi.yaml"
EXAMPLES = 15  # per operation: the whole run stays well under two minutes


def _document() -> dict[str, Any]:
    return yaml.safe_load(SPEC.read_text())


def test_openapi_document_is_valid() -> None:
    errors = [str(e).splitlines()[0] for e in OpenAPIV31SpecValidator(_document()).iter_errors()]
    assert errors == []


def _fuzzable() -> dict[str, Any]:
    """The document with fetch waits capped at 100 ms: a generated fetch of a group that
    happens to exist would otherwise wait up to five minutes."""
    doc = copy.deepcopy(_document())
    fetch = doc["paths"]["/api/stations/{name}/groups/{group}/fetch"]["post"]
    body = fetch["requestBody"]["content"]["application/json"]["schema"]
    body["properties"]["waitMs"]["maximum"] = 100
    return doc


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_server("sqlite", tmp_path_factory, "--long-poll-timeout-ms", "200")


@pytest.fixture(scope="module")
def api_schema(srv: Server) -> Any:
    # The service routes take no input: nothing to fuzz, and a health probe's 503 under a
    # loaded machine would be no bug.
    return schemathesis.openapi.from_dict(_fuzzable()).exclude(tag="service")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_fuzz_no_server_errors(case: Any, srv: Server) -> None:
    response = case.call(base_url=srv.url, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])
