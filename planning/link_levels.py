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
within a few dwells, :func:`level_mix` gives the policy that mix: the bandwidth of each
stretch of the link and the share of steps run at it. The policy then judges every candidate by its time per progress
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
side with the link back within the factor of where that level began undoes the level in
between (a blip of the reading with a trial on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

from planning.link import describe_rate


@dataclass(frozen=True)
class Stretch:
    """A stretch of reports over which the averaged bandwidth stayed within the shift factor
    of where it began: what the mix weighs (the link's level, whichever side the policy was on)."""

    since: float  # time of its first report
    since_step: int | None  # the step of its first report (None: not reported)
    anchor: float  # bytes/s: the average when it began
    bandwidth: float  # bytes/s: the latest average within it


@dataclass(frozen=True)
class Level(Stretch):
    """A stretch of reports with the policy on one side (see the module docstring)."""

    #: Whether the policy would compress (a lossy compressor) at the link as it stood.
    lossy: bool = field(kw_only=True)
    #: The mean of the log of the averaged bandwidth over the level's reports, and their count:
    #: the level's typical rate (:attr:`typical`).
    log_mean: float = field(kw_only=True)
    reports: int = field(kw_only=True, default=1)

    @property
    def typical(self) -> float:
        """Bytes/s: the geometric mean of the averaged bandwidth over the level's reports.

        Why not the anchor for an uncompressed level: a level begins at the first report of
        its side, and when the link comes back that report is part-way up the averaged
        reading's climb. On the benchmark's oscillating link the rise from 50 Mbit/s began a
        level at 171 Mbit/s and the reading went on to 2 Gbit/s within 0.7 s; anchored at 171,
        less than the separation (4x) above the slow level's 48 Mbit/s, the level ended the
        mix at once and kept it off for the rest of the window, and the policy followed the
        phases again (session 25, two of two kept runs). The mean of the level's reports
        climbs with the reading (285 Mbit/s after three reports there)."""
        return math.exp(self.log_mean)

    def with_report(self, bandwidth: float, lossy: bool) -> "Level":
        """The level with one more report at ``bandwidth`` (the latest average) and that side."""
        reports = self.reports + 1
        log_mean = self.log_mean + (math.log(bandwidth) - self.log_mean) / reports
        return Level(self.since, self.since_step, self.anchor, bandwidth, lossy=lossy, log_mean=log_mean,
                     reports=reports)


#: Levels or stretches, oldest first; the last is the one in progress.
LevelHistory = tuple[Level, ...]
StretchHistory = tuple[Stretch, ...]


@dataclass(frozen=True)
class LevelMix:
    """The link's stretches within the span of an oscillation, and their weights."""

    stretches: tuple[Stretch, ...]
    shares: tuple[float, ...]  # each stretch's share of the steps within the span; they sum to 1
    shifts: int  # changes of level within the span
    span_s: float

    def describe(self) -> str:
        """The mix in words, the stretches grouped below and above the geometric middle of the
        slowest and fastest: ``28% of steps at 48 Mb/s, 72% of steps at 1.34 Gb/s``."""
        rates = [stretch.bandwidth for stretch in self.stretches]
        middle = math.sqrt(min(rates) * max(rates))
        parts = []
        for group in ([r <= middle for r in rates], [r > middle for r in rates]):
            picked = [(share, rate) for share, rate, inside in zip(self.shares, rates, group) if inside]
            total = math.fsum(share for share, _ in picked)
            if total > 0:
                mean = math.exp(math.fsum(share * math.log(rate) for share, rate in picked) / total)
                parts.append(f"{total:.0%} of steps at {describe_rate(mean)}")
        return f"link oscillates ({self.shifts} level changes in {self.span_s:.0f} s): judged on the mix, {', '.join(parts)}"


def same_level(anchor: float, bandwidth: float, factor: float) -> bool:
    """Whether ``bandwidth`` lies within ``factor`` of ``anchor`` (one level of the link; two
    infinite bandwidths, one worker's, are one level)."""
    return anchor == bandwidth or max(bandwidth / anchor, anchor / bandwidth) <= factor


def _moved(anchor: float, bandwidth: float, factor: float) -> bool:
    return not same_level(anchor, bandwidth, factor)


_S = TypeVar("_S", bound=Stretch)


def _trim(history: tuple[_S, ...], now: float, keep_s: float) -> tuple[_S, ...]:
    """``history`` without the entries that ended more than ``keep_s`` before ``now``."""
    ends = [entry.since for entry in history[1:]] + [now]
    return tuple(entry for entry, end in zip(history, ends) if end >= now - keep_s)


def record_level(history: LevelHistory, bandwidth: float | None, lossy: bool, now: float, step: int | None,
                 shift_factor: float, keep_s: float) -> LevelHistory:
    """``history`` with this report: a new level when the side (``lossy``: the policy would
    compress) changed and the average moved beyond ``shift_factor`` of the level's anchor,
    else the level in progress updated (its side too). Levels that ended more than ``keep_s``
    ago are dropped. No link (None or an infinite bandwidth, one worker) forgets the history."""
    if bandwidth is None or not math.isfinite(bandwidth):
        return ()
    if not history:
        return (_new_level(now, step, bandwidth, lossy),)
    last = history[-1]
    moved = _moved(last.anchor, bandwidth, shift_factor)
    before = history[-2] if len(history) > 1 else None
    if (last.lossy != lossy and not moved and before is not None and before.lossy == lossy
            and not _moved(before.anchor, bandwidth, shift_factor)):
        # The side went back to the previous level's, and the link is within the factor of
        # where both levels began: the level in between was a blip of the reading with the
        # policy trying a choice on it, not the link; it is undone. (Not when the link has
        # moved from the earlier level: that level's anchor would then be stale, and every
        # later change of side at this bandwidth would read as a move.)
        history = history[:-2] + (before.with_report(bandwidth, lossy),)
    elif last.lossy == lossy or not moved:
        history = history[:-1] + (last.with_report(bandwidth, lossy),)
    else:
        history = history + (_new_level(now, step, bandwidth, lossy),)
    return _trim(history, now, keep_s)


def _new_level(now: float, step: int | None, bandwidth: float, lossy: bool) -> Level:
    return Level(now, step, bandwidth, bandwidth, lossy=lossy, log_mean=math.log(bandwidth))


def record_stretch(history: StretchHistory, bandwidth: float | None, now: float, step: int | None,
                   shift_factor: float, keep_s: float) -> StretchHistory:
    """``history`` with this report: a new stretch when the average moved beyond
    ``shift_factor`` of the stretch's anchor, else the stretch in progress updated."""
    if bandwidth is None or not math.isfinite(bandwidth):
        return ()
    if history and not _moved(history[-1].anchor, bandwidth, shift_factor):
        last = history[-1]
        return _trim(history[:-1] + (Stretch(last.since, last.since_step, last.anchor, bandwidth),), now, keep_s)
    return _trim(history + (Stretch(now, step, bandwidth, bandwidth),), now, keep_s)


def level_mix(levels: LevelHistory, stretches: StretchHistory, now: float, step: int | None, window_s: float,
              min_shifts: int, separation: float) -> LevelMix | None:
    """The mix of levels while the link oscillates, else None (the link holds a level: follow it).

    It oscillates while the last ``min_shifts`` changes of level each came within ``window_s``
    of the one before and the last within ``window_s`` of now; the mix spans the last
    ``window_s``, or from the first of those changes if that is earlier. Why not "that many
    changes within the last window" alone: compressing, the workers see the link come back
    only at a probe or a recovery check, so changes to the uncompressed side are seen seconds
    apart; in the benchmark's oscillating link the count within 8 s fell below three after
    6 s of the mix, the policy followed the link again, and switched out of phase. The mix
    ends once a whole window passed without a change. The histories must reach back
    ``min_shifts · window_s`` for it (the caller's ``keep_s``).

    And every uncompressed level in the span must run, typically (:attr:`Level.typical`: the
    geometric mean of its reports), at least ``separation`` times as fast as every lossy one
    began (their anchors): a link that truly swings between a level that calls for compression and
    one that does not. (A lossy level by where it began: compressing, the workers see the link
    come back only at a probe, so a lossy level's later reports can lie at either rate.) Why: in fast-slow-fast the fast link's averaged reading dipped 2.4x
    (1336 to 548 Mbit/s) in its first phase, the policy tried a lossy compressor on an
    estimate there and went back as the reading recovered, and with the drop that followed
    three changes read as oscillating; the mix then held compression for a window after the
    link came back. The oscillating link's levels began 8x and more apart.

    The weights come from the bandwidth's stretches (:func:`record_stretch`), not the levels:
    a level can span both rates (compressing, the policy saw the link come back without a
    move worth a switch, and stayed on its side). Each stretch weighs by the steps run at it
    within the span (one that began before the span by its steps times the share of its
    time inside it); by its seconds when a step is unknown. Steps, not seconds: what a fixed choice pays over the mix is its step time at
    each level times the steps it runs there, and a link that changes with the work done
    (the benchmark's schedule) gives every choice the same steps at each level.
    """
    if min_shifts < 1:
        raise ValueError(f"min_shifts: must be >= 1, got {min_shifts}")
    # A change of level is a change of side: two levels of one side in a row (the side went
    # back where the link had moved) are one side's stretch as far as oscillating goes.
    shift_times = [level.since for previous, level in zip(levels, levels[1:]) if level.lossy != previous.lossy]
    if window_s <= 0 or len(shift_times) < min_shifts or now - shift_times[-1] > window_s:
        return None
    recent = shift_times[-min_shifts:]
    if any(later - earlier > window_s for earlier, later in zip(recent, recent[1:])):
        return None
    start = min(now - window_s, recent[0])
    level_ends = [level.since for level in levels[1:]] + [now]
    in_span = [level for level, end in zip(levels, level_ends) if end >= start]
    lossy = [level.anchor for level in in_span if level.lossy]
    plain = [level.typical for level in in_span if not level.lossy]
    if lossy and plain and min(plain) < separation * max(lossy):
        return None
    shares = stretch_shares(stretches, start, now, step)
    if not shares:
        return None
    return LevelMix(tuple(stretch for _, stretch in shares), tuple(share for share, _ in shares),
                    sum(1 for t in shift_times if t >= start), now - max(start, stretches[0].since))


def stretch_shares(stretches: StretchHistory, start: float, now: float, step: int | None) -> tuple[tuple[float, Stretch], ...]:
    """(share, stretch) of the link's stretches from ``start`` to ``now``, by the steps run at
    each (one that began before ``start`` by its steps times the share of its time inside);
    by seconds when a step is unknown. Empty when nothing was run in that span."""
    ends = [(stretch.since, stretch.since_step) for stretch in stretches[1:]] + [(now, step)]
    spanned = [(stretch, end, end_step) for stretch, (end, end_step) in zip(stretches, ends)
               if end >= start and end > stretch.since]
    by_steps = all(x is not None for stretch, _, end_step in spanned for x in (stretch.since_step, end_step))
    weights: list[tuple[float, Stretch]] = []
    for stretch, end, end_step in spanned:
        inside = (end - max(stretch.since, start)) / (end - stretch.since)
        if by_steps:
            assert stretch.since_step is not None and end_step is not None
            weight = max(0, end_step - stretch.since_step) * inside
        else:
            weight = end - max(stretch.since, start)
        if weight > 0:
            weights.append((weight, stretch))
    total = math.fsum(w for w, _ in weights)
    return tuple((w / total, stretch) for w, stretch in weights) if total > 0 else ()


def steps_mix(stretches: StretchHistory, step: int | None, steps: int) -> tuple[tuple[float, float], ...] | None:
    """(share, bandwidth) of the stretches the last ``steps`` steps up to ``step`` ran at, by
    their steps: the link a window of measured steps met (``planning.step_correction``). The
    oldest stretch stands for any steps before it (the histories reach back a few windows of
    the oscillation, a measured window is 50 steps). None when a step is unknown, nothing
    was recorded, or the steps went back."""
    if not stretches or step is None or steps <= 0:
        return None
    begins = [stretch.since_step for stretch in stretches if stretch.since_step is not None]
    if len(begins) < len(stretches):
        return None
    if step < begins[-1] or any(later < earlier for earlier, later in zip(begins, begins[1:])):
        return None  # steps went back (a resumed job): the stretches are of another run
    start = step - steps
    ends = begins[1:] + [step]
    weights = []
    for index, (stretch, begin, end) in enumerate(zip(stretches, begins, ends)):
        first = min(begin, start) if index == 0 else begin
        weight = min(end, step) - max(first, start)
        if weight > 0:
            weights.append((weight, stretch.bandwidth))
    total = sum(weight for weight, _ in weights)
    if total <= 0:
        return None
    return tuple((weight / total, bandwidth) for weight, bandwidth in weights)
