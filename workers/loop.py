"""The training loop every worker runs: model, DDP, GradientSync, timed steps, checkpoints.

``train_loop_per_worker(config)`` is what ``ray.train.torch.TorchTrainer`` runs on each
worker; ``run_training(cfg, env)`` is the same loop for any :class:`WorkerEnv` (Ray Train, or
plain torch multiprocessing for ``gradwire train --no-ray``). It reads top to bottom:

1. build model and data from the registries, wrap DDP, install GradientSync;
2. resume from the latest checkpoint if there is one (model, optimizer, compressor state,
   step, RNG), folding compressor state if the world size changed;
3. each step: data → forward → backward (the hook compresses and communicates per bucket
   while backward runs) → optimizer, every phase timed;
4. every ``sync_every`` steps rank 0 broadcasts the decision in force (and whether to probe
   the link); every rank switches compressor at that same step;
5. rank 0 reports telemetry every ``report_interval_s``; every rank checkpoints every
   ``checkpoint_every`` steps and at the end.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from compressors import GradientSync
from compressors.base import GradSlot, from_spec, run_in_lockstep
from planning import registry
from planning.controller import decision_for
from planning.costmodel import build_bucket_layout, codec_work
from planning.protocol import Decision, ModelProfile, Telemetry, TrainConfig
from planning.spec import make_spec, spec_to_dict
from workers import checkpoint as ckpt
from workers.control import (
    CallbackSink,
    CoordinatorClient,
    DecisionSource,
    FixedDecision,
    InProcessPolicy,
    SwitchAgreement,
    TelemetrySink,
)
from workers.link_estimate import LinkEstimate
from workers.loaders import InfiniteLoader, batches_per_epoch, make_loader
from workers.passive_bandwidth import PassiveBandwidth
from workers.probe import DEFAULT_SIZES, PROBE_STOP_FACTOR, PROBE_TRANSFER_S, probe_link, sized_probe
from workers.probe_scheduler import ProbeScheduler
from workers.quality import QualitySignal
from workers.timing import StepTimer, codec_clock
from workers.usercode import Workload, build_workload

log = logging.getLogger(__name__)

#: Rank 0's passive bandwidth estimate takes the fastest of this many consecutive steps'
#: collectives: the others include waiting for the peer (see PassiveBandwidth.min_of_last).
PASSIVE_MIN_OF_LAST = 4


# --------------------------------------------------------------------------- environment


class WorkerEnv(Protocol):
    """Where the loop runs: rank, device, checkpoints, and where progress goes."""

    rank: int
    world_size: int
    device: torch.device

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        """Call ``reader`` on the latest checkpoint directory; None if there is none."""

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        """Collective: every rank writes its files with ``writer``; one checkpoint results."""

    def progress_sink(self) -> TelemetrySink | None:
        """Where rank 0's telemetry goes besides the coordinator (live progress), if anywhere."""


class RayWorkerEnv:
    """Ray Train: checkpoints through ``ray.train.report``; progress to a named Ray actor."""

    def __init__(self, progress_actor: str | None = None) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.device = ray.train.torch.get_device()
        self._progress_actor = progress_actor

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            return reader(Path(directory))

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        import ray.train

        with tempfile.TemporaryDirectory() as directory:
            writer(Path(directory))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def progress_sink(self) -> TelemetrySink | None:
        if self._progress_actor is None or self.rank != 0:
            return None
        import ray

        try:
            actor = ray.get_actor(self._progress_actor)
        except ValueError:
            return None
        return CallbackSink(lambda report: actor.push.remote(report))


