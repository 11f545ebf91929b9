"""The adaptive policy against every fixed compressor, judged by time to a target held-out loss.

Why: what a user wants from adaptive compression is the shortest time to a given model
quality on a network they do not know in advance, without tuning a rank per model. This
benchmark runs the same two-worker job (one worker per network namespace of
:mod:`benchmarks.testbed`: local processes, not a Ray cluster) once with each fixed
compressor and once with the adaptive policy at its DEFAULT bounds (every compressor, ranks
1..64; rank 0's in-process policy, no coordinator), in each scenario of :data:`SCENARIOS`:
steady fast (1000 Mbit/s), steady slow (50 Mbit/s), fast->slow->fast, and oscillating with
a period near the policy's dwell.

The job: the small CNN (0.15 M parameters, 0.6 MB of gradients) at batch 32 on 32x32
synthetic images, 0.25 MB DDP buckets, 300 steps, the same seed for every run.

Judged by time to target. Every run checkpoints every :data:`EVAL_EVERY` steps (the same
cost for every run); after the run each checkpoint's model is evaluated on the first 512 held-out
samples, outside the timed run. The scenario's target is the held-out loss uncompressed
training (``none``) reaches at 90 % of its steps; a run's ``time_to_target_s`` is the wall
time of its first evaluation at or below it (null: never). Wall times come from rank 0's
telemetry, from the end of step 1 (start-up, model build and the first probe left out;
later probes, the quality signal, the policy and the checkpoints are in, for every run alike).

Fixed steps, not fixed time: each phase of a schedule is a number of training steps; the
driver follows rank 0's telemetry and changes the rate when a report shows the phase's last
step done, so every run does the same work under each rate.

The machine is shared: every run records the cores other processes kept busy meanwhile
(``foreign_cores``) and is repeated once when that exceeded :data:`BUSY_CORES`; the run with
the least foreign load is kept (``foreign_cores_runs`` lists every attempt's).

JSON (``--json-out``)::

    {"scenarios": {"<name>": {"target": x, "schedule": [...], "verdict": {...},
        "runs": {"<label>": {"time_to_target_s": t or null, "total_s": t, "final_eval": x,
                              "eval": [[step, wall_s, x], ...], "switches": [...], ...}}}},
     "verdict": {"worst_ratio_to_best_fixed": {...}}, "job": {...}}

    python benchmarks/adaptive.py --json-out benchmarks/results/adaptive.json          # every scenario
    python benchmarks/adaptive.py --quick --json-out benchmarks/results/adaptive_quick.json  # fast-slow-fast only

Needs root (network namespaces); every timed run holds ``/tmp/gradwire-bench.lock``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.testbed import Testbed, TestbedError, worker_env  # noqa: E402
from planning.config import TrainConfig  # noqa: E402

LOCK_PATH = "/tmp/gradwire-bench.lock"
FIXED_CHOICES = ("none", "fp16", "powersgd-r4", "acpsgd-r4", "acpsgd-r16", "topk-0.01", "signsgd")
#: The policy with every bound at its default (all compressors, ranks 1..64).
ADAPTIVE = "adaptive"
#: Every scenario: 300 steps, the same for every run (Mbit/s:steps, ...).
SCENARIOS = {
    "steady-fast": "1000:300",
    "steady-slow": "50:300",
    "fast-slow-fast": "1000:120,50:60,1000:120",
    # A period of ~2-4 s, near the benchmark's 2 s dwell.
    "oscillating": ",".join(["1000:40,50:20"] * 5),
}
QUICK_SCENARIOS = ("fast-slow-fast",)
#: Held-out evaluation every this many steps (a checkpoint, evaluated after the run).
EVAL_EVERY = 15
#: Held-out samples per evaluation (the same for every run and step).
HELD_OUT_SAMPLES = 512
#: A run that saw other users keep more cores than this busy is repeated (once).
BUSY_CORES = 0.5
POLL_S = 0.005
#: A run starts once other processes keep fewer than this many cores busy (or after the wait).
QUIET_CORES = 0.3


# --------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class Phase:
    """``steps`` training steps with every link at ``mbit`` Mbit/s."""

    mbit: float
    steps: int


def parse_schedule(text: str) -> list[Phase]:
    """``"1000:150,50:80"`` -> phases of (Mbit/s, steps)."""
    phases = []
    for item in text.split(","):
        mbit, _, steps = item.strip().partition(":")
        try:
            phase = Phase(float(mbit), int(steps))
        except ValueError:
            raise ValueError(f"schedule: expected MBIT:STEPS items, got {item!r}") from None
        if phase.mbit <= 0 or phase.steps < 1:
            raise ValueError(f"schedule: rate and steps must be positive, got {item!r}")
        phases.append(phase)
    return phases


def boundaries(phases: Sequence[Phase]) -> list[int]:
    """Step count at the end of each phase (cumulative)."""
    out, total = [], 0
    for phase in phases:
        total += phase.steps
        out.append(total)
    return out


# --------------------------------------------------------------------------- job configs


def fixed_compression(label: str) -> dict[str, Any]:
    """The job's ``compression`` block for a fixed choice label (``acpsgd-r4``)."""
    name, params = parse_label(label)
    return {"mode": "fixed", "compressor": name, **params}


