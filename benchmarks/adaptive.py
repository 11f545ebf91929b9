"""The adaptive policy against every fixed compressor, on an emulated link whose rate changes.

Why: the claim of gradwire is that choosing the compressor from the *measured* link beats
any single choice made in advance when the network changes. This benchmark runs the same
two-worker job (one worker per network namespace of :mod:`benchmarks.testbed`) once with
each fixed compressor and once with the adaptive policy (rank 0's in-process policy, no
coordinator), while the link rate follows a schedule, e.g. 1000 -> 50 -> 500 Mbit/s.

The job: the small CNN (0.15 M parameters, 0.6 MB of gradients) at batch 32 on 32x32
synthetic images, with 0.25 MB DDP buckets, so the classifier's gradients (ready early in
backward) travel while the convolutions' backward runs: at 1000 Mbit/s the uncompressed
all-reduce hides behind compute, at 50 Mbit/s it costs ~4x the compute. ``adaptive`` runs
the policy with a quality bound, ``min_rank = max_rank = 16`` (this CNN's held-out loss is
~30 % worse at rank 4, within run-to-run noise at 16); ``adaptive-defaults`` runs it with
every bound at its default and is reported under ``extra_runs``.

Fixed steps, not fixed time. Every phase of the schedule is a fixed number of training
steps: the driver follows rank 0's telemetry and changes the rate as soon as a report shows
the phase's last step done. So every run does the same work under each rate, and the time
it needs (``total_s``, ``phase_s``) compares directly across runs; the oracle is the sum
over phases of the fastest fixed choice's ``phase_s`` in that phase. (Fixed wall-clock
phases would let a slow choice spend fewer steps on the slow link, blurring what it costs
there.) Reports come every ``--report-interval-s`` (0.1 s: the policy decides on each one),
so the rate changes up to one interval plus ~20 ms (a poll, two ``tc`` calls) after the
boundary; phase times are interpolated between reports at the nominal boundary steps. In
the JSON, each schedule entry gives ``steps`` and ``seconds``, the phase's length in the
adaptive run (or, without one, the first choice's run).

Times come from the telemetry's wall clock: ``total_s`` runs from the end of step 1 to the
last step (process start-up, model build and the first probe are left out; later probes,
the policy and telemetry are in, for every run alike). Each choice runs ``--repeats``
times, round-robin, and each phase counts its best time over the repeats (other users of
this shared machine only ever add time; every run records the cores they kept busy as
``foreign_cores``). ``final_loss`` is the job summary's (last step's batch, averaged over
ranks; every run sees the same batches); ``eval_loss``, the final model's loss on the 1024
held-out samples, is the steadier figure to compare quality by.

    python benchmarks/adaptive.py --json-out benchmarks/results/adaptive.json   # --quick: ~5 minutes

Needs root (network namespaces); every timed run holds ``/tmp/gradwire-bench.lock``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
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
from workers.protocol import TrainConfig  # noqa: E402

LOCK_PATH = "/tmp/gradwire-bench.lock"
FIXED_CHOICES = ("none", "fp16", "powersgd-r4", "acpsgd-r4", "acpsgd-r16", "topk-0.01", "signsgd")
ADAPTIVE = "adaptive"
#: The policy with every bound at its default (min_rank 1, max_rank 64, all compressors).
ADAPTIVE_DEFAULTS = "adaptive-defaults"
DEFAULT_SCHEDULE = "1000:400,50:200,500:400"
QUICK_SCHEDULE = "1000:120,50:60,500:120"
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
            label: str, timeout_s: float = 600.0) -> JobRun:
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
                  checkpoint=checkpoint, eval_loss=eval_loss(cfg, checkpoint))


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
    """Cross-entropy of the checkpointed model on the held-out split (1024 samples).

    Why: the training loss of the last step is one batch of 64 samples, far too noisy to
    compare runs within a few per cent; the held-out set is the same for every run.
    """
    import torch
    import torch.nn.functional as F

    from workers.checkpoint import TRAINER_FILE
    from workers.data import build_dataset, input_spec, make_loader
    from workers.models import build_model

    model = build_model(cfg.model, **input_spec(cfg.model, cfg.dataset, seq_len=cfg.seq_len, image_size=cfg.image_size))
    model.load_state_dict(torch.load(checkpoint / TRAINER_FILE, map_location="cpu", weights_only=False)["model"])
    model.eval()
    test_set = build_dataset(cfg.dataset, model=cfg.model, split="test", seed=cfg.seed, seq_len=cfg.seq_len,
                             image_size=cfg.image_size)
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in make_loader(test_set, batch_size=256, rank=0, world_size=1, seed=cfg.seed,
                                           shuffle=False, drop_last=False):
            total += float(F.cross_entropy(model(inputs), targets, reduction="sum"))
            count += int(targets.numel())
    return total / count


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


def phase_seconds(run: JobRun, phases: Sequence[Phase]) -> list[float]:
    """Seconds each phase took: from its first step's end (phase 1: step 1) to its last's."""
    starts = [1] + boundaries(phases)[:-1]
    ends = boundaries(phases)
    return [run.wall_at(end) - run.wall_at(start) for start, end in zip(starts, ends)]


def switches(run: JobRun) -> list[dict[str, Any]]:
    """Compressor changes, timed like ``total_s`` (seconds since the report of step 1)."""
    origin = run.wall_at(1)
    out = []
    for switch in run.summary.get("switches", []):
        step = int(switch["step"])
        at = run.wall_at(step) - origin
        out.append({"at_s": round(at, 3), "step": step, "to": switch["to"], "reason": switch.get("reason", "")})
    return out


def step_label(report: dict[str, Any]) -> str:
    """Telemetry's compressor as a label (``acpsgd-r4``)."""
    name = report.get("compressor") or "?"
    if report.get("rank"):
        return f"{name}-r{report['rank']}"
    if report.get("ratio"):
        return f"{name}-{report['ratio']:g}"
    return name


