"""The adaptive policy on an emulated link: when the bandwidth drops, the job switches to
compression; when it comes back, the job sees it and stops compressing.

Two workers, one per network namespace of the testbed, train a small CNN with the in-process
policy on rank 0. The link starts at 1000 Mbit/s, where uncompressed all-reduce hides behind
the convolutions' backward pass, and drops to 20 Mbit/s after a fixed number of steps, where
the same all-reduce takes ~10x the compute. The policy must notice the drop (from the hook's
own timings) and move to a low-rank or lossy compressor, and both ranks must switch at the
same step. Once compressing, the hook's payloads are too small to time: the link coming back
is seen by a recovery check (``workers.probe.check_link``) and the probe it calls for.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from benchmarks.adaptive import JobRun, Phase, run_job
from benchmarks.machine import wait_for_quiet
from benchmarks.testbed import Testbed
from planning.config import TrainConfig
from workers.runner import rank_records

COMPRESSING = ("acpsgd", "powersgd", "topk", "signsgd")
FAST, SLOW = Phase(mbit=1000, steps=25), Phase(mbit=20, steps=35)
SYNC_EVERY = 5


@pytest.fixture(autouse=True)
def testbed_ok() -> None:
    ok, why = Testbed.available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")


def job(**overrides: object) -> TrainConfig:
    """A CNN on 64 64x64 images a step: its backward hides 0.6 MB of gradients at 1 Gbit/s
    with a wide margin (so a CPU hiccup on this shared machine does not make compression look
    worth it before the drop), while at 20 Mbit/s the all-reduce costs more than the compute.
    Reports every 0.5 s (and right after an exchange that read a drop of the link)."""
    fields: dict[str, object] = dict(
        name="adaptive-testbed", model="cnn", dataset="synthetic", image_size=64, batch_size=64,
        steps=FAST.steps + SLOW.steps, lr=0.02, workers=2, bucket_cap_mb=0.25,
        compression={"mode": "adaptive", "compressor": "none"},
        report_interval_s=0.5, probe_interval_s=60.0, sync_every=SYNC_EVERY,
    )
    return TrainConfig(**{**fields, **overrides})


def early_switches(run: JobRun) -> list[dict]:
    """Switches to compression before the rate dropped."""
    drop_step = run.rate_changes[0][0]
    return [s for s in run.summary["switches"] if s["step"] <= drop_step and s["to"].startswith(COMPRESSING)]


def run_once(tmp_path: Path, attempt: int) -> JobRun:
    wait_for_quiet(15.0)
    with Testbed(hosts=2, mbit=FAST.mbit) as tb:
        return run_job(tb, job(), [FAST, SLOW], tmp_path / f"run{attempt}", label="adaptive", timeout_s=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_policy_moves_to_compression_after_the_link_drops(tmp_path: Path) -> None:
    # Rank 0 estimates the link from its own collectives' times. A peer that arrives late at
    # every collective (its core shared with other work on this machine) looks like a slow
    # link, and the policy may compress before the drop; such a run says nothing about the
    # reaction to the drop, so it is repeated once.
    run = run_once(tmp_path, 0)
    if early_switches(run):
        warnings.warn(f"busy machine, repeating: switched before the drop: {early_switches(run)}", stacklevel=1)
        run = run_once(tmp_path, 1)
    drop_step = run.rate_changes[0][0]
    switches = run.summary["switches"]
    assert not early_switches(run), f"compressed before the drop at step {drop_step}: {switches}"
    after = [s for s in switches if s["step"] > drop_step]
    assert after and after[-1]["to"].startswith(COMPRESSING), f"no switch to compression after step {drop_step}: {switches}"
    # The first exchange after the drop whose last three steps were slow on both ranks read it;
    # rank 0's reading restarted from those steps' rate, the report after that step carried it
    # with the exchange's step, the policy took it as the link's level at once, and the eager
    # agreement applied the switch at the next step (before session 45 the reading after a
    # drop averaged the two links, and the policy waited for a second report).
    read = [s for s in run.summary["link_drops_read"] if s > drop_step]
    assert read and read[0] <= drop_step + 2 * SYNC_EVERY, f"drop at step {drop_step} read at {read}"
    assert after[0]["step"] <= read[0] + 2, f"drop read at step {read[0]}, switches {switches}"
    bringing = [r for r in run.reports if r.get("link_drop_step") == read[0]]
    assert bringing and bringing[0]["step"] == read[0] + 1, [(r["step"], r.get("link_drop_step")) for r in run.reports]
    first_reading = bringing[0]["bandwidth_bytes_per_second"] * 8e-6
    assert first_reading < 1.5 * SLOW.mbit, f"the report that brought the drop read {first_reading:.1f} Mbit/s"

    # The telemetry's bandwidth follows the link down (rank 0's passive estimate, in bytes/s).
    slow_reports = [r for r in run.reports if r["step"] > drop_step + 5 and r["compressor"] == "none"]
    seen = [r["bandwidth_bytes_per_second"] * 8e-6 for r in slow_reports]
    assert not seen or min(seen) < 3 * SLOW.mbit, f"bandwidth seen after the drop: {seen} Mbit/s"

    # Each report says how many steps its phase means cover: the timer's window (50 steps),
    # restarted at a switch, so a report's mean is of steps its compressor ran.
    assert all(1 <= r["timed_steps"] <= 50 for r in run.reports), [r["timed_steps"] for r in run.reports]
    # ... and the mean wall time from the end of one of them to the end of the next: while the
    # window only grows, the wall time it spans grows by the time between the two reports.
    grown = [(a, b) for a, b in zip(run.reports, run.reports[1:])
             if a["timed_steps"] >= 2 and b["timed_steps"] - a["timed_steps"] == b["step"] - a["step"] > 0]
    assert grown, "no two reports of one growing window"
    for a, b in grown:
        spanned = b["step_wall_seconds"] * (b["timed_steps"] - 1) - a["step_wall_seconds"] * (a["timed_steps"] - 1)
        assert spanned == pytest.approx(b["wall_time"] - a["wall_time"], abs=0.1), (a, b)
    for before, after in zip(run.reports, run.reports[1:]):
        if (after["compressor"], after["compressor_rank"]) != (before["compressor"], before["compressor_rank"]):
            assert after["timed_steps"] <= after["step"] - before["step"], (before, after)

    # Both ranks used the same compressor at every step.
    records = rank_records(str(run.checkpoint))
    assert [r["rank"] for r in records] == [0, 1]
    assert records[0]["step_compressors"] == records[1]["step_compressors"]
    assert records[0]["applied"] == records[1]["applied"]
    used = set(records[0]["step_compressors"].values())
    assert "none" in used and any(label.startswith(COMPRESSING) for label in used)


RISEN = Phase(mbit=1000, steps=60)


def recovery_job() -> TrainConfig:
    """The same job, with the benchmark's probing (every 2 s within 5 % of the run): checks
    may come every 0.5 s, the budget spaces them ~2 s apart at 20 Mbit/s (~0.1 s each)."""
    return job(steps=FAST.steps + SLOW.steps + RISEN.steps, probe_interval_s=2.0, probe_budget=0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_compressing_job_sees_the_link_come_back_and_the_policy_prices_it(tmp_path: Path) -> None:
    wait_for_quiet(15.0)
    with Testbed(hosts=2, mbit=FAST.mbit) as tb:
        run = run_job(tb, recovery_job(), [FAST, SLOW, RISEN], tmp_path / "run", label="adaptive", timeout_s=180)
    (_, dropped_at, _), (rise_step, risen_at, _) = run.rate_changes
    switches = run.summary["switches"]
    compressing = [s for s in switches if s["to"].startswith(COMPRESSING)]
    assert compressing, f"never compressed on the slow link: {switches}"
    # Blind while compressing: the recovery checks ran (the telemetry counts them) ...
    during = [r for r in run.reports if dropped_at <= r["wall_time"] <= risen_at]
    assert during and during[-1]["link_checks"] > 0, f"no recovery check while slow: {during[-1:]}"
    # ... and one of them saw the link come back: a probe follows at once and the reading is
    # the fast link's within a few checks' time (the next probe by the budget alone would
    # come later: at 20 Mbit/s a probe costs ~0.5 s, 10 s of run at 5 %).
    back = [r for r in run.reports if r["wall_time"] > risen_at and r["bandwidth_bytes_per_second"] * 8e-6 > 10 * SLOW.mbit]
    assert back, f"the reading never showed the link back: {[r['bandwidth_bytes_per_second'] for r in run.reports[-5:]]}"
    assert back[0]["link_probes"] > max(r["link_probes"] for r in during), "the reading rose without a probe"
    assert back[0]["wall_time"] - risen_at < 5.0, f"the rise was seen {back[0]['wall_time'] - risen_at:.1f} s late"
    # Then the policy prices the fast link. It leaves the low-rank and lossy compressors where
    # its model says that gains more than its threshold (fp16 or none; which one is the cost
    # model's call on this CPU); where not, it keeps one by its own rules (the threshold, the
    # dwell), not for want of the reading: its last reason is priced at the fast rate. (In
    # session 29's CI it kept PowerSGD r8, its best, PowerSGD r64, 2.7-4.2 % ahead, below the
    # 10 % threshold: at ~0.2 s steps the choices cost about the same here.)
    after = [s for s in switches if s["step"] > rise_step]
    if switches[-1]["to"].startswith(COMPRESSING):
        reason = run.summary["policy_reason"]
        priced = [float(x) * (1000 if unit == "G" else 1) for x, unit in re.findall(r"at ([\d.]+) ([GM])b/s", reason)]
        assert priced and priced[-1] > 10 * SLOW.mbit, \
            f"still compressing after the rise, not priced at the fast link: {reason!r}; {switches}"
    else:
        assert after, f"left compression before the rise: {switches}"
