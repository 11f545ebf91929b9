"""The foreign load a benchmark records: processes named as ours are not foreign."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from benchmarks.machine import ForeignLoad, process_cpu_s


def test_processes_named_as_ours_are_not_foreign_load_even_when_they_start_later():
    everything = ForeignLoad()
    spinner: list[int] = []
    ours = ForeignLoad(lambda: spinner)  # constructed before the process exists: it counts from 0
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # not waited for: its CPU is
    try:                                                               # not in our getrusage
        spinner.append(child.pid)
        time.sleep(1.0)
        child.send_signal(signal.SIGSTOP)  # its CPU stops moving while both meters are read
        read = process_cpu_s(child.pid)
        assert read is not None
        child_cpu_s = read[0]
        seen_by_everything = everything.cores() * everything.elapsed_s()
        seen_by_ours = ours.cores() * ours.elapsed_s()
    finally:
        child.kill()
        child.wait()
        ours.close()
    assert child_cpu_s > 0.3  # it ran (a busy machine gives it less than a core)
    assert abs((seen_by_everything - seen_by_ours) - child_cpu_s) < 0.1
