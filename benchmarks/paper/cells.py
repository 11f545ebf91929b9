"""What the benchmark measures: the workloads, the measuring protocols, the grid's settings, and one
cell (workload × method × workers × rate × protocol) of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

METHODS: tuple[str, ...] = ("ssgd", "signsgd", "topk", "powersgd", "torch_powersgd", "acpsgd")
COMPRESSOR_OF = {"ssgd": "none", "signsgd": "signsgd", "topk": "topk", "powersgd": "powersgd", "acpsgd": "acpsgd"}
TOPK_RATIO = 0.01
TORCH_ONE_BUCKET_MB = 10_000.0
#: gloo on the testbed sees 3-10 % less than the tc rate (headers, ring): used to pick rates.
LINK_EFFICIENCY = 0.94
A_RATIO = 4.0  # regime (a): S-SGD communication ≈ 4× compute (acceptance asks for >= 3×)
CALIBRATION_MBIT = 10_000.0
RETRY_PAUSE_S = 30.0
CALIBRATION_PROTOCOL_STEPS = (5, 1, 6)
#: One colour per method in every plot.
METHOD_COLOURS = {"ssgd": "#4c72b0", "signsgd": "#dd8452", "topk": "#937860", "powersgd": "#55a868",
                  "torch_powersgd": "#8172b3", "acpsgd": "#c44e52"}
PHASES = ("data", "forward", "backward", "exposed_comm", "optimizer", "compress", "communicate", "decompress")


@dataclass(frozen=True)
class Workload:
    """A paper workload scaled to this machine (see the module docstring for why)."""

    name: str
    model: str
    batch_size: int
    rank: int
    seq_len: int = 32
    image_size: int = 32
    layers: int | None = None  # BERT depth override
    paper: str = ""

    @property
    def is_bert(self) -> bool:
        return self.model.startswith("bert")

    def build_kwargs(self) -> dict[str, Any]:
        """``build_model`` keywords: the paper's heads (1000 ImageNet classes, 2 for BERT)."""
        from workers.models import default_num_classes

        kwargs: dict[str, Any] = {"num_classes": default_num_classes(self.model)}
        if self.is_bert:
            kwargs["seq_len"] = self.seq_len
            if self.layers:
                kwargs["num_layers"] = self.layers
        else:
            kwargs["image_size"] = self.image_size
        return kwargs

    def describe(self) -> str:
        if self.is_bert:
            depth = f"{self.layers} layers, " if self.layers else ""
            return f"{depth}batch {self.batch_size}, seq {self.seq_len}, rank {self.rank}"
        return f"batch {self.batch_size}, {self.image_size} px, rank {self.rank}"


WORKLOADS: dict[str, Workload] = {
    "resnet50": Workload("resnet50", "resnet50", batch_size=8, rank=4, paper="batch 64, 224 px, rank 4"),
    "resnet152": Workload("resnet152", "resnet152", batch_size=4, rank=4, paper="batch 32, 224 px, rank 4"),
    "bert-base": Workload("bert-base", "bert-base", batch_size=4, rank=32, seq_len=32, paper="batch 32, seq 64, rank 32"),
    "bert-large": Workload("bert-large", "bert-large", batch_size=2, rank=32, seq_len=32, layers=8,
                           paper="24 layers, batch 8, seq 64, rank 32"),
}


@dataclass(frozen=True)
class Protocol:
    """Iterations of one measured configuration: warm-up, then ``repeats`` blocks of ``iters``."""

    warmup: int = 10
    repeats: int = 5
    iters: int = 10

    @property
    def steps(self) -> int:
        return self.warmup + self.repeats * self.iters


PAPER_PROTOCOL = Protocol(10, 5, 10)
#: Cheaper protocols for configurations whose predicted time exceeds the per-cell budget
#: (S-SGD of BERT at 100 Mbit/s takes ~35 s an iteration). Even block lengths keep ACP-SGD's
#: P- and Q-steps balanced; warm-up >= 3 lets PyTorch's hook start compressing first.
FALLBACK_PROTOCOLS = (Protocol(6, 5, 6), Protocol(4, 3, 4), Protocol(3, 2, 2))
CALIBRATION_PROTOCOL = Protocol(*CALIBRATION_PROTOCOL_STEPS)
ABLATION_PROTOCOL = Protocol(4, 3, 4)
GRID_MBITS = {"resnet50": (100.0, 500.0, 2000.0), "bert-base": (100.0, 500.0, 2000.0),
              "resnet152": (500.0, 2000.0), "bert-large": (500.0, 2000.0)}
FUSION_CAPS_MB = (1e-4, 1.0, 5.0, 25.0, 100.0, 1000.0)  # 1e-4: one tensor per bucket (fusion off)
MIN_FUSED_CAP_MB = 1.0  # buckets of this size or more hold many tensors: fusion on
RANK_SWEEP = {"resnet50": (1, 2, 4, 8, 16), "bert-base": (8, 16, 32, 64)}
QUICK_PROTOCOL = Protocol(5, 2, 2)  # PyTorch's hook needs ~5 steps to settle (allocations)


@dataclass(frozen=True)
class Cell:
    """One measured configuration; its JSON is the cache key."""

    workload: str
    method: str
    workers: int
    mbit: float
    bucket_cap_mb: float = 25.0
    pipelining: bool = True
    rank: int | None = None  # None: the workload's rank
    protocol: Protocol = PAPER_PROTOCOL
    tag: str = "grid"
    seed: int = 0
    #: DDP's gradient_as_bucket_view: gradients live in the bucket buffers, so DDP does not
    #: copy every bucket into .grad after backward (~15 ms per 100 MB on one core, all exposed).
    bucket_view: bool = True

    @property
    def effective_cap_mb(self) -> float:
        return TORCH_ONE_BUCKET_MB if self.method == "torch_powersgd" else self.bucket_cap_mb

    def key(self) -> str:
        payload = json.dumps({**asdict(self), "tag": None}, sort_keys=True)
        return hashlib.sha1(payload.encode()).hexdigest()[:16]


#: The bucket cap of the grid's cells: the isolated codec measurement uses the same layout.
CODEC_BUCKET_CAP_MB = Cell.__dataclass_fields__["bucket_cap_mb"].default


def cell_from_json(text: str) -> Cell:
    data = json.loads(text)
    data["protocol"] = Protocol(**data["protocol"])
    return Cell(**data)


