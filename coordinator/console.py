"""Terminal views with rich: the jobs table, live progress of one job, the final summary."""

from __future__ import annotations

import time
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coordinator.client import ApiError, Client

TERMINAL = {"succeeded", "failed", "cancelled"}
STATE_STYLE = {"queued": "dim", "running": "blue", "succeeded": "green", "failed": "red", "cancelled": "yellow"}


def gbps(value: float | None) -> str:
    return "–" if not value else f"{value * 8 / 1e9:.3g} Gb/s"


def num(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def compressor(job: dict[str, Any]) -> str:
    name = job.get("compressor") or "–"
    if job.get("compressor_rank"):
        return f"{name} r{job['compressor_rank']}"
    return f"{name} {job['ratio']}" if job.get("ratio") else name


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table(title="gradwire jobs")
    for column in ("id", "name", "state", "step", "loss", "compressor", "bandwidth"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold")
    for job in jobs:
        style = STATE_STYLE.get(job["state"], "")
        table.add_row(job["id"], job["name"], f"[{style}]{job['state']}[/]", f"{job['step']}/{job['steps'] or '?'}",
                      num(job["loss"]), compressor(job), gbps(job["bandwidth_bytes_per_second"]), job["reason"])
    return table


def summary_table(history: dict[str, Any]) -> Table:
    job = history["job"]
    table = Table(title=f"job {job['id']} ({job['name']}): {job['state']}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    wall = (job["finished_at"] or time.time()) - (job["started_at"] or job["created_at"])
    rows = [
        ("state", f"[{STATE_STYLE.get(job['state'], '')}]{job['state']}[/] — {job['reason']}"),
        ("steps", f"{job['step']}/{job['steps'] or '?'}"),
        ("final loss", num(job["loss"])),
        ("samples/s", num(job["samples_per_second"])),
        ("compressor", compressor(job)),
        ("bandwidth", gbps(job["bandwidth_bytes_per_second"])),
        ("wall time", f"{wall:.1f} s"),
        ("decisions", str(len(history["decisions"]))),
    ]
    for d in history["decisions"]:
        gain = "" if d["predicted_gain"] is None else f", predicted gain {d['predicted_gain'] * 100:.1f} %"
        rows.append((f"  v{d['version']} ({d['source']})", f"{d['compressor']} {d['params']} — {d['reason']}{gain}"))
    for phase, seconds in (job.get("phase_seconds") or {}).items():
        rows.append((f"  {phase}", f"{seconds * 1e3:.2f} ms/step"))
    for key, value in rows:
        table.add_row(key, value)
    return table


def watch(client: Client, job_id: str, console: Console) -> dict[str, Any]:
    """Show live progress until the job ends; returns its final status. Follows the event
    stream, and falls back to polling if the stream breaks (e.g. the coordinator restarts)."""
    job = client.job(job_id)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(job["name"], total=job["steps"] or None, completed=job["step"], info="")

        def show(j: dict[str, Any]) -> None:
            info = (f"{j['state']} · loss {num(j['loss'])} · {compressor(j)} · {gbps(j['bandwidth_bytes_per_second'])}")
            progress.update(task, completed=j["step"], total=j["steps"] or None, info=info)

        show(job)
        while job["state"] not in TERMINAL:
            try:
                for event, data in client.events(job_id):
                    if event in ("snapshot",):
                        job = data["job"]
                    elif event == "telemetry":
                        job = data["job"]
                    elif event == "decision" and data["version"] > 0:
                        progress.console.print(f"  decision v{data['version']}: {data['reason']}")
                    elif event == "end":
                        job = data
                    show(job)
                    if job["state"] in TERMINAL:
                        break
            except (httpx.HTTPError, ApiError):
                time.sleep(1.0)
                try:
                    job = client.job(job_id)
                    show(job)
                except httpx.HTTPError:
                    continue
    return job
