"""The steady C heap of a training process (``workers.heap``) and its benchmark's bookkeeping.

The heap's thresholds are process state, so each check runs in a fresh interpreter and reads
glibc's own account of its mmapped blocks (``mallinfo2``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from benchmarks.heap import main, run_trial, summarise, table
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
    if sys.argv[1].startswith("session"):  # a user's script, asking gradwire.start for it or not
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from benchmarks.compressor_cost import single_process_group
        from workers.session import start
        with single_process_group():
            start(torch.nn.Linear(4, 2), device=torch.device("cpu"), wrap=DistributedDataParallel,
                  compression="none", keep_heap=sys.argv[1] == "session-kept").close()
    before = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    mmapped = libc.mallinfo2().hblks - before
    libc.free(block)
    print(json.dumps({"kept": kept, "mmapped": mmapped, "free_in_heap": libc.mallinfo2().fordblks}))
""")


def _glibc_with_mallinfo2() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION")) and hasattr(ctypes.CDLL(None), "mallinfo2")
    except (ValueError, OSError, AttributeError):
        return False


def _fresh_process(heap: str) -> dict[str, Any]:
    # The heap's own settings in the environment would change what a fresh process does.
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS_OF_A_4_MIB_MALLOC, heap], cwd=str(REPO_ROOT),
                          env={**env, **repo_env()}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only (keep_heap changes nothing elsewhere)")
def test_a_kept_heap_serves_a_large_buffer_itself_and_keeps_it_after_free():
    default, kept = _fresh_process("default"), _fresh_process("kept")
    # glibc's default maps a 4 MiB buffer of a fresh process on its own (threshold 128 KiB) ...
    assert default["mmapped"] == 1
    # ... a kept heap serves it from the heap, and keeps the freed 4 MiB for the next step's buffers
    assert kept["kept"] is True
    assert kept["mmapped"] == 0
    assert kept["free_in_heap"] >= 4 << 20


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
def test_a_users_script_keeps_the_heap_only_when_it_asks_gradwire_start():
    assert _fresh_process("session-kept")["mmapped"] == 0
    assert _fresh_process("session")["mmapped"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc only")
def test_a_kept_trial_runs_with_the_heap_kept_and_times_its_steps_in_a_fresh_process():
    record = run_trial("kept", "calibration")
    assert (record["heap"], record["between"], record["kept"]) == ("kept", "calibration", True)
    assert record["before_ms"] > 0 and record["after_ms"] > 0


def test_a_trial_of_an_unknown_kind_is_refused_with_the_choices():
    with pytest.raises(SystemExit):
        main(["_trial", "kept", "sleep"])
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])


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
