"""The emulated network: rates gloo sees, live rate changes, and that nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.machine import wait_for_quiet
from benchmarks.testbed import (
    Testbed,
    cleanup_stale,
    list_namespaces,
    measure_allreduce,
    run_schedule,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def testbed_ok() -> None:
    ok, why = Testbed.available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")


def root_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def tc_show(tb: Testbed, i: int) -> str:
    cmd = ["tc", "-n", tb.namespace(i), "qdisc", "show", "dev", tb.interface(i)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def assert_gone(namespaces: list[str]) -> None:
    left = set(namespaces) & set(list_namespaces())
    assert not left, f"namespaces left behind: {left}"
    assert "gweth" not in root_links() and "gwport" not in root_links()


# --------------------------------------------------------------------------- rates


@pytest.mark.slow
def test_set_rate_changes_what_an_all_reduce_sees() -> None:
    # A rate read within 15 %: gloo's transfer threads need the CPU, so not beside other work.
    wait_for_quiet(15.0)
    with Testbed(hosts=2, mbit=400) as tb:
        fast = measure_allreduce(tb, nbytes=8 << 20, iters=3)
        tb.set_rate(100)
        slow = measure_allreduce(tb, nbytes=8 << 20, iters=3)
    for m in (fast, slow):
        assert abs(m.mbit_seen - m.mbit_set) / m.mbit_set <= 0.15, f"set {m.mbit_set}, saw {m.mbit_seen:.1f}"
    assert slow.median_s >= 2 * fast.median_s


def test_wake_up_rounds_time_a_late_joined_all_reduce_across_the_link() -> None:
    with Testbed(hosts=2, mbit=200.0) as tb:
        plain = measure_allreduce(tb, nbytes=4096, iters=3)
        woken = measure_allreduce(tb, nbytes=4096, iters=3, wake_rounds=4)
    assert plain.wake_up_s is None and plain.wake_s == 0.0
    assert woken.wake_up_s is not None and 0 < woken.wake_up_s < 0.05  # a 4 kB all-reduce: milliseconds
    assert woken.wake_s == max(0.0, woken.wake_up_s - min(woken.seconds))


@pytest.mark.slow
def test_three_hosts_share_a_switch_at_the_set_rate() -> None:
    with Testbed(hosts=3, mbit=150) as tb:
        assert tb.address(2) != tb.address(0)
        m = measure_allreduce(tb, nbytes=6 << 20, iters=2)
    assert abs(m.mbit_seen - 150) / 150 <= 0.15, f"saw {m.mbit_seen:.1f}"


def test_both_directions_are_shaped_and_rates_change_live() -> None:
    with Testbed(hosts=2, mbit=300) as tb:
        assert all("rate 300Mbit" in tc_show(tb, i) for i in range(2))
        tb.set_rate(75.5)
        assert all("rate 75500Kbit" in tc_show(tb, i) for i in range(2))
        assert tb.mbit == 75.5
        with pytest.raises(ValueError, match="mbit"):
            tb.set_rate(0)


def test_run_schedule_walks_the_steps_and_records_change_points() -> None:
    with Testbed(hosts=2, mbit=100) as tb:
        start = time.time()
        with run_schedule(tb, [(300, 0.3), (50, 0.3), (120, 0.1)]) as schedule:
            schedule.join(timeout=10)
        assert schedule.done and schedule.error is None
        assert [mbit for _, mbit in schedule.changes] == [300, 50, 120]
        times = [t for t, _ in schedule.changes]
        assert start <= times[0] and times[1] - times[0] >= 0.29 and times[2] - times[1] >= 0.29
        assert tb.mbit == 120 and "rate 120Mbit" in tc_show(tb, 1)


def test_addresses_are_private_and_interfaces_live_only_in_namespaces() -> None:
    with Testbed(hosts=2, mbit=100) as tb:
        assert tb.address(0).startswith("10.213.") and tb.address(1).startswith("10.213.")
        assert tb.address(0) not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert "gweth" not in root_links()
        with pytest.raises(IndexError):
            tb.address(2)


# --------------------------------------------------------------------------- cleanup


def test_cleanup_after_normal_exit_removes_namespaces_links_and_processes() -> None:
    with Testbed(hosts=2, mbit=100) as tb:
        names = [tb.namespace(0), tb.namespace(1)]
        assert set(names) <= set(list_namespaces())
        sleeper = tb.run(1, ["sleep", "60"])
    assert sleeper.poll() is not None, "a process started in the testbed outlived it"
    assert_gone(names)


def test_cleanup_after_an_exception_inside_the_with_block() -> None:
    names: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(hosts=3, mbit=100) as tb:
            names = [tb.namespace(i) for i in range(3)] + [f"{tb.tag}-sw"]
            assert set(names) <= set(list_namespaces())
            raise RuntimeError("boom")
    assert_gone(names)


def test_cleanup_on_sigterm() -> None:
    script = (
        "import time\n"
        "from benchmarks.testbed import Testbed\n"
        "with Testbed(hosts=2, mbit=100) as tb:\n"
        "    print(tb.namespace(0), tb.namespace(1), flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    names = proc.stdout.readline().split()
    assert len(names) == 2 and set(names) <= set(list_namespaces())
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert_gone(names)


def test_cleanup_stale_removes_only_namespaces_of_dead_creators() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"gw-{dead.pid}-abc123-0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with Testbed(hosts=2, mbit=100) as tb:
            removed = cleanup_stale()
            assert stale in removed
            assert tb.namespace(0) in list_namespaces(), "a live testbed must not be touched"
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
    assert stale not in list_namespaces()
