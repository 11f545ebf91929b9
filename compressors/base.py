"""The Compressor protocol, the collective requests it yields, and ``build``.

A compressor owns its math and its per-parameter state. It never talks to a process
group: for each DDP bucket it runs as a *generator* that yields the collectives it needs
(:class:`AllReduce`, :class:`AllGather`) and receives their results. ``GradientSync``
drives the generator with asynchronous collectives chained by futures, so the same
compressor code gets pipelining (buckets fire during backward), timing and byte counts
without knowing about them, and can be unit-tested with a fake in-process "collective".
"""

from __future__ import annotations

import importlib
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Sequence, Union

import torch

from compressors.memory import ErrorFeedback
from planning import registry, wire
from planning.spec import CompressorSpec, make_spec


@dataclass
class GradSlot:
    """One parameter's gradient inside a DDP bucket.

    ``key`` is the parameter's name in the model (stable across DDP's bucket rebuild and
    across checkpoints); ``grad`` is a view into the bucket's flat buffer in the
    parameter's shape, so writing it writes the bucket.
    """

    key: str
    grad: torch.Tensor
    #: Where the gradient starts in the bucket's flat buffer (elements).
    offset: int = 0

    @property
    def matrix(self) -> torch.Tensor:
        """The ``n × m`` matrix view of the gradient (docs/compressors.md, "The matrix view")."""
        n, m = wire.matrix_dims(tuple(self.grad.shape))
        return self.grad.view(n, m)


@dataclass(frozen=True)
class AllReduce:
    """Sum ``tensor`` across ranks, in place. The generator receives the same tensor back."""

    tensor: torch.Tensor


@dataclass(frozen=True)
class AllGather:
    """Gather a 1-D ``tensor`` from every rank. The generator receives a ``(world, numel)`` tensor."""

    tensor: torch.Tensor


