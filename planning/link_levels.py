"""Whether the link oscillates, and the mix of levels a fixed choice would meet if it does.

Torch-free and pure (``planning.policy.decide`` keeps a :data:`LevelHistory` in its state).

Why: following every change of the link is the right move when the link changes rarely, and
the wrong one when it changes about as often as the policy may switch. On the benchmark's
oscillating link (1000 Mbit/s for 40 steps, 50 Mbit/s for 20, a period of 3-5 s against a 2 s
dwell) the policy saw each drop 6-17 steps late, each rise 0-31 steps late, then waited for
confirmation and the dwell: it switched about once a phase and half a phase late, ran a
low-rank compressor in 26-59 % of the fast steps and an uncompressed one in 40-84 % of the
slow steps (``README.md``, session 19's runs A-C), and lost to the best fixed choice. A fixed
choice is judged on the mix of levels it meets, so once the link has shifted level often
within a few dwells, :func:`level_mix` gives the policy that mix: each level's bandwidth and
the share of steps run at it. The policy then judges every candidate by its time per progress
averaged over the mix and settles on the one that serves it best (the choice a user would
have needed to know in advance); when the link holds one level for the window, the mix ends
and the policy follows the link again.

A level is a stretch of reports at one level of the link: a new one begins when the side the
policy would be on for the link as it stands changes (a lossy compressor, or an uncompressed
one: a cast or ``none``) *and* the averaged bandwidth has moved by more than the policy's
``level_shift_factor`` from where the level began. Its bandwidth is the latest average within
it. Why both: the readings of a steady link swing too far for a level of the bandwidth alone
(on the benchmark's steady 1000 Mbit/s link the averaged passive reading moved by more than
2x 5-9 times in a 12-17 s run, 0.5-5 Gbit/s: a token bucket's bursts, while the choice
stayed uncompressed), and the side alone also changes when the policy learns rather than
when the link moves (a lossy compressor tried on an estimate on the fast link and dropped a
second later: two changes of side in fast-slow-fast's first phase, which with the drop read
as oscillating and held the policy to compression after the link came back). A change of
side at the same bandwidth updates the level's side, and one back to the previous level's
side undoes that level (a reading's dip of 2.3x on the fast link with a trial of ACP-SGD
on it, dropped 0.7 s later, made one such level in fast-slow-fast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planning.link import describe_rate


@dataclass(frozen=True)
class Level:
    """A stretch of reports at one level of the averaged bandwidth."""

    since: float  # time of its first report
    since_step: int | None  # the step of its first report (None: not reported)
    lossy: bool  # whether the policy would compress (a lossy compressor) at the link as it stood
    anchor: float  # bytes/s: the average when it began
    bandwidth: float  # bytes/s: the latest average within it


#: The levels seen, oldest first; the last is the one in progress.
LevelHistory = tuple[Level, ...]


@dataclass(frozen=True)
class LevelMix:
    """The levels an oscillating link went through within the window, and their weights."""

    levels: tuple[Level, ...]  # the levels within the window
    shares: tuple[float, ...]  # each level's share of the steps within the window; they sum to 1
    shifts: int  # level shifts within the window

    def describe(self, window_s: float) -> str:
        """The mix in words, by side: ``33% of steps compressing (50 Mb/s), 67% not (1.2 Gb/s)``
        (each side's bandwidth the share-weighted geometric mean of its levels)."""
        parts = []
        for lossy, side in ((True, "compressing"), (False, "not")):
            picked = [(share, level.bandwidth) for share, level in zip(self.shares, self.levels) if level.lossy == lossy]
            total = math.fsum(share for share, _ in picked)
            if total > 0:
                mean = math.exp(math.fsum(share * math.log(b) for share, b in picked) / total)
                parts.append(f"{total:.0%} of steps {side} ({describe_rate(mean)})")
        return f"link oscillates ({self.shifts} level shifts in {window_s:.0f} s): judged on the mix, {', '.join(parts)}"


def record_level(history: LevelHistory, bandwidth: float | None, lossy: bool, now: float, step: int | None,
                 shift_factor: float, keep_s: float) -> LevelHistory:
    """``history`` with this report: a new level when the side (``lossy``: the policy would
    compress) changed and the average moved beyond ``shift_factor`` of the level's anchor,
    else the level in progress updated (its side too). Levels that ended more than ``keep_s``
    ago are dropped. No link (None or an infinite bandwidth, one worker) forgets the history."""
    if bandwidth is None or not math.isfinite(bandwidth):
        return ()
    if history:
        last = history[-1]
        moved = max(bandwidth / last.anchor, last.anchor / bandwidth) > shift_factor
        if last.lossy != lossy and not moved and len(history) > 1 and history[-2].lossy == lossy:
            # The side went back to the previous level's without the link moving: the change
            # that began this level was the policy learning, not the link; it is undone.
            before = history[-2]
            history = history[:-2] + (Level(before.since, before.since_step, lossy, before.anchor, bandwidth),)
        elif last.lossy == lossy or not moved:
            history = history[:-1] + (Level(last.since, last.since_step, lossy, last.anchor, bandwidth),)
        else:
            history = history + (Level(now, step, lossy, bandwidth, bandwidth),)
    else:
        history = (Level(now, step, lossy, bandwidth, bandwidth),)
    ends = [level.since for level in history[1:]] + [now]
    return tuple(level for level, end in zip(history, ends) if end >= now - keep_s)


def level_mix(history: LevelHistory, now: float, step: int | None, window_s: float,
              min_shifts: int) -> LevelMix | None:
    """The mix of levels while the link oscillates, else None (the link holds a level: follow it).

    It oscillates while the last ``min_shifts`` changes of side each came within ``window_s``
    of the one before and the last within ``window_s`` of now; the mix spans the last
    ``window_s``, or from the first of those changes if that is earlier. Why not "that many
    changes within the last window" alone: compressing, the workers see the link come back
    only at a probe or a recovery check, so changes to the uncompressed side are seen seconds
    apart; in the benchmark's oscillating link the count within 8 s fell below three after
    6 s of the mix, the policy followed the link again, and switched out of phase. The mix
    ends once a whole window passed without a change (:func:`record_level` keeps
    ``2 · window_s`` of history for it).

    Each level weighs by the steps run at it within the span (a level that began before the
    span by its steps times the share of its time inside it); by its seconds when a step is
    unknown. Steps, not seconds: what a fixed choice pays over the mix is its step time at
    each level times the steps it runs there, and a link that changes with the work done
    (the benchmark's schedule) gives every choice the same steps at each level.
    """
    shift_times = [level.since for level in history[1:]]
    if window_s <= 0 or len(shift_times) < min_shifts or now - shift_times[-1] > window_s:
        return None
    recent = shift_times[-min_shifts:]
    if any(later - earlier > window_s for earlier, later in zip(recent, recent[1:])):
        return None
    start = min(now - window_s, recent[0])
    shifts = sum(1 for t in shift_times if t >= start)
    ends = [(level.since, level.since_step) for level in history[1:]] + [(now, step)]
    by_steps = all(s is not None for s in [level.since_step for level in history] + [step])
    weights: list[tuple[float, Level]] = []
    for level, (end, end_step) in zip(history, ends):
        if end < start or end <= level.since:
            continue
        inside = (end - max(level.since, start)) / (end - level.since)
        if by_steps:
            assert level.since_step is not None and end_step is not None
            weight = max(0, end_step - level.since_step) * inside
        else:
            weight = end - max(level.since, start)
        if weight > 0:
            weights.append((weight, level))
    total = math.fsum(w for w, _ in weights)
    if total <= 0:
        return None
    return LevelMix(tuple(level for _, level in weights), tuple(w / total for w, _ in weights), shifts)
