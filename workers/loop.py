"""The training loop every worker runs: model, DDP, GradientSync, timed steps, checkpoints.

``train_loop_per_worker(config)`` is what ``ray.train.torch.TorchTrainer`` runs on each
worker; ``run_training(cfg, env)`` is the same loop for any :class:`~workers.envs.WorkerEnv`
(Ray Train, or plain torch multiprocessing for ``gradwire train --no-ray``). It reads top to
bottom:

1. build model and data from the registries, wrap DDP, install GradientSync;
2. resume from the latest checkpoint if there is one (model, optimizer, compressor state,
   step, RNG), folding compressor state if the world size changed (``workers.trainstate``);
3. each step: data → forward → backward (the hook compresses and communicates per bucket
   while backward runs) → optimizer, every phase timed;
4. every ``compression.sync_every`` steps rank 0 broadcasts the decision in force (and
   whether to probe the link); every rank switches compressor at that same step;
5. rank 0 reports telemetry every ``probing.report_interval_s`` (``workers.reporter``); every
   rank checkpoints every ``checkpoints.every`` steps and at the end; with ``GRADWIRE_STEP_TRACE``
   set, every rank writes each step's timings (``workers.step_trace``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from compressors import GradientSync
from compressors.base import from_spec
from planning.config import TrainConfig
from planning.controller import decision_for
from planning.spec import make_spec
from workers.agreed_step import agree_and_switch, switch_record
from workers.control import CoordinatorClient, InProcessPolicy, SwitchAgreement
from workers.envs import RayWorkerEnv, WorkerEnv
from workers.heap import keep_heap
from workers.loaders import InfiniteLoader, batches_per_epoch, make_loader
from workers.reporter import Reporter
from workers.scripted import decision_source
from workers.step_trace import StepTrace
from workers.timing import StepTimer
from workers.trainstate import RankRecord, resume, save
from workers.usercode import Workload, build_workload

log = logging.getLogger(__name__)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Entry point for ``ray.train.torch.TorchTrainer`` (``train_loop_config`` = this dict)."""
    logging.basicConfig(level=logging.INFO)
    cfg = TrainConfig.model_validate(config["train"])
    run_training(cfg, RayWorkerEnv(progress_actor=config.get("progress_actor")))


# --------------------------------------------------------------------------- the loop


