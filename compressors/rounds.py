"""The collective plumbing under GradientSync: issuing a compressor's requests on a process
group, ordering later rounds across ranks, the per-step handshake, and a bucket as slots.

Nothing here knows about compressors' maths; ``compressors/sync.py`` drives the generators.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from compressors import handshake
from compressors.base import AllReduce, Collective, GradSlot
from compressors.records import GradientSyncError
from planning.spec import CompressorSpec

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class OrderedRound:
    """Issues one round's collectives in bucket order, whichever thread asks first.

    Collectives are matched across ranks by the order they are issued on a process group.
    Round 1 of every bucket is issued by the autograd thread inside the hook, in bucket
    order on every rank. Later rounds (PowerSGD's Q all-reduce) are issued from completion
    callbacks, whose order can differ between ranks, so each later round gets its own
    process group and this queue, which issues bucket ``seq`` only after ``seq - 1``
    issued (or declared it had nothing to send in this round).
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self._next = 0
        self._waiting: dict[int, Callable[[dist.ProcessGroup | None], None] | None] = {}
        # Re-entrant: a collective that completes at once runs its callback inline, which
        # may finish the bucket and submit to this queue again from inside submit().
        self._lock = threading.RLock()

    def submit(self, seq: int, launch: Callable[[dist.ProcessGroup | None], None] | None) -> None:
        """Queue bucket ``seq``'s collective for this round (``None``: it has none)."""
        with self._lock:
            self._waiting[seq] = launch
            while self._next in self._waiting:
                ready = self._waiting.pop(self._next)
                self._next += 1
                if ready is not None:
                    ready(self.group)


@dataclass
class Flight:
    """One bucket's journey through its collectives in one step."""

    seq: int  # position of this bucket among all buckets since install(): same on every rank
    bucket_index: int
    gate: handshake.StepGate = field(default_factory=handshake.StepGate.opened)  # the step's handshake
    rounds: int = 0  # collectives issued so far


def launch_collective(
    request: Collective, group: dist.ProcessGroup | None
) -> tuple[torch.futures.Future, torch.Tensor]:
    """Start the collective; return its future and the tensor that will hold its result."""
    tensor = request.tensor
    if isinstance(request, AllReduce):
        work = dist.all_reduce(tensor, group=group, async_op=True)
        return work.get_future(), tensor
    world_size = dist.get_world_size(group)
    gathered = torch.empty((world_size, tensor.numel()), dtype=tensor.dtype, device=tensor.device)
    work = all_gather_single(gathered.view(-1), tensor, group=group, async_op=True)
    return work.get_future(), gathered


def start_handshake(spec: CompressorSpec, switches: int, process_group: dist.ProcessGroup | None,
                    first_round_group: dist.ProcessGroup | None) -> handshake.StepGate:
    """Launch this step's fingerprint all-gather; its gate opens (or fails) when it completes."""
    gate = handshake.StepGate()
    mine = handshake.fingerprint(spec, switches)
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(process_group) == "nccl" else None
        mine = mine.to(device) if device is not None else mine
        gathered = torch.empty(dist.get_world_size(process_group) * mine.numel(), dtype=torch.uint8, device=mine.device)
        work = all_gather_single(gathered, mine, group=first_round_group, async_op=True)
    except BaseException as exc:  # noqa: BLE001 - every bucket of the step fails with it
        gate.open(exc)
        return gate

    def on_done(done: torch.futures.Future) -> None:
        try:
            done.value()
            problem = handshake.mismatch(gathered)
        except BaseException as exc:  # noqa: BLE001
            gate.open(exc)
            return
        gate.open(None if problem is None else GradientSyncError(problem))

    work.get_future().then(on_done)
    return gate


def bucket_slots(bucket: dist.GradBucket, buffer: torch.Tensor, names: dict[int, str]) -> list[GradSlot]:
    """A DDP bucket as per-parameter slots: views into its flat buffer, keyed by parameter name."""
    slots: list[GradSlot] = []
    offset = 0
    for param in bucket.parameters():
        size = param.numel()
        key = names.get(param.data_ptr())
        if key is None:
            raise GradientSyncError("a bucket holds a parameter the model did not name; call install() on this model")
        slots.append(GradSlot(key=key, grad=buffer[offset : offset + size].view(param.shape), offset=offset))
        offset += size
    if offset != buffer.numel():
        raise GradientSyncError(f"bucket layout: parameters cover {offset} of {buffer.numel()} elements")
    return slots


def timeout_of(group: dist.ProcessGroup):
    """The group's collective timeout (so a peer's failure ends our rounds as soon as the user's group)."""
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def unwrap(future: torch.futures.Future) -> torch.Tensor:
    return future.value()


def comm_hook(sync, bucket):
    """DDP's ``(state, bucket) -> Future[Tensor]`` hook, bound to a GradientSync.

    Left unannotated on purpose: DDP inspects the annotations and rejects the string
    form that ``from __future__ import annotations`` would give them.
    """
    return sync._on_bucket(bucket)
