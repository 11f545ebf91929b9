"""``python -m benchmarks.testbed verify|cleanup``: check the rate gloo sees on a fresh testbed; remove stale namespaces.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from benchmarks.testbed.bed import Testbed
from benchmarks.testbed.gloo import allreduce_worker, measure_allreduce
from benchmarks.testbed.netns import cleanup_stale

# --------------------------------------------------------------------------- CLI


def _verify(args: argparse.Namespace) -> int:
    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    with Testbed(hosts=args.hosts, mbit=args.mbit) as tb:
        m = measure_allreduce(tb, nbytes=args.mib << 20, iters=args.iters)
    err = (m.mbit_seen - m.mbit_set) / m.mbit_set
    print(f"set {m.mbit_set:.1f} Mbit/s, gloo all-reduce saw {m.mbit_seen:.1f} Mbit/s "
          f"({err:+.1%}; {args.hosts} hosts, {args.mib} MiB, median of {args.iters}: {m.median_s:.3f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.testbed", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    verify = sub.add_parser("verify", help="measure the rate gloo sees on a fresh testbed")
    verify.add_argument("--mbit", type=float, default=200.0)
    verify.add_argument("--hosts", type=int, default=2)
    verify.add_argument("--mib", type=int, default=16, help="all-reduce size in MiB")
    verify.add_argument("--iters", type=int, default=3)
    sub.add_parser("cleanup", help="remove namespaces left by dead testbed processes")
    worker = sub.add_parser("_allreduce-worker", help=argparse.SUPPRESS)
    worker.add_argument("--rank", type=int, required=True)
    worker.add_argument("--world", type=int, required=True)
    worker.add_argument("--init", required=True)
    worker.add_argument("--nbytes", type=int, required=True)
    worker.add_argument("--iters", type=int, required=True)
    worker.add_argument("--wake-rounds", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "verify":
        return _verify(args)
    if args.cmd == "cleanup":
        print("\n".join(cleanup_stale()) or "nothing stale")
        return 0
    allreduce_worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
