"""``gradwire dashboards push``: put the gradwire dashboard and its Prometheus datasource into a
running Grafana, through Grafana's HTTP API (with ``grafana-client``).

Why a push command next to provisioning files: provisioning needs a Grafana whose files we
control (docker-compose, Helm); a shared company Grafana only offers its API and a token. The
push is idempotent — the datasource and the dashboard are found by uid and updated in place —
so it can run on every deploy.

Why grafana-client is imported lazily and lives in the optional extra ``gradwire[grafana]``:
it depends on ``niquests``/``urllib3-future``, which take over the ``urllib3`` import name in
the environment they are installed in. Ray and other libraries of the main environment expect
the real urllib3, so the push is meant for an environment (or pipx) of its own, and the rest
of the CLI works without it.

What is pushed comes from the repository's ``dashboards/`` folder: the generated dashboard
JSON (``dashboards/grafana/gradwire.json``) and the datasource of the provisioning file
(``dashboards/provisioning/datasources/prometheus.yml``) with its URL replaced by
``--prometheus-url`` — the same objects a provisioned Grafana gets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

#: The repository's dashboards/ folder (present in a source checkout or an editable install).
DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "dashboards"
DASHBOARD_FILE = Path("grafana") / "gradwire.json"
DATASOURCE_FILE = Path("provisioning") / "datasources" / "prometheus.yml"
INSTALL_HINT = "install with: pip install 'gradwire[grafana]'"

dashboards_app = typer.Typer(help="Grafana dashboards for gradwire's Prometheus metrics.",
                             no_args_is_help=True, add_completion=False)
console = Console()
err_console = Console(stderr=True)


class PushError(Exception):
    """A failure the user can act on, told in one line (the CLI prints it, no traceback)."""


@dataclass(frozen=True)
class PushResult:
    datasource_uid: str
    datasource_action: str  # "created" or "updated"
    dashboard_uid: str
    dashboard_url: str
    dashboard_version: Optional[int]


def load_dashboard(dashboards_dir: Path = DASHBOARDS_DIR) -> dict[str, Any]:
    path = dashboards_dir / DASHBOARD_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PushError(f"{path} not found: run from a gradwire checkout or pass --dashboards-dir") from None
    except json.JSONDecodeError as exc:
        raise PushError(f"{path} is not valid JSON: {exc}") from None


def dashboard_datasource_uid(dashboard: dict[str, Any]) -> str:
    """The one Prometheus datasource uid the dashboard's panels and variables refer to."""
    refs = [p.get("datasource") for p in dashboard.get("panels", []) if p.get("type") != "row"]
    refs += [v.get("datasource") for v in dashboard.get("templating", {}).get("list", [])]
    uids = {r["uid"] for r in refs if isinstance(r, dict) and r.get("type") == "prometheus" and r.get("uid")}
    if len(uids) != 1:
        raise PushError(f"the dashboard must refer to exactly one Prometheus datasource uid, found {sorted(uids)}")
    return uids.pop()


def datasource_body(uid: str, prometheus_url: str, dashboards_dir: Path = DASHBOARDS_DIR) -> dict[str, Any]:
    """The provisioned datasource with this uid, as the body of Grafana's datasource API.
    ``isDefault`` is left false: a push must not take over an existing Grafana's default."""
    import yaml

    path = dashboards_dir / DATASOURCE_FILE
    try:
        provisioned = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise PushError(f"{path} not found: run from a gradwire checkout or pass --dashboards-dir") from None
    for entry in provisioned.get("datasources", []):
        if entry.get("uid") == uid:
            return {"uid": uid, "name": entry["name"], "type": entry["type"], "access": entry.get("access", "proxy"),
                    "url": prometheus_url, "isDefault": False, "jsonData": entry.get("jsonData", {})}
    raise PushError(f"{path} has no datasource with uid {uid!r}")


