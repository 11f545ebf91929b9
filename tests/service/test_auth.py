"""Operator token on /v1, per-job tokens on worker routes, no open listening beyond loopback."""

import subprocess
import sys

import httpx
import pytest
from support.api import SMALLEST_SPEC, report, submit, telemetry
from support.servers import REPO_ROOT

from coordinator.app import create_app
from coordinator.auth import InsecureBindError
from coordinator.settings import Settings

TOKEN = "s3cret-operator-token"
UNAUTHORIZED = {"detail": "missing or wrong bearer token"}


@pytest.fixture
def guarded(start_coordinator):
    return start_coordinator(token=TOKEN)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": TOKEN}])
def test_v1_needs_the_operator_token(guarded, headers):
    for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/0123456789ab"),
                         ("PUT", "/v1/jobs/0123456789ab/policy"), ("GET", "/v1/jobs/0123456789ab/events")]:
        response = httpx.request(method, f"{guarded.url}{path}", headers=headers, json=SMALLEST_SPEC)
        assert response.status_code == 401, (method, path)
        assert response.json() == UNAUTHORIZED
        assert response.headers["www-authenticate"] == "Bearer"
    # refused before validation: nothing stored
    assert httpx.get(f"{guarded.url}/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json() == []


def test_operator_token_opens_v1_and_health_metrics_page_stay_open(guarded):
    job = submit(guarded.url, token=TOKEN)
    listed = httpx.get(f"{guarded.url}/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert [j["id"] for j in listed] == [job["id"]]
    # EventSource cannot send headers: the stream also takes ?access_token=
    with httpx.stream("GET", f"{guarded.url}/v1/jobs/{job['id']}/events", params={"access_token": TOKEN}) as r:
        assert r.status_code == 200
    for path in ("/healthz", "/metrics", "/"):
        assert httpx.get(f"{guarded.url}{path}").status_code == 200


def test_worker_routes_take_only_that_jobs_token(guarded):
    first = submit(guarded.url, token=TOKEN)
    second = submit(guarded.url, token=TOKEN)
    url = f"{guarded.url}/v1/jobs/{first['id']}"
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {second['worker_token']}"}):
        assert httpx.post(f"{url}/telemetry", json=telemetry(1), headers=headers).status_code == 401
        response = httpx.get(f"{url}/decision", headers=headers)
        assert response.status_code == 401
        assert response.json() == {"detail": "missing or wrong job token"}
    assert report(guarded.url, first, 1).status_code == 200
    decision = httpx.get(f"{url}/decision", headers={"Authorization": f"Bearer {first['worker_token']}"})
    assert decision.status_code == 200 and decision.json()["version"] == 0


def test_worker_token_does_not_open_operator_routes(guarded):
    job = submit(guarded.url, token=TOKEN)
    response = httpx.get(f"{guarded.url}/v1/jobs", headers={"Authorization": f"Bearer {job['worker_token']}"})
    assert response.status_code == 401


def test_without_operator_token_worker_routes_still_need_the_job_token(coordinator):
    job = submit(coordinator.url)
    assert httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}/decision").status_code == 401


def test_app_refuses_a_public_address_without_a_token(tmp_path):
    with pytest.raises(InsecureBindError, match="refusing to listen on '0.0.0.0' without a token"):
        create_app(Settings(host="0.0.0.0", launcher="none", data_dir=tmp_path))
    create_app(Settings(host="0.0.0.0", token=TOKEN, launcher="none", data_dir=tmp_path))  # with one: fine
    create_app(Settings(host="::1", launcher="none", data_dir=tmp_path / "other"))  # loopback: fine


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "GRADWIRE_DATA_DIR": str(tmp_path), "GRADWIRE_LAUNCHER": "none"}
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "refusing to listen on '0.0.0.0' without a token" in " ".join(result.stderr.split())
