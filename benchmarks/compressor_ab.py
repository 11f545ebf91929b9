"""Encode+decode of this checkout's compressors against another checkout's, alternated every step.

Why: on a shared machine two separate runs of ``benchmarks.compressor_cost`` differ by 10-30 % from
load alone (PyTorch's unchanged hook moved that much between runs here), far more than the
few percent a change must be checked to. This runs both versions in ONE process on the same
gradients, one step each per round (``compressor_cost.measure``), so machine noise hits both
alike. The other checkout's ``compressors`` package is copied to a temporary directory as
``compressors_before`` (its imports rewritten), so both can be imported side by side.

    python -m benchmarks.compressor_ab --before /work/main --steps 20 --json-out /tmp/ab.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks import compressor_cost as cc
from benchmarks.machine import foreign_load
from benchmarks.outputs import write_whole
from workers.models import parameter_shapes


def import_before(checkout: Path, into: Path):  # type: ignore[no-untyped-def]
    """The other checkout's compressors as the package ``compressors_before``."""
    target = into / "compressors_before"
    shutil.copytree(checkout / "compressors", target)
    for path in target.glob("*.py"):
        text = re.sub(r"\b(from|import) compressors\b", r"\1 compressors_before", path.read_text())
        path.write_text(text)
    spec = importlib.util.spec_from_file_location("compressors_before", target / "__init__.py",
                                                  submodule_search_locations=[str(target)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["compressors_before"] = package  # its modules import each other by this name
    spec.loader.exec_module(package)
    return importlib.import_module("compressors_before.base"), importlib.import_module("compressors_before.sync")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compressor_ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its compressors/ is used)")
    parser.add_argument("--workloads", nargs="+", default=list(cc.WORKLOADS), choices=list(cc.WORKLOADS))
    parser.add_argument("--methods", nargs="+", default=list(cc.OUR_METHODS), choices=list(cc.OUR_METHODS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed rounds (even: ACP-SGD alternates)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, cc.single_process_group():
        before_base, before_sync = import_before(args.before.resolve(), Path(tmp))
        for workload_name in args.workloads:
            model, rank = cc.WORKLOADS[workload_name]
            workload = cc.make_workload(workload_name, parameter_shapes(model), rank)
            cases = {}
            for name in args.methods:
                old = before_sync.GradientSync(before_base.build(name, **cc.method_params(name, rank)))
                old.bind((f"param{index}", param) for index, param in enumerate(workload.params))
                cases[f"{name}/before"] = cc.Case(workload, lambda sync=old, workload=workload: cc.run_step(workload, sync.hook), old)
                cases[f"{name}/after"] = cc.make_case(workload, name)
            load: dict[str, float] = {}
            with foreign_load(load):
                rows = cc.measure(cases, args.warmup, args.steps, workload_name)
            results[workload_name] = {"foreign_cores": load["foreign_cores"], "rows": rows}
            print(f"\n{workload_name} (foreign load {load['foreign_cores']} cores)")
            for name in args.methods:
                old_row, new_row = rows[f"{name}/before"], rows[f"{name}/after"]
                check = new_row.get("nonfinite_check_s", 0.0)
                print(f"{name:9s} before {old_row['encode_decode_s'] * 1e3:8.1f} ms  after {new_row['encode_decode_s'] * 1e3:8.1f} ms"
                      f"  after/before {new_row['encode_decode_s'] / old_row['encode_decode_s']:.3f}"
                      f"  non-finite check {check * 1e3:.2f} ms ({check / new_row['encode_decode_s']:.1%})")
            del workload, cases
    if args.json_out:
        write_whole(args.json_out, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
