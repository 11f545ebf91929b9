"""How the policy prices a candidate on a link: the cost model's step, corrected by what the job
measured, and its time per progress.

Torch-free and pure: step 4 of :func:`planning.policy.decide`, and what the checks beside it
(``planning.recent_link``, ``planning.estimate_gate``) judge by. Kept apart from
``planning.policy`` so a rule that prices a move on other links than the one the policy judges on
(the link's recent stretches) prices it the same way, and so each module reads in one sitting.
"""

from __future__ import annotations

import math
from typing import Iterable

from planning.costmodel import Link, alpha_beta_from_bandwidth, predict_step
from planning.policy_types import Links, Measurements, PolicyState, Scored
from planning.progress import error_of, seconds_per_progress
from planning.spec import CompressorSpec
from planning.step_correction import correction_for


def alpha_of(all_reduce_latency_s: float, world_size: int) -> float:
    """α from a zero-byte all-reduce's time ``2(N−1)·α`` (ring model; no link for N = 1)."""
    return all_reduce_latency_s / (2 * (world_size - 1)) if world_size > 1 else 0.0


def link_at(bandwidth: float, state: PolicyState, m: Measurements) -> Link:
    """The α-β link at ``bandwidth`` with the policy's averaged latency and the report's wake-up."""
    assert state.link.latency is not None
    return alpha_beta_from_bandwidth(bandwidth, alpha_of(state.link.latency, m.world_size))._replace(wake_s=m.wake_s)


def link_now(state: PolicyState, m: Measurements) -> Links:
    """The averaged link as it stands, share 1."""
    assert state.link.bandwidth is not None and state.link.latency is not None
    return ((1.0, link_at(state.link.bandwidth, state, m)),)


def bandwidth_of(link: Link) -> float:
    """Bytes/s of ``link`` (infinite for one worker's: β = 0)."""
    return math.inf if link.beta <= 0 else 1.0 / link.beta


def predicted_step(spec: CompressorSpec, m: Measurements, link: Link) -> float:
    """The cost model's step time of ``spec`` at ``link``."""
    return predict_step(spec, m.profile, m.world_size, link).step_s


def score(spec: CompressorSpec, m: Measurements, links: Links, level_factor: float) -> Scored:
    """``spec``'s step time, the prediction corrected by what the job measured
    (``planning.step_correction``: at each of ``links`` by the level it lies at), and its time
    per progress. A correction never takes more than half of a prediction away: a measured
    mean the link's smoothing placed on the wrong level can lie far below the model for a while."""
    step_s = math.fsum(share * _corrected(spec, m, link, level_factor) for share, link in links)
    if m.errors is None:
        return Scored(spec, spec.label, step_s, None, step_s)
    error = error_of(spec.label, spec.name, m.errors)
    tau = math.inf if error is None else seconds_per_progress(step_s, error)
    return Scored(spec, spec.label, step_s, error, tau)


def _corrected(spec: CompressorSpec, m: Measurements, link: Link, level_factor: float) -> float:
    """The cost model's step of ``spec`` at ``link``, corrected (see :func:`score`)."""
    predicted = predicted_step(spec, m, link)
    correction = correction_for(m.step_corrections, spec.label, bandwidth_of(link), level_factor)
    return max(0.5 * predicted, predicted + correction)


def least_tau(scored: Iterable[Scored]) -> Scored | None:
    """The scored option with the least time per progress; ``min`` keeps the first (least
    lossy) of equal ones. None when no option can be judged (every one lossy and unmeasured)."""
    judged = [s for s in scored if math.isfinite(s.tau)]
    return min(judged, key=lambda s: s.tau) if judged else None
