"""StepTimer on CPU: every phase of docs/step.md ("Timing phases"), the hook's sums, exposed communication, means.

Only lower bounds on measured time are asserted (a sleep takes at least its length); the
CPU is shared, so nothing asserts an upper bound.
"""

from __future__ import annotations

import time

import pytest
import torch

from compressors.sync import StepRecord
from planning.protocol import ALL_PHASES, HOOK_PHASES, PHASES
from workers.timing import StepTimer, codec_clock

CPU = torch.device("cpu")


def timed_step(timer: StepTimer, step: int, record: StepRecord | None, sleep_s: float = 0.002):
    for phase in ("data", "forward", "backward", "optimizer"):
        with timer.phase(phase):
            time.sleep(sleep_s)
    return timer.end_step(step, record)


def test_every_phase_is_timed_and_hook_sums_are_taken_from_the_record():
    timer = StepTimer(CPU)
    record = StepRecord(compressor="acpsgd-r4", compress_s=0.011, communicate_s=0.022, decompress_s=0.033)
    with timer.phase("data"):
        time.sleep(0.002)
    with timer.phase("forward"):
        time.sleep(0.002)
    with timer.phase("backward"):
        time.sleep(0.001)  # backward compute ...
        record.last_bucket_at = time.perf_counter()  # ... ends when autograd hands over the last bucket
        time.sleep(0.003)  # then backward() waits for communication: exposed
    with timer.phase("optimizer"):
        time.sleep(0.002)
    timing = timer.end_step(7, record)

    assert timing.step == 7
    assert set(timing.seconds) == set(ALL_PHASES)
    assert all(timing.seconds[p] >= 0.002 for p in ("data", "forward", "backward", "optimizer"))
    assert timing.seconds["exposed_comm"] >= 0.003
    assert timing.seconds["exposed_comm"] < timing.seconds["backward"]
    assert (timing.seconds["compress"], timing.seconds["communicate"], timing.seconds["decompress"]) == (0.011, 0.022, 0.033)
    # a step's total is the sequential phases; exposed comm is inside backward, not added again
    assert timing.total_s == pytest.approx(sum(timing.seconds[p] for p in PHASES if p != "exposed_comm"))


def test_a_step_without_a_hook_record_has_zero_hook_phases():
    timing = timed_step(StepTimer(CPU), 0, None)
    assert all(timing.seconds[p] == 0.0 for p in (*HOOK_PHASES, "exposed_comm"))
    assert timing.seconds["backward"] > 0


def test_a_phase_entered_twice_in_one_step_accumulates():
    timer = StepTimer(CPU)
    for _ in range(2):
        with timer.phase("data"):
            time.sleep(0.002)
    assert timer.end_step(0, None).seconds["data"] >= 0.004


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'compress'"):
        with StepTimer(CPU).phase("compress"):  # hook phases come from the record, not the timer
            pass


def test_means_over_a_window_and_reset_after_a_switch():
    timer = StepTimer(CPU, window=3)
    assert timer.means() == {p: 0.0 for p in ALL_PHASES}
    assert timer.mean_step_s() == 0.0
    for step in range(5):
        timed_step(timer, step, StepRecord(compressor="none", communicate_s=float(step)), sleep_s=0.0005)
    assert [t.step for t in timer.recent] == [2, 3, 4]  # the window keeps the latest 3
    assert timer.means()["communicate"] == pytest.approx((2 + 3 + 4) / 3)
    assert timer.mean_step_s() == pytest.approx(sum(t.total_s for t in timer.recent) / 3)
    assert timer.mean_step_s() >= 4 * 0.0005

    timer.reset_window()
    assert not timer.recent and timer.means()["communicate"] == 0.0


def test_the_compute_floor_is_each_phases_least_over_the_window():
    """The model profile's compute: a first step with one-time work (session 32's CNN: forward
    47 ms in step 0, 11 ms later) does not lift it, and backward's compute is each step's
    backward less the communication it waited for, its least over the steps (not the least
    backward less the least wait)."""
    from workers.timing import StepTiming

    timer = StepTimer(CPU)
    assert timer.compute_floor() == {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    steps = [{"forward": 0.047, "backward": 0.184, "exposed_comm": 0.141, "optimizer": 0.0005},
             {"forward": 0.022, "backward": 0.094, "exposed_comm": 0.083, "optimizer": 0.0004},
             {"forward": 0.011, "backward": 0.100, "exposed_comm": 0.090, "optimizer": 0.0006}]
    for step, seconds in enumerate(steps):
        timer.recent.append(StepTiming(step=step, seconds={p: seconds.get(p, 0.0) for p in ALL_PHASES}, ended_at=step))
    floor = timer.compute_floor()
    assert floor["forward"] == pytest.approx(0.011)
    assert floor["backward"] == pytest.approx(0.010)  # step 2's 0.100 - 0.090; 0.094 - 0.090 was never a step's
    assert floor["optimizer"] == pytest.approx(0.0004)


def test_a_step_does_not_leak_phases_into_the_next():
    timer = StepTimer(CPU)
    with timer.phase("data"):
        time.sleep(0.003)
    timer.end_step(0, None)
    with timer.phase("forward"):
        pass
    second = timer.end_step(1, None)
    assert second.seconds["data"] == 0.0


def test_the_cpu_codec_clock_counts_this_threads_work_not_waiting():
    """Codecs are timed as this thread's CPU time, as the hook does: a sleep (another thread
    holding the core) adds nothing, work does. The work is measured in CPU time, not wall
    time, so a loaded machine cannot make it fail."""
    clock = codec_clock(CPU)
    before = clock()
    time.sleep(0.2)
    slept = clock() - before
    before, cpu_before = clock(), time.thread_time()
    while time.thread_time() - cpu_before < 0.1:  # 0.1 s of this thread's own CPU time
        pass
    busy = clock() - before
    assert slept < 0.05
    assert busy >= 0.1


def test_the_gpu_codec_clock_waits_for_the_device_then_reads_wall_time(monkeypatch):
    """On an accelerator the codec's kernels run asynchronously: the clock first waits for
    the device (recorded here: no GPU on this machine), then reads wall time."""
    waited: list[torch.device] = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waited.append(device))
    gpu = torch.device("cuda", 0)
    clock = codec_clock(gpu)
    before = clock()
    time.sleep(0.05)
    assert clock() - before >= 0.05
    assert waited == [gpu, gpu]


def test_the_wall_time_per_step_counts_the_work_between_the_phases():
    """From the end of one step to the end of the next: the phases plus what runs outside
    them (here a sleep between steps, as the decision exchange or a checkpoint would)."""
    timer = StepTimer(CPU, window=4)
    timed_step(timer, 0, None, sleep_s=0.001)
    assert timer.wall_step_s() is None  # one step: no interval yet
    for step in range(1, 6):
        time.sleep(0.004)  # untimed work between steps
        timed_step(timer, step, None, sleep_s=0.001)
    assert timer.wall_step_s() >= 4 * 0.001 + 0.004  # four timed phases and the gap, per interval
    assert timer.wall_step_s() > timer.mean_step_s() + 0.003
    timer.reset_window()
    assert timer.wall_step_s() is None
