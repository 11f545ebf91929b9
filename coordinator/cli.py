"""The ``gradwire`` command: serve, submit, jobs, watch, cancel, demo (and train, when
``coordinator.train_cmd`` provides it).

Client commands talk to a coordinator over HTTP: ``--url`` (``GRADWIRE_URL``, default
``http://127.0.0.1:8321``) and ``--token`` (``GRADWIRE_TOKEN``). Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from coordinator.client import ApiError, Client, format_detail
from coordinator.grafana import dashboards_app

app = typer.Typer(help="gradwire: compressed, adaptive data-parallel training on Ray.",
                  no_args_is_help=True, add_completion=False)
app.add_typer(dashboards_app, name="dashboards")  # `gradwire dashboards push` (Grafana)
console = Console()
err_console = Console(stderr=True)

DEFAULT_URL = "http://127.0.0.1:8321"
UrlOption = typer.Option(DEFAULT_URL, "--url", envvar="GRADWIRE_URL", help="coordinator URL")
TokenOption = typer.Option(None, "--token", envvar="GRADWIRE_TOKEN", help="operator token", show_default=False)


def _client(url: str, token: Optional[str]) -> Client:
    return Client(url, token)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/] {message}")
    return typer.Exit(code)


def _api(call: Any, *args: Any) -> Any:
    import httpx

    try:
        return call(*args)
    except ApiError as exc:
        raise _fail(f"{exc.status}: {format_detail(exc.detail)}") from None
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach the coordinator: {exc}") from None


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="listen address (GRADWIRE_HOST, default 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="port (GRADWIRE_PORT, default 8321)"),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="join this Ray cluster (host:port or auto) instead of the local head"),
    stop_ray: bool = typer.Option(
        False, "--stop-ray", help="stop the local Ray head (and a coordinator left by `demo --keep`), then exit"),
) -> None:
    """Run the coordinator (REST API, live page at /, /metrics). Without --ray-address it
    starts a local Ray head as its own process, which keeps running jobs alive across restarts."""
    from pydantic import ValidationError

    from coordinator.auth import InsecureBindError, check_bind
    from coordinator.settings import Settings

    overrides: dict[str, Any] = {"host": host, "port": port, "ray_address": ray_address}
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise _fail(f"invalid settings: {problems}", code=2) from None
    if stop_ray:
        from coordinator import raylocal
        from coordinator.demo import stop_coordinator

        if stop_coordinator(settings.data_dir):
            console.print("stopped the background coordinator")
        stopped = raylocal.stop_head(settings.data_dir)
        console.print("stopped the local Ray head" if stopped else "no local Ray head was running")
        return
    try:
        check_bind(settings.host, settings.token_value)
    except InsecureBindError as exc:
        raise _fail(str(exc), code=2) from None

    import uvicorn

    from coordinator.app import create_app
    from coordinator.datadir import DataDirInUse

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except DataDirInUse as exc:
        raise _fail(str(exc), code=2) from None
    except OSError as exc:  # the data dir or database cannot be created/opened
        raise _fail(f"cannot use data dir {settings.data_dir}: {exc.strerror or exc}", code=2) from None
    except Exception as exc:  # noqa: BLE001 - e.g. SQLite refusing a read-only file: say so, no traceback
        raise _fail(f"cannot open the database {settings.db_url}: {str(exc).splitlines()[0]}", code=2) from None
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=5)


def _load_spec(path: Path) -> dict[str, Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the spec must be a mapping of fields")
    return data


@app.command()
def submit(
    spec: Path = typer.Argument(..., help="job spec, .yaml/.yml or .json ('-' reads JSON from stdin)"),
    follow: bool = typer.Option(False, "--watch", help="then follow the job until it ends"),
    url: str = UrlOption, token: Optional[str] = TokenOption,
) -> None:
    """Submit a job spec; prints the new job's id."""
    try:
        data = _load_spec(spec)
    except Exception as exc:  # noqa: BLE001 - missing file, JSON or YAML syntax: all the user's to fix
        raise _fail(f"cannot read {spec}: {exc}") from None
    client = _client(url, token)
    job = _api(client.submit, data)
    console.print(f"submitted [bold]{job['id']}[/] ({job['name']}): {job['state']}")
    if follow:
        watch(job["id"], url, token)


