"""The adaptive loop around ``planning.policy.decide``, on a frozen clock."""

import pytest

from coordinator.decisions import DecisionLoop
from coordinator.schemas import PinnedPolicy
from planning.decision import Decision
from planning.policy import PolicyConfig
from planning.protocol import ModelProfile, Telemetry
from planning.sections import CompressionConfig

ADAPTIVE = CompressionConfig(mode="adaptive", compressor="acpsgd", rank=4)
PROFILE = ModelProfile(shapes=[[1024, 1024], [1024]], forward_s=0.002, backward_s=0.004)
PHASES = {"data": 0.001, "forward": 0.004, "backward": 0.009, "exposed_comm": 0.003, "optimizer": 0.001}
FAST, SLOW = 40e9 / 8, 0.1e9 / 8  # bytes/s: the 4 MB model is best uncompressed / compressed
DWELL = PolicyConfig().min_dwell_s


def tele(step, bandwidth, profile=None):
    return Telemetry(step=step, bandwidth_bytes_per_second=bandwidth, latency_seconds=1e-4, phase_seconds=PHASES,
                     world_size=2, profile=profile)


def test_fixed_and_pinned_jobs_are_not_steered():
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    for mode in ("fixed", "pinned"):
        assert loop.on_report("j", mode, ADAPTIVE, v0, tele(10, FAST, PROFILE), PROFILE, 1.0) is None


def test_waits_for_bandwidth_and_profile():
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    assert loop.on_report("j", "adaptive", ADAPTIVE, v0, tele(10, FAST), None, 1.0) is None
    assert loop.on_report("j", "adaptive", ADAPTIVE, v0, tele(10, None, PROFILE), PROFILE, 2.0) is None


def test_switch_is_versioned_with_reason_and_gain_then_dwell_holds_it():
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    assert (v0.version, v0.compressor, v0.params, v0.source) == (0, "acpsgd", {"warmup_steps": 0, "rank": 4}, "config")
    v1 = loop.on_report("j", "adaptive", ADAPTIVE, v0, tele(20, FAST, PROFILE), PROFILE, 10.0)
    assert (v1.version, v1.compressor, v1.params, v1.source, v1.at) == (1, "none", {}, "policy", 10.0)
    assert v1.reason.startswith("none predicted") and "vs acpsgd-r4" in v1.reason
    assert 0.1 < v1.predicted_gain < 1
    # the link collapses: a drop to a new level ends the dwell of an uncompressed choice
    # (planning.hysteresis.link_dropped_since_switch), once a second slow report confirms it
    assert loop.on_report("j", "adaptive", ADAPTIVE, v1, tele(31, SLOW), PROFILE, 11.0) is None
    v2 = loop.on_report("j", "adaptive", ADAPTIVE, v1, tele(32, SLOW), PROFILE, 12.0)
    assert (v2.version, v2.compressor, v2.source) == (2, "acpsgd", "policy")
    assert "the link dropped to another level since the last switch: its dwell ends early" in v2.reason
    # the link comes back: the minimum dwell holds the compressed choice until it has passed
    for t in range(13, int(12 + DWELL)):
        assert loop.on_report("j", "adaptive", ADAPTIVE, v2, tele(20 + t, FAST), PROFILE, float(t)) is None, t
    v3 = loop.on_report("j", "adaptive", ADAPTIVE, v2, tele(100, FAST), PROFILE, 12.0 + DWELL + 1)
    assert (v3.version, v3.compressor, v3.source) == (3, "none", "policy")


def test_after_a_restart_the_dwell_counts_from_the_last_stored_switch():
    loop = DecisionLoop()  # a fresh process: no policy state in memory
    last = Decision(version=3, compressor="none", params={}, reason="", source="policy", at=100.0)
    assert loop.on_report("j", "adaptive", ADAPTIVE, last, tele(200, SLOW, PROFILE), PROFILE, 100.0 + DWELL / 2) is None
    assert loop.on_report("j", "adaptive", ADAPTIVE, last, tele(210, SLOW, PROFILE), PROFILE,
                          101.0 + DWELL).version == 4


