"""A steady C heap for a training process: glibc's malloc told to keep what it has.

Why: on a CPU, a step's activations and gradients are large buffers allocated and freed every
step. glibc's default serves a buffer above a threshold (128 KiB in a fresh process) with a
mapping of its own (fresh pages, a page fault on each first touch), and returns the heap's free
top to the system above another; both thresholds move with the mapped blocks the process freed
before. A step's speed then depends on the process's history: measured on the benchmark's CNN
(fresh processes, one thread, medians of 60 steps, ``python -m benchmarks.heap``,
``benchmarks/results/heap.md``): 19.2-20.6 ms a step with the defaults, 1.11x that after the
adaptive job's codec calibration had run between two steps (1.04x after nothing); 16.7 ms with
the thresholds fixed here, 1.002x after the calibration. The adaptive benchmark's
steady-fast runs paid that history: the adaptive job ran fp16 from its first decision, and its
time to target was 1.11-1.15x the fixed fp16 run's (the extra work between its steps, the
calibration, the estimates and the policy, left the heap in another state); 1.04x with it.

Fixing both thresholds (``mallopt``) turns the moving adjustment off: buffers up to
:data:`MMAP_THRESHOLD_BYTES` come from the heap and are reused, and each arena keeps up to
:data:`TRIM_THRESHOLD_BYTES` of free memory. The cost is resident memory: a process keeps its
largest step's buffers (as a caching allocator on a GPU does), and the setting holds for the
rest of the process's life.

The built-in training loop's processes (``workers.loop``) do it; a user's own script does it
only when it asks (``keep_heap=True`` to ``gradwire.ray.prepare`` / ``gradwire.torch.prepare``,
``workers.session.start``): the process is the script's.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (``<malloc.h>``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Buffers up to this size come from the heap: the ceiling glibc's own moving threshold stops
#: at on 64-bit systems (4 MiB · sizeof(long)), so no buffer the defaults would ever have served
#: from the heap is mapped on its own.
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: Free memory an arena keeps before returning its top to the system: several of the largest
#: buffers (the trim threshold must exceed what a step frees at once, or each step returns its
#: memory and faults it back in).
TRIM_THRESHOLD_BYTES = 256 * 2**20


def keep_heap() -> bool:
    """Fix glibc's mmap and trim thresholds for this process. True when glibc took both; False
    where the C library is not glibc (nothing changed: other allocators have no such thresholds)
    or refused a value (logged). Calling it again sets the same values again."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):  # not a glibc name, or no confstr (Windows)
        glibc = None
    if not glibc:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    refused = [name for name, parameter, value in (("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                                                   ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
               if not mallopt(parameter, value)]
    if refused:
        log.warning("%s refused %s; the C heap keeps its default there", glibc, ", ".join(refused))
    return not refused