def push(grafana_url: str, token: str, prometheus_url: str, *, dashboards_dir: Path = DASHBOARDS_DIR,
         timeout_s: float = 10.0) -> PushResult:
    """Create or update the datasource (by uid), then the dashboard (by uid, overwrite)."""
    if not re.match(r"^https?://[^/]", grafana_url):
        raise PushError(f"--grafana-url must start with http:// or https://, got {grafana_url!r}")
    dashboard = load_dashboard(dashboards_dir)
    uid = dashboard_datasource_uid(dashboard)
    body = datasource_body(uid, prometheus_url, dashboards_dir)
    try:
        import niquests.exceptions
        from grafana_client import GrafanaApi
        from grafana_client.client import GrafanaClientError, GrafanaException
    except ImportError:
        raise PushError(f"the grafana-client package is missing; {INSTALL_HINT}") from None

    api = GrafanaApi.from_url(grafana_url.rstrip("/"), credential=token, timeout=timeout_s)
    try:
        api.client.GET("/health")  # no auth needed: tells "unreachable" apart from "refused"
        try:
            api.datasource.get_datasource_by_uid(uid)
            api.datasource.update_datasource_by_uid(uid, body)
            action = "updated"
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise
            api.datasource.create_datasource(body)
            action = "created"
        saved = api.dashboard.update_dashboard({
            "dashboard": {**dashboard, "id": None}, "overwrite": True,
            "message": "gradwire dashboards push"})
    except GrafanaClientError as exc:
        raise PushError(_client_error_message(grafana_url, exc, body["name"])) from None
    except GrafanaException as exc:  # 5xx, timeouts, protocol errors wrapped by grafana-client
        raise PushError(f"Grafana at {grafana_url} failed: {exc}") from None
    except niquests.exceptions.RequestException as exc:
        raise PushError(f"cannot reach Grafana at {grafana_url}: {_reason(exc)}") from None
    return PushResult(datasource_uid=uid, datasource_action=action, dashboard_uid=saved.get("uid", dashboard["uid"]),
                      dashboard_url=grafana_url.rstrip("/") + saved.get("url", f"/d/{dashboard['uid']}"),
                      dashboard_version=saved.get("version"))


def _client_error_message(url: str, exc: Any, datasource_name: str) -> str:
    status = exc.status_code
    detail = exc.response.get("message") if isinstance(exc.response, dict) else exc.response
    if status == 401:
        return (f"Grafana at {url} refused the token (401 Unauthorized): check --token "
                "(a service account token or API key of this Grafana)")
    if status == 403:
        return (f"the token may not do this on Grafana at {url} (403 Forbidden: {detail}): "
                "creating datasources needs the Admin role, dashboards the Editor role")
    if status == 409:
        return (f"Grafana at {url} already has a datasource named {datasource_name!r} with another uid "
                f"(409 Conflict: {detail}): rename or delete it")
    return f"Grafana at {url} answered {status}: {detail}"


def _reason(exc: Exception) -> str:
    """The useful part of a connection error (``[Errno 111] Connection refused``)."""
    match = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
    return match.group(0) if match else f"{type(exc).__name__}: {exc}"


@dashboards_app.command("push")
def push_command(
    grafana_url: str = typer.Option(..., "--grafana-url", envvar="GRAFANA_URL",
                                    help="Grafana base URL, e.g. http://localhost:3000"),
    token: str = typer.Option(..., "--token", envvar="GRAFANA_TOKEN",
                              help="Grafana service account token (Admin role: it creates a datasource)"),
    prometheus_url: str = typer.Option("http://localhost:9090", "--prometheus-url",
                                       envvar="GRADWIRE_PROMETHEUS_URL",
                                       help="Prometheus URL as Grafana's server reaches it"),
    dashboards_dir: Path = typer.Option(DASHBOARDS_DIR, "--dashboards-dir",
                                        help="gradwire's dashboards/ folder (JSON and provisioning files)"),
) -> None:
    """Create or update the Prometheus datasource and the gradwire dashboard in Grafana."""
    try:
        result = push(grafana_url, token, prometheus_url, dashboards_dir=dashboards_dir)
    except PushError as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"datasource {result.datasource_uid}: {result.datasource_action}")
    version = f" (version {result.dashboard_version})" if result.dashboard_version is not None else ""
    console.print(f"dashboard {result.dashboard_uid}: {escape(result.dashboard_url)}{version}")
