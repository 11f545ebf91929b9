"""Whether a move between ``none`` and the casts is exposed to the link's next drop.

Torch-free and pure: a check of :func:`planning.policy.decide`'s step 5, applied after a move
passed its threshold on the link as it stands. Kept apart from ``planning.policy`` so each reads
in one sitting; it prices the move the way the policy does (``planning.scoring``), on the
link's stretches of the last oscillation window (``planning.link_levels``).
"""

from __future__ import annotations

from planning import hysteresis, registry
from planning.link import describe_rate
from planning.link_levels import stretch_shares
from planning.policy_types import Measurements, PolicyConfig, PolicyState, Scored
from planning.scoring import link_at, score
from planning.wire import wire_bytes


def loses_on_recent_link(current: Scored, best: Scored, m: Measurements, state: PolicyState, cfg: PolicyConfig,
                         now: float, threshold: float) -> str | None:
    """Why a move between two choices whose error is known (``none`` and the casts), to one
    that sends more bytes, is held back: over the stretches the link went through in the last
    oscillation window it saves no more than ``threshold``; None when it does, or when the
    move is of another kind.

    Why: such a move trades a few per cent of the step on the link as it stands (fp16 → ``none``
    "3.5 % less time per progress" at 1 Gbit/s) against the next drop of the link, which the
    averaged reading follows several steps late, each at the new choice's step there: ``none``
    sends twice fp16's bytes. On the benchmark's oscillating link, before the mix was
    recognised (its sides change only with the policy's moves, and compressing it sees the link
    come back late), 4 of 20 adaptive runs moved fp16 → ``none`` at steps 145-160 of a fast
    stretch, and the slow stretch from step 160 began on ``none`` for 7-12 steps, each ~4x
    PowerSGD r4's there (README, session 39, item 1; session 40). A link that dropped within
    the window may drop again; one that held its level passes as before (one stretch: the
    same comparison), and so does a move to a choice that sends no more bytes (fp16 for bf16
    is as exposed as the choice it leaves; on the steady fast link the readings' swings span
    stretches 2x apart, and such a move was held there in one of session 40's 48 kept runs).
    A move to or from a lossy choice is judged on the link as it stands: leaving compression
    when the link comes back is what fast-slow-fast asks for.
    """
    if registry.is_lossy(current.spec.name) or registry.is_lossy(best.spec.name):
        return None
    window = stretch_shares(state.stretches, now - cfg.oscillation_window_s, now, m.step)
    if not state.stretches or all(stretch.since == state.stretches[-1].since for _, stretch in window):
        return None  # the link held its level over the window (or its new one has no steps yet)
    shapes = m.profile.shapes
    if wire_bytes(best.spec, shapes, m.world_size) <= wire_bytes(current.spec, shapes, m.world_size):
        return None  # no more bytes, no more exposed to a drop than the current choice (a cast for a cast)
    links = tuple((share, link_at(stretch.bandwidth, state, m)) for share, stretch in window)
    on_window = hysteresis.gain(score(current.spec, m, links, cfg.level_shift_factor),
                                score(best.spec, m, links, cfg.level_shift_factor))
    if on_window > threshold:
        return None
    slowest = min(stretch.bandwidth for _, stretch in window)
    return (f"over the link of the last {cfg.oscillation_window_s:.0f} s (down to {describe_rate(slowest)}) "
            f"it saves {on_window:.1%}, not above the {threshold:.0%} threshold: the link may drop again")