class LocalWorkerEnv:
    """Plain torch multiprocessing: checkpoints in a directory, progress to a callback."""

    def __init__(self, rank: int, world_size: int, device: torch.device, checkpoint_root: Path | None,
                 progress: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.root = checkpoint_root
        self._progress = progress
        self.saved = 0

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        if self.root is None or not (self.root / "latest").exists():
            return None
        return reader(self.root / (self.root / "latest").read_text().strip())

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        if self.root is None:
            return
        self.saved += 1
        name = f"checkpoint_{self.saved:06d}"
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        writer(directory)
        dist.barrier()
        if self.rank == 0:
            (directory / "metrics.json").write_text(json.dumps(metrics))
            (self.root / "latest").write_text(name)
        dist.barrier()

    def progress_sink(self) -> TelemetrySink | None:
        if self._progress is None or self.rank != 0:
            return None
        return CallbackSink(self._progress)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Entry point for ``ray.train.torch.TorchTrainer`` (``train_loop_config`` = this dict)."""
    logging.basicConfig(level=logging.INFO)
    cfg = TrainConfig.model_validate(config["train"])
    run_training(cfg, RayWorkerEnv(progress_actor=config.get("progress_actor")))


# --------------------------------------------------------------------------- the loop


@dataclass
class RankRecord:
    """What this rank itself saw: which compressor each step used, and when decisions applied."""

    rank: int
    step_compressors: dict[int, str] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)


def run_training(cfg: TrainConfig, env: WorkerEnv) -> dict[str, Any]:
    """Train ``cfg`` on this worker; returns the run summary (rank 0's is the job's)."""
    torch.manual_seed(cfg.seed)
    device = env.device
    workload = build_workload(cfg)
    model, train_set = workload.model.to(device), workload.train_set
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = _optimizer(cfg, model)
    total_steps = cfg.steps or cfg.epochs * batches_per_epoch(len(train_set), cfg.batch_size, env.world_size)  # type: ignore[operator]
    checkpoint_every = cfg.checkpoint_interval(total_steps)
    scheduler = _lr_schedule(cfg, optimizer, total_steps)
    first = make_spec(cfg.compression.compressor, **cfg.compression.compressor_params())
    sync = GradientSync(from_spec(first), pipelining=cfg.pipelining).install(ddp)
    control_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    agreement = SwitchAgreement(cfg.sync_every, group=control_group)

    start_step, resumed_decision = _resume(env, cfg, model, optimizer, scheduler, sync)
    agreement.version = resumed_decision.version if resumed_decision else 0
    record = RankRecord(rank=env.rank)
    source = _decision_source(cfg, env, resumed_decision or decision_for(first, 0, "initial choice from the job spec"))
    sinks = [s for s in (env.progress_sink(), source if isinstance(source, CoordinatorClient) else None) if s is not None]
    reporter = _Reporter(cfg, env, sync, source, sinks, total_steps,
                         resumed_from_step=start_step if resumed_decision is not None else None)

    loader = InfiniteLoader(train_set, cfg.batch_size, env.rank, env.world_size, cfg.seed, start_step=start_step)
    timer = StepTimer(device)
    link = probe_link(sync.process_group) if env.world_size > 1 else LinkEstimate.no_link()
    reporter.link(link)
    loss_value = math.nan
    switches: list[dict[str, Any]] = []
    run_started = time.monotonic()
    log.info("rank %d: training %s steps %d..%d with %s", env.rank, cfg.model, start_step, total_steps, sync.compressor.label)

    for step in range(start_step, total_steps):
        # 4. agree on the compressor (and a probe) at the same step on every rank
        if agreement.due(step):
            decision, probe_bytes = agreement.exchange(step, reporter.proposal(), reporter.probe_request())
            if decision is not None:
                record.applied.append({"step": step, "version": decision.version,
                                       "compressor": decision.compressor, "params": decision.params})
                spec = make_spec(decision.compressor, **decision.params)
                if spec != sync.compressor.spec:
                    sync.switch(from_spec(spec))
                    timer.reset_window()
                    switches.append({"step": step, "at_s": round(time.monotonic() - run_started, 3), "to": spec.label,
                                     "version": decision.version, "reason": decision.reason})
            if probe_bytes and env.world_size > 1:
                reporter.link(probe_link(sync.process_group, sizes=(DEFAULT_SIZES[0], probe_bytes),
                                         stop_after_s=PROBE_STOP_FACTOR * PROBE_TRANSFER_S))
        # 3. one step, every phase timed
        loss = train_step(ddp, optimizer, loader, timer, device, scheduler, loss_fn=workload.loss_fn)
        timer.end_step(step, sync.last_step())
        last = sync.last_step()
        record.step_compressors[step] = last.compressor if last else sync.compressor.label
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss became {loss_value} at step {step} with {sync.compressor.label}")
        # 5. telemetry and checkpoints
        reporter.after_step(step, loss_value, timer, model)
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < total_steps:
            _save(env, cfg, step + 1, model, optimizer, scheduler, sync, agreement, record, {"step": step + 1, "loss": loss_value})

    summary = _summary(cfg, env, sync, timer, total_steps, loss_value, switches, workload, device)
    summary["checkpoint_every"] = checkpoint_every
    summary["start_step"] = start_step
    if reporter.quality is not None:  # the quality signal's cost (issue 14)
        summary["quality_overhead"] = reporter.quality.overhead()
    if isinstance(source, InProcessPolicy):  # no coordinator: show that the policy ran, and why it chose
        summary["policy_decisions"], summary["policy_reason"] = source.evaluations, source.last_reason
    _save(env, cfg, total_steps, model, optimizer, scheduler, sync, agreement, record, summary, final=True)
    reporter.close(summary)
    dist.barrier()  # with a comm hook registered, peers must not tear down mid-collective
    return summary


# --------------------------------------------------------------------------- building blocks


def train_step(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, loader: Iterator[Any],
               timer: StepTimer, device: torch.device,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> torch.Tensor:
    """One data-parallel step, each phase of docs/step.md ("Timing phases") timed by ``timer`` (the caller ends
    the step with the hook's record); returns the loss."""
    with timer.phase("data"):
        inputs, targets = (t.to(device, non_blocking=True) for t in next(loader))
    with timer.phase("forward"):
        loss = loss_fn(ddp(inputs), targets)
    with timer.phase("backward"):
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
    with timer.phase("optimizer"):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return loss


def _optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _lr_schedule(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    if cfg.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, total_steps // 3), gamma=0.1)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


def _decision_source(cfg: TrainConfig, env: WorkerEnv, initial: Decision) -> DecisionSource:
    """Rank 0's source of decisions (other ranks only follow the broadcast)."""
    if env.rank != 0:
        return FixedDecision(initial)
    if cfg.schedule:
        return ScriptedDecisions(cfg, initial)
    if cfg.coordinator_url and cfg.job_id:
        return CoordinatorClient(cfg.coordinator_url, cfg.job_id, cfg.job_token)
    if cfg.compression.mode == "adaptive":
        return InProcessPolicy(cfg.compression, initial)
    return FixedDecision(initial)


class ScriptedDecisions:
    """Decisions from ``cfg.schedule``: the entry with the highest step <= the current step."""

    def __init__(self, cfg: TrainConfig, initial: Decision) -> None:
        self._initial = initial
        self._schedule = sorted(cfg.schedule or [], key=lambda entry: entry.step)
        self.step = 0

    def current(self) -> Decision | None:
        chosen = self._initial
        for version, entry in enumerate(self._schedule, start=1):
            if entry.step <= self.step:
                chosen = Decision(version=version, compressor=entry.compressor, params=entry.params,
                                  reason=f"scheduled at step {entry.step}")
        return chosen

    def observe(self, telemetry: Telemetry) -> None:
        self.step = telemetry.step


class _Reporter:
    """Rank 0's telemetry: link estimates, phase means, profile, and the decision proposal."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, sync: GradientSync, source: DecisionSource,
                 sinks: list[TelemetrySink], total_steps: int | None, *, resumed_from_step: int | None = None) -> None:
        self.cfg, self.env, self.sync, self.source, self.sinks = cfg, env, sync, source, sinks
        self.total_steps = total_steps
        #: Names this worker group in its reports (new on every start or restart of the group).
        self.worker_group = uuid.uuid4().hex[:12]
        self.resumed_from_step = resumed_from_step
        #: Samples per step on one rank; a user's loop (workers.session) sets it from its batches.
        self.batch_size = cfg.batch_size
        self.estimate = LinkEstimate.no_link()
        self.passive = PassiveBandwidth(min_of_last=PASSIVE_MIN_OF_LAST)
        self.scheduler = ProbeScheduler(probe_interval_s=cfg.probe_interval_s, max_cost_fraction=cfg.probe_budget)
        self.started = time.monotonic()
        self.next_report = 0.0
        self.profile_sent = False
        self.calibration: dict[str, float] = {}
        self.per_element: dict[str, float] = {}
        self._last_bytes = 0
        #: Rank 0 measures the compression error (issue 14); other ranks do not report.
        self.quality = QualitySignal(cfg, sync) if env.rank == 0 else None

    def link(self, estimate: LinkEstimate) -> None:
        self.estimate = estimate
        if estimate.has_link:
            # A fresh probe supersedes the passive history: restart the average from the
            # probe's β, else bandwidth() would keep reporting the passive value from before
            # (for ever, while the compressor sends payloads too small to observe).
            self.passive = PassiveBandwidth(beta_s_per_byte=estimate.beta_s_per_byte, min_of_last=PASSIVE_MIN_OF_LAST)
            self.passive.anchor(estimate)
            self.scheduler.record(time.monotonic() - self.started, estimate.cost_s)

    def probe_request(self) -> int:
        """Rank 0: the large probe message's size if a probe is due now, else 0.

        The probe is sized to the current estimate (:func:`workers.probe.sized_probe`), so it
        costs about the same at any rate and fits the probe budget every few seconds.
        """
        if self.env.rank != 0 or self.env.world_size == 1:
            return 0
        elapsed = time.monotonic() - self.started
        current, _ = self.bandwidth()
        large = sized_probe(current)[1]
        return large if self.scheduler.due(elapsed, elapsed, expected_cost_s=self._next_probe_cost(large, current)) else 0

    def _next_probe_cost(self, large_bytes: int, current: float | None) -> float:
        """The last probe's cost, scaled by the bytes the next one moves and by how much the
        link has slowed since (a probe of the same size takes ~20x as long at 50 Mbit/s as at
        1 Gbit/s; budgeting it at the last fast probe's cost broke the budget)."""
        cost = self.scheduler.last_cost_s
        if self.estimate.probe_bytes:
            cost *= large_bytes / self.estimate.probe_bytes
        probed = self.estimate.bandwidth_bytes_per_second
        if current and math.isfinite(probed) and current < probed:
            cost *= probed / current
        return cost

    def proposal(self) -> Decision | None:
        return self.source.current() if self.env.rank == 0 else None

    def bandwidth(self) -> tuple[float | None, float | None]:
        if not self.estimate.has_link:
            return None, None
        passive = self.passive.bytes_per_second
        return (passive or self.estimate.bandwidth_bytes_per_second), self.estimate.latency_s

    def after_step(self, step: int, loss: float, timer: StepTimer, model: torch.nn.Module) -> None:
        last = self.sync.last_step()
        if self.env.rank != 0:
            return
        if self.quality is not None:
            self.quality.after_step()
        if last is not None and last.communicate_s > 0 and self.env.world_size > 1:
            kind = registry.codec(self.sync.compressor.name).collective
            self.passive.observe(last.bytes_sent, last.communicate_s, kind, self.env.world_size)
        now = time.monotonic()
        if isinstance(self.source, ScriptedDecisions):
            self.source.step = step + 1
        if now < self.next_report and (self.total_steps is None or step + 1 < self.total_steps):
            return
        self.next_report = now + self.cfg.report_interval_s
        telemetry = self._telemetry(step, loss, timer, model)
        self.source.observe(telemetry)
        for sink in self.sinks:
            sink.send(telemetry)

    def _telemetry(self, step: int, loss: float, timer: StepTimer, model: torch.nn.Module) -> Telemetry:
        means = timer.means()
        step_s = timer.mean_step_s()
        stats = self.sync.stats()
        spec = self.sync.compressor.spec
        bandwidth, latency = self.bandwidth()
        profile = None
        if not self.profile_sent and len(timer.recent) >= 3:
            profile = self._profile(model, means)
            self.profile_sent = True
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None])
        )
        return Telemetry(
            step=step + 1,
            steps=self.total_steps,
            loss=loss,
            samples_per_second=(self.batch_size * self.env.world_size / step_s) if step_s > 0 else None,
            phase_seconds=means,
            bytes_sent_per_step=stats.bytes_sent / stats.steps if stats.steps else None,
            bandwidth_bytes_per_second=bandwidth,
            latency_seconds=latency,
            link_wake_seconds=self.estimate.wake_s if self.estimate.has_link else None,
            compute_jitter_seconds=timer.compute_jitter_s(),
            grad_norm=float(grad_norm),
            compression_error=self.quality.running_error if self.quality else None,
            compression_error_estimates=self.quality.estimates if self.quality else {},
            compressor=spec.name,
            rank=spec.rank,
            ratio=spec.ratio,
            world_size=self.env.world_size,
            decision_version=_version(self.source),
            wall_time=time.time(),
            profile=profile,
            worker_group=self.worker_group,
            resumed_from_step=self.resumed_from_step,
        )

    def _profile(self, model: torch.nn.Module, means: dict[str, float]) -> ModelProfile:
        shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
        # DDP gives the first bucket 1 MiB only when bucket_cap_mb is left unset; this loop
        # always sets it, so every bucket (the first too) has the same cap.
        buckets = build_bucket_layout(shapes, self.cfg.bucket_cap_mb * 2**20, first_bucket_bytes=None)
        if self.cfg.compression.mode == "adaptive" and not self.calibration:
            self.calibration, self.per_element = calibrate_codecs(shapes, buckets, self.cfg, self.env.world_size,
                                                                  self.env.device)
        return ModelProfile(
            shapes=[list(s) for s in shapes],
            buckets=[list(b) for b in buckets],
            forward_s=means["forward"],
            backward_s=max(0.0, means["backward"] - means["exposed_comm"]),
            optimizer_s=means["optimizer"],
            codec_s=self.calibration,
            codec_per_element_s=self.per_element,
            device=str(self.env.device),
        )

    def close(self, summary: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.close()


def _version(source: DecisionSource) -> int:
    current = source.current()
    return current.version if current else 0


def calibrate_codecs(shapes: list[tuple[int, ...]], buckets: Sequence[Sequence[int]], cfg: TrainConfig,
                     world_size: int, device: torch.device | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Time one step's encode+decode of each compressor family on ``device`` (the worker's;
    default CPU), at world size 1.

    Bucket by bucket, in the job's DDP layout (each bucket's fixed costs count, as in the
    hook), the median of three timed steps after one warm-up (the first run also warms
    PowerSGD's factors), read with :func:`workers.timing.codec_clock` (on CPU the hook's own
    clock, thread CPU time). Returns (seconds by label, seconds per element pass by compressor
    name); the cost model scales the per-element figure to the ranks and ratios not timed.
    """
    device = device or torch.device("cpu")
    clock = codec_clock(device)
    rank = max(cfg.compression.min_rank, min(4, cfg.compression.max_rank))
    allowed = cfg.compression.allowed or list(registry.names())
    seconds: dict[str, float] = {}
    per_element: dict[str, float] = {}
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the training's RNG streams alone
    grads = [torch.randn(shape, device=device, generator=generator) for shape in shapes]
    for name in allowed:
        params = {"rank": rank} if registry.codec(name).takes("rank") else {}
        spec = make_spec(name, **params)
        compressor = from_spec(spec)
        timed = []
        for _ in range(4):
            elapsed = 0.0
            for bucket in buckets:
                buffer = torch.cat([grads[i].reshape(-1) for i in bucket])
                slots, offset = [], 0
                for index in bucket:
                    size = math.prod(shapes[index])
                    slots.append(GradSlot(key=f"p{index}", grad=buffer[offset:offset + size].view(shapes[index]), offset=offset))
                    offset += size
                started = clock()
                run_in_lockstep([compressor.process(buffer, slots, 1)])
                elapsed += clock() - started
            compressor.end_step()
            timed.append(elapsed)
        step_s = statistics.median(timed[1:])
        seconds[spec.label] = step_s
        work = codec_work(spec, shapes, world_size)
        if work > 0:
            per_element[name] = step_s / work
    return seconds, per_element


# --------------------------------------------------------------------------- checkpoints


def _save(env: WorkerEnv, cfg: TrainConfig, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: Any, sync: GradientSync, agreement: SwitchAgreement, record: RankRecord,
          metrics: dict[str, Any], final: bool = False) -> None:
    def write(directory: Path) -> None:
        torch.save({"sync": sync.state_dict(), "rng": ckpt.rng_state()}, directory / ckpt.rank_file(env.rank))
        (directory / f"record{env.rank}.json").write_text(json.dumps(asdict(record)))
        if env.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "step": step, "decision_version": agreement.version,
                        "decision": spec_to_dict(sync.compressor.spec)}, directory / ckpt.TRAINER_FILE)
            ckpt.write_meta(directory, step, env.world_size, {"final": final})
            if final:
                (directory / "summary.json").write_text(json.dumps(metrics, default=str))

    env.save_checkpoint({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))} | {"step": step}, write)


def _resume(env: WorkerEnv, cfg: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any, sync: GradientSync) -> tuple[int, Decision | None]:
    """Restore the latest checkpoint into the live objects; returns (start step, decision in force)."""

    def read(directory: Path) -> tuple[int, Decision | None]:
        trainer = torch.load(directory / ckpt.TRAINER_FILE, weights_only=False, map_location=env.device)
        model.load_state_dict(trainer["model"])
        optimizer.load_state_dict(trainer["optimizer"])
        scheduler.load_state_dict(trainer["scheduler"])
        sync.load_state_dict(ckpt.load_sync_state(directory, env.rank, env.world_size), device=env.device)
        rank_path = directory / ckpt.rank_file(env.rank)
        if ckpt.read_meta(directory)["world_size"] == env.world_size and rank_path.exists():
            ckpt.set_rng_state(torch.load(rank_path, weights_only=False)["rng"])
        saved = dict(trainer["decision"])
        name = saved.pop("name")
        decision = Decision(version=trainer["decision_version"], compressor=name, params=saved, reason="resumed from checkpoint")
        log.info("rank %d: resumed at step %d with %s", env.rank, trainer["step"], sync.compressor.label)
        return int(trainer["step"]), decision

    restored = env.load_checkpoint(read)
    return restored if restored is not None else (0, None)


# --------------------------------------------------------------------------- summary


def _summary(cfg: TrainConfig, env: WorkerEnv, sync: GradientSync, timer: StepTimer, total_steps: int,
             loss: float, switches: list[dict[str, Any]], workload: Workload, device: torch.device) -> dict[str, Any]:
    """The machine-readable result of docs/step.md ("The run summary") (loss averaged over ranks)."""
    mean_loss = torch.tensor([loss if math.isfinite(loss) else 0.0], dtype=torch.float64)
    dist.all_reduce(mean_loss.to(device) if device.type == "cuda" else mean_loss)
    stats = sync.stats()
    spec = sync.compressor.spec
    step_s = timer.mean_step_s()
    summary: dict[str, Any] = {
        "name": cfg.name,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "steps": total_steps,
        "final_loss": float(mean_loss) / env.world_size,
        "samples_per_second": cfg.batch_size * env.world_size / step_s if step_s > 0 else None,
        "step_seconds": step_s,
        "phase_seconds": timer.means(),
        "bytes_sent_per_step": stats.bytes_sent / stats.steps if stats.steps else 0.0,
        "compressor": spec.name,
        "rank": spec.rank,
        "ratio": spec.ratio,
        "world_size": env.world_size,
        "switches": switches,
    }
    if workload.test_set is not None and (cfg.dataset == "digits" or cfg.user_dataset):
        summary.update(evaluate(workload, device, seed=cfg.seed))
    return summary


@torch.no_grad()
def evaluate(workload: Workload, device: torch.device, *, seed: int = 0) -> dict[str, float]:
    """Mean loss on the held-out set, and accuracy where outputs are class scores for integer
    targets (every rank evaluates the same model; the held-out sets here are small)."""
    assert workload.test_set is not None
    loader = make_loader(workload.test_set, batch_size=256, rank=0, world_size=1, seed=seed, shuffle=False,
                         drop_last=False)
    model = workload.model
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    classify = True
    for inputs, targets in loader:
        outputs, targets = model(inputs.to(device)), targets.to(device)
        loss_sum += float(workload.loss_fn(outputs, targets)) * len(targets)
        total += len(targets)
        classify = classify and outputs.dim() == 2 and targets.dim() == 1 and not targets.is_floating_point()
        if classify:
            correct += int((outputs.argmax(dim=1) == targets).sum())
    model.train()
    result = {"eval_loss": loss_sum / total if total else math.nan}
    if classify and total:
        result["eval_accuracy"] = correct / total
    return result