def run_training(cfg: TrainConfig, env: WorkerEnv) -> dict[str, Any]:
    """Train ``cfg`` on this worker; returns the run summary (rank 0's is the job's)."""
    # A step's speed must not depend on what the process did between steps (workers.heap).
    log.info("rank %d: C heap thresholds %s", env.rank, "fixed" if keep_heap() else "left at the C library's defaults")
    torch.manual_seed(cfg.seed)
    device = env.device
    workload = build_workload(cfg)
    model, train_set = workload.model.to(device), workload.train_set
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.compression.bucket_cap_mb, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = _optimizer(cfg, model)
    total_steps = cfg.steps or cfg.epochs * batches_per_epoch(len(train_set), cfg.data.batch_size, env.world_size)  # type: ignore[operator]
    checkpoint_every = cfg.checkpoints.interval(total_steps)
    scheduler = _lr_schedule(cfg, optimizer, total_steps)
    first = make_spec(cfg.compression.compressor, **cfg.compression.compressor_params())
    sync = GradientSync(from_spec(first), pipelining=cfg.compression.pipelining).install(ddp)
    control_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    agreement = SwitchAgreement.for_job(cfg.compression, group=control_group)

    start_step, resumed_decision = resume(env, model, optimizer, scheduler, sync)
    agreement.version = resumed_decision.version if resumed_decision else 0
    record = RankRecord(rank=env.rank)
    source = decision_source(cfg, env.rank, resumed_decision or decision_for(first, 0, "initial choice from the job spec"))
    sinks = [s for s in (env.progress_sink(), source if isinstance(source, CoordinatorClient) else None) if s is not None]
    reporter = Reporter(cfg, env, sync, source, sinks, total_steps,
                         resumed_from_step=start_step if resumed_decision is not None else None)

    loader = InfiniteLoader(train_set, cfg.data.batch_size, env.rank, env.world_size, cfg.shuffle_seed,
                            start_step=start_step)
    timer = StepTimer(device)
    reporter.probe_at_start(sync.process_group)
    loss_value = math.nan
    switches: list[dict[str, Any]] = []
    run_started = time.monotonic()
    log.info("rank %d: training %s steps %d..%d with %s", env.rank, cfg.model.name, start_step, total_steps, sync.compressor.label)
    trace = StepTrace.for_job(env.rank, cfg, sync.compressor.label)

    for step in range(start_step, total_steps):
        started, began = time.time(), time.perf_counter()
        # 4. agree on the compressor (and a probe) at the same step on every rank
        if agreement.due(step):
            agreed = agree_and_switch(step, agreement, reporter, sync, timer)
            if agreed.decision is not None:
                record.applied.append({"step": step, "version": agreed.decision.version,
                                       "compressor": agreed.decision.compressor, "params": agreed.decision.params})
            if agreed.switched_to is not None:
                switches.append(switch_record(step, agreed, started_at=run_started))
        agreed_at = time.perf_counter()
        # 3. one step, every phase timed
        loss = train_step(ddp, optimizer, loader, timer, device, scheduler, loss_fn=workload.loss_fn)
        timing = timer.end_step(step, sync.last_step())
        trained_at = time.perf_counter()
        last = sync.last_step()
        record.step_compressors[step] = last.compressor if last else sync.compressor.label
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss became {loss_value} at step {step} with {sync.compressor.label}")
        # 5. telemetry and checkpoints
        reporter.after_step(step, loss_value, timer, model)
        reported_at = time.perf_counter()
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < total_steps:
            save(env, step + 1, model, optimizer, scheduler, sync, agreement, record, {"step": step + 1, "loss": loss_value})
        if trace.enabled:
            trace.step(step, started, {"agree": agreed_at - began, "train": trained_at - agreed_at,
                                       "after": reported_at - trained_at, "checkpoint": time.perf_counter() - reported_at},
                       timing.seconds, last)
    trace.close()

    summary = _summary(cfg, env, sync, timer, total_steps, loss_value, switches, workload, device)
    summary["checkpoint_every"] = checkpoint_every
    summary["start_step"] = start_step
    summary["quality_overhead"] = reporter.quality.overhead()  # the quality signal's cost (issue 14)
    summary["link_drops_read"] = agreement.drops  # the exchanges that read a drop (each made the next steps eager)
    if isinstance(source, InProcessPolicy):  # no coordinator: show that the policy ran, and why it chose
        summary["policy_decisions"], summary["policy_reason"] = source.evaluations, source.last_reason
    save(env, total_steps, model, optimizer, scheduler, sync, agreement, record, summary, final=True)
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
    if cfg.optimizer.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum, weight_decay=cfg.optimizer.weight_decay)


def _lr_schedule(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    if cfg.optimizer.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    if cfg.optimizer.lr_schedule == "linear":
        # To 0 at the last step like the cosine, but still a tenth of the start at 90 % of the
        # steps (the cosine's: 2.4 %), so the loss is still falling there.
        # LinearLR keeps its length in its state, as the cosine keeps T_max: a resume follows
        # the schedule the job began with.
        return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=max(1, total_steps))
    if cfg.optimizer.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, total_steps // 3), gamma=0.1)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


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
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
        "steps": total_steps,
        "final_loss": float(mean_loss) / env.world_size,
        "samples_per_second": cfg.data.batch_size * env.world_size / step_s if step_s > 0 else None,
        "step_seconds": step_s,
        "phase_seconds": timer.means(),
        "bytes_sent_per_step": stats.bytes_sent / stats.steps if stats.steps else 0.0,
        "compressor": spec.name,
        "compressor_rank": spec.rank,
        "ratio": spec.ratio,
        "world_size": env.world_size,
        "switches": switches,
    }
    if workload.test_set is not None and (cfg.data.dataset == "digits" or cfg.data.user_code):
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