Collective = Union[AllReduce, AllGather]
#: What a compressor runs per bucket: yields collectives, gets their results, returns nothing.
#: When it returns, the bucket's buffer holds the mean gradient over all ranks.
BucketJob = Generator[Collective, torch.Tensor, None]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision a compressor keeps state and does its linear algebra in for ``dtype``.

    16-bit gradients are accumulated (error feedback) and orthogonalised in fp32: a bf16
    residual would round away every update smaller than 2^-8 of it, and LAPACK has no 16-bit
    QR. fp32 and fp64 compute in their own precision. What goes on the wire stays in the
    parameters' dtype.
    """
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class Compressor(ABC):
    """Base of every compressor. Subclasses implement :meth:`encode_decode`.

    The uncompressed warm-up (``warmup_steps``), the byte formula and the step counter
    live here, so every compressor handles them the same way.

    **Non-finite steps.** A lossy compressor's state (residuals, factors) must not keep an
    inf/NaN of one overflowing step (fp16 AMP produces them; ``GradScaler`` skips the step).
    Every job therefore reports the finiteness of what it *received* (:meth:`observe`: the
    all-reduced or all-gathered payload, identical on every rank, so every rank reaches the
    same verdict) and journals how to undo its state change (:meth:`journal`). When the step
    is over, :meth:`settle` keeps the step's state if every payload was finite and undoes it
    otherwise. A non-finite gradient on any rank makes the summed/gathered payload
    non-finite, so the decoded gradients are non-finite on every rank too.
    """

    def __init__(self, spec: CompressorSpec) -> None:
        self.spec = spec
        self.steps_done = 0
        self._step_checks: list[tuple[torch.Tensor, torch.Tensor]] = []  # (sum, tensor) per collective
        self._step_undo: list[Callable[[], None]] = []
        #: Whether the last settled step was finite everywhere (True before any step).
        self.last_step_finite = True
        self._open_step = 0  # steps_done when the step in flight began

    # -- identity -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return self.spec.label

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec.label}>"

    # -- the per-bucket job ----------------------------------------------------------
    def process(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        """The job GradientSync drives for one bucket (the warm-up is plain all-reduce).

        The first call of a step settles the previous step if nobody did (drivers such as
        :func:`run_in_lockstep` just call ``process``/``end_step``): every job of that step has
        finished by now. Later calls of the same step must not: buckets that already
        completed in this step have journaled into the step in flight.
        """
        if self.steps_done != self._open_step:
            self.settle()
            self._open_step = self.steps_done
        if self.steps_done < self.spec.warmup_steps:
            return mean_allreduce(buffer, world_size)
        return self.encode_decode(buffer, slots, world_size)

    @abstractmethod
    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        """Yield collectives; leave the mean over ranks of the (compressed) gradient in ``buffer``."""

    def end_step(self) -> None:
        """Called once per step, when the step's last bucket has been handed over."""
        self.steps_done += 1

    # -- non-finite steps ---------------------------------------------------------------
    def observe(self, received: torch.Tensor) -> None:
        """Record whether a collective's result is finite (no host sync: read in :meth:`settle`).

        The check is the sum's finiteness: an inf or NaN anywhere makes the sum non-finite,
        and one reduction reads the tensor once (``isfinite(x).all()`` costs ~30x more on a
        CPU, 2.4 % of ACP-SGD's step on ResNet-50). A sum can also overflow on finite values;
        :meth:`settle` then checks that tensor element by element, so the verdict is exact and
        the same on every rank whatever its summation order.
        """
        accumulate = torch.float64 if received.dtype == torch.float64 else torch.float32
        self._step_checks.append((received.sum(dtype=accumulate), received))

    def journal(self, undo: Callable[[], None]) -> None:
        """Record how to undo one state change of the step in flight."""
        self._step_undo.append(undo)

    def settle(self) -> bool:
        """End the step whose jobs have all finished: keep its state, or undo it if non-finite.

        Returns whether the step was finite on every rank. Called by GradientSync when a
        step's last bucket completes; safe to call again (a no-op).
        """
        checks, undo = self._step_checks, self._step_undo
        self._step_checks, self._step_undo = [], []
        finite = not checks or bool(torch.stack([torch.isfinite(total) for total, _ in checks]).all())
        if not finite:  # a non-finite sum: an inf/NaN, or an overflow of finite values
            finite = all(bool(torch.isfinite(received).all()) for total, received in checks if not torch.isfinite(total))
        if not finite:
            for step_back in reversed(undo):
                step_back()
        self.last_step_finite = finite
        return finite

    # -- bytes ----------------------------------------------------------------------
    def wire_bytes(self, shapes: Iterable[Sequence[int]], world_size: int, dtype: torch.dtype = torch.float32) -> float:
        """Bytes this rank passes into collectives per step (average over steps), from the formula,
        for gradients of ``dtype`` (what travels is in that dtype, or 16-bit for fp16/bf16)."""
        return wire.wire_bytes(self.spec, shapes, world_size, element_bytes=dtype.itemsize)

    def compresses(self, shape: Sequence[int]) -> bool:
        return wire.is_compressed(self.spec, tuple(shape))

    # -- state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.settle()
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.settle()
        self.steps_done = int(state.get("steps_done", 0))

    def take_residuals(self) -> dict[str, torch.Tensor]:
        """Hand over (and forget) the error-feedback residuals, keyed by parameter.

        GradientSync adds them to the next gradients after a switch, so no gradient mass
        is lost when the compressor changes. Compressors without error feedback have none.
        """
        self.settle()
        return {}

    def residuals(self) -> dict[str, torch.Tensor]:
        """The error-feedback residuals, left in place (read-only use)."""
        return {}

    # -- quality estimates ------------------------------------------------------------
    @classmethod
    def lost_energy(cls, spec: CompressorSpec, tensor: torch.Tensor, flat: torch.Tensor, cache: dict[str, Any],
                    previous: torch.Tensor | None = None) -> float:
        """``‖x − C(x)‖²`` of one gradient ``tensor`` (``flat``: it as 1-D fp32) that ``spec``
        compresses, for ``compressors.quality.estimate_errors``; ``previous``: the same
        parameter's gradient one step before, where the sample has it (for a kernel whose
        step uses what the step before left, ACP-SGD's factor; the others ignore it).

        The default runs one step of a fresh compressor at world size 1 on a copy; kernels
        with a closed form override it (``cache`` holds per-tensor work they can share, such
        as the singular values).
        """
        compressor = cls(spec)
        buffer = flat.clone()
        run_in_lockstep([compressor.process(buffer, [GradSlot(key="sample", grad=buffer.view(tensor.shape))], 1)])
        return float(torch.sum((flat - buffer) ** 2))


