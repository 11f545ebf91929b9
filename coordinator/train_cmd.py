"""``gradwire train SPEC.yaml``: run one job here, without a coordinator, and watch it live.

The spec (YAML or JSON, ``planning.config.TrainConfig`` in sections or in the flat form, so
a ``gradwire submit`` spec works too) is read, flags override its fields, and the result is
validated as a whole by the same section models as the REST API: a bad value is a CLI error
naming the field by its section path (exit code 2), never a traceback.

The job runs on Ray Train (a local Ray cluster, or the one ``RAY_ADDRESS`` names) through
``workers.runner.run_job``. Rank 0 pushes its telemetry to a small named actor created
here; this process drains it for a live progress bar and a per-phase breakdown. With
``--no-ray`` the same loop runs on local processes (``workers.runner.run_local``) and the
reports arrive through a callback. The adaptive policy (``--mode adaptive``) runs in-process
on rank 0. At the end a summary table is printed and ``--summary`` writes the summary JSON
(docs/step.md, "The run summary").

Nothing heavy is imported at module level: ``gradwire --help`` must not load torch or Ray.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coordinator.console import compressor as compressor_label
from coordinator.console import num

console = Console()
err_console = Console(stderr=True)

#: Seconds between two drains of the progress actor.
POLL_S = 0.25


class SpecError(ValueError):
    """The spec or a flag is invalid; the message names the field."""


# --------------------------------------------------------------------------- the spec


def read_spec(path: Path) -> dict[str, Any]:
    """The spec file as a dict (YAML for .yaml/.yml, else JSON)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - YAML/JSON syntax: the user's to fix
        raise SpecError(f"cannot parse {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the spec must be a mapping of fields")
    return data


def apply_overrides(data: dict[str, Any], top: dict[str, Any], compression: dict[str, Any],
                    settings: list[str]) -> dict[str, Any]:
    """``data`` in sections (flat keys folded, ``planning.config.fold_flat``) with flags
    applied: top-level or flat fields (``--batch-size`` lands in ``data.batch_size``),
    ``compression`` fields, and ``--set a.b=v`` (a flat name works there too)."""
    import yaml

    from planning.config import FLAT_KEYS, NAMED_SECTIONS

    merged = _folded(data)
    flags = _folded({key: value for key, value in top.items() if value is not None})
    for key, value in flags.items():
        merged[key] = {**_section(merged, key), **value} if isinstance(value, dict) else value
    given = {key: value for key, value in compression.items() if value is not None}
    if given:
        merged["compression"] = {**_section(merged, "compression"), **given}
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {item!r}: expected FIELD=VALUE (e.g. compression.compressor_rank=8)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        path = key.strip().split(".")
        if len(path) == 1 and path[0] in FLAT_KEYS:
            path = list(FLAT_KEYS[path[0]])
        elif len(path) == 1 and path[0] in NAMED_SECTIONS and isinstance(value, str):
            path = [path[0], NAMED_SECTIONS[path[0]]]
        target = merged
        *parents, leaf = path
        for parent in parents:
            child = target.get(parent)
            target[parent] = child = dict(child) if isinstance(child, dict) else {}
            target = child
        target[leaf] = value
    if isinstance(merged.get("compression"), dict):
        merged["compression"] = _section(merged, "compression")
    return merged


