"""When estimating the candidates' errors is worth its cost: the gate rank 0 asks before each
due estimate (``workers.quality.QualitySignal.after_step``).

Kept beside :mod:`planning.policy`, not in it: it answers a question about the policy (could
any estimate change what :func:`planning.policy.decide` chooses now?) from the same cost
model and quality guard, but the policy never calls it.
"""

from __future__ import annotations

import math

from planning import registry
from planning.costmodel import alpha_beta_from_bandwidth, predict_step
from planning.policy import Measurements, PolicyConfig, adopt_settings, guard_failure
from planning.progress import seconds_per_progress
from planning.scoring import alpha_of


def estimates_can_matter(m: Measurements, cfg: PolicyConfig) -> bool:
    """Whether any candidate whose error must be estimated could win :func:`planning.policy.decide` now.

    Why: estimating the candidates' errors (``compressors.quality.estimate_errors``) costs an
    SVD per sampled matrix, 1.6 % of the CNN's steady-fast run, and on a fast link it buys
    nothing. A candidate's time per progress is at least its predicted step time (δ ≤ 1), so
    while the current choice's error is known (``none`` and the casts: ``Codec.known_error``)
    and no estimated candidate's step is predicted faster than the current time per progress
    by more than ``gain_threshold``, no estimate, however small, could make the policy switch
    to it at this link. Judged at the link of rank 0's latest report (not the policy's
    smoothed one: a drop opens the gate at once; while a recovery is still being confirmed the
    policy may decide on the estimates it already has) and with the ordinary quality guard (a
    superset of the critical one). True for a current choice that is itself lossy (judged
    against estimates) or that fails the guard (``decide`` leaves it at once for the best that
    passes, and needs the estimates to judge them).
    """
    known = registry.codec(m.current.name).known_error
    if known is None or guard_failure(m.current, cfg, False) is not None:
        return True  # judged against estimates, or leaving at once for the best that passes
    if m.world_size < 2 or not math.isfinite(m.bandwidth_bytes_per_second):
        return False  # no collective has a peer: compressing only adds work
    link = alpha_beta_from_bandwidth(m.bandwidth_bytes_per_second, alpha_of(m.latency_s, m.world_size))._replace(
        wake_s=m.wake_s)
    current_tau = seconds_per_progress(predict_step(m.current, m.profile, m.world_size, link).step_s, known)
    for spec in cfg.candidates():
        if not registry.is_lossy(spec.name) or guard_failure(spec, cfg, False) is not None:
            continue
        step_s = predict_step(adopt_settings(spec, m.current), m.profile, m.world_size, link).step_s
        if (current_tau - step_s) / current_tau > cfg.gain_threshold:
            return True
    return False
