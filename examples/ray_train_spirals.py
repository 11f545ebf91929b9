"""A Ray Train script written the way Ray's documentation writes TorchTrainer scripts, with
gradwire's three lines (marked ``# gradwire``): compression, per-phase timing, telemetry to a
coordinator and its decisions.

    python examples/ray_train_spirals.py                                  # a local Ray cluster
    GRADWIRE_URL=http://127.0.0.1:8321 python examples/ray_train_spirals.py   # report to `gradwire serve`
    RAY_ADDRESS=127.0.0.1:6390 python examples/ray_train_spirals.py --workers 2 --epochs 3

The model and data come from the user package in examples/userpkg (shipped to the workers
with runtime_env, as Ray's docs do for a script's own modules).
"""

import argparse
import os
import tempfile
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader

import gradwire.ray  # gradwire

HERE = Path(__file__).resolve().parent


def train_func(config):
    from gw_example.data import spirals
    from gw_example.models import make_model

    train_set, _ = spirals(seed=0)
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True)
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    model = make_model()
    model = gradwire.ray.prepare(model, compression=config["compression"], rank=4,  # gradwire (was: prepare_model)
                                 coordinator=config["coordinator"], steps=config["epochs"] * len(train_loader))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)

    for epoch in range(config["epochs"]):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        for inputs, labels in train_loader:
            outputs = model(inputs)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            gradwire.ray.step(loss)  # gradwire

        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(temp_checkpoint_dir))
        if ray.train.get_context().get_world_rank() == 0:
            print(f"epoch {epoch}: loss {metrics['loss']:.4f}")

    session = gradwire.ray.current()  # optional: what gradwire did on this worker
    print(f"rank {ray.train.get_context().get_world_rank()}: compressor {session.compressor}, "
          f"switches {[(s['step'], s['to'], s['version']) for s in session.switches]}, phases_ms "
          + " ".join(f"{k}={v * 1e3:.2f}" for k, v in session.phase_means().items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--compression", default="acpsgd", help="a compressor name, or 'adaptive'")
    parser.add_argument("--storage", default=str(Path(tempfile.gettempdir()) / "gradwire-examples"))
    args = parser.parse_args()

    # RAY_ADDRESS joins a running cluster; without it, a new local one (never another user's).
    ray.init(address=os.environ.get("RAY_ADDRESS", "local"),
             runtime_env={"py_modules": [str(HERE / "userpkg" / "gw_example")]})
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.1, "epochs": args.epochs, "batch_size": 64, "compression": args.compression,
                           # Ray workers do not see the driver's environment: hand them the URL.
                           "coordinator": os.environ.get("GRADWIRE_URL")},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=ray.train.RunConfig(storage_path=args.storage),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")


if __name__ == "__main__":
    main()
