"""A plain torchrun script (torch.distributed, no Ray) with gradwire's three lines (``# gradwire``).

    torchrun --nproc-per-node 2 examples/torchrun_spirals.py
    GRADWIRE_URL=http://127.0.0.1:8321 torchrun --nproc-per-node 2 examples/torchrun_spirals.py

Without GRADWIRE_URL no coordinator is involved; ``--compression adaptive`` then runs the
adaptive policy inside the script.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import gradwire.torch  # gradwire

sys.path.insert(0, str(Path(__file__).resolve().parent / "userpkg"))  # the user's own package

from gw_example.data import spirals  # noqa: E402
from gw_example.models import make_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--compression", default="acpsgd", help="a compressor name, or 'adaptive'")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    train_set, held_out = spirals(seed=0)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)

    torch.manual_seed(0)  # the same initial weights every run (DDP copies rank 0's to the others)
    model = make_model()
    model = gradwire.torch.prepare(model, compression=args.compression, rank=4,  # gradwire (was: DDP(model))
                                   steps=args.epochs * len(loader))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = criterion(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            gradwire.torch.step(loss)  # gradwire
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)

    with torch.no_grad():
        points, labels = held_out.tensors
        accuracy = (model.module(points).argmax(1) == labels).float().mean().item()
    session = gradwire.torch.current()  # optional: what gradwire did on this rank
    print(f"rank {dist.get_rank()}: compressor {session.compressor}, "
          f"switches {[(s['step'], s['to'], s['version']) for s in session.switches]}, "
          f"held-out accuracy {accuracy:.3f}, phases_ms "
          + " ".join(f"{k}={v * 1e3:.2f}" for k, v in session.phase_means().items()), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