def _folded(data: dict[str, Any]) -> dict[str, Any]:
    from planning.config import fold_flat

    try:
        return dict(fold_flat(data))
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of section ``name`` (``compression``'s old ``rank`` spelt ``compressor_rank``)."""
    section = data.get(name) or {}
    if not isinstance(section, dict):
        raise SpecError(f"{name}: must be a mapping of fields")
    section = dict(section)
    if name == "compression" and "rank" in section and "compressor_rank" not in section:
        section["compressor_rank"] = section.pop("rank")
    return section


def build_config(data: dict[str, Any]) -> Any:
    """A validated ``TrainConfig``; :class:`SpecError` names the first bad field."""
    from pydantic import ValidationError

    from planning.config import TrainConfig

    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "spec"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{field}: {message}")
        raise SpecError("; ".join(problems)) from None


# --------------------------------------------------------------------------- live view


def phase_table(phase_seconds: dict[str, float], title: str = "per-phase breakdown (mean per step)") -> Table:
    """Milliseconds per phase, and each phase's share of the step (hook phases nest in backward)."""
    from planning.protocol import ALL_PHASES, STEP_PHASES, step_seconds

    table = Table(title=title, title_justify="left")
    table.add_column("phase")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    step = step_seconds(phase_seconds) or 1.0
    for phase in ALL_PHASES:
        seconds = phase_seconds.get(phase, 0.0)
        nested = "" if phase in STEP_PHASES else "  (in backward)"
        table.add_row(phase + nested, f"{seconds * 1e3:.3f}", f"{100 * seconds / step:.1f}%")
    return table


class ProgressView:
    """A progress bar (step/steps, loss, samples/s, compressor) over the latest phase table."""

    def __init__(self, name: str, steps: int | None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]} · {task.fields[rate]} samples/s · {task.fields[comp]}"),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task(name, total=steps, loss="–", rate="–", comp="starting…")
        self.last: dict[str, Any] | None = None
        self.reports = 0
        self.finished = False  # then only the bar: the summary shows the final phases

    def update(self, report: dict[str, Any]) -> None:
        self.last, self.reports = report, self.reports + 1
        self.progress.update(self.task, completed=report.get("step", 0), total=report.get("steps"),
                             loss=num(report.get("loss")), rate=num(report.get("samples_per_second")),
                             comp=compressor_label(report))

    def __rich__(self) -> Group:
        if self.last and self.last.get("phase_seconds") and not self.finished:
            return Group(self.progress, phase_table(self.last["phase_seconds"]))
        return Group(self.progress)


class _ProgressBuffer:
    """Holds rank 0's reports until the CLI drains them (made a Ray actor at run time)."""

    def __init__(self) -> None:
        self._reports: list[dict[str, Any]] = []

    def push(self, report: dict[str, Any]) -> None:
        self._reports.append(report)

    def drain(self) -> list[dict[str, Any]]:
        reports, self._reports = self._reports, []
        return reports


# --------------------------------------------------------------------------- running


def run_on_ray(config: Any, view: ProgressView, storage_path: str | None, verbose: bool) -> dict[str, Any]:
    """``run_job`` in a thread; this thread drains the progress actor into ``view``."""
    from coordinator import raylocal

    raylocal.use_token_auth()  # as `gradwire serve` does, so RAY_ADDRESS may name its head
    import ray

    from workers.runner import run_job

    started_here = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        # The job's runtime_env (its user code) applies to every process of this Ray job.
        runtime_env = config.runtime_env.to_ray() if config.runtime_env else None
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=verbose, runtime_env=runtime_env)
        else:
            ray.init(address="local", num_cpus=max(2, config.max_workers), include_dashboard=False,
                     log_to_driver=verbose, runtime_env=runtime_env)
        started_here = True
    name = f"gradwire-train-progress-{uuid.uuid4().hex[:10]}"
    actor = ray.remote(num_cpus=0)(_ProgressBuffer).options(name=name).remote()
    ray.get(actor.drain.remote())  # the actor is up before any worker looks it up
    outcome: dict[str, Any] = {}

    def job() -> None:
        try:
            outcome["summary"] = run_job(config, storage_path=storage_path, progress_actor=name)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=job, name="gradwire-train-job", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(timeout=POLL_S)
            for report in ray.get(actor.drain.remote()):
                view.update(report)
        for report in ray.get(actor.drain.remote()):
            view.update(report)
        ray.kill(actor)
    finally:
        if started_here:
            ray.shutdown()  # also what ends the job if we were interrupted
    if "error" in outcome:
        raise outcome["error"]
    return outcome["summary"]


def run_without_ray(config: Any, view: ProgressView) -> dict[str, Any]:
    from workers.runner import run_local

    return run_local(config, checkpoint_dir=config.checkpoint_dir, progress=view.update)


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary.get('name', 'job')}: finished", show_header=False, title_justify="left")
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("model / dataset", f"{summary.get('model')} / {summary.get('dataset')}"),
        ("steps", f"{summary.get('start_step', 0)} → {summary.get('steps')}"),
        ("final loss", num(summary.get("final_loss"))),
    ]
    if summary.get("eval_accuracy") is not None:
        rows.append(("held-out accuracy", f"{100 * summary['eval_accuracy']:.2f}%"))
    rows += [
        ("samples/s", num(summary.get("samples_per_second"))),
        ("step time", f"{1e3 * (summary.get('step_seconds') or 0):.2f} ms"),
        ("bytes sent/step", num(summary.get("bytes_sent_per_step"))),
        ("compressor", compressor_label(summary)),
        ("workers", str(summary.get("world_size"))),
        ("switches", ", ".join(f"{s['to']}@{s['step']}" for s in summary.get("switches") or []) or "none"),
    ]
    if "policy_decisions" in summary:
        rows.append(("policy", f"{summary['policy_decisions']} evaluations; {summary.get('policy_reason') or '–'}"))
    if summary.get("checkpoint_path"):
        rows.append(("checkpoint", str(summary["checkpoint_path"])))
    for key, value in rows:
        table.add_row(key, value)
    return table