def run_result(run: JobRun, phases: Sequence[Phase]) -> dict[str, Any]:
    """The JSON entry of one run (design.md §3 figures plus the phase breakdown)."""
    per_phase = phase_seconds(run, phases)
    return {
        "total_s": round(sum(per_phase), 3),
        "phase_s": [round(s, 3) for s in per_phase],
        "final_loss": run.summary["final_loss"],
        "eval_loss": None if run.eval_loss is None else round(run.eval_loss, 5),
        "switches": switches(run),
        "steps": run.summary["steps"],
        "bandwidth_mbit": bandwidth_by_phase(run, phases),
        "foreign_cores": run.foreign_cores,
    }


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


def is_adaptive(label: str) -> bool:
    return label.startswith(ADAPTIVE)


def oracle(results: dict[str, dict[str, Any]]) -> tuple[float, list[str]]:
    """Sum over phases of the fastest fixed choice in that phase, and which one it was."""
    fixed = {label: r for label, r in results.items() if not is_adaptive(label)}
    if not fixed:
        return float("nan"), []
    best = [min(fixed, key=lambda label: fixed[label]["phase_s"][i]) for i in range(len(next(iter(fixed.values()))["phase_s"]))]
    return sum(fixed[label]["phase_s"][i] for i, label in enumerate(best)), best


# --------------------------------------------------------------------------- outputs