def parse_label(label: str) -> tuple[str, dict[str, Any]]:
    """``acpsgd-r4`` -> ("acpsgd", {"rank": 4}); ``topk-0.01`` -> ("topk", {"ratio": 0.01})."""
    name, _, arg = label.partition("-")
    if not arg:
        return name, {}
    if arg.startswith("r") and arg[1:].isdigit():
        return name, {"rank": int(arg[1:])}
    return name, {"ratio": float(arg)}


def train_config(args: argparse.Namespace, compression: dict[str, Any], steps: int, **extra: Any) -> TrainConfig:
    """The job every run shares; only ``compression`` (and ``extra``) differ."""
    return TrainConfig(
        name="adaptive-bench", model=args.model, dataset="synthetic", batch_size=args.batch_size,
        image_size=args.image_size, seq_len=args.seq_len, steps=steps, lr=args.lr, workers=2, compression=compression,
        bucket_cap_mb=args.bucket_cap_mb,
        report_interval_s=args.report_interval_s, probe_interval_s=args.probe_interval_s, probe_budget=args.probe_budget,
        sync_every=args.sync_every, seed=args.seed, **extra,
    )


# --------------------------------------------------------------------------- running a job


@contextmanager
def bench_lock() -> Iterator[None]:
    """Hold the machine-wide benchmark lock: no one else measures while we do."""
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _busy_ticks() -> int:
    """Busy CPU time of the whole machine so far, in clock ticks (``/proc/stat``)."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle


def busy_cores(window_s: float = 0.5) -> float:
    """How many cores the machine keeps busy, averaged over ``window_s``."""
    before = _busy_ticks()
    time.sleep(window_s)
    return (_busy_ticks() - before) / os.sysconf("SC_CLK_TCK") / window_s


def wait_for_quiet(max_wait_s: float) -> float:
    """Wait (at most ``max_wait_s``) until other work leaves the CPUs idle; return the load seen.

    Why: this machine is shared, and tests of others (which hold no lock) can take both cores.
    """
    deadline = time.monotonic() + max_wait_s
    load = busy_cores()
    while load > QUIET_CORES and time.monotonic() < deadline:
        load = busy_cores()
    return load


@contextmanager
def foreign_load(record: dict[str, float]) -> Iterator[None]:
    """Measure the cores that processes *other than this one's children* kept busy meanwhile."""
    ticks = os.sysconf("SC_CLK_TCK")
    busy0 = _busy_ticks()
    ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    try:
        yield
    finally:
        busy1 = _busy_ticks()
        ours1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        ours = sum(getattr(b, f) - getattr(a, f) for a, b in ((ours0, ours1), (self0, self1)) for f in ("ru_utime", "ru_stime"))
        wall = max(1e-9, time.monotonic() - started)
        record["foreign_cores"] = round(max(0.0, (busy1 - busy0) / ticks - ours) / wall, 2)


@dataclass
class JobRun:
    """What one job left behind: rank 0's telemetry reports, its summary, the rate changes."""

    label: str
    reports: list[dict[str, Any]]
    summary: dict[str, Any]
    #: (last step reported when the rate was changed, wall time after the change, Mbit/s)
    rate_changes: list[tuple[int, float, float]] = field(default_factory=list)
    #: Cores kept busy by other users of the machine during the run (0 = it had the CPUs).
    foreign_cores: float | None = None
    checkpoint: Path | None = None
    #: Cross-entropy of the final model on the held-out split (see :func:`eval_loss`).
    eval_loss: float | None = None

    def wall_at(self, step: float) -> float:
        """Wall time at which ``step`` steps were done, interpolated between reports."""
        before = self.reports[0]
        for report in self.reports:
            if report["step"] >= step:
                if report["step"] == before["step"]:
                    return report["wall_time"]
                share = (step - before["step"]) / (report["step"] - before["step"])
                return before["wall_time"] + share * (report["wall_time"] - before["wall_time"])
            before = report
        return self.reports[-1]["wall_time"]


