"""Schemathesis against the served OpenAPI document: generated requests, with and without an
operator token, must get no 5xx and no answer the document does not describe (status code,
content type, body schema, auth). Half of the cases aimed at one job are pointed at a real job
with its real worker token, so the handlers behind the 404 are fuzzed too (telemetry above all).

Bounded: ``EXAMPLES`` cases per operation and variant (a few minutes on a busy 2-core box).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from support.api import SMALLEST_SPEC

pytestmark = pytest.mark.slow

TOKEN = "schemathesis-operator-token"
#: What the document must get right. Not ``positive_data_acceptance``: a JSON schema cannot
#: state the spec's cross-field rules (steps xor epochs, min_rank <= max_rank, a rank that
#: fits the compressor...), so a schema-valid body may rightly get a 422 naming the rule.
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.response_headers_conformance,
          checks.negative_data_rejection, checks.ignored_auth]
EXAMPLES = 150


class Target:
    def __init__(self, url: str, token: str | None, job: dict[str, Any]) -> None:
        self.url, self.token, self.job = url, token, job


@pytest.fixture(params=[None, TOKEN], ids=["no-token", "token"])
def target(request: pytest.FixtureRequest, start_coordinator: Any) -> Iterator[Target]:
    token = request.param
    coordinator = start_coordinator(token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    job = httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "steps": 10_000_000},
                     headers=headers).json()
    yield Target(coordinator.url, token, job)


def _aim(case: Any, target: Target) -> None:
    """Point about half the cases at the real job; give each route the credential it takes."""
    params = case.path_parameters or {}
    real = "job_id" in params and not case.path.endswith("/events") and \
        hashlib.sha1(repr(case.body).encode() + case.path.encode()).digest()[0] % 2 == 0
    if real:
        params["job_id"] = target.job["id"]
    worker_route = case.path.endswith(("/telemetry", "/decision"))
    secret = target.job["worker_token"] if worker_route else target.token
    if secret:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {secret}"}


def test_the_api_matches_its_document_and_never_errs(target: Target) -> None:
    # One hypothesis run per operation (schemathesis.pytest's lazy fixture does not work with
    # this pytest version, so the strategies are driven here).
    api = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    calls = {"n": 0}
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: Any) -> None:
            _aim(case, target)
            calls["n"] += 1
            case.call_and_validate(base_url=target.url, timeout=30, checks=CHECKS)

        run()
    print(f"schemathesis: {calls['n']} requests")
    assert calls["n"] >= EXAMPLES  # the campaign did run
