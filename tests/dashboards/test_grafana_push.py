"""``gradwire dashboards push`` against a real HTTP server speaking Grafana's documented API
(``fake_grafana``; no Grafana server can run here).

The command runs as a subprocess in an environment of its own, ``.gradwire/venv-grafana``:
grafana-client brings urllib3-future, which replaces urllib3 in whatever environment it is
installed in, so it must never enter the main ``.venv`` (a test below guards that). The
environment is created once and reused; if pip cannot install into it, the tests skip and
say why.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_grafana import FakeGrafana, GrafanaState
from grafana_model import DASHBOARD_JSON, REPO_ROOT

from coordinator.raylocal import free_port

GRAFANA_VENV = REPO_ROOT / ".gradwire" / "venv-grafana"
#: What `gradwire dashboards push` imports in that environment (the CLI's own imports included).
VENV_PACKAGES = ["grafana-client", "typer", "rich", "pydantic", "pydantic-settings", "httpx", "pyyaml"]
READY_MARK = GRAFANA_VENV / ".gradwire-ready"
TOKEN = "glsa_test_admin_token"
VIEWER_TOKEN = "glsa_test_viewer_token"
PROMETHEUS_URL = "http://prometheus:9090"


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def grafana_python() -> Path:
    """The Python of ``.gradwire/venv-grafana`` (created on first use, then reused)."""
    python = GRAFANA_VENV / "bin" / "python"
    if READY_MARK.exists() and python.exists():
        return python
    shutil.rmtree(GRAFANA_VENV, ignore_errors=True)
    GRAFANA_VENV.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(GRAFANA_VENV)], capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot create {GRAFANA_VENV}: {made.stderr.strip()[-500:]}")
    for args in (VENV_PACKAGES, ["--no-deps", "-e", str(REPO_ROOT)]):
        installed = _pip(python, *args)
        if installed.returncode != 0:
            pytest.skip(f"pip cannot install {' '.join(args)} into {GRAFANA_VENV}: "
                        f"{(installed.stderr or installed.stdout).strip()[-500:]}")
    READY_MARK.write_text("grafana-client environment for tests/dashboards/test_grafana_push.py\n")
    return python


def _push(python: Path, grafana_url: str, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAFANA_", "GRADWIRE_"))}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(python), "-m", "coordinator.cli", "dashboards", "push", "--grafana-url", grafana_url,
         "--token", token, "--prometheus-url", PROMETHEUS_URL, *extra],
        capture_output=True, text=True, timeout=120, env=env, cwd=Path(python).parents[1])


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_main_environment_has_no_urllib3_future():
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("urllib3-future")


def test_push_creates_then_updates_without_duplicates(grafana_python):
    state = GrafanaState(admin_tokens={TOKEN})
    with FakeGrafana(state) as grafana:
        first = _push(grafana_python, grafana.url, TOKEN)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "datasource gradwire-prometheus: created" in first.stdout
        assert f"{grafana.url}/d/gradwire/gradwire (version 1)" in _one_line(first.stdout)

        second = _push(grafana_python, grafana.url, TOKEN)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "datasource gradwire-prometheus: updated" in second.stdout
        assert "(version 2)" in second.stdout

    # One datasource and one dashboard, both updated in place.
    assert list(state.datasources) == ["gradwire-prometheus"]
    datasource = state.datasources["gradwire-prometheus"]
    assert datasource["type"] == "prometheus" and datasource["url"] == PROMETHEUS_URL
    assert datasource["access"] == "proxy" and datasource["isDefault"] is False
    assert datasource["jsonData"]["timeInterval"] == "5s"
    assert list(state.dashboards) == ["gradwire"] and state.dashboards["gradwire"]["version"] == 2
    committed = json.loads(DASHBOARD_JSON.read_text())
    assert state.dashboards["gradwire"]["dashboard"] == {**committed, "id": None}

    writes = [(r.method, r.path.split("?")[0]) for r in state.requests if r.method != "GET"]
    assert writes == [("POST", "/api/datasources"), ("POST", "/api/dashboards/db"),
                      ("PUT", "/api/datasources/uid/gradwire-prometheus"), ("POST", "/api/dashboards/db")]
    dashboard_posts = [r.body for r in state.requests if r.path == "/api/dashboards/db"]
    assert all(body["overwrite"] is True for body in dashboard_posts)
    for request in state.requests:
        if request.path != "/api/health":
            assert request.headers.get("Authorization") == f"Bearer {TOKEN}", request


def test_bad_token_is_a_clear_error(grafana_python):
    state = GrafanaState(admin_tokens={TOKEN})
    with FakeGrafana(state) as grafana:
        result = _push(grafana_python, grafana.url, "wrong-token")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert f"error: Grafana at {grafana.url} refused the token (401 Unauthorized)" in _one_line(result.stderr)
    assert not state.datasources and not state.dashboards


def test_token_without_permission_is_a_clear_error(grafana_python):
    state = GrafanaState(admin_tokens={TOKEN}, viewer_tokens={VIEWER_TOKEN})
    with FakeGrafana(state) as grafana:
        result = _push(grafana_python, grafana.url, VIEWER_TOKEN)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "403 Forbidden" in result.stderr and "Admin role" in _one_line(result.stderr)


def test_unreachable_grafana_is_a_clear_error(grafana_python):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = _push(grafana_python, url, TOKEN)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert f"error: cannot reach Grafana at {url}" in _one_line(result.stderr)


@pytest.mark.skipif(importlib.util.find_spec("grafana_client") is not None,
                    reason="grafana-client is installed in this environment")
def test_without_grafana_client_the_command_says_how_to_install():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAFANA_", "GRADWIRE_"))}
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "dashboards", "push", "--grafana-url",
                             "http://127.0.0.1:3000", "--token", TOKEN], capture_output=True, text=True,
                            timeout=60, env=env, cwd=REPO_ROOT)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "install with: pip install 'gradwire[grafana]'" in _one_line(result.stderr)
