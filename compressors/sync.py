"""GradientSync: the DDP communication hook that runs a compressor on every bucket.

It owns what is common to all compressors (docs/architecture.md, "Who owns what"): registering the hook, turning a
DDP bucket into per-parameter slots, driving the compressor's collectives asynchronously
(chained futures, so buckets pipeline with backward and each bucket is decoded as soon as
its collective completes), timing, byte counting, switching at a step boundary, carrying
error feedback across a switch, and checkpoint state. It also guards what real training
hands it: a per-step handshake that catches a switch made on some ranks only
(``compressors.handshake``), settling each step so a non-finite (AMP overflow) step leaves
no state behind, rank-checked and one-file checkpoints (``compressors.checkpoint``), and a
warning when a compressor would compress none of the model's gradients.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from compressors import handshake
from compressors.base import BucketJob, Compressor
from compressors.quality import ErrorMeter
from compressors.records import GradientSyncError, NothingCompressedWarning, StepRecord, SyncStats
from compressors.rounds import (
    Flight,
    OrderedRound,
    bucket_slots,
    comm_hook,
    launch_collective,
    start_handshake,
    timeout_of,
    unwrap,
)
from compressors.syncstate import SyncCheckpoint
from planning import registry
from planning.wire import why_nothing_compressed

# Re-exported: where callers have always found them.
__all__ = ["GradientSync", "GradientSyncError", "NothingCompressedWarning", "StepRecord", "SyncStats"]

class GradientSync(SyncCheckpoint):
    """Runs ``compressor`` as the communication hook of a DDP model.

    Usage::

        sync = GradientSync(build("acpsgd", rank=4))
        sync.install(ddp_model)
        ...                      # train as usual
        sync.switch(build("powersgd", rank=8))   # on every rank, between the same two steps
    """

    def __init__(self, compressor: Compressor, process_group: dist.ProcessGroup | None = None, *, pipelining: bool = True) -> None:
        _require_compressor(compressor, "GradientSync()")
        self._compressor = compressor
        #: False holds every bucket until backward has handed over the last one, then sends
        #: them all: the "pipelining off" ablation of the paper (communication never overlaps
        #: backward compute). True is the normal, overlapped mode.
        self.pipelining = pipelining
        self._held: list[Callable[[], None]] = []
        self._pending: Compressor | None = None
        self.process_group = process_group
        self._names: dict[int, str] = {}
        self._carry: dict[str, torch.Tensor] = {}
        self._stats = SyncStats()
        self._lock = threading.Lock()
        self._current: StepRecord | None = None
        self._last: StepRecord | None = None
        self._error: BaseException | None = None
        self._bucket_seq = 0
        #: The handshake and every bucket's first round go on a group of their own: they are
        #: launched once the handshake completes, possibly after DDP issued its own collectives
        #: (find_unused_parameters' used-map all-reduce) on the model's group.
        self._first_round_group: dist.ProcessGroup | None = None
        self._later_rounds: list[OrderedRound] = []
        #: Called with each finished StepRecord (from whichever thread finished it).
        self.on_step: Callable[[StepRecord], None] | None = None
        #: Set to measure the running compressor's relative error every step (compressors.quality).
        self.error_meter: ErrorMeter | None = None
        #: Switches applied (and checkpoints loaded) so far: part of the per-step handshake.
        self._switches = 0
        self._shapes: list[tuple[int, ...]] | None = None
        self._warned: set[str] = set()

    # -- public API ------------------------------------------------------------------
    @property
    def compressor(self) -> Compressor:
        """The compressor in force (a pending switch shows from the next step)."""
        return self._compressor

    def install(self, ddp_model: DistributedDataParallel) -> "GradientSync":
        """Register the hook on a DDP-wrapped model. Call once, before the first backward."""
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"install() needs a DistributedDataParallel model, got {type(ddp_model).__name__}")
        self.bind(ddp_model.module.named_parameters())
        ddp_model.register_comm_hook(self, comm_hook)
        return self

    def bind(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> "GradientSync":
        """Learn the parameters' names (state is keyed by name) and set up later rounds' groups.

        ``install()`` calls it; call it yourself only to drive :meth:`hook` without DDP
        (benchmarks do). Collective when the world has more than one rank.
        """
        trained = [(name, param) for name, param in named_parameters if param.requires_grad]
        self._names = {param.data_ptr(): name for name, param in trained}
        self._shapes = [tuple(param.shape) for _, param in trained]
        self._first_round_group = self._new_group()
        self._later_rounds = [OrderedRound(self._new_group()) for _ in range(registry.max_rounds() - 1)]
        self._bucket_seq = 0
        self._warn_if_nothing_compressed(self._compressor)
        return self

    @property
    def trained_elements(self) -> int:
        """Elements of all trained parameters (after :meth:`bind`; 0 before)."""
        return sum(math.prod(shape) for shape in self._shapes or ())

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The communication hook for one bucket: a future of the bucket's mean gradient."""
        return self._on_bucket(bucket)

    def _new_group(self) -> dist.ProcessGroup | None:
        """A process group over the same ranks, with the same timeout (collective: every rank calls install())."""
        if dist.get_world_size(self.process_group) == 1:
            return self.process_group
        ranks = dist.get_process_group_ranks(self._group())
        return dist.new_group(ranks=ranks, backend=dist.get_backend(self.process_group), timeout=timeout_of(self._group()))

    def switch(self, compressor: Compressor) -> None:
        """Use ``compressor`` from the next backward on. Call on every rank between the same steps
        (the next step's handshake raises on every rank, before any payload is sent, if not)."""
        _require_compressor(compressor, "switch()")
        self._warn_if_nothing_compressed(compressor)
        self._pending = compressor

    def stats(self) -> SyncStats:
        with self._lock:
            return self._stats

    @property
    def error(self) -> BaseException | None:
        """The last failure inside the hook. DDP re-raises it from backward() as a
        RuntimeError carrying only its text; this keeps the typed error and its cause."""
        return self._error

    def last_step(self) -> StepRecord | None:
        """The record of the last step whose communication completed."""
        return self._last

    def _group(self) -> dist.ProcessGroup:
        group = self.process_group or dist.group.WORLD
        assert group is not None, "torch.distributed is not initialised"
        return group

    def _rank_and_world(self) -> tuple[int, int]:
        if not dist.is_initialized():
            return 0, 1
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)

    def _warn_if_nothing_compressed(self, compressor: Compressor) -> None:
        """Warn once per compressor label when it would send every gradient uncompressed."""
        if self._shapes is None or compressor.label in self._warned:
            return
        reason = why_nothing_compressed(compressor.spec, self._shapes)
        if reason is not None:
            self._warned.add(compressor.label)
            warnings.warn(f"{reason}; every gradient travels as plain all-reduce", NothingCompressedWarning, stacklevel=3)

    # -- the hook ----------------------------------------------------------------------
    def _on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        # DDP reads a future's *value* in C++, where a Python-side set_exception() is just an
        # object that cannot be cast to a Tensor. Unwrapping through .then() turns a failure
        # into a real error of the returned future, so backward() raises with our message.
        return self._bucket_future(bucket).then(unwrap)

    def _bucket_future(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        now = time.perf_counter()
        if self._current is None:
            self._begin_step(now)
        record = self._current
        assert record is not None
        seq, self._bucket_seq = self._bucket_seq, self._bucket_seq + 1
        record.buckets += 1
        record._open += 1
        if bucket.is_last():
            record.last_bucket_at = now
            record._handed_last = True
            self._current = None
        try:
            slots = bucket_slots(bucket, buffer, self._names)
            for slot in slots:
                carried = self._carry.pop(slot.key, None)
                if carried is not None:
                    slot.grad.add_(carried.view_as(slot.grad))
                    record._carried[slot.key] = carried
            if self.error_meter is not None:  # before encoding: ‖g + e_old‖ (compressors.quality)
                self.error_meter.bucket(slots, self._compressor)
            world_size = dist.get_world_size(self.process_group)
            job = self._compressor.process(buffer, slots, world_size)
        except BaseException as exc:  # noqa: BLE001 - reported through the future, never swallowed
            self._fail(result, record, exc, Flight(seq, bucket.index()))
            return result
        if bucket.is_last():
            self._compressor.end_step()
        flight = Flight(seq, bucket.index(), record._gate)
        start = lambda: self._advance(job, None, result, buffer, record, flight)  # noqa: E731
        if self.pipelining:
            start()
        else:
            self._held.append(start)
            if bucket.is_last():
                held, self._held = self._held, []
                for begin in held:
                    begin()
        return result

    def _begin_step(self, now: float) -> None:
        if self._pending is not None:
            # Error feedback of the old compressor is added to the next gradients, so a
            # switch loses no gradient mass.
            for key, residual in self._compressor.take_residuals().items():
                self._carry[key] = residual
            self._compressor, self._pending = self._pending, None
            self._switches += 1
        self._current = record = StepRecord(compressor=self._compressor.label, first_bucket_at=now)
        if self._carry:  # a step that adds carried residuals must know if it was finite
            record._results_finite = []
        if dist.get_world_size(self.process_group) > 1:
            record._gate = self._start_handshake()

    def _start_handshake(self) -> handshake.StepGate:
        """Launch this step's fingerprint all-gather; its gate opens (or fails) when it completes."""
        return start_handshake(self._compressor.spec, self._switches, self.process_group, self._first_round_group)

    def _advance(
        self,
        job: BucketJob,
        value: torch.Tensor | None,
        result: torch.futures.Future,
        buffer: torch.Tensor,
        record: StepRecord,
        flight: Flight,
    ) -> None:
        """Run the compressor up to its next collective, launch it, and continue when it completes."""
        # Codec time is this thread's CPU time, not wall time: decode runs in the collective's
        # completion callback while backward runs on the autograd thread, and where they share
        # a core, wall time would count backward's slices as codec (measured: +40-65% on CPU).
        # On CUDA this is the host's share (kernel launches); calibrations wait for the device
        # (workers.timing.codec_clock), which a step must not.
        started = time.thread_time()
        try:
            request = job.send(value)  # type: ignore[arg-type]
        except StopIteration:
            self._add(record, decompress_s=time.thread_time() - started)
            self._finish(result, record, buffer, flight)
            return
        except BaseException as exc:  # noqa: BLE001 - reported through the future, never swallowed
            self._fail(result, record, exc, flight)
            return
        self._add(record, compress_s=time.thread_time() - started)
        round_index, flight.rounds = flight.rounds, flight.rounds + 1
        if round_index >= self._max_rounds:
            self._fail(result, record, GradientSyncError(f"more than {self._max_rounds} collective rounds in one step"),
                       flight)
            return

        def launch(group: dist.ProcessGroup | None) -> None:
            launched = time.perf_counter()
            try:
                self._add(record, bytes_sent=request.tensor.numel() * request.tensor.element_size())
                future, received = launch_collective(request, group)
            except BaseException as exc:  # noqa: BLE001
                self._fail(result, record, exc, flight)
                return

            def on_done(done: torch.futures.Future) -> None:
                self._add(record, communicate_s=time.perf_counter() - launched)
                try:
                    done.value()  # raises if the collective failed
                except BaseException as exc:  # noqa: BLE001
                    job.close()
                    self._fail(result, record, exc, flight)
                    return
                self._advance(job, received, result, buffer, record, flight)

            # .then() (not add_done_callback) so CUDA streams are synchronised for the callback.
            future.then(on_done)

        if round_index == 0:
            def go(error: BaseException | None) -> None:
                if error is None:
                    launch(self._first_round_group)
                else:
                    job.close()
                    self._fail(result, record, error, flight)

            flight.gate.submit(go)
        else:
            self._later_rounds[round_index - 1].submit(flight.seq, launch)

    def _release_later_rounds(self, flight: Flight) -> None:
        """Tell the later rounds' queues this bucket sends nothing more this step."""
        for round_index in range(max(flight.rounds, 1), self._max_rounds):
            self._later_rounds[round_index - 1].submit(flight.seq, None)
        flight.rounds = self._max_rounds

    @property
    def _max_rounds(self) -> int:
        """Dependent rounds a bucket may use: the first plus one ordered group per later round
        (as many as the registry's compressors need, ``Codec.rounds``, fixed at :meth:`bind`)."""
        return len(self._later_rounds) + 1

    def _add(self, record: StepRecord, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(record, name, getattr(record, name) + amount)
            self._stats = replace(self._stats, **{name: getattr(self._stats, name) + amount for name, amount in amounts.items()})

    def _finish(self, result: torch.futures.Future, record: StepRecord, buffer: torch.Tensor, flight: Flight) -> None:
        self._release_later_rounds(flight)
        if record._results_finite is not None:
            record._results_finite.append(torch.isfinite(buffer).all())
        with self._lock:
            record._open -= 1
            step_done = record._handed_last and record._open == 0
            if step_done:
                record.done_at = time.perf_counter()
                self._stats = replace(self._stats, steps=self._stats.steps + 1)
        if step_done:
            finite = self._settle(record)
            if self.error_meter is not None:  # after the last bucket: ‖e_new‖ (compressors.quality)
                if finite:
                    self.error_meter.step_done(self._compressor)
                else:  # an undone step measured nothing
                    self.error_meter.discard_step()
            self._last = record
            if self.on_step is not None:
                self.on_step(record)
        result.set_result(buffer)

    def _fail(self, result: torch.futures.Future, record: StepRecord, exc: BaseException, flight: Flight) -> None:
        if self._later_rounds:
            self._release_later_rounds(flight)
        with self._lock:
            record._open -= 1
        error = GradientSyncError(f"{self._compressor.label} failed on bucket {flight.bucket_index}: {exc!r}")
        error.__cause__ = exc
        self._error = error
        result.set_exception(error)


    def _settle(self, record: StepRecord) -> bool:
        """The step's buckets are all done: the compressor keeps or undoes the step's state, and
        residuals carried into a non-finite step are carried again into the next one. Returns
        whether the step was finite on every rank."""
        finite = self._compressor.settle()
        if record._results_finite:
            finite = finite and bool(torch.stack(record._results_finite).all())
        if not finite:
            self._carry.update(record._carried)
        return finite


def _require_compressor(value: Any, where: str) -> None:
    if not isinstance(value, Compressor):
        hint = f" (build({value!r}) makes one)" if isinstance(value, str) else ""
        raise TypeError(f"compressor: {where} needs a Compressor from compressors.build(), got {type(value).__name__} {value!r}{hint}")