def _fail(message: str, code: int) -> typer.Exit:
    err_console.print(f"[red]error:[/] {message}")
    return typer.Exit(code)


def train(
    spec: Path = typer.Argument(..., help="job spec, .yaml/.yml or .json (TrainConfig: sections or flat fields)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="training steps"),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="or epochs (not both)"),
    workers: Optional[str] = typer.Option(None, "--workers", help="N, or MIN..MAX for elastic"),
    compressor: Optional[str] = typer.Option(None, "--compressor", help="none fp16 bf16 signsgd topk powersgd acpsgd"),
    compressor_rank: Optional[int] = typer.Option(None, "--compressor-rank", "--rank",
                                                  help="the compressor's rank (powersgd/acpsgd)"),
    ratio: Optional[float] = typer.Option(None, "--ratio", help="kept fraction of topk"),
    mode: Optional[str] = typer.Option(None, "--mode", help="fixed | adaptive"),
    model: Optional[str] = typer.Option(None, "--model", help="mlp cnn resnet18 ... bert-large"),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="synthetic | digits"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="per worker"),
    lr: Optional[float] = typer.Option(None, "--lr", help="learning rate"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    name: Optional[str] = typer.Option(None, "--name", help="job name"),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="steps between checkpoints"),
    settings: list[str] = typer.Option([], "--set", help="any other field, FIELD=VALUE (repeatable; "
                                                       "SECTION.FIELD, e.g. compression.max_rank=16)"),
    summary_path: Optional[Path] = typer.Option(None, "--summary", help="write the summary JSON here"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run on local processes without Ray (debugging)"),
    storage_path: Optional[str] = typer.Option(None, "--storage-path", help="Ray Train checkpoint storage"),
    verbose: bool = typer.Option(False, "--verbose", help="show the workers' logs"),
) -> None:
    """Train one job here (local Ray cluster, or RAY_ADDRESS), with live progress and a summary."""
    try:
        data = apply_overrides(
            read_spec(spec),
            {"steps": steps, "epochs": epochs, "workers": workers, "model": model, "dataset": dataset,
             "batch_size": batch_size, "lr": lr, "seed": seed, "name": name, "checkpoint_every": checkpoint_every},
            {"compressor": compressor, "compressor_rank": compressor_rank, "ratio": ratio, "mode": mode},
            settings,
        )
        if steps is not None and epochs is None:
            data.pop("epochs", None)  # --steps replaces the spec's epochs
        if epochs is not None and steps is None:
            data.pop("steps", None)
        config = build_config(data)
        from workers.runner import validate

        validate(config, import_here=False)  # user code is imported where it runs (runtime_env)
    except SpecError as exc:
        raise _fail(f"invalid spec: {exc}", 2) from None
    except ValueError as exc:  # the combination cannot run (model/dataset/batch)
        raise _fail(f"invalid spec: {exc}", 2) from None

    view = ProgressView(config.name, config.steps)
    runner: Callable[[], dict[str, Any]] = (
        (lambda: run_without_ray(config, view)) if no_ray else (lambda: run_on_ray(config, view, storage_path, verbose))
    )
    started = time.monotonic()
    try:
        with Live(view, console=console, refresh_per_second=4, transient=False):
            summary = runner()
            view.finished = True
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    except Exception as exc:  # noqa: BLE001 - a failed job: say why, without our traceback
        raise _fail(f"training failed: {type(exc).__name__}: {exc}", 1) from None
    summary.setdefault("wall_seconds", round(time.monotonic() - started, 3))
    console.print()
    console.print(summary_table(summary))
    console.print(phase_table(summary.get("phase_seconds") or {}, title="phases (mean per step, last window)"))
    if summary_path is not None:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        console.print(f"summary written to {summary_path}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``train`` to the ``gradwire`` command (``coordinator.cli`` calls this)."""
    app.command("train")(train)


if __name__ == "__main__":  # pragma: no cover
    typer.run(train)
