"""workers/control.py: agreement on the switch step over a real gloo group, the coordinator
client against an unreachable URL and a real (stdlib) HTTP server, the in-process policy.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from harness import free_port, run_ranks  # noqa: E402

from planning.protocol import Decision, ModelProfile, Telemetry  # noqa: E402
from planning.sections import CompressionConfig  # noqa: E402
from planning.step_correction import Correction  # noqa: E402
from workers.control import CallbackSink, CoordinatorClient, InProcessPolicy, ListSink, SwitchAgreement  # noqa: E402
from workers.probe import LinkRequest  # noqa: E402


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# --------------------------------------------------------------------------- SwitchAgreement

V1 = Decision(version=1, compressor="powersgd", params={"rank": 2}, reason="first")
V2 = Decision(version=2, compressor="topk", params={"ratio": 0.05}, reason="second")
#: Rank 0's proposal and link request (a probe, a check, or None) at each agreement step.
PROBE = LinkRequest("probe", 256 * 1024)
CHECK = LinkRequest("check", 256 * 1024, reading_bps=2.5e6)
PLAN: dict[int, tuple[Decision | None, LinkRequest | None]] = {0: (None, None), 5: (V1, PROBE), 10: (V1, CHECK),
                                                               15: (V2, None)}


def _agree(rank: int, world_size: int) -> dict[str, Any]:
    agreement = SwitchAgreement(sync_every=5)
    seen = []
    for step in range(20):
        if not agreement.due(step):
            continue
        proposal, probe = PLAN[step]
        if rank != 0:  # other ranks' proposals are ignored: only rank 0's choice counts
            proposal, probe = Decision(version=99, compressor="signsgd", reason="not rank 0"), LinkRequest("probe", 12345)
        decision, probe_now = agreement.exchange(step, proposal, probe)
        seen.append((step, decision.model_dump() if decision else None, probe_now))
    resumed = SwitchAgreement(sync_every=5, version=2)  # after a restart: version 2 already in force
    again, _ = resumed.exchange(20, V2 if rank == 0 else None, None)
    return {"seen": seen, "history": [vars(a) for a in agreement.history], "version": agreement.version,
            "resumed": again}


def test_switch_agreement_gives_every_rank_rank_0s_decision_at_the_same_step():
    results = run_ranks(_agree, 2, timeout=120)
    expected_seen = [(0, None, None), (5, V1.model_dump(), PROBE), (10, None, CHECK), (15, V2.model_dump(), None)]
    for result in results:
        assert result["seen"] == expected_seen
        assert [(a["step"], a["version"], a["compressor"], a["params"]) for a in result["history"]] == [
            (5, 1, "powersgd", {"rank": 2}), (15, 2, "topk", {"ratio": 0.05})]
        assert result["version"] == 2
        assert result["resumed"] is None  # not newer than the version in force: nothing to apply
    assert results[0] == results[1]


def test_switch_agreement_is_due_every_sync_every_steps():
    agreement = SwitchAgreement(sync_every=4)
    assert [s for s in range(13) if agreement.due(s)] == [0, 4, 8, 12]


def test_an_adaptive_jobs_agreement_is_due_at_every_step_until_its_first_decision_applies():
    """Eager for the first two cycles while the initial choice is in force (version 0); back to
    every ``sync_every`` steps once a decision is applied, or after those cycles. Fixed: never eager."""
    adaptive = SwitchAgreement.for_job(CompressionConfig(mode="adaptive", sync_every=4), group=None)
    adaptive.version = 0
    assert [s for s in range(13) if adaptive.due(s)] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12]
    assert [s for s in range(13) if adaptive.regular(s)] == [0, 4, 8, 12]
    adaptive.version = 1  # the policy's first decision applied
    assert [s for s in range(13) if adaptive.due(s)] == [0, 4, 8, 12]
    fixed = SwitchAgreement.for_job(CompressionConfig(mode="fixed", compressor="fp16", sync_every=4), group=None)
    fixed.version = 0
    assert [s for s in range(13) if fixed.due(s)] == [0, 4, 8, 12]


def test_after_a_drop_an_adaptive_jobs_agreement_is_due_at_every_step_until_the_next_decision():
    """A drop read at the exchange of step 8 (sync every 4): due at steps 9-11 while the
    decision in force stays the same; the next decision, or the next regular exchange, ends it.
    A fixed job's decision never changes: a drop makes nothing eager."""
    adaptive = SwitchAgreement.for_job(CompressionConfig(mode="adaptive", sync_every=4), group=None)
    adaptive.version = 3  # past the start
    adaptive.link_dropped(8)
    assert [s for s in range(8, 17) if adaptive.due(s)] == [8, 9, 10, 11, 12, 16]
    adaptive.link_dropped(12)
    adaptive.version = 4  # the policy's decision applied at step 13
    assert [s for s in range(12, 17) if adaptive.due(s)] == [12, 16]
    assert adaptive.drops == [8, 12]
    fixed = SwitchAgreement.for_job(CompressionConfig(mode="fixed", compressor="fp16", sync_every=4), group=None)
    fixed.version = 0
    fixed.link_dropped(8)
    assert [s for s in range(8, 17) if fixed.due(s)] == [8, 12, 16] and fixed.drops == [8]


