"""gradwire inside a training loop the user already has (a Ray Train or torchrun script).

:func:`start` takes the user's model, wraps it in DDP if it is not wrapped yet, installs
:class:`compressors.GradientSync` and returns a :class:`TrainingSession`; the loop calls
``session.step(loss)`` once per step, after ``optimizer.step()``. Nothing else in the loop
changes: the phases are timed with hooks — a forward pre-hook and hook on the model, and
PyTorch's global optimizer step hooks — so ``data`` is the time from the end of one step to
the next forward, ``forward`` the model's forward, ``backward`` from the end of forward to
``optimizer.step()`` (the loss, ``zero_grad`` and ``loss.backward()``, with communication
overlapped), ``optimizer`` the step itself; ``exposed_comm`` and the hook's ``compress,
communicate, decompress`` come from GradientSync, as in gradwire's own loop.

The rest is the built-in loop's own machinery (``workers.loop``): rank 0's reporter (link
probes, passive bandwidth, phase means, model profile), the decision source (the
coordinator over HTTP, or the in-process adaptive policy, or the fixed choice), and the
agreement every ``sync_every`` steps by which all ranks switch compressor at the same step,
and with ``GRADWIRE_STEP_TRACE`` set every rank's step trace (``workers.step_trace``: ``train``
is the user's step from the end of the last ``session.step`` call, ``after`` rank 0's reporting,
``agree`` the agreement made before the step). With a coordinator, rank 0 registers the run as an *external* job (the coordinator records
it, decides for it and shows it, but launches nothing) unless it is given an existing one.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_pre_hook

from compressors import GradientSync
from compressors.base import from_spec
from planning import registry
from planning.config import TrainConfig
from planning.controller import decision_for
from planning.protocol import Decision
from planning.sections import (
    EXTERNAL_DATASET,
    CheckpointConfig,
    CompressionConfig,
    DataConfig,
    ModelConfig,
    ProbingConfig,
    is_import_path,
)
from planning.spec import make_spec
from workers import heap
from workers.agreed_step import agree_and_switch, switch_record
from workers.control import (
    CoordinatorClient,
    DecisionSource,
    FixedDecision,
    InProcessPolicy,
    SwitchAgreement,
    TelemetrySink,
)
from workers.reporter import Reporter
from workers.step_trace import StepTrace
from workers.timing import StepTimer

log = logging.getLogger(__name__)

#: Environment variables a script may use instead of arguments (``coordinator=`` and its token).
URL_ENV, TOKEN_ENV = "GRADWIRE_URL", "GRADWIRE_TOKEN"


@dataclass(frozen=True)
class JobLink:
    """An existing coordinator job to report to (its id and worker token, from ``POST /v1/jobs``)."""

    url: str
    job_id: str
    worker_token: str


def compression_config(compression: str | dict[str, Any] | CompressionConfig | None, **params: Any) -> CompressionConfig:
    """``"acpsgd"`` (+ ``rank=4``), ``"adaptive"``, a dict of a job's ``compression`` block, or one."""
    if isinstance(compression, CompressionConfig):
        return compression
    if compression is None or isinstance(compression, str):
        if compression == "adaptive":
            return CompressionConfig(mode="adaptive", **params)
        return CompressionConfig(mode="fixed", compressor=compression or registry.DEFAULT_COMPRESSOR, **params)
    return CompressionConfig.model_validate({**compression, **params})


def _model_path(model: nn.Module) -> str:
    """The model's class as an import path, for the job record (``mlp`` if it has no such form)."""
    cls = type(model)
    path = f"{cls.__module__}:{cls.__name__}"
    return path if is_import_path(path) else "mlp"


class _Where:
    """This process in the job: what the loop's reporter needs of a WorkerEnv."""

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device