def test_pin_then_release_switches_at_the_next_report():
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    v1 = loop.pin("j", ADAPTIVE, PinnedPolicy(mode="pinned", compressor="powersgd", rank=8), v0, 5.0)
    assert (v1.version, v1.compressor, v1.params, v1.source, v1.reason) == (
        1, "powersgd", {"rank": 8}, "pinned", "pinned by operator: powersgd-r8")
    loop.release("j")
    v2 = loop.on_report("j", "adaptive", ADAPTIVE, v1, tele(20, FAST, PROFILE), PROFILE, 6.0)
    assert (v2.version, v2.compressor) == (2, "none")


def test_allowed_list_and_rank_bounds_reach_the_policy():
    cfg = CompressionConfig(mode="adaptive", compressor="powersgd", rank=8, allowed=["powersgd"], min_rank=8,
                            max_rank=8)
    v0 = DecisionLoop.initial(cfg, 0.0)
    assert DecisionLoop().on_report("j", "adaptive", cfg, v0, tele(20, FAST, PROFILE), PROFILE, 1.0) is None


def test_a_world_size_change_is_decided_again_at_once_and_a_lone_worker_drops_compression():
    """An elastic job loses a node: at world size 1 there is no one to send to, so the policy
    (despite its dwell) moves to `none`; when the node returns it decides again for 2."""
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    assert loop.on_report("j", "adaptive", ADAPTIVE, v0, tele(20, SLOW, PROFILE), PROFILE, 1.0) is None  # keeps acpsgd
    lone = Telemetry(step=30, bandwidth_bytes_per_second=None, phase_seconds=PHASES, world_size=1)
    v1 = loop.on_report("j", "adaptive", ADAPTIVE, v0, lone, PROFILE, 2.0)
    assert (v1.compressor, v1.source) == ("none", "policy") and "1 workers" in v1.reason
    # the node is back within the dwell: the job is decided again for 2 workers on the slow link
    v2 = loop.on_report("j", "adaptive", ADAPTIVE, v1, tele(40, SLOW), PROFILE, 3.0)
    assert (v2.version, v2.compressor, v2.source) == (2, "acpsgd", "policy") and "2 workers" in v2.reason


def test_a_decision_without_source_or_time_is_not_stored(tmp_path):
    """The store keeps who made a decision and when; one missing either is refused whole."""
    from coordinator.schemas import JobSpec
    from coordinator.store import Store

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        spec = JobSpec(compression=ADAPTIVE)
        store.create_job(job_id="j", spec=spec, worker_token="t", policy_mode="adaptive",
                         decision=DecisionLoop.initial(ADAPTIVE, 1.0), now=1.0)
        unsourced = Decision(version=1, compressor="none", reason="made elsewhere")
        with pytest.raises(ValueError, match="v1: a stored decision needs its source and time"):
            store.set_decision("j", unsourced, policy_mode="pinned", now=2.0)
        assert [d.version for d in store.decisions("j")] == [0]
        assert store.get_job("j").policy_mode == "adaptive"  # the whole write was rolled back
    finally:
        store.close()


def test_a_pin_that_never_reached_the_store_does_not_stop_the_policy():
    """The stored policy mode and decision are the truth: if writing a pin failed, the job is
    still adaptive at the version the store holds."""
    loop, v0 = DecisionLoop(), DecisionLoop.initial(ADAPTIVE, 0.0)
    loop.pin("j", ADAPTIVE, PinnedPolicy(mode="pinned", compressor="powersgd", rank=8), v0, 5.0)
    v1 = loop.on_report("j", "adaptive", ADAPTIVE, v0, tele(20, FAST, PROFILE), PROFILE, 6.0)
    assert (v1.version, v1.compressor, v1.source) == (1, "none", "policy")