class ErrorFeedbackCompressor(Compressor):
    """A lossy compressor that keeps what it left out and adds it to the next gradient."""

    def __init__(self, spec: CompressorSpec) -> None:
        super().__init__(spec)
        self.memory = ErrorFeedback()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.memory.load_state_dict(state.get("memory", {}))

    def take_residuals(self) -> dict[str, torch.Tensor]:
        self.settle()
        return self.memory.take()

    def keep_residual(self, key: str, work: torch.Tensor) -> None:
        """Make ``work`` (from ``memory.accumulate``) the residual of ``key``, undoable until settled."""
        prior = self.memory.commit(key, work)
        self.journal(lambda: self.memory.restore(key, prior))

    def residuals(self) -> dict[str, torch.Tensor]:
        self.settle()
        return self.memory.peek()


def mean_allreduce(buffer: torch.Tensor, world_size: int) -> BucketJob:
    """Plain all-reduce of the whole bucket (in its dtype), then divide: S-SGD.

    Stateless: an inf/NaN on any rank is in every rank's sum, nothing to undo."""
    yield AllReduce(buffer)
    buffer.div_(world_size)


def seeded_normal(shape: Sequence[int], seed: int, key: str, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A random matrix that is identical on every rank: seeded by (seed, parameter name).

    The reference implementation leaves the first factor unseeded, which makes replicas
    diverge once; seeding by name also keeps it stable across DDP's bucket rebuild.
    """
    generator = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)


def build(name: str, **params: Any) -> Compressor:
    """Build a compressor by name (``planning.registry.names()``). Raises ``ValueError``
    naming the bad field."""
    spec = make_spec(name, **params)
    return from_spec(spec)


def kernel_class(name: str) -> type[Compressor]:
    """The torch kernel of compressor ``name``: the class its description names by import
    path (``Codec.kernel``, ``"module:Class"``).

    Resolved by ``importlib`` at call time, so this module imports no compressor module
    (each of them imports this one): the import graph stays acyclic.
    """
    path = registry.codec(name).kernel
    module_name, _, attribute = path.partition(":")
    kernel = getattr(importlib.import_module(module_name), attribute, None)
    if not (isinstance(kernel, type) and issubclass(kernel, Compressor)):
        raise TypeError(f"kernel: {path!r} of compressor {name!r} is not a Compressor subclass")
    return kernel


def from_spec(spec: CompressorSpec) -> Compressor:
    """Build a compressor from an already validated spec."""
    return kernel_class(spec.name)(spec)


def run_in_lockstep(jobs: Sequence[BucketJob]) -> None:
    """Drive one bucket job per simulated rank in one process, doing the collectives by hand.

    Every job must yield the same sequence of collectives (as real ranks must). Used by
    unit tests and by benchmarks that time encode+decode without a network; with a single
    job it is the world-size-1 case.
    """
    results: list[torch.Tensor | None] = [None] * len(jobs)
    while True:
        requests: list[Collective] = []
        finished = 0
        for index, job in enumerate(jobs):
            try:
                requests.append(job.send(results[index]))  # type: ignore[arg-type]
            except StopIteration:
                finished += 1
        if finished:
            if finished != len(jobs):
                raise RuntimeError("bucket jobs of different ranks ended at different rounds")
            return
        kinds = {type(r) for r in requests}
        if len(kinds) != 1:
            raise RuntimeError(f"ranks asked for different collectives: {kinds}")
        if len(requests) == 1:  # world size 1: the collective is the identity
            only = requests[0].tensor
            results = [only if isinstance(requests[0], AllReduce) else only.unsqueeze(0)]
        elif isinstance(requests[0], AllReduce):
            total = torch.stack([r.tensor for r in requests]).sum(0)
            for r in requests:
                r.tensor.copy_(total)
            results = [r.tensor for r in requests]
        else:
            gathered = torch.stack([r.tensor for r in requests])
            results = [gathered.clone() for _ in requests]
