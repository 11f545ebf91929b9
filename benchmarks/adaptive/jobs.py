"""Running one job on the testbed: two ranks in their namespaces, the rate walked by step, the held-out
evaluation of its checkpoints; and the ``_rank`` entry each rank runs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from benchmarks.adaptive.scenarios import POLL_S, Phase, boundaries
from benchmarks.repo import REPO_ROOT, module_command, repo_env
from benchmarks.testbed import Testbed, TestbedError, worker_env
from planning.config import TrainConfig


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
        argv = module_command("benchmarks.adaptive", "_rank", "--checkpoint-dir", str(workdir / "checkpoints"),
                "--config", str(config_path), "--rank", str(rank), "--world-size", "2", "--init-method", init,
                "--summary", str(summary_path), "--progress", str(progress))
        env = {**worker_env(tb, rank), **repo_env()}
        with open(workdir / f"rank{rank}.log", "w") as log:
            procs.append(tb.run(rank, argv, env=env, cwd=str(REPO_ROOT), stdout=log, stderr=subprocess.STDOUT))
    reports, changes = follow_reports(tb, procs, progress, phases, time.monotonic() + timeout_s)
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = (workdir / f"rank{rank}.log").read_text()[-3000:]
            raise TestbedError(f"{label}: rank {rank} exited with {proc.returncode}:\n{tail}")
    checkpoint = final_checkpoint(workdir / "checkpoints")
    return JobRun(label=label, reports=reports, summary=json.loads(summary_path.read_text()), rate_changes=changes,
                  checkpoint=checkpoint, eval_loss=eval_loss(cfg, checkpoint) if evaluate else None)


class Backend(Protocol):
    """Where the benchmark's jobs run (``LocalBackend``, or ``on_cluster.ClusterBackend``)."""

    #: Said in the results: where the runs ran.
    where: str

    def run(self, cfg: TrainConfig, phases: Sequence[Phase], workdir: Path, *, label: str) -> JobRun:
        """Run one job through ``phases``; the run's ``checkpoint`` is its final checkpoint, among
        its others in the same directory."""
        ...

    def own_pids(self) -> Iterable[int]:
        """Processes besides this one and its waited-for children whose CPU is the benchmark's own."""
        ...


class LocalBackend:
    """Two local processes in the testbed's namespaces (:func:`run_job`)."""

    where = "local processes in network namespaces (benchmarks.testbed), not a Ray cluster"

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb

    def run(self, cfg: TrainConfig, phases: Sequence[Phase], workdir: Path, *, label: str) -> JobRun:
        return run_job(self.tb, cfg, phases, workdir, label=label, evaluate=False)

    def own_pids(self) -> list[int]:
        return []  # the ranks are children, waited for before the load is read


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


#: Held-out samples a forward pass takes at once (the benchmark's 512 in one).
EVAL_CHUNK = 512


class HeldOut:
    """The held-out split of ``cfg``'s dataset, built once; calling it evaluates a checkpoint.

    Why held-out loss: the training loss of the last step is one batch of 64 samples, far too
    noisy to compare runs within a few per cent; the held-out set is the same for every run
    of a seed (the seed draws it).
    """

    def __init__(self, cfg: TrainConfig, samples: int = 1024) -> None:
        from workers.data import build_dataset, dataset_size, input_spec
        from workers.loaders import make_loader
        from workers.models import build_model

        self.cfg = cfg
        inputs = input_spec(cfg.model.name, cfg.data.dataset, seq_len=cfg.data.seq_len, image_size=cfg.data.image_size)
        self.model = build_model(cfg.model.name, **inputs)
        self.model.eval()
        # A synthetic split is drawn sample by sample from the seed, so a larger one keeps the
        # default split's samples first (``benchmarks.adaptive.rejudge`` evaluates prefixes).
        size = samples if cfg.data.dataset == "synthetic" and samples > dataset_size("synthetic", "test") else None
        test_set = build_dataset(cfg.data.dataset, model=cfg.model.name, split="test", seed=cfg.seed, seq_len=cfg.data.seq_len,
                                 image_size=cfg.data.image_size, num_samples=size)
        # Loaded once: every checkpoint is evaluated on the very same tensors (the first
        # ``samples`` of the split: 512 keeps 20 evaluations of a run under a minute on this
        # shared 2-core machine).
        batches = make_loader(test_set, batch_size=samples, rank=0, world_size=1, seed=cfg.seed,
                              shuffle=False, drop_last=False)
        self.batches = [next(iter(batches))]
        self.size = sum(int(targets.numel()) for _, targets in self.batches)

    def __call__(self, checkpoint: Path) -> float:
        return float(self.losses(checkpoint).mean())

    def losses(self, checkpoint: Path) -> Any:
        """Each held-out sample's cross-entropy under the checkpointed model (a float64 tensor)."""
        import torch
        import torch.nn.functional as F

        from workers.checkpoint import TRAINER_FILE

        self.model.load_state_dict(torch.load(checkpoint / TRAINER_FILE, map_location="cpu", weights_only=False)["model"])
        with torch.no_grad():  # in chunks of EVAL_CHUNK: one forward of thousands of images costs
            # more in allocating its activations than in computing them
            return torch.cat([F.cross_entropy(self.model(x), y, reduction="none").double()
                              for inputs, targets in self.batches
                              for x, y in zip(inputs.split(EVAL_CHUNK), targets.split(EVAL_CHUNK))])

    def curve(self, root: Path) -> list[tuple[int, float]]:
        """(step, held-out loss) of every checkpoint under ``root``, by step."""
        return self.prefix_curves(root, [self.size])[self.size]

    def prefix_curves(self, root: Path, sizes: Sequence[int]) -> dict[int, list[tuple[int, float]]]:
        """``{N: [(step, held-out loss on the first N samples), ...]}`` of every checkpoint under
        ``root``, by step: one evaluation of each checkpoint serves every N."""
        from workers.checkpoint import read_meta

        checkpoints = sorted((int(read_meta(d)["step"]), d) for d in root.glob("checkpoint_*") if d.is_dir())
        curves: dict[int, list[tuple[int, float]]] = {n: [] for n in sizes}
        for step, directory in checkpoints:
            losses = self.losses(directory)
            for n in sizes:
                curves[n].append((step, float(losses[:n].mean())))
        return curves


def follow_reports(tb: Testbed, procs: list[subprocess.Popen], progress: Path, phases: Sequence[Phase],
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


def rank_entry(argv: Sequence[str]) -> int:
    """``python -m benchmarks.adaptive _rank``: ``workers.rank_main`` plus checkpoints in ``--checkpoint-dir``.

    The final checkpoint holds every rank's own record of the compressor it used at each
    step, which is how a test checks that the ranks switched together.
    """
    from workers.runner import run_rank

    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive _rank")
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