class TrainingSession:
    """Per-step timing, telemetry and agreed compressor switches around a user's loop."""

    def __init__(self, ddp: DistributedDataParallel, sync: GradientSync, cfg: TrainConfig, device: torch.device,
                 source: DecisionSource, sinks: list[TelemetrySink], steps: int | None) -> None:
        self.ddp, self.sync, self.cfg, self.device = ddp, sync, cfg, device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.source, self.steps = source, steps
        self.timer = StepTimer(device)
        self.agreement = SwitchAgreement.for_job(cfg.compression, group=dist.new_group(backend="gloo")
                                                 if dist.get_backend() != "gloo" else None)
        self.agreement.version = 0
        self.reporter = Reporter(cfg, _Where(self.rank, self.world_size, device), sync, source, sinks, steps)  # type: ignore[arg-type]
        self.step_index = 0
        self.switches: list[dict[str, Any]] = []
        self.closed = False
        self._open: dict[str, AbstractContextManager[None]] = {}
        self._handles: list[Any] = []
        self._install_hooks()
        self.reporter.probe_at_start(sync.process_group)
        self.trace = StepTrace.for_job(self.rank, cfg, sync.compressor.label)
        self._agree_s = 0.0  # the agreement made before the step in progress (traced with it)
        self._began()

    # ---- phase timing by hooks -----------------------------------------------------------

    def _begin(self, phase: str) -> None:
        self._end_all()
        context = self.timer.phase(phase)
        context.__enter__()
        self._open[phase] = context

    def _end_all(self) -> None:
        for context in self._open.values():
            context.__exit__(None, None, None)
        self._open.clear()

    def _training_forward(self) -> bool:
        return self.ddp.training and torch.is_grad_enabled() and not self.closed

    def _install_hooks(self) -> None:
        def before_forward(module: nn.Module, args: Any) -> None:
            if self._training_forward():
                if args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
                    self.reporter.batch_size = int(args[0].shape[0])  # samples/s from the real batches
                self._begin("forward")

        def after_forward(module: nn.Module, args: Any, output: Any) -> None:
            if self._training_forward():
                self._begin("backward")

        def before_optimizer(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if not self.closed and "backward" in self._open:
                self._begin("optimizer")

        self._handles = [
            self.ddp.register_forward_pre_hook(before_forward),
            self.ddp.register_forward_hook(after_forward),
            register_optimizer_step_pre_hook(before_optimizer),
        ]

    # ---- the step boundary ---------------------------------------------------------------

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """End one training step (call on every rank, after ``optimizer.step()``): record its
        phases, report (rank 0), and at agreed steps switch every rank's compressor."""
        if self.closed:
            return
        self._end_all()
        trained_at = time.perf_counter()
        step = self.step_index
        last = self.sync.last_step()
        timing = self.timer.end_step(step, last)
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else (float(loss) if loss is not None else float("nan"))
        self.reporter.after_step(step, value, self.timer, self.ddp.module)
        if self.trace.enabled:
            self.trace.step(step, self._started, {"agree": self._agree_s, "train": trained_at - self._step_began,
                                                  "after": time.perf_counter() - trained_at}, timing.seconds, last)
        self.step_index = step + 1
        agree_began = time.perf_counter()
        if self.agreement.due(self.step_index):
            self._agree(self.step_index)
        self._agree_s = time.perf_counter() - agree_began
        if self.steps is not None and self.step_index >= self.steps:
            self.close()
            return
        self._began()

    def _began(self) -> None:
        """The next step begins (its ``data`` phase runs until the model's forward)."""
        self._started, self._step_began = time.time(), time.perf_counter()
        self._begin("data")

    def _agree(self, step: int) -> None:
        agreed = agree_and_switch(step, self.agreement, self.reporter, self.sync, self.timer)
        if agreed.switched_to is not None:
            entry = switch_record(step, agreed)
            self.switches.append(entry)
            log.info("rank %d: step %d: switching to %s (%s)", self.rank, step, entry["to"], entry["reason"])

    def close(self) -> None:
        """Stop timing and reporting (sends the last report first). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._end_all()
        for handle in self._handles:
            handle.remove()
        self.trace.close()
        self.reporter.close({})

    # ---- what the script may read ----------------------------------------------------------

    @property
    def compressor(self) -> str:
        return self.sync.compressor.label

    @property
    def link_drops_read(self) -> list[int]:
        """The regular exchanges (their steps) that read a drop of the link, each of which made
        the next exchanges eager (``workers.control.SwitchAgreement.link_dropped``), as the
        built-in loop's summary lists them."""
        return list(self.agreement.drops)

    def phase_means(self) -> dict[str, float]:
        return self.timer.means()


def start(model: nn.Module, *, device: torch.device, wrap: Callable[[nn.Module], DistributedDataParallel],
          compression: str | dict[str, Any] | CompressionConfig | None = None, rank: int | None = None,
          coordinator: str | JobLink | None = None, token: str | None = None, name: str = "external",
          steps: int | None = None, sync_every: int = 5, report_interval_s: float = 2.0,
          probe_interval_s: float = 60.0, bucket_cap_mb: float = 25.0, batch_size: int = 1,
          keep_heap: bool = False) -> TrainingSession:
    """Wrap ``model`` (``wrap`` makes the DDP model), install GradientSync, start a session.

    Needs an initialised process group. ``coordinator``: a URL (rank 0 registers an external
    job there, with ``token`` if the coordinator has one), a :class:`JobLink`, or None (then
    ``GRADWIRE_URL``/``GRADWIRE_TOKEN`` if set; else no coordinator: an adaptive policy runs in
    process). ``steps``: the run's length, if known (the job then ends by itself after it).
    ``keep_heap``: fix the C heap's thresholds for the rest of this process, as the built-in
    loop does (:mod:`workers.heap`: on a CPU a step's time then no longer depends on what the
    process allocated between steps); off by default, the process is the user's.
    """
    if not dist.is_initialized():
        raise RuntimeError("gradwire: torch.distributed is not initialised (call dist.init_process_group "
                           "first, or run under Ray Train / torchrun)")
    if keep_heap and not heap.keep_heap():
        log.warning("gradwire: keep_heap asked for, but the C library is not glibc or refused: the heap is as it was")
    params = {"rank": rank} if rank is not None else {}
    compression_cfg = compression_config(compression, **params)
    ddp = model if isinstance(model, DistributedDataParallel) else wrap(model)
    cfg = TrainConfig(
        name=name, external=True, workers=dist.get_world_size(), steps=steps,
        model=ModelConfig(name=_model_path(ddp.module)),
        data=DataConfig(dataset=EXTERNAL_DATASET, batch_size=batch_size),
        compression=CompressionConfig.model_validate(
            {**compression_cfg.model_dump(exclude_unset=True), "sync_every": sync_every, "bucket_cap_mb": bucket_cap_mb}),
        probing=ProbingConfig(interval_s=probe_interval_s, report_interval_s=report_interval_s),
        checkpoints=CheckpointConfig(every=0))
    first = make_spec(compression_cfg.compressor, **compression_cfg.compressor_params())
    sync = GradientSync(from_spec(first)).install(ddp)
    initial = decision_for(first, 0, "initial choice of the script")
    source, sinks = _source(cfg, initial, coordinator or os.environ.get(URL_ENV), token or os.environ.get(TOKEN_ENV),
                            steps)
    return TrainingSession(ddp, sync, cfg, device, source, sinks, steps)


def _source(cfg: TrainConfig, initial: Decision, coordinator: str | JobLink | None, token: str | None,
            steps: int | None) -> tuple[DecisionSource, list[TelemetrySink]]:
    """Rank 0's decision source and telemetry sinks; the other ranks follow the broadcast."""
    if dist.get_rank() != 0:
        return FixedDecision(initial), []
    if coordinator is not None:
        link = coordinator if isinstance(coordinator, JobLink) else register(coordinator, cfg, steps, token)
        client = CoordinatorClient(link.url, link.job_id, link.worker_token)
        log.info("gradwire: reporting to %s as job %s", link.url, link.job_id)
        return client, [client]
    if cfg.compression.mode == "adaptive":
        return InProcessPolicy(cfg.compression, initial), []
    return FixedDecision(initial), []


#: The length an external job of unknown length is registered with (the JobSpec's upper bound):
#: such a job ends when it is cancelled.
UNKNOWN_STEPS = 10_000_000


def register(url: str, cfg: TrainConfig, steps: int | None, token: str | None = None, *,
             timeout_s: float = 10.0) -> JobLink:
    """Create an external job for this run on the coordinator at ``url``; returns its link."""
    import httpx

    spec = cfg.model_dump(mode="json", include={"name", "external", "workers", "model", "data", "compression",
                                                 "probing"})
    spec["steps"] = steps or UNKNOWN_STEPS
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.post(f"{url.rstrip('/')}/v1/jobs", json=spec, headers=headers, timeout=timeout_s)
            break
        except httpx.HTTPError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"gradwire: cannot reach the coordinator at {url}: {exc}") from None
            time.sleep(0.5)
    if response.status_code != 201:
        raise RuntimeError(f"gradwire: the coordinator at {url} refused the job ({response.status_code}): {response.text}")
    body = response.json()
    return JobLink(url=url, job_id=body["id"], worker_token=body["worker_token"])
