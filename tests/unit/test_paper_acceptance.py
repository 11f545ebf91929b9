"""benchmarks.paper's acceptance checks on synthetic result rows (no runs)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.paper import acceptance

LINK = {"alpha_s": 1e-4, "beta_s_per_byte": 8 / 100e6}  # 100 Mbit/s
CALIBRATION = {"resnet50/2": {"compute_s": 0.2, "backward_s": 0.13}}
WORKLOADS = {"resnet50": {"bytes": {"ssgd": 100e6, "powersgd": 1.5e6}}}


def row(method: str, iter_s: float, exposed_s: float = 0.0, *, cap: float = 25.0, tag: str = "regime-b",
        pipelining: bool = True) -> dict[str, Any]:
    return {"model": "resnet50", "method": method, "workers": 2, "mbit": 100.0, "iter_s": iter_s,
            "exposed_comm_s": exposed_s, "bucket_cap_mb": cap, "tag": tag, "pipelining": pipelining, "link": LINK}


REGIME_B = [row("acpsgd", 0.35, 0.057), row("powersgd", 0.38), row("torch_powersgd", 0.5)]


def test_c_fails_on_the_default_buffer_without_a_sweep() -> None:
    (c,) = acceptance(REGIME_B, CALIBRATION, WORKLOADS)["c"]
    assert c["share"] == pytest.approx(0.057 / 0.35) and not c["pass"] and "tuned" not in c


def test_c_is_judged_on_the_fastest_fused_buffer_of_the_sweep() -> None:
    sweep = [row("acpsgd", 0.25, 0.01, cap=1e-4, tag="fusion"),  # fastest, but fusion off: not eligible
             row("acpsgd", 0.30, 0.026, cap=1.0, tag="fusion"),
             row("acpsgd", 0.32, 0.020, cap=5.0, tag="fusion"),
             row("acpsgd", 0.29, 0.001, cap=5.0, tag="pipelining", pipelining=False),  # not the sweep
             row("powersgd", 0.20, 0.0, cap=1.0, tag="fusion")]  # another method
    result = acceptance(REGIME_B, CALIBRATION, WORKLOADS, sweep)
    (c,) = result["c"]
    assert c["tuned"]["bucket_cap_mb"] == 1.0 and c["tuned"]["share"] == pytest.approx(0.026 / 0.30)
    assert c["pass"] and result["c_pass"]
    assert c["share"] == pytest.approx(0.057 / 0.35)  # the default buffer's figure stays reported


def test_torch_hook_codec_estimate_uses_the_ratio_measured_in_its_own_layout() -> None:
    """Our PowerSGD's codec in the runs × the torch/ours ratio measured apart for that model;
    compressor_cost.json's ratio only where a model has no measurement of its own."""
    from benchmarks.paper import add_codec_estimates

    def psgd(codec_s: float, *, workers: int = 2, cap: float = 25.0, pipelining: bool = True) -> dict[str, Any]:
        return {"model": "resnet152", "method": "powersgd", "workers": workers, "rank": 4, "codec_s": codec_s,
                "bucket_cap_mb": cap, "pipelining": pipelining}

    def rows() -> list[dict[str, Any]]:
        return [
            psgd(0.2), psgd(0.3),
            {"model": "resnet152", "method": "torch_powersgd", "workers": 2, "rank": 4, "codec_s": 0.07,
             "bucket_cap_mb": 10_000.0, "pipelining": True},
            psgd(9.0, workers=4),  # another world size
            psgd(5.0, cap=1000.0), psgd(5.0, pipelining=False),  # ablations: not the ratio's layout
        ]

    cost = {"resnet50": {"powersgd": {"encode_decode_s": 1.0}, "torch_powersgd": {"encode_decode_s": 1.2}}}
    measured = rows()
    isolated = {"resnet152": {"powersgd_s": 0.2, "torch_powersgd_s": 0.36, "bucket_cap_mb": 25.0}}
    add_codec_estimates(measured, isolated, cost)
    assert measured[2]["codec_estimate_s"] == pytest.approx(0.25 * 1.8)
    assert measured[0]["codec_estimate_s"] == 0.2  # our own rows keep their measured codec
    fallback = rows()
    add_codec_estimates(fallback, {}, cost)
    assert fallback[2]["codec_estimate_s"] == pytest.approx(0.25 * 1.2)