@app.command()
def jobs(url: str = UrlOption, token: Optional[str] = TokenOption) -> None:
    """List jobs, newest first."""
    from coordinator.console import jobs_table

    console.print(jobs_table(_api(_client(url, token).jobs)))


@app.command()
def watch(job_id: str = typer.Argument(..., help="job id"), url: str = UrlOption,
          token: Optional[str] = TokenOption) -> None:
    """Follow a job live (event stream, or polling), then print its summary."""
    from coordinator import console as views

    client = _client(url, token)
    final = _api(views.watch, client, job_id, console)
    console.print(views.summary_table(_api(client.history, job_id)))
    if final["state"] != "succeeded":
        raise typer.Exit(1)


@app.command()
def cancel(job_id: str = typer.Argument(..., help="job id"), url: str = UrlOption,
           token: Optional[str] = TokenOption) -> None:
    """Cancel a queued or running job."""
    job = _api(_client(url, token).cancel, job_id)
    console.print(f"job [bold]{job['id']}[/]: {job['state']}")


@app.command()
def demo(
    keep: bool = typer.Option(False, "--keep", help="leave the coordinator and Ray head running afterwards"),
    port: Optional[int] = typer.Option(None, help="coordinator port (default 8321)"),
    steps: int = typer.Option(150, min=10, max=100_000, help="training steps of the demo job"),
    network: bool = typer.Option(
        False, "--network", help="run on an emulated 2-node Ray cluster whose link drops and recovers "
        "(needs root and `ip netns`; benchmarks.cluster of a source checkout)"),
) -> None:
    """Start everything locally, run a small adaptive-compression job, show it live, clean up.

    Starts (if not already running) a local Ray head and a coordinator in the background with
    SQLite under ./.gradwire, submits an MLP job on 2 CPU workers, prints the live page and
    /metrics URLs, follows the job and prints a summary. Everything it started is stopped at
    the end unless --keep (then `gradwire serve --stop-ray` stops it). Over loopback the link
    never changes, so nothing adapts: --network shows the bandwidth fall, the coordinator
    switch compressor and the per-phase picture change."""
    if network:
        raise typer.Exit(_network_demo(keep))
    from coordinator.demo import run_demo
    from coordinator.settings import Settings

    chosen: dict[str, Any] = {"port": port} if port else {}
    settings = Settings(**chosen)
    try:
        code = run_demo(settings, keep=keep, steps=steps, console=console)
    except (ApiError, RuntimeError, TimeoutError) as exc:
        raise _fail(str(exc)) from None
    console.print("[dim]over loopback the link is fast and steady, so the policy keeps its first choice; "
                  "to see it adapt to a changing network, run as root: [bold]gradwire demo --network[/][/]")
    raise typer.Exit(code)


def _network_demo(keep: bool) -> int:
    """``python -m benchmarks.cluster demo`` of this source tree, in a process of its own (it needs
    root and namespaces, and the coordinator package must not depend on the benchmarks)."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    if not (repo / "benchmarks" / "cluster" / "__main__.py").exists():
        raise _fail(f"--network needs a source checkout of gradwire (no benchmarks/cluster/ under {repo})")
    cmd = [sys.executable, "-m", "benchmarks.cluster", "demo", *(["--keep"] if keep else [])]
    proc = subprocess.Popen(cmd, cwd=repo)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # the child got the same Ctrl-C and is removing its cluster: wait for it


def _register_train() -> None:
    """``gradwire train`` comes from coordinator.train_cmd once it exists (it imports torch
    only when run). It may offer ``register(app)`` or a ``train`` command function."""
    if importlib.util.find_spec("coordinator.train_cmd") is None:
        return
    from coordinator import train_cmd

    if hasattr(train_cmd, "register"):
        train_cmd.register(app)
    elif hasattr(train_cmd, "train"):
        app.command("train")(train_cmd.train)


_register_train()

if __name__ == "__main__":
    app()
