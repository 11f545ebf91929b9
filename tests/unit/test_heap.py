"""The steady C heap of a training process (``workers.heap``) and its benchmark's bookkeeping.

The heap's thresholds are process state, so each check runs in a fresh interpreter and reads
glibc's own account of its mmapped blocks (``mallinfo2``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks.heap import run_trial, summarise, table
from benchmarks.repo import REPO_ROOT, repo_env

_MMAPPED_BLOCKS_OF_A_4_MIB_MALLOC = textwrap.dedent("""
    import ctypes, json, sys
    from workers.heap import keep_heap

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    kept = keep_heap() if sys.argv[1] == "kept" else None
    before = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    mmapped = libc.mallinfo2().hblks - before
    libc.free(block)
    print(json.dumps({"kept": kept, "mmapped": mmapped, "free_in_heap": libc.mallinfo2().fordblks}))
""")


def _fresh_process(heap: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS_OF_A_4_MIB_MALLOC, heap], cwd=str(REPO_ROOT),
                          env={**os.environ, **repo_env()}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_kept_heap_serves_a_large_buffer_itself_and_keeps_it_after_free():
    default, kept = _fresh_process("default"), _fresh_process("kept")
    if kept["kept"] is False:
        pytest.skip("the C library is not glibc")  # keep_heap changes nothing there, by design
    # glibc's default maps a 4 MiB buffer of a fresh process on its own (threshold 128 KiB) ...
    assert default["mmapped"] == 1
    # ... a kept heap serves it, and keeps the freed 4 MiB for the next step's buffers
    assert kept == {"kept": True, "mmapped": 0, "free_in_heap": kept["free_in_heap"]}
    assert kept["free_in_heap"] >= 4 << 20


def test_a_trial_times_steps_before_and_after_the_calibration_in_a_fresh_process():
    record = run_trial("default", "calibration")
    assert record["heap"] == "default" and record["between"] == "calibration"
    assert record["before_ms"] > 0 and record["after_ms"] > 0
    assert record["foreign_cores"] >= 0


def test_the_summary_takes_medians_per_kind_and_their_ratio():
    trials = [
        {"heap": "default", "between": "calibration", "before_ms": 18.0, "after_ms": 21.0, "foreign_cores": 0.0},
        {"heap": "default", "between": "calibration", "before_ms": 19.0, "after_ms": 22.0, "foreign_cores": 0.1},
        {"heap": "default", "between": "calibration", "before_ms": 40.0, "after_ms": 20.0, "foreign_cores": 0.0},
        {"heap": "kept", "between": "nothing", "before_ms": 16.0, "after_ms": 16.4, "foreign_cores": 0.0},
    ]
    rows = summarise(trials)
    assert rows == [
        {"heap": "default", "between": "calibration", "trials": 3, "before_ms": 19.0, "after_ms": 21.0,
         "after_over_before": round(21.0 / 19.0, 3), "foreign_cores_max": 0.1},
        {"heap": "kept", "between": "nothing", "trials": 1, "before_ms": 16.0, "after_ms": 16.4,
         "after_over_before": round(16.4 / 16.0, 3), "foreign_cores_max": 0.0},
    ]
    assert "| kept | nothing | 1 | 16.00 | 16.40 | 1.025 | 0.0 |" in table(rows)