# --------------------------------------------------------------------------- CoordinatorClient


class FakeCoordinator:
    """The two worker-facing endpoints on stdlib ``http.server``, in a thread."""

    def __init__(self, port: int = 0, decision: Decision | None = None) -> None:
        self.telemetry: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.decision = decision
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                owner.paths.append(f"POST {self.path}")
                owner.auth.append(self.headers.get("Authorization"))
                length = int(self.headers.get("Content-Length", 0))
                owner.telemetry.append(json.loads(self.rfile.read(length)))
                self._reply(202, {"accepted": True})

            def do_GET(self) -> None:  # noqa: N802
                owner.paths.append(f"GET {self.path}")
                if owner.decision is None:
                    self._reply(404, {"detail": "no decision yet"})
                else:
                    self._reply(200, owner.decision.model_dump(mode="json"))

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def telemetry(step: int) -> Telemetry:
    return Telemetry(step=step, steps=100, loss=2.0 / (step + 1), compressor="acpsgd", compressor_rank=4, world_size=2,
                     phase_seconds={"forward": 0.01, "backward": 0.02})


def test_client_delivers_telemetry_and_picks_up_the_decision():
    decision = Decision(version=3, compressor="powersgd", params={"rank": 8}, reason="bandwidth dropped")
    server = FakeCoordinator(decision=decision)
    client = CoordinatorClient(server.url, "job-7", "secret", poll_s=0.05, timeout_s=5)
    try:
        assert client.current() is None
        client.send(telemetry(10))
        wait_until(lambda: server.telemetry, 10, "the telemetry to arrive")
        assert Telemetry.model_validate(server.telemetry[0]).step == 10
        assert "POST /v1/jobs/job-7/telemetry" in server.paths
        assert server.auth[0] == "Bearer secret"
        assert wait_until(client.current, 10, "the decision") == decision
        assert "GET /v1/jobs/job-7/decision" in server.paths
        for step in (11, 12, 13):  # the newest report wins; none is sent out of order
            client.send(telemetry(step))
        wait_until(lambda: server.telemetry[-1]["step"] == 13, 10, "the newest report")
        steps = [t["step"] for t in server.telemetry]
        assert steps == sorted(steps)
        assert client.failures == 0
    finally:
        client.close()
        server.stop()


def test_client_keeps_the_last_decision_when_the_coordinator_has_none():
    server = FakeCoordinator(decision=None)  # GET .../decision answers 404
    client = CoordinatorClient(server.url, "job-1", None, poll_s=0.05)
    try:
        client.send(telemetry(1))
        wait_until(lambda: len([p for p in server.paths if p.startswith("GET")]) >= 2, 10, "two decision polls")
        assert client.current() is None and client.failures == 0
        assert server.auth == [None]  # no token: no Authorization header
    finally:
        client.close()
        server.stop()