def run_job(tb: Testbed, cfg: TrainConfig, phases: Sequence[Phase], workdir: Path, *,
            label: str, timeout_s: float = 600.0, evaluate: bool = True) -> JobRun:
    """Run ``cfg`` on the testbed's two hosts, walking the rate through ``phases`` by step.

    1. Set the first phase's rate; start this module's ``_rank`` entry (``workers.rank_main``
       plus a final checkpoint in ``workdir/checkpoints``) in each namespace.
    2. Follow rank 0's telemetry file; once the report of a phase's last step appears,
       set the next phase's rate.
    3. Wait for both ranks; raise with their log if one failed or the run timed out.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    config_path, progress, summary_path = workdir / "config.json", workdir / "telemetry.jsonl", workdir / "summary.json"
    config_path.write_text(cfg.model_dump_json())
    progress.unlink(missing_ok=True)
    cap_gso(tb)
    tb.set_rate(phases[0].mbit)
    init = f"tcp://{tb.address(0)}:{random.randint(20000, 40000)}"
    procs = []
    for rank in range(2):
        argv = [sys.executable, __file__, "_rank", "--checkpoint-dir", str(workdir / "checkpoints"),
                "--config", str(config_path), "--rank", str(rank), "--world-size", "2", "--init-method", init,
                "--summary", str(summary_path), "--progress", str(progress)]
        env = {**worker_env(tb, rank), "PYTHONPATH": str(ROOT)}
        with open(workdir / f"rank{rank}.log", "w") as log:
            procs.append(tb.run(rank, argv, env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT))
    reports, changes = _follow(tb, procs, progress, phases, time.monotonic() + timeout_s)
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = (workdir / f"rank{rank}.log").read_text()[-3000:]
            raise TestbedError(f"{label}: rank {rank} exited with {proc.returncode}:\n{tail}")
    checkpoint = final_checkpoint(workdir / "checkpoints")
    return JobRun(label=label, reports=reports, summary=json.loads(summary_path.read_text()), rate_changes=changes,
                  checkpoint=checkpoint, eval_loss=eval_loss(cfg, checkpoint) if evaluate else None)


def cap_gso(tb: Testbed, max_bytes: int = 32 * 1024) -> None:
    """Keep GSO packets well under the shaper's bucket, or a link can stall for good.

    The testbed's ``tbf`` bucket is 64 KiB at rates up to ~130 Mbit/s, the size of a
    full GSO packet; on this kernel a packet that needs a token or two more than the bucket
    holds stays at the head of the queue for ever, and the job hangs (seen at 50 Mbit/s:
    the backlog never drained, TCP backed off to 120 s retransmits). Smaller GSO packets
    always fit.
    """
    for host in range(tb.hosts):
        subprocess.run(["ip", "-n", tb.namespace(host), "link", "set", "dev", tb.interface(host),
                        "gso_max_size", str(max_bytes)], check=True, capture_output=True)


def final_checkpoint(root: Path) -> Path:
    """The directory of a local run's last checkpoint (``LocalWorkerEnv`` layout)."""
    return root / (root / "latest").read_text().strip()


def eval_loss(cfg: TrainConfig, checkpoint: Path) -> float:
    """Cross-entropy of the checkpointed model on the held-out split's first 1024 samples."""
    return HeldOut(cfg)(checkpoint)