def plot(runs: dict[str, JobRun], phases: Sequence[Phase], path: Path) -> None:
    """Step time against wall time for every run, with the link rate overlaid (second axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    rate_ax = ax.twinx()
    for label, run in runs.items():
        origin = run.wall_at(1)
        xs, ys = [], []
        for before, after in zip(run.reports, run.reports[1:]):
            steps = after["step"] - before["step"]
            if steps > 0:
                xs.append(after["wall_time"] - origin)
                ys.append((after["wall_time"] - before["wall_time"]) / steps * 1e3)
        style = ({"lw": 2.2, "color": "black", "zorder": 5} if label == ADAPTIVE else
                 {"lw": 1.4, "color": "dimgrey", "ls": "--", "zorder": 4} if is_adaptive(label) else {"lw": 0.9, "alpha": 0.8})
        ax.plot(xs, _smooth(ys), label=label, **style)
        if label == ADAPTIVE:
            _rate_steps(rate_ax, run, phases)
            for switch in switches(run):
                ax.axvline(switch["at_s"], color="black", ls=":", lw=0.8)
                ax.annotate(switch["to"], (switch["at_s"], 1.0), xycoords=("data", "axes fraction"),
                            rotation=90, va="top", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("wall time since step 1 (s)")
    ax.set_ylabel("step time (ms, 5-step moving average)")
    rate_ax.set_ylabel("link rate (Mbit/s), adaptive run")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    ax.set_title("2 workers on an emulated link: step time of fixed compressors vs adaptive")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values: list[float], width: int = 5) -> list[float]:
    return [sum(values[max(0, i - width + 1):i + 1]) / len(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def _rate_steps(rate_ax: Any, run: JobRun, phases: Sequence[Phase]) -> None:
    """The rate as set during ``run`` (a step function), shaded behind the step times."""
    origin = run.wall_at(1)
    xs, ys = [0.0], [phases[0].mbit]
    for _, wall, mbit in run.rate_changes:
        xs += [wall - origin, wall - origin]
        ys += [ys[-1], mbit]
    xs.append(run.reports[-1]["wall_time"] - origin)
    ys.append(ys[-1])
    rate_ax.fill_between(xs, ys, color="tab:blue", alpha=0.08, step=None)
    rate_ax.plot(xs, ys, color="tab:blue", lw=1, alpha=0.5)
    rate_ax.set_ylim(0, max(p.mbit for p in phases) * 1.15)


def markdown(doc: dict[str, Any], best_per_phase: list[str]) -> str:
    """A table for the README: one row per run, one column per phase."""
    heads = [f"{p['mbit']:g} Mbit/s × {p['steps']} steps" for p in doc["schedule"]]
    lines = ["| run | total s | " + " | ".join(heads) + " | final loss | held-out loss | switches |",
             "|---|---:|" + "---:|" * len(heads) + "---:|---:|---|"]
    for label, r in {**doc["runs"], **doc.get("extra_runs", {})}.items():
        moves = ", ".join(f"{s['to']} @ {s['at_s']:.1f} s" for s in r["switches"]) or "-"
        lines.append(f"| {label} | {r['total_s']:.2f} | " + " | ".join(f"{s:.2f}" for s in r["phase_s"])
                     + f" | {r['final_loss']:.4f} | {r['eval_loss']:.4f} | {moves} |")
    lines.append(f"| oracle | {doc['oracle_total_s']:.2f} | " + " | ".join(best_per_phase) + " | | | |")
    return "\n".join(lines) + "\n"


def verdict(doc: dict[str, Any]) -> dict[str, Any]:
    """The acceptance figures of each adaptive run: vs oracle, vs the best fixed choice, loss vs none."""
    runs = {**doc["runs"], **doc.get("extra_runs", {})}
    fixed = {k: v for k, v in runs.items() if not is_adaptive(k)}
    if not fixed:
        return {}
    best_fixed = min(fixed, key=lambda k: fixed[k]["total_s"])
    out: dict[str, Any] = {"best_fixed": best_fixed}
    for label in filter(is_adaptive, runs):
        figures = {"over_oracle": round(runs[label]["total_s"] / doc["oracle_total_s"], 3),
                   "over_best_fixed": round(runs[label]["total_s"] / fixed[best_fixed]["total_s"], 3)}
        if "none" in runs:
            for key in ("final_loss", "eval_loss"):
                figures[f"{key}_vs_none"] = round(runs[label][key] / runs["none"][key] - 1, 4)
        out[label] = figures
    return out


# --------------------------------------------------------------------------- main


def compression_of(choice: str, args: argparse.Namespace) -> dict[str, Any]:
    """``adaptive`` with the quality bounds of ``args``, ``adaptive-defaults`` with the policy's
    own defaults, or a fixed label's block."""
    if choice == ADAPTIVE:
        block: dict[str, Any] = {"mode": "adaptive", "compressor": args.start,
                                 "min_rank": args.min_rank, "max_rank": args.max_rank,
                                 "min_dwell_s": args.min_dwell_s, "gain_threshold": args.gain_threshold}
        return block | ({"allowed": list(args.allowed)} if args.allowed else {})
    if choice == ADAPTIVE_DEFAULTS:
        return {"mode": "adaptive", "compressor": args.start, "min_dwell_s": args.min_dwell_s}
    return fixed_compression(choice)


def run_all(args: argparse.Namespace) -> dict[str, list[JobRun]]:
    """Every choice ``repeats`` times, round-robin on one testbed, each run under the lock.

    Round-robin, so a burst of load from other users of the machine slows one run of
    several choices rather than every run of one choice.
    """
    phases = parse_schedule(args.schedule)
    steps = sum(p.steps for p in phases)
    runs: dict[str, list[JobRun]] = {choice: [] for choice in args.choices}
    with Testbed(hosts=2, mbit=phases[0].mbit) as tb, tempfile.TemporaryDirectory(prefix="gw-adaptive-") as tmp:
        for repeat in range(args.repeats):
            for choice in args.choices:
                cfg = train_config(args, compression_of(choice, args), steps)
                workdir = Path(args.keep or tmp) / f"{choice}-{repeat}"
                load: dict[str, float] = {}
                with bench_lock():
                    wait_for_quiet(args.max_wait_quiet_s)
                    with foreign_load(load):
                        run = run_job(tb, cfg, phases, workdir, label=choice)
                run.foreign_cores = load.get("foreign_cores")
                runs[choice].append(run)
                result = run_result(run, phases)
                print(f"[adaptive] {repeat + 1}/{args.repeats} {choice}: total {result['total_s']:.2f} s, "
                      f"phases {result['phase_s']}, loss {result['final_loss']:.4f}, "
                      f"bandwidth seen {result['bandwidth_mbit']} Mbit/s, "
                      f"switches {[(s['to'], s['at_s']) for s in result['switches']]}, "
                      f"foreign load {run.foreign_cores} cores", flush=True)
    return runs