def test_unreachable_coordinator_never_stops_training_and_is_retried_with_backoff():
    port = free_port()  # nothing listens here (yet)
    client = CoordinatorClient(f"http://127.0.0.1:{port}", "job-2", "t", poll_s=0.05, timeout_s=1)
    server = None
    try:
        for step in range(200):  # a training loop reporting every step: send() never raises nor blocks
            client.send(telemetry(step))
        wait_until(lambda: client.failures >= 2, 20, "two failed attempts")
        assert client.current() is None
        failures = client.failures
        time.sleep(0.3)
        assert client.failures <= failures + 1  # backing off (0.5 s, 1 s, ...), not spinning
        # the coordinator comes up: the newest report is delivered and the decision picked up
        decision = Decision(version=1, compressor="fp16", reason="up again")
        server = FakeCoordinator(port=port, decision=decision)
        wait_until(lambda: server.telemetry, 30, "delivery after the coordinator came up")
        assert server.telemetry[0]["step"] == 199
        assert wait_until(client.current, 30, "the decision after recovery") == decision
    finally:
        client.close()
        if server is not None:
            server.stop()


# --------------------------------------------------------------------------- sinks and the in-process policy


def test_sinks_keep_reports_and_a_failing_callback_never_raises():
    sink = ListSink()
    sink.send(telemetry(1))
    assert [t.step for t in sink.reports] == [1]
    received: list[dict[str, Any]] = []
    CallbackSink(received.append).send(telemetry(2))
    assert received[0]["step"] == 2 and received[0]["compressor"] == "acpsgd"  # JSON-ready dict

    def broken(report: dict[str, Any]) -> None:
        raise ConnectionError("progress actor gone")

    CallbackSink(broken).send(telemetry(3))  # logged, not raised


PROFILE = ModelProfile(shapes=[[256, 64], [256], [10, 256], [10]], buckets=[[3, 2, 1, 0]], forward_s=0.002,
                       backward_s=0.004, optimizer_s=0.001)


def test_in_process_policy_runs_once_it_has_a_profile_and_a_bandwidth():
    now = [1000.0]
    policy = InProcessPolicy(CompressionConfig(mode="adaptive", compressor="acpsgd", rank=4), clock=lambda: now[0])
    initial = policy.current()
    assert initial is not None and initial.compressor == "acpsgd" and initial.version == 0

    policy.observe(telemetry(1))  # no profile, no bandwidth yet: nothing to decide on
    assert policy.evaluations == 0 and policy.last_reason.startswith("waiting")

    for step in range(2, 6):
        now[0] += 2.0
        policy.observe(telemetry(step).model_copy(update={
            "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-4, "grad_norm": 1.0,
            "profile": PROFILE if step == 2 else None}))
    assert policy.evaluations == 4
    assert policy.last_reason and not policy.last_reason.startswith("waiting")
    assert isinstance(policy.current(), Decision)


def test_a_profile_is_measured_again_when_the_forward_pass_drifts_from_it():
    """The testbed run of session 25: profiled at forward 0.19 s on a busy machine, then 0.10 s."""
    from workers.reporter import PROFILE_RECHECK_STEPS, profile_stale

    busy = PROFILE.model_copy(update={"forward_s": 0.19, "backward_s": 0.18})
    assert not profile_stale(None, {"forward": 0.10}, 50)  # nothing sent yet: the first profile is not a re-check
    assert not profile_stale(busy, {"forward": 0.10}, PROFILE_RECHECK_STEPS - 1)  # too few steps to judge
    assert profile_stale(busy, {"forward": 0.10}, PROFILE_RECHECK_STEPS)
    assert not profile_stale(busy, {"forward": 0.15}, 50)  # within 30 %
    assert profile_stale(busy, {"forward": 0.26}, 50)  # slower too


def test_a_new_profile_reprices_the_candidates_and_drops_the_step_corrections():
    """A profile from busy first steps prices compression barely ahead of ``none`` on a slow link
    (its 0.25 s all-reduce hides behind a backward of 0.30 s, 0.10 s in truth); the profile measured again
    makes the same report a switch, and the residuals against the old one are dropped."""
    from planning.controller import AdaptiveController

    shapes = [[64, 3, 3, 3], [64], [128, 64, 3, 3], [128], [10, 8192], [10]]  # 0.63 MB of gradients
    busy = ModelProfile(shapes=shapes, buckets=[[5, 4], [3, 2, 1, 0]], forward_s=0.19, backward_s=0.30,
                        optimizer_s=0.001)
    quiet = busy.model_copy(update={"forward_s": 0.10, "backward_s": 0.10})
    slow_link = {"bandwidth_bytes_per_second": 20e6 / 8, "latency_seconds": 1e-3, "grad_norm": 1.0,
                 "compressor": "none", "compressor_rank": None, "world_size": 2}
    ctl = AdaptiveController(CompressionConfig(mode="adaptive", compressor="none", min_dwell_s=0.0,
                                               allowed=["none", "powersgd"], min_rank=4, max_rank=4))
    ctl.state = dataclasses.replace(ctl.state, corrections=(Correction("none", 0.05, 1e9),))
    report = telemetry(200).model_copy(update={**slow_link, "profile": busy})
    assert ctl.observe(report, 0.0) is None, ctl.last_reason
    assert ctl.state.corrections == (Correction("none", 0.05, 1e9),)
    decision = ctl.observe(report.model_copy(update={"step": 201, "profile": quiet}), 1.0)
    assert ctl.state.corrections == ()
    assert decision is not None and decision.compressor == "powersgd", ctl.last_reason