class HeldOut:
    """The held-out split of ``cfg``'s dataset, built once; calling it evaluates a checkpoint.

    Why held-out loss: the training loss of the last step is one batch of 64 samples, far too
    noisy to compare runs within a few per cent; the held-out set is the same for every run.
    """

    def __init__(self, cfg: TrainConfig, samples: int = 1024) -> None:
        from workers.data import build_dataset, input_spec, make_loader
        from workers.models import build_model

        self.cfg = cfg
        inputs = input_spec(cfg.model.name, cfg.data.dataset, seq_len=cfg.data.seq_len, image_size=cfg.data.image_size)
        self.model = build_model(cfg.model.name, **inputs)
        self.model.eval()
        test_set = build_dataset(cfg.data.dataset, model=cfg.model.name, split="test", seed=cfg.seed, seq_len=cfg.data.seq_len,
                                 image_size=cfg.data.image_size)
        # Loaded once: every checkpoint is evaluated on the very same tensors (the first
        # ``samples`` of the split: 512 keeps 20 evaluations of a run under a minute on this
        # shared 2-core machine).
        batches = make_loader(test_set, batch_size=samples, rank=0, world_size=1, seed=cfg.seed,
                              shuffle=False, drop_last=False)
        self.batches = [next(iter(batches))]

    def __call__(self, checkpoint: Path) -> float:
        import torch
        import torch.nn.functional as F

        from workers.checkpoint import TRAINER_FILE

        self.model.load_state_dict(torch.load(checkpoint / TRAINER_FILE, map_location="cpu", weights_only=False)["model"])
        total, count = 0.0, 0
        with torch.no_grad():
            for inputs, targets in self.batches:
                total += float(F.cross_entropy(self.model(inputs), targets, reduction="sum"))
                count += int(targets.numel())
        return total / count

    def curve(self, root: Path) -> list[tuple[int, float]]:
        """(step, held-out loss) of every checkpoint under ``root``, by step."""
        from workers.checkpoint import read_meta

        points = [(int(read_meta(d)["step"]), self(d)) for d in root.glob("checkpoint_*") if d.is_dir()]
        return sorted(points)


def _follow(tb: Testbed, procs: list[subprocess.Popen], progress: Path, phases: Sequence[Phase],
            deadline: float) -> tuple[list[dict[str, Any]], list[tuple[int, float, float]]]:
    """Read reports as they come; change the rate at each phase boundary (step 2 of run_job)."""
    reports: list[dict[str, Any]] = []
    changes: list[tuple[int, float, float]] = []
    ends = boundaries(phases)
    offset, pending = 0, ""
    while True:
        finished = all(p.poll() is not None for p in procs)
        if progress.exists():
            with progress.open() as handle:
                handle.seek(offset)
                chunk = handle.read()
                offset = handle.tell()
            pending += chunk
            *lines, pending = pending.split("\n")
            reports.extend(json.loads(line) for line in lines if line.strip())
        while reports and len(changes) + 1 < len(phases) and reports[-1]["step"] >= ends[len(changes)]:
            nxt = phases[len(changes) + 1].mbit
            tb.set_rate(nxt)
            changes.append((reports[-1]["step"], time.time(), nxt))
        if finished:
            return reports, changes
        if time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            raise TestbedError(f"run did not finish in time; last report: {reports[-1] if reports else None}")
        time.sleep(POLL_S)


# --------------------------------------------------------------------------- results of a run


def switches(run: JobRun) -> list[dict[str, Any]]:
    """Compressor changes, timed like ``total_s`` (seconds since the report of step 1)."""
    origin = run.wall_at(1)
    out = []
    for switch in run.summary.get("switches", []):
        step = int(switch["step"])
        out.append({"at_s": round(run.wall_at(step) - origin, 3), "step": step, "to": switch["to"],
                    "reason": switch.get("reason", "")})
    return out


