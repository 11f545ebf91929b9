"""Per-rank loaders: each rank's shard of a dataset, in batches, epoch after epoch.

Why apart from the datasets: the loop, the benchmarks and the checks use the same sharding
(``DistributedSampler`` with ``drop_last``, reshuffled per epoch identically on all ranks), so
every rank takes the same number of equally sized steps whatever dataset feeds it.
``batch_size`` is always per worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler


def batches_per_epoch(num_samples: int, batch_size: int, world_size: int) -> int:
    """Full per-worker batches in one epoch (the sampler and loader both drop remainders)."""
    return (num_samples // world_size) // batch_size


def _sampler(dataset: Dataset, rank: int, world_size: int, seed: int, epoch: int, shuffle: bool) -> DistributedSampler:
    """Equal, disjoint shards per rank (drop_last), reshuffled per epoch identically on all ranks."""
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
    )
    sampler.set_epoch(epoch)
    return sampler


def make_loader(
    dataset: Dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    epoch: int = 0,
    *,
    shuffle: bool = True,
    drop_last: bool = True,
) -> DataLoader:
    """One epoch of ``rank``'s shard in batches of ``batch_size``.

    ``drop_last`` (default) keeps every batch full so all ranks take the same number of
    equally sized steps; pass ``False`` for evaluation.
    """
    sampler = _sampler(dataset, rank, world_size, seed, epoch, shuffle)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)


class InfiniteLoader(Iterator[Any]):
    """Endless batches for step-based training: epoch after epoch of this rank's shard.

    ``start_step`` resumes mid-epoch after a checkpoint, without reading the skipped batches:
    the same (seed, epoch) gives the same shuffle, so step ``s`` always gets the same batch.
    ``epoch`` is the epoch of the batch most recently returned (the starting epoch before any).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        *,
        start_step: int = 0,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.steps_per_epoch = batches_per_epoch(len(dataset), batch_size, world_size)  # type: ignore[arg-type]
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"per-worker batch_size {batch_size} is larger than each worker's shard "
                f"({len(dataset)} samples / {world_size} workers)"  # type: ignore[arg-type]
            )
        self.epoch, skip = divmod(start_step, self.steps_per_epoch)
        self._batches = self._epoch_batches(skip)

    def _epoch_batches(self, skip: int) -> Iterator[Any]:
        sampler = _sampler(self.dataset, self.rank, self.world_size, self.seed, self.epoch, shuffle=True)
        indices = list(sampler)
        index_batches: Sequence[list[int]] = [
            indices[i * self.batch_size:(i + 1) * self.batch_size] for i in range(skip, self.steps_per_epoch)
        ]
        return iter(DataLoader(self.dataset, batch_sampler=index_batches))

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            self.epoch += 1
            self._batches = self._epoch_batches(0)
            return next(self._batches)
