"""Rank 0's reporter: link estimates, phase means, the model profile, and the decision proposal.

After every step each rank keeps the passive bandwidth sample of the hook's own timings, and
at each decision exchange rank 0 takes the group's smallest (:meth:`Reporter.exchange`); every
``probing.report_interval_s`` it builds one :class:`~planning.protocol.Telemetry` and hands it
to the decision source and the sinks (the coordinator, the live progress). It also says when
the link is to be measured, within the job's probe budget (:meth:`Reporter.link_request`,
rank 0), and measures it with every rank (:meth:`Reporter.measure_link`): an active probe,
or while the passive estimate is blind a recovery check. Used by the built-in loop
(``workers.loop``) and by a user's own loop (``workers.session``).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

from compressors import GradientSync
from planning import registry
from planning.config import TrainConfig
from planning.controller import policy_config, policy_measurements, step_profile
from planning.costmodel import StepProfile
from planning.estimate_gate import estimates_can_matter
from planning.protocol import Decision, ModelProfile, Telemetry
from workers.calibration import calibrate_codecs, job_layout
from workers.control import DecisionSource, TelemetrySink
from workers.envs import WorkerEnv
from workers.link_estimate import LinkEstimate, all_reduce_seconds
from workers.passive_bandwidth import DROP_STEPS, PassiveBandwidth, cycle_sample, drop_threshold, recent_steps_beta
from workers.probe import (
    DEFAULT_SIZES,
    PROBE_STOP_FACTOR,
    PROBE_TRANSFER_S,
    RISE_FACTOR,
    LinkRequest,
    check_link,
    implied_bandwidth,
    link_rose,
    probe_link,
    sized_probe,
)
from workers.probe_scheduler import ProbeScheduler
from workers.quality import QualitySignal
from workers.scripted import ScriptedDecisions
from workers.timing import StepTimer

#: Rank 0's passive estimate is blind after this many steps in a row sent too little to time.
BLIND_AFTER_STEPS = 4


class Reporter:
    """Rank 0's telemetry: link estimates, phase means, profile, and the decision proposal."""

    def __init__(self, cfg: TrainConfig, env: WorkerEnv, sync: GradientSync, source: DecisionSource,
                 sinks: list[TelemetrySink], total_steps: int | None, *, resumed_from_step: int | None = None) -> None:
        self.cfg, self.env, self.sync, self.source, self.sinks = cfg, env, sync, source, sinks
        self.total_steps = total_steps
        #: Names this worker group in its reports (new on every start or restart of the group).
        self.worker_group = uuid.uuid4().hex[:12]
        self.resumed_from_step = resumed_from_step
        #: Samples per step on one rank; a user's loop (workers.session) sets it from its batches.
        self.batch_size = cfg.data.batch_size
        self.estimate = LinkEstimate.no_link()
        self.passive = PassiveBandwidth()
        #: The smallest β this rank's collectives implied since the last decision exchange
        #: (every rank keeps one; :meth:`exchange` gives rank 0 the group's smallest).
        self._cycle_beta: float | None = None
        self._cycle_timings = 0
        #: This rank's last ``DROP_STEPS`` timed steps' β since the last exchange (a drop shows
        #: in the smallest of them only when all were slow: :func:`workers.passive_bandwidth.cycle_sample`).
        self._last_steps: list[float] = []
        #: Rank 0's steps in a row that sent too little for the passive estimate to time,
        #: counted from the last probe.
        self._steps_unseen = 0
        #: The fastest rate a probe has measured this run (bytes/s): what the link may come
        #: back to. Probes only: the passive reading of a fast link's small buckets scatters
        #: far above the line rate (2-13 Gbit/s read on the 1 Gbit/s testbed link).
        self._fastest_bps = 0.0
        self.scheduler = ProbeScheduler(probe_interval_s=cfg.probing.interval_s, max_cost_fraction=cfg.probing.budget)
        self.started = time.monotonic()
        self.next_report = 0.0
        self.calibration: dict[str, float] = {}
        self.per_element: dict[str, float] = {}
        self._last_bytes = 0
        #: Every rank meters the compression error (the group's needs all of them, issue 14);
        #: rank 0 estimates the candidates and reports.
        self.quality = QualitySignal(cfg, sync, estimating=env.rank == 0)
        #: The model profile once measured, and the cost model's profile built from it (for
        #: the estimates' gate).
        self.model_profile: ModelProfile | None = None
        self._cost_profile: StepProfile | None = None
        self._last_report: Telemetry | None = None
        #: The latest exchange that read a drop of the link (:meth:`exchange`; rank 0 reports it).
        self.drop_step: int | None = None

    def link(self, estimate: LinkEstimate) -> None:
        self.estimate = estimate
        if estimate.has_link:
            # A fresh probe supersedes the passive history: restart the average from the
            # probe's β, else bandwidth() would keep reporting the passive value from before
            # (for ever, while the compressor sends payloads too small to observe).
            self.passive = PassiveBandwidth(beta_s_per_byte=estimate.beta_s_per_byte)
            self.passive.anchor(estimate)
            self._steps_unseen = 0
            self._fastest_bps = max(self._fastest_bps, estimate.bandwidth_bytes_per_second)
            self.scheduler.record(time.monotonic() - self.started, estimate.cost_s)

    def probe_at_start(self, process_group: Any = None) -> None:
        """Every rank: the first probe, before training (world size 1: no link, no probe)."""
        self.link(probe_link(process_group) if self.env.world_size > 1 else LinkEstimate.no_link())

    def link_request(self) -> LinkRequest | None:
        """Rank 0: what to measure of the link now, if anything.

        A probe when due, sized to the current estimate (:func:`workers.probe.sized_probe`),
        so it costs about the same at any rate and fits the budget every few seconds. While
        the passive estimate is blind and the reading is at most half the fastest rate a probe
        has measured this run (there is a rise to see), a recovery check of the same message
        size instead, when due (:meth:`~workers.probe_scheduler.ProbeScheduler.next_measurement`).
        Not at the fastest reading: a check sized to 20 ms at 1000 Mbit/s costs ~0.45 s if the
        link has in fact dropped to 50 (a fixed PowerSGD job in the oscillating scenario spent
        6-8 % of its run on such checks, over its 5 % budget).
        """
        if self.env.rank != 0 or self.env.world_size == 1:
            return None
        elapsed = time.monotonic() - self.started
        current, _ = self.bandwidth()
        # Sized to the lower of the reading and the last probe's rate: the passive reading of a
        # fast link scatters high, and a probe sized to 3 Gbit/s that meets a drop to 50 Mbit/s
        # costs ~0.9 s (seen at the drop in fast-slow-fast, spending the budget for the run).
        probed = self.estimate.bandwidth_bytes_per_second
        large = sized_probe(min(current, probed) if current else probed)[1]
        check_cost = None
        if current and self.passive_blind() and current * RISE_FACTOR <= self._fastest_bps:
            # A check's cost: its message at the current reading, and the barrier before it.
            check_cost = (all_reduce_seconds(large, self.env.world_size, self.estimate.alpha_s, 1.0 / current)
                          + self.estimate.latency_s)
        kind = self.scheduler.next_measurement(elapsed, elapsed, self._next_probe_cost(large, current), check_cost)
        if kind == "check":
            return LinkRequest("check", large, reading_bps=current)
        return LinkRequest("probe", large) if kind == "probe" else None

    def passive_blind(self) -> bool:
        """Whether the last ``BLIND_AFTER_STEPS`` steps all sent too little to time: the
        compressor's payloads are small, so the reading is whatever the last probe or timed
        step said. A step that sent enough but finished within the latency term is not blind:
        the link was fast."""
        return self.estimate.has_link and self._steps_unseen >= BLIND_AFTER_STEPS

    def exchange(self, step: int, group: Any = None) -> bool:
        """Every rank, at the decision exchange (a collective): the quality signal's group
        figures, and the passive link sample of the cycle -- the smallest β any rank's
        collectives implied since the last exchange, which rank 0 folds into its reading.
        Returns whether the cycle read a drop of the link (the same answer on every rank:
        :func:`workers.passive_bandwidth.cycle_sample`); rank 0's reading then restarts from the
        slow steps' rate (:meth:`~workers.passive_bandwidth.PassiveBandwidth.restart`) and it
        reports after this step, with ``step`` as the report's ``link_drop_step``.

        Why every rank's: a collective's time on one rank includes waiting for the peers that
        start it later, and is the transfer alone on the rank that arrives last. Timed on rank
        0 alone, the reading followed whichever rank was slower: on the testbed's 1 Gbit/s link
        it fell to 41-60 Mbit/s while fp16 ran (rank 0's exposed communication 40-50 ms a step,
        its forward 35 ms shorter than its peer's), a link the policy then priced as slow.
        The smallest over the cycle's steps and the ranks is the last arrival's, the transfer;
        it moves the average as far as rank 0's timings of the cycle would have one by one (at
        one fold per cycle with the per-step weight, the reading had followed the testbed's
        drop to 20 Mbit/s no lower than ~78 Mbit/s in 10 steps).
        """
        self.quality.exchange(group)
        if self.env.world_size == 1:
            return False
        threshold = math.inf
        if self.env.rank == 0 and self.estimate.has_link:
            threshold = drop_threshold(self.passive.beta_s_per_byte, self.estimate.beta_s_per_byte)
        recent = recent_steps_beta(self._last_steps)
        # One all-reduce for the three: rank 0's threshold is the smallest (the others send inf).
        figures = torch.tensor([math.inf if self._cycle_beta is None else self._cycle_beta, recent, threshold],
                               dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MIN, group=group)
        sample, dropped = cycle_sample(float(figures[0]), float(figures[1]), float(figures[2]))
        timings, self._cycle_beta, self._cycle_timings, self._last_steps = self._cycle_timings, None, 0, []
        if self.env.rank == 0 and math.isfinite(sample):
            if dropped:
                self.passive.restart(sample)
                self.drop_step = step
                self.next_report = 0.0  # the policy hears of the drop after this step, not a report later
            else:
                self.passive.fold(sample, max(1, timings))
        return dropped

    def measure_link(self, request: LinkRequest | None, process_group: Any = None) -> None:
        """Every rank: carry out rank 0's ``request`` (the agreement gave it to all).

        A check that sees the link come back (:func:`workers.probe.link_rose`) is followed at
        once by a probe sized to the rate the check implies, outside the budget's wait (it
        counts towards it): the decision to switch back waits on that reading. The check's
        inputs are the same on every rank, so every rank probes or none does. Any other check
        is a barrier-aligned timed collective (no wait for a peer in it), and rank 0's passive
        estimate takes it (:meth:`~workers.passive_bandwidth.PassiveBandwidth.observe`): a link slower
        than the reading lowers it, so the next check is sized and budgeted for that rate
        (else a check sized to 20 ms at a stale fast reading costs ~0.4 s on a 50 Mbit/s link,
        each time).
        """
        if request is None or self.env.world_size == 1:
            return
        large = request.nbytes
        if request.kind == "check":
            assert request.reading_bps is not None  # LinkRequest refuses a check without one
            check = check_link(process_group, request.nbytes)
            self.scheduler.record_check(time.monotonic() - self.started, check.cost_s)
            if not link_rose(self.estimate, check, request.reading_bps):
                self.passive.observe(check.nbytes, check.seconds, "all_reduce", self.env.world_size)
                return
            large = sized_probe(implied_bandwidth(self.estimate, check))[1]
        self.link(probe_link(process_group, sizes=(DEFAULT_SIZES[0], large),
                             stop_after_s=PROBE_STOP_FACTOR * PROBE_TRANSFER_S))

    def _next_probe_cost(self, large_bytes: int, current: float | None) -> float:
        """The last probe's cost, scaled by the bytes the next one moves and by how much the
        link has slowed since (a probe of the same size takes ~20x as long at 50 Mbit/s as at
        1 Gbit/s; budgeting it at the last fast probe's cost broke the budget)."""
        cost = self.scheduler.last_cost_s
        if self.estimate.probe_bytes:
            cost *= large_bytes / self.estimate.probe_bytes
        probed = self.estimate.bandwidth_bytes_per_second
        if current and math.isfinite(probed) and current < probed:
            cost *= probed / current
        return cost

    def proposal(self) -> Decision | None:
        return self.source.current() if self.env.rank == 0 else None

    def bandwidth(self) -> tuple[float | None, float | None]:
        if not self.estimate.has_link:
            return None, None
        passive = self.passive.bytes_per_second
        return (passive or self.estimate.bandwidth_bytes_per_second), self.estimate.latency_s

    def after_step(self, step: int, loss: float, timer: StepTimer, model: torch.nn.Module) -> None:
        last = self.sync.last_step()
        if last is not None and last.communicate_s > 0 and self.env.world_size > 1:
            kind = registry.codec(self.sync.compressor.name).collective
            sample = self.passive.sample(last.bytes_sent, last.communicate_s, kind, self.env.world_size)
            if sample is not None:
                self._cycle_beta = sample if self._cycle_beta is None else min(self._cycle_beta, sample)
                self._cycle_timings += 1
                self._last_steps = (self._last_steps + [sample])[-DROP_STEPS:]
        if self.env.rank != 0:
            return
        self.quality.after_step(self._estimates_can_matter)
        timeable = last is not None and last.bytes_sent >= self.passive.min_bytes
        self._steps_unseen = 0 if timeable else self._steps_unseen + 1
        now = time.monotonic()
        if isinstance(self.source, ScriptedDecisions):
            self.source.step = step + 1
        if now < self.next_report and (self.total_steps is None or step + 1 < self.total_steps):
            return
        self.next_report = now + self.cfg.probing.report_interval_s
        telemetry = self._last_report = self._telemetry(step, loss, timer, model)
        self.source.observe(telemetry)
        for sink in self.sinks:
            sink.send(telemetry)

    def _telemetry(self, step: int, loss: float, timer: StepTimer, model: torch.nn.Module) -> Telemetry:
        means = timer.means()
        step_s = timer.mean_step_s()
        stats = self.sync.stats()
        spec = self.sync.compressor.spec
        bandwidth, latency = self.bandwidth()
        profile = None
        # Measured again only while a choice without a codec in the hook runs (none, a cast):
        # backward's wall time holds the hook's work, and a lossy codec's would then be
        # counted twice, in the profile's backward and in the cost model's codec time.
        if len(timer.recent) >= 3 and (self.model_profile is None or not registry.is_lossy(spec.name)):
            floor = timer.compute_floor()
            if self.model_profile is None or profile_stale(self.model_profile, floor, len(timer.recent)):
                profile = self.model_profile = self._profile(model, floor)
                self._cost_profile = None
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None])
        )
        return Telemetry(
            step=step + 1,
            steps=self.total_steps,
            loss=loss,
            samples_per_second=(self.batch_size * self.env.world_size / step_s) if step_s > 0 else None,
            phase_seconds=means,
            timed_steps=len(timer.recent),
            step_wall_seconds=timer.wall_step_s(),
            bytes_sent_per_step=stats.bytes_sent / stats.steps if stats.steps else None,
            bandwidth_bytes_per_second=bandwidth,
            latency_seconds=latency,
            link_wake_seconds=self.estimate.wake_s if self.estimate.has_link else None,
            link_probe_seconds=self.scheduler.total_cost_s if self.estimate.has_link else None,
            link_probes=self.scheduler.probes,
            link_checks=self.scheduler.checks,
            link_drop_step=self.drop_step,
            compute_jitter_seconds=timer.compute_jitter_s(),
            grad_norm=float(grad_norm),
            compression_error=self.quality.running_error(spec.label),
            update_efficiency=self.quality.running_efficiency(spec.label),
            compression_error_estimates=self.quality.estimates,
            compressor=spec.name,
            compressor_rank=spec.rank,
            ratio=spec.ratio,
            world_size=self.env.world_size,
            decision_version=_version(self.source),
            wall_time=time.time(),
            profile=profile,
            worker_group=self.worker_group,
            resumed_from_step=self.resumed_from_step,
        )

    def _estimates_can_matter(self) -> bool:
        """Whether a due estimate of the candidates could change the policy's choice
        (``planning.estimate_gate.estimates_can_matter``), judged on rank 0's latest report through
        the builder of the policy's own inputs (``planning.controller.policy_measurements``:
        the report's link, wake-up cost and compute jitter); True while the model profile or
        the link is not known yet (the first estimate is made as before)."""
        if self.model_profile is None or self._last_report is None:
            return True
        if self._cost_profile is None:
            self._cost_profile = step_profile(self.model_profile, self.quality.candidates)
        m = policy_measurements(self._last_report, self._cost_profile, self.sync.compressor.spec)
        return m is None or estimates_can_matter(m, policy_config(self.cfg.compression))

    def _profile(self, model: torch.nn.Module, floor: dict[str, float]) -> ModelProfile:
        """The model profile from the compute phases' least seconds over the timer's window
        (``workers.timing.StepTimer.compute_floor`` says why), the job's layout and, the first
        time, the codecs' calibration."""
        shapes, buckets = job_layout(model, self.cfg)
        if self.cfg.compression.mode == "adaptive" and not self.calibration:
            self.calibration, self.per_element = calibrate_codecs(shapes, buckets, self.cfg, self.env.world_size,
                                                                  self.env.device)
        return ModelProfile(
            shapes=[list(s) for s in shapes],
            buckets=[list(b) for b in buckets],
            forward_s=floor["forward"],
            backward_s=floor["backward"],
            optimizer_s=floor["optimizer"],
            codec_s=self.calibration,
            codec_per_element_s=self.per_element,
            device=str(self.env.device),
        )

    def close(self, summary: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.close()


#: A profile is measured again when the forward pass's least seconds over at least
#: ``PROFILE_RECHECK_STEPS`` timed steps differ from the profile's by more than this share.
PROFILE_DRIFT = 0.3
PROFILE_RECHECK_STEPS = 10


def profile_stale(profile: ModelProfile | None, floor: dict[str, float], timed_steps: int) -> bool:
    """Whether the model profile sent (``profile``) no longer describes the steps: the
    forward pass's least seconds over the timer's window (``floor``,
    ``workers.timing.StepTimer.compute_floor``, over ``timed_steps`` steps) are more than
    ``PROFILE_DRIFT`` away from the profile's.

    Why: the profile is taken from the first three timed steps, and the cost model prices
    every candidate from it for the rest of the job. In a run of the testbed's drop test
    those steps met a busy machine: forward 0.19 s and backward 0.18 s in the profile
    against 0.10 s each in the steps that followed, so at 20 Mbit/s the model saw the
    all-reduce hidden behind a backward twice its length and priced compression 9 % faster
    than ``none`` (measured: 0.41 s a step against ~0.25 s), below the 10 % threshold, and the
    job never compressed (session 25). Forward alone is the check: it is the one phase no
    compressor or link changes."""
    if profile is None or timed_steps < PROFILE_RECHECK_STEPS or profile.forward_s <= 0:
        return False
    return abs(floor["forward"] - profile.forward_s) > PROFILE_DRIFT * profile.forward_s


def _version(source: DecisionSource) -> int:
    current = source.current()
    return current.version if current else 0

