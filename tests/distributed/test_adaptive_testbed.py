"""The adaptive policy on an emulated link: when the bandwidth drops, the job switches to compression.

Two workers, one per network namespace of the testbed, train a small CNN with the in-process
policy on rank 0. The link starts at 1000 Mbit/s, where uncompressed all-reduce hides behind
the convolutions' backward pass, and drops to 20 Mbit/s after a fixed number of steps, where
the same all-reduce takes ~10x the compute. The policy must notice the drop (from the hook's
own timings) and move to a low-rank or lossy compressor, and both ranks must switch at the
same step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.adaptive import Phase, run_job  # noqa: E402
from benchmarks.testbed import Testbed  # noqa: E402
from workers.protocol import TrainConfig  # noqa: E402
from workers.runner import rank_records  # noqa: E402

COMPRESSING = ("acpsgd", "powersgd", "topk", "signsgd")
FAST, SLOW = Phase(mbit=1000, steps=30), Phase(mbit=20, steps=40)


@pytest.fixture(autouse=True)
def testbed_ok() -> None:
    ok, why = Testbed.available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")


def job() -> TrainConfig:
    """A CNN on 64x64 images: enough backward compute to hide 0.6 MB of gradients at 1 Gbit/s."""
    return TrainConfig(
        name="adaptive-testbed", model="cnn", dataset="synthetic", image_size=64, batch_size=32,
        steps=FAST.steps + SLOW.steps, lr=0.02, workers=2, bucket_cap_mb=0.25,
        compression={"mode": "adaptive", "compressor": "none"},
        report_interval_s=0.2, probe_interval_s=60.0, sync_every=5,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_policy_moves_to_compression_after_the_link_drops(tmp_path: Path) -> None:
    with Testbed(hosts=2, mbit=FAST.mbit) as tb:
        run = run_job(tb, job(), [FAST, SLOW], tmp_path / "run", label="adaptive", timeout_s=150)
    drop_step = run.rate_changes[0][0]
    switches = run.summary["switches"]
    assert not [s for s in switches if s["step"] <= drop_step and s["to"].startswith(COMPRESSING)], (
        f"compressed before the drop at step {drop_step}: {switches}")
    after = [s for s in switches if s["step"] > drop_step]
    assert after and after[-1]["to"].startswith(COMPRESSING), f"no switch to compression after step {drop_step}: {switches}"
    assert after[0]["step"] <= drop_step + 20, f"reacted late to the drop at step {drop_step}: {switches}"

    # The telemetry's bandwidth follows the link down (rank 0's passive estimate, in bytes/s).
    slow_reports = [r for r in run.reports if r["step"] > drop_step + 5 and r["compressor"] == "none"]
    seen = [r["bandwidth_bytes_per_second"] * 8e-6 for r in slow_reports]
    assert not seen or min(seen) < 3 * SLOW.mbit, f"bandwidth seen after the drop: {seen} Mbit/s"

    # Both ranks used the same compressor at every step.
    records = rank_records(str(run.checkpoint))
    assert [r["rank"] for r in records] == [0, 1]
    assert records[0]["step_compressors"] == records[1]["step_compressors"]
    assert records[0]["applied"] == records[1]["applied"]
    used = set(records[0]["step_compressors"].values())
    assert "none" in used and any(label.startswith(COMPRESSING) for label in used)