def test_the_jobs_hysteresis_settings_reach_the_policy():
    from planning.controller import AdaptiveController

    default = AdaptiveController(CompressionConfig(mode="adaptive")).config
    assert (default.min_dwell_s, default.gain_threshold) == (30.0, 0.10)
    tuned = AdaptiveController(CompressionConfig(mode="adaptive", min_dwell_s=2.5, gain_threshold=0.2)).config
    assert (tuned.min_dwell_s, tuned.gain_threshold) == (2.5, 0.2)


def test_an_adaptive_job_that_names_no_compressor_starts_on_a_cast_it_allows():
    """Its first steps run before the policy's first decision: a cast sends half of ``none``'s
    bytes at a known error, and bf16 cannot overflow; a compressor the job names, and a fixed
    job's default, are kept."""
    from planning import registry

    assert CompressionConfig(mode="adaptive").compressor == "bf16"
    assert CompressionConfig.model_validate({"mode": "adaptive", "allowed": ["none", "fp16", "acpsgd"]}).compressor == "fp16"
    assert CompressionConfig(mode="adaptive", allowed=["acpsgd", "none"]).compressor == "none"
    assert CompressionConfig(mode="adaptive", allowed=["topk", "acpsgd"]).compressor == "topk"
    assert CompressionConfig(mode="adaptive", compressor="acpsgd", rank=4).compressor == "acpsgd"
    assert CompressionConfig().compressor == CompressionConfig(mode="fixed").compressor == registry.DEFAULT_COMPRESSOR
    with pytest.raises(ValueError, match="allowed"):
        CompressionConfig(mode="adaptive", allowed=[])
    with pytest.raises(ValueError, match="allowed"):
        CompressionConfig(mode="adaptive", allowed=["gzip"])
    with pytest.raises(ValueError, match="allowed"):
        registry.adaptive_start([])


@pytest.mark.parametrize("field, value", [("min_dwell_s", -1.0), ("gain_threshold", 1.5)])
def test_hysteresis_settings_out_of_range_name_the_field(field: str, value: float):
    with pytest.raises(ValueError, match=field):
        CompressionConfig(mode="adaptive", **{field: value})


def test_a_switch_not_yet_in_effect_leaves_no_dwell_after_a_release_or_a_new_world_size():
    """The dwell restarts when a switch takes effect (``PolicyState.awaiting``); a release from
    a pin or a change of world size clears the dwell, and must clear that pending restart too,
    or the first report of the awaited choice would bring the dwell back."""
    from planning.controller import AdaptiveController
    from planning.hysteresis import switch_took_effect
    from planning.policy import Measurements, PolicyState
    from planning.spec import make_spec

    pending = PolicyState(last_switch_at=100.0, awaiting="acpsgd-r4")
    controller = AdaptiveController(CompressionConfig(mode="adaptive"))
    controller.state = pending
    controller.pin(make_spec("acpsgd", rank=4), 110.0)
    assert controller.state.awaiting is None and controller.state.last_switch_at == 110.0
    controller.release()
    assert controller.state.last_switch_at is None and controller.state.awaiting is None
    controller.state = pending
    controller._for_world_size(telemetry(1).model_copy(update={"world_size": 2}))
    controller._for_world_size(telemetry(2).model_copy(update={"world_size": 1}))
    assert controller.state.last_switch_at is None and controller.state.awaiting is None
    # a controller that starts mid-job (coordinator restart) awaits the decision in force
    made = Decision(version=3, compressor="acpsgd", params={"rank": 4}, source="policy", at=50.0)
    restarted = AdaptiveController(CompressionConfig(mode="adaptive"), current=made).state
    assert (restarted.last_switch_at, restarted.awaiting) == (50.0, "acpsgd-r4")
    assert AdaptiveController(CompressionConfig(mode="adaptive")).state == PolicyState()
    # what the awaited choice's first report does: the dwell restarts, once
    m = Measurements(1e9, 1e-4, 2, None, make_spec("acpsgd", rank=4), running="acpsgd-r4")  # type: ignore[arg-type]
    assert switch_took_effect(pending, m, 130.0) == PolicyState(last_switch_at=130.0)
    assert switch_took_effect(PolicyState(), m, 130.0) == PolicyState()