def bandwidth_by_phase(run: JobRun, phases: Sequence[Phase]) -> list[float | None]:
    """Median telemetry bandwidth (Mbit/s) over the second half of each phase: does it track?"""
    out: list[float | None] = []
    start = 1
    for end in boundaries(phases):
        middle = (start + end) // 2
        values = sorted(r["bandwidth_bytes_per_second"] * 8e-6 for r in run.reports
                        if middle <= r["step"] <= end and r.get("bandwidth_bytes_per_second"))
        out.append(round(values[len(values) // 2], 1) if values else None)
        start = end
    return out


def eval_points(run: JobRun, curve: Sequence[tuple[int, float]]) -> list[list[float]]:
    """``[[step, wall_s, held-out loss], ...]``; wall_s from the report of step 1, like total_s."""
    origin = run.wall_at(1)
    return [[step, round(run.wall_at(step) - origin, 3), round(loss, 5)] for step, loss in curve]


def time_to_target(evals: Sequence[Sequence[float]], target: float) -> float | None:
    """Wall time of the first evaluation at or below ``target`` (None: never reached)."""
    for _, wall, loss in evals:
        if loss <= target:
            return wall
    return None


def running_over_estimate(reports: Sequence[dict[str, Any]]) -> list[float]:
    """Per report of a low-rank choice: its running error over its own estimate (the raw
    gradient's best rank-r error). What error feedback and a warm start cost beyond the best case;
    ``benchmarks/adaptive_replay.py`` takes the median as its default."""
    out = []
    for report in reports:
        label, error = step_label(report), report.get("compression_error")
        estimate = (report.get("compression_error_estimates") or {}).get(label)
        if report.get("compressor_rank") and error is not None and estimate and estimate > 0.05:
            out.append(round(error / estimate, 3))
    return out


def step_label(report: dict[str, Any]) -> str:
    """Telemetry's compressor as a label (``acpsgd-r4``)."""
    name = report.get("compressor") or "?"
    if report.get("compressor_rank"):
        return f"{name}-r{report['compressor_rank']}"
    if report.get("ratio"):
        return f"{name}-{report['ratio']:g}"
    return name


def run_result(run: JobRun, phases: Sequence[Phase], curve: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """One run's JSON entry, without the target (set once uncompressed training has run)."""
    evals = eval_points(run, curve)
    errors = [r["compression_error"] for r in run.reports if r.get("compression_error") is not None]
    return {
        "time_to_target_s": None,
        "total_s": round(run.wall_at(sum(p.steps for p in phases)) - run.wall_at(1), 3),
        "final_eval": evals[-1][2],
        "eval": evals,
        "switches": switches(run),
        "foreign_cores": run.foreign_cores,
        "bandwidth_mbit": bandwidth_by_phase(run, phases),
        "compression_error_median": round(sorted(errors)[len(errors) // 2], 4) if errors else None,
        "quality_overhead": run.summary.get("quality_overhead"),
        "error_ratios": _median_only(running_over_estimate(run.reports)),
        "final_loss": run.summary["final_loss"],
    }


def _median_only(values: list[float]) -> list[float]:
    return [sorted(values)[len(values) // 2]] if values else []


def is_adaptive(label: str) -> bool:
    return label.startswith(ADAPTIVE)


def target_of(runs: dict[str, dict[str, Any]], phases: Sequence[Phase]) -> float:
    """The held-out loss uncompressed training reaches at 90 % of its steps in this scenario."""
    at = round(0.9 * sum(p.steps for p in phases))
    points = {int(step): loss for step, _, loss in runs["none"]["eval"]}
    if at not in points:
        raise ValueError(f"no evaluation at step {at}: evaluate every {EVAL_EVERY} steps, a divisor of it")
    return points[at]


def scenario_verdict(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Adaptive against the best fixed choice (by time to target) and against uncompressed."""
    def ttt(label: str) -> float:
        value = runs[label]["time_to_target_s"]
        return math.inf if value is None else value

    fixed = [label for label in runs if not is_adaptive(label)]
    best = min(fixed, key=ttt)
    out: dict[str, Any] = {"best_fixed": best, "best_fixed_time_to_target_s": runs[best]["time_to_target_s"],
                           "ratio_to_best": {label: _ratio(ttt(label), ttt(best)) for label in runs}}
    if ADAPTIVE in runs:
        out["adaptive_final_eval_vs_none"] = round(runs[ADAPTIVE]["final_eval"] / runs["none"]["final_eval"] - 1, 4)
    out["final_eval_vs_none"] = {label: round(r["final_eval"] / runs["none"]["final_eval"] - 1, 4) for label, r in runs.items()}
    return out


def _ratio(a: float, b: float) -> float | None:
    return None if not (math.isfinite(a) and math.isfinite(b)) or b <= 0 else round(a / b, 3)


def overall_verdict(doc: dict[str, Any]) -> dict[str, Any]:
    """Each run's worst ratio to the scenario's best fixed choice (None: missed a target)."""
    worst: dict[str, float | None] = {}
    for scenario in doc["scenarios"].values():
        for label, ratio in scenario["verdict"]["ratio_to_best"].items():
            if label not in worst:
                worst[label] = ratio
            elif worst[label] is not None:
                worst[label] = None if ratio is None else max(worst[label], ratio)  # type: ignore[type-var]
    return {"worst_ratio_to_best_fixed": worst}


# --------------------------------------------------------------------------- outputs


def plot(doc: dict[str, Any], path: Path) -> None:
    """Held-out loss against wall time per run, one panel per scenario, link rate shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["scenarios"])
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 4.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        scenario = doc["scenarios"][name]
        rate_ax = ax.twinx()
        shade = scenario["runs"].get(ADAPTIVE) or scenario["runs"]["none"]
        xs, ys = [0.0], [scenario["schedule"][0]["mbit"]]
        for wall, mbit in shade.get("rate_changes_s", []):
            xs += [wall, wall]
            ys += [ys[-1], mbit]
        xs.append(shade["total_s"])
        ys.append(ys[-1])
        rate_ax.fill_between(xs, ys, color="tab:blue", alpha=0.08)
        rate_ax.set_ylim(0, max(p["mbit"] for p in scenario["schedule"]) * 1.15)
        rate_ax.set_ylabel("link rate (Mbit/s), adaptive run")
        for label, run in scenario["runs"].items():
            style = {"lw": 2.4, "color": "black", "zorder": 5} if label == ADAPTIVE else {"lw": 1.0, "alpha": 0.85}
            ax.plot([e[1] for e in run["eval"]], [e[2] for e in run["eval"]], label=label, **style)
        ax.axhline(scenario["target"], color="red", ls=":", lw=1, label="target")
        ax.set_title(f"{name}: held-out loss vs wall time (2 workers, emulated link)")
        ax.set_xlabel("wall time since step 1 (s)")
        ax.set_ylabel("held-out loss")
        ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """One table per scenario, then each run's worst ratio across scenarios."""
    out = []
    for name, scenario in doc["scenarios"].items():
        v = scenario["verdict"]
        out += [(f"**{name}** (`{scenario['schedule_text']}`; target held-out loss {scenario['target']:.4f}, "
                 f"best fixed: {v['best_fixed']})"), "",
                "| run | time to target s | ratio to best fixed | total s | final held-out | vs none | foreign cores | switches |",
                "|---|---:|---:|---:|---:|---:|---:|---|"]
        for label, r in scenario["runs"].items():
            ttt = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            ratio = v["ratio_to_best"][label]
            moves = ", ".join(f"{s['to']} @ {s['at_s']:.1f} s" for s in r["switches"]) or "-"
            out.append(f"| {label} | {ttt} | {'-' if ratio is None else f'{ratio:.3f}'} | {r['total_s']:.2f} | "
                       f"{r['final_eval']:.4f} | {v['final_eval_vs_none'][label]:+.1%} | {r['foreign_cores']} | {moves} |")
        out.append("")
    worst = doc["verdict"]["worst_ratio_to_best_fixed"]
    out += ["**Worst ratio to the best fixed choice across scenarios** (- : missed a target)", "",
            "| run | worst ratio |", "|---|---:|"]
    out += [f"| {label} | {'-' if r is None else f'{r:.3f}'} |" for label, r in worst.items()]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def compression_of(choice: str, args: argparse.Namespace) -> dict[str, Any]:
    """``adaptive``: the policy with its DEFAULT bounds (every compressor, ranks 1..64) and the
    benchmark's scaled dwell; else a fixed label's block."""
    if choice == ADAPTIVE:
        return {"mode": "adaptive", "compressor": args.start, "min_dwell_s": args.min_dwell_s}
    return fixed_compression(choice)


def run_choice(tb: Testbed, args: argparse.Namespace, choice: str, phases: Sequence[Phase], workdir: Path,
               held_out: HeldOut) -> tuple[JobRun, list[tuple[int, float]], list[float]]:
    """One run under the lock, repeated once if other users kept the machine busy; the run
    with the least foreign load is kept. Returns it, its held-out curve and every load seen."""
    loads: list[float] = []
    kept: tuple[JobRun, Path] | None = None
    for attempt in range(1 + args.busy_repeats):
        cfg = train_config(args, compression_of(choice, args), sum(p.steps for p in phases), checkpoint_every=EVAL_EVERY)
        load: dict[str, float] = {}
        workdir_attempt = workdir / f"{choice}-{attempt}"
        with bench_lock():
            wait_for_quiet(args.max_wait_quiet_s)
            with foreign_load(load):
                run = run_job(tb, cfg, phases, workdir_attempt, label=choice, evaluate=False)
        run.foreign_cores = load.get("foreign_cores")
        loads.append(run.foreign_cores or 0.0)
        if kept is None or (run.foreign_cores or 0.0) < (kept[0].foreign_cores or 0.0):
            kept = (run, workdir_attempt)
        if (run.foreign_cores or 0.0) <= BUSY_CORES or attempt == args.busy_repeats:
            break
        print(f"[adaptive] {choice}: foreign load {run.foreign_cores} cores > {BUSY_CORES}: repeating", flush=True)
    assert kept is not None
    return kept[0], held_out.curve(kept[1] / "checkpoints"), loads


def run_scenario(tb: Testbed, args: argparse.Namespace, name: str, workdir: Path) -> dict[str, Any]:
    """Every choice once (same seeds), ``none`` first: its curve sets the target."""
    phases = parse_schedule(args.scenarios[name])
    held_out = HeldOut(train_config(args, fixed_compression("none"), sum(p.steps for p in phases)), HELD_OUT_SAMPLES)
    runs: dict[str, dict[str, Any]] = {}
    for choice in ["none", *[c for c in args.choices if c != "none"]]:
        run, curve, loads = run_choice(tb, args, choice, phases, workdir / name, held_out)
        result = run_result(run, phases, curve)
        result["foreign_cores_runs"] = loads
        origin = run.wall_at(1)
        result["rate_changes_s"] = [[round(wall - origin, 3), mbit] for _, wall, mbit in run.rate_changes]
        runs[choice] = result
        print(f"[adaptive] {name} {choice}: total {result['total_s']:.2f} s, final held-out {result['final_eval']:.4f}, "
              f"switches {[(s['to'], s['at_s']) for s in result['switches']]}, foreign load {loads} cores, "
              f"quality overhead {result['quality_overhead']}", flush=True)
    target = target_of(runs, phases)
    for result in runs.values():
        result["time_to_target_s"] = time_to_target(result["eval"], target)
    scenario = {"schedule_text": args.scenarios[name], "schedule": [{"mbit": p.mbit, "steps": p.steps} for p in phases],
                "target": target, "runs": runs}
    scenario["verdict"] = scenario_verdict(runs)
    return scenario


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_SCENARIOS)}: within 15 minutes")
    parser.add_argument("--scenario", action="append", default=None, metavar="NAME[=MBIT:STEPS,...]",
                        help=f"scenarios to run (default all: {', '.join(SCENARIOS)})")
    parser.add_argument("--choices", nargs="+", default=[*FIXED_CHOICES, ADAPTIVE],
                        help=f"fixed labels and {ADAPTIVE} (the policy with default bounds)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length (BERT models)")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25,
                        help="DDP bucket cap; small, so the CNN's buckets overlap backward")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--report-interval-s", type=float, default=0.1,
                        help="telemetry cadence (the policy decides on each report); rates change on reports")
    parser.add_argument("--probe-interval-s", type=float, default=2.0,
                        help="probes (and error estimates) come at most this often, within the budget")
    parser.add_argument("--probe-budget", type=float, default=0.05,
                        help="share of run time probes may take (estimates: half of it); scaled up like the "
                             "dwell, as phases here last seconds, not minutes (the job default is 0.02)")
    parser.add_argument("--start", default="none", help="the adaptive run's first compressor")
    parser.add_argument("--min-dwell-s", type=float, default=2.0,
                        help="the policy's minimum dwell, scaled to the schedule's seconds-long phases "
                             "(the job default, 30 s, suits links that change over minutes)")
    parser.add_argument("--busy-repeats", type=int, default=1,
                        help=f"repeat a run this often while it saw more than {BUSY_CORES} foreign cores")
    parser.add_argument("--max-wait-quiet-s", type=float, default=20.0,
                        help="before each run, wait up to this long for other work to leave the CPUs")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --json-out)")
    parser.add_argument("--md-out", type=Path, default=None, help="markdown tables (default: next to --json-out)")
    parser.add_argument("--include", type=Path, action="append", default=None,
                        help="add the scenarios of an earlier result JSON that this run does not measure")
    parser.add_argument("--merge-only", action="store_true",
                        help="measure nothing: write the --include files' scenarios as one result")
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's telemetry, checkpoints and logs here")
    args = parser.parse_args(argv)
    chosen: dict[str, str] = {}
    for item in args.scenario or (QUICK_SCENARIOS if args.quick else SCENARIOS):
        name, _, schedule = item.partition("=")
        if not schedule and name not in SCENARIOS:
            parser.error(f"--scenario: unknown {name!r}; known: {', '.join(SCENARIOS)}, or NAME=MBIT:STEPS,...")
        chosen[name] = schedule or SCENARIOS[name]
        try:
            total = sum(p.steps for p in parse_schedule(chosen[name]))
        except ValueError as exc:
            parser.error(f"--scenario {name}: {exc}")
        if round(0.9 * total) % EVAL_EVERY or total % EVAL_EVERY:
            parser.error(f"--scenario {name}: {total} steps; the total and 90 % of it must be multiples of {EVAL_EVERY}")
    args.scenarios = chosen
    if args.merge_only and not args.include:
        parser.error("--merge-only: name the results to merge with --include")
    return args


def rank_entry(argv: Sequence[str]) -> int:
    """``adaptive.py _rank``: ``workers.rank_main`` plus checkpoints in ``--checkpoint-dir``.

    The final checkpoint holds every rank's own record of the compressor it used at each
    step, which is how a test checks that the ranks switched together.
    """
    from workers.runner import run_rank

    parser = argparse.ArgumentParser(prog="adaptive.py _rank")
    for flag in ("--config", "--summary", "--progress", "--checkpoint-dir"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    args = parser.parse_args(argv)
    config = TrainConfig.model_validate_json(args.config.read_text())

    def progress(report: dict[str, Any]) -> None:
        with args.progress.open("a") as handle:
            handle.write(json.dumps(report) + "\n")

    summary = run_rank(config, args.rank, args.world_size, args.init_method,
                       checkpoint_root=args.checkpoint_dir, progress=progress)
    if args.rank == 0:
        args.summary.write_text(json.dumps(summary, default=str))
    return 0


def write_results(args: argparse.Namespace, doc: dict[str, Any], table: str) -> Path | None:
    """Write ``--json-out`` and the markdown table (``--md-out``, default beside the JSON);
    return where the plot goes (``--plot``, default beside the JSON; None: no plot)."""
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
        (args.md_out or args.json_out.with_suffix(".md")).write_text(table)
    return args.plot or (args.json_out.with_suffix(".png") if args.json_out else None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_rank"]:
        return rank_entry(argv[1:])
    args = parse_args(argv)
    started = time.monotonic()
    doc: dict[str, Any] = {"scenarios": {}}
    if args.merge_only:
        args.scenarios = {}
    else:
        ok, why = Testbed.available()
        if not ok:
            print(f"testbed unavailable: {why}", file=sys.stderr)
            return 2
        first_rate = parse_schedule(next(iter(args.scenarios.values())))[0].mbit
        with Testbed(hosts=2, mbit=first_rate) as tb, tempfile.TemporaryDirectory(prefix="gw-adaptive-") as tmp:
            for name in args.scenarios:
                doc["scenarios"][name] = run_scenario(tb, args, name, Path(args.keep or tmp))
    for path in args.include or []:  # scenarios measured by another run of this command
        for name, scenario in json.loads(path.read_text())["scenarios"].items():
            doc["scenarios"].setdefault(name, {**scenario, "from": str(path)})
    doc["verdict"] = overall_verdict(doc)
    doc["job"] = {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size, "lr": args.lr,
                  "bucket_cap_mb": args.bucket_cap_mb, "workers": 2, "seed": args.seed, "eval_every": EVAL_EVERY,
                  "probe_interval_s": args.probe_interval_s, "probe_budget": args.probe_budget,
                  "sync_every": args.sync_every, "report_interval_s": args.report_interval_s,
                  "cluster": "local processes in network namespaces (benchmarks.testbed), not a Ray cluster",
                  ADAPTIVE: compression_of(ADAPTIVE, args), "cpu_cores": os.cpu_count(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "wall_s": round(time.monotonic() - started)}
    if args.merge_only:
        doc["job"] = {**json.loads(args.include[0].read_text())["job"], "merged_from": [str(p) for p in args.include]}
    table = markdown(doc)
    print(table)
    print(json.dumps(doc["verdict"], indent=2))
    plot_path = write_results(args, doc, table)
    if plot_path:
        plot(doc, plot_path)
    print(f"[adaptive] done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
