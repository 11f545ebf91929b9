"""A steady C heap for a training process: glibc's malloc told to keep what it has.

Why: on a CPU, a step's activations and gradients are large buffers allocated and freed every
step. glibc's default serves a buffer above a moving threshold with its own ``mmap`` (page
faults on every touch of fresh pages) and returns the heap's free top to the system once it
exceeds a threshold, and both thresholds move with what the process allocated before. A
step's speed then depends on the process's history: measured on the benchmark's CNN (fresh
processes, one thread, medians of 60 steps, ``python -m benchmarks.heap``,
``benchmarks/results/heap.md``): 19.3-20.3 ms a step with the defaults, 1.08x that after the
adaptive job's codec calibration had run between two steps (1.035x after nothing); 17.1 ms with
the thresholds fixed here, 1.006x after the calibration. The adaptive benchmark's
steady-fast runs paid that history: the adaptive job ran fp16 from its first decision, and its
time to target was 1.09-1.15x the fixed fp16 run's (the extra work between its steps, the
calibration, the estimates and the policy, left the heap in another state).

Fixing both thresholds (``mallopt``) turns the dynamic adjustment off: buffers up to
:data:`MMAP_THRESHOLD_BYTES` come from the heap and are reused, and the heap keeps up to
:data:`TRIM_THRESHOLD_BYTES` of free memory. The cost is resident memory: a process keeps its
largest step's buffers (as a caching allocator on a GPU does).

Only the built-in training loop's processes (``workers.loop``) do it: a user's own script
(``gradwire.start``) keeps its process as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (``<malloc.h>``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Buffers up to this size come from the heap (where glibc's own dynamic threshold stops on
#: 64-bit systems).
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: Free memory the heap keeps before returning its top to the system.
TRIM_THRESHOLD_BYTES = 256 * 2**20


def keep_heap() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where the C library is
    not glibc (nothing changed: other allocators have no such thresholds)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not done:
        log.warning("mallopt refused the heap thresholds; the C heap keeps its defaults")
    return done