def test_a_failing_policy_keeps_the_current_decision(monkeypatch):
    policy = InProcessPolicy(CompressionConfig(mode="adaptive"))
    before = policy.current()

    def explode(*args: Any) -> None:
        raise RuntimeError("policy bug")

    monkeypatch.setattr(policy.controller, "observe", explode)
    policy.observe(telemetry(1))  # logged, not raised
    assert policy.current() == before and policy.evaluations == 0


@pytest.fixture(autouse=True)
def _quiet_control_logs(caplog):
    caplog.set_level("ERROR", logger="workers.control")


def test_the_reports_wake_up_and_jitter_reach_the_policys_prediction():
    """The probe's wake-up cost and the timer's compute jitter enter the policy's prediction
    through the one helper both the worker and the coordinator use; each lengthens it."""
    from planning.controller import policy_measurements, step_profile
    from planning.policy import Keep, PolicyConfig, PolicyState, decide
    from planning.spec import make_spec

    profile = ModelProfile(shapes=[[512, 512], [512]], buckets=[[1, 0]], forward_s=0.01, backward_s=0.02)
    spec = make_spec("powersgd", rank=4)
    model = step_profile(profile, (spec,))
    only_current = PolicyConfig(allowed=("powersgd",), min_rank=4, max_rank=4)

    def predicted(**fields: float) -> float:
        report = Telemetry(step=50, world_size=2, bandwidth_bytes_per_second=1e8, latency_seconds=2e-4, **fields)
        m = policy_measurements(report, model, spec)
        assert m is not None
        verdict, _ = decide(PolicyState(), m, only_current, now=0.0)
        assert isinstance(verdict, Keep) and verdict.predicted_step_s is not None
        return verdict.predicted_step_s

    bare = predicted()
    # PowerSGD's two rounds each find the link idle (compute runs between them): two wake-ups.
    assert predicted(link_wake_seconds=0.001) == pytest.approx(bare + 0.002)
    assert predicted(compute_jitter_seconds=0.004) > bare + 0.002  # e_2·σ ≈ 0.59·4 ms
    assert policy_measurements(Telemetry(step=1), model, spec) is None  # no bandwidth yet


def test_a_reports_drop_step_reaches_the_policy_and_moves_its_link_at_once():
    """``Telemetry.link_drop_step`` passes through the helper both the worker and the
    coordinator use: the report that brings it moves the policy's averaged link to its rate."""
    from planning.controller import policy_measurements, step_profile
    from planning.policy import PolicyConfig, PolicyState, decide
    from planning.spec import make_spec

    profile = ModelProfile(shapes=[[512, 512], [512]], buckets=[[1, 0]], forward_s=0.01, backward_s=0.02)
    spec = make_spec("none")
    model = step_profile(profile, (spec,))
    cfg = PolicyConfig(allowed=("none",))

    def report(rate: float, drop: int | None) -> Telemetry:
        return Telemetry(step=50, world_size=2, bandwidth_bytes_per_second=rate, latency_seconds=2e-4,
                         link_drop_step=drop)

    fast = policy_measurements(report(1e8, None), model, spec)
    assert fast is not None and fast.link_drop_step is None
    _, state = decide(PolicyState(), fast, cfg, now=0.0)
    for drop, expected in ((None, 1e8), (40, 5e6)):
        slow = policy_measurements(report(5e6, drop), model, spec)
        assert slow is not None and slow.link_drop_step == drop
        _, after = decide(state, slow, cfg, now=1.0)
        assert after.link.bandwidth == pytest.approx(expected)
