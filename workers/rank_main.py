"""Run one rank of a job as its own process: ``python -m workers.rank_main ...``.

The network testbed starts one of these inside each network namespace, so ranks talk over
the rate-limited veth links; ``--summary`` writes rank 0's result as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planning.config import TrainConfig
from workers.runner import run_rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="TrainConfig as JSON")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="e.g. tcp://10.213.0.1:29500")
    parser.add_argument("--summary", type=Path, help="where rank 0 writes the summary JSON")
    parser.add_argument("--progress", type=Path, help="where rank 0 appends telemetry, one JSON line each")
    args = parser.parse_args(argv)
    config = TrainConfig.model_validate_json(args.config.read_text())

    def progress(report: dict) -> None:
        if args.progress:
            with args.progress.open("a") as handle:
                handle.write(json.dumps(report) + "\n")

    summary = run_rank(config, args.rank, args.world_size, args.init_method, progress=progress)
    if args.rank == 0 and args.summary:
        args.summary.write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