def summarise(runs: list[JobRun], phases: Sequence[Phase]) -> tuple[dict[str, Any], JobRun]:
    """One choice over its repeats: the best time of each phase (interference only ever adds
    time, as with ``timeit``); loss, switches and the plot from the run of median total."""
    results = [run_result(run, phases) for run in runs]
    per_phase = [min(r["phase_s"][i] for r in results) for i in range(len(phases))]
    typical = sorted(range(len(runs)), key=lambda i: results[i]["total_s"])[(len(runs) - 1) // 2]
    out = dict(results[typical])
    out["phase_s"] = [round(s, 3) for s in per_phase]
    out["total_s"] = round(sum(per_phase), 3)
    out["repeat_total_s"] = [r["total_s"] for r in results]
    return out, runs[typical]


def report(args: argparse.Namespace, runs: dict[str, list[JobRun]]) -> tuple[dict[str, Any], dict[str, JobRun], list[str]]:
    """The JSON document of the module docstring, plus the runs to plot and the oracle's picks."""
    phases = parse_schedule(args.schedule)
    results: dict[str, dict[str, Any]] = {}
    typical: dict[str, JobRun] = {}
    for choice, repeats in runs.items():
        results[choice], typical[choice] = summarise(repeats, phases)
    reference = typical.get(ADAPTIVE) or next(iter(typical.values()))
    seconds = phase_seconds(reference, phases)
    doc: dict[str, Any] = {
        "schedule": [{"mbit": p.mbit, "seconds": round(s, 3), "steps": p.steps} for p, s in zip(phases, seconds)],
        "runs": {k: v for k, v in results.items() if k == ADAPTIVE or not is_adaptive(k)},
        "extra_runs": {k: v for k, v in results.items() if is_adaptive(k) and k != ADAPTIVE},
    }
    total, best = oracle(results)
    doc["oracle_total_s"] = round(total, 3)
    doc["oracle_choices"] = best
    doc["job"] = {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size, "seq_len": args.seq_len, "lr": args.lr,
                  "bucket_cap_mb": args.bucket_cap_mb, "workers": 2, "probe_interval_s": args.probe_interval_s,
                  "probe_budget": args.probe_budget,
                  "sync_every": args.sync_every, "report_interval_s": args.report_interval_s, "repeats": args.repeats,
                  ADAPTIVE: compression_of(ADAPTIVE, args), ADAPTIVE_DEFAULTS: compression_of(ADAPTIVE_DEFAULTS, args)}
    doc["verdict"] = verdict(doc)
    return doc, typical, best


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", help=f"MBIT:STEPS,... (default {DEFAULT_SCHEDULE}; --quick {QUICK_SCHEDULE})")
    parser.add_argument("--quick", action="store_true", help="shorter phases, 2 repeats: within ~10 minutes")
    parser.add_argument("--repeats", type=int, default=None, help="runs per choice (default 2; --quick 1)")
    parser.add_argument("--choices", nargs="+", default=[*FIXED_CHOICES, ADAPTIVE, ADAPTIVE_DEFAULTS],
                        help=f"fixed labels, {ADAPTIVE} (bounds below) and {ADAPTIVE_DEFAULTS}")
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
                        help="probes come at most this often, and within the 2 %% budget")
    parser.add_argument("--probe-budget", type=float, default=0.05,
                        help="share of run time probes may take; scaled up like the dwell, as phases here "
                             "last seconds, not minutes (the job default is 0.02)")
    parser.add_argument("--start", default="none", help="the adaptive run's first compressor")
    parser.add_argument("--allowed", nargs="+", default=None, help="compressors the policy may pick (default all)")
    parser.add_argument("--min-rank", type=int, default=16, help="adaptive's quality bound (the CNN keeps its "
                        "loss at rank 16, not at 4)")
    parser.add_argument("--max-rank", type=int, default=16)
    parser.add_argument("--min-dwell-s", type=float, default=2.0,
                        help="the policy's minimum dwell, scaled to the schedule's seconds-long phases "
                             "(the job default, 30 s, suits links that change over minutes)")
    parser.add_argument("--gain-threshold", type=float, default=0.10)
    parser.add_argument("--max-wait-quiet-s", type=float, default=20.0,
                        help="before each run, wait up to this long for other work to leave the CPUs")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --json-out)")
    parser.add_argument("--md-out", type=Path, default=None, help="markdown table (default: next to --json-out)")
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's telemetry and logs here")
    args = parser.parse_args(argv)
    args.schedule = args.schedule or (QUICK_SCHEDULE if args.quick else DEFAULT_SCHEDULE)
    args.repeats = args.repeats or (1 if args.quick else 2)
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
    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    doc, typical, best = report(args, run_all(args))
    table = markdown(doc, best)
    print(table)
    print(json.dumps(doc["verdict"], indent=2))
    plot_path = write_results(args, doc, table)
    if plot_path:
        plot(typical, parse_schedule(args.schedule), plot_path)
    print(f"[adaptive] done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
