"""The adaptive policy against every fixed compressor, judged by time to a target held-out loss.

Why: what a user wants from adaptive compression is the shortest time to a given model
quality on a network they do not know in advance, without tuning a rank per model. This
benchmark runs the same two-worker job (one worker per network namespace of
:mod:`benchmarks.testbed`: local processes, rank 0's in-process policy; or, with
``--cluster``, a job submitted over REST to the coordinator of the emulated 2-node Ray
cluster of :mod:`benchmarks.cluster`, the policy in the coordinator, see :mod:`.on_cluster`)
once with each fixed compressor and once with the adaptive policy at its DEFAULT bounds
(every compressor, ranks 1..64), in each scenario of :data:`SCENARIOS`:
steady fast (1000 Mbit/s), steady slow (50 Mbit/s), fast->slow->fast, and oscillating with
a period near the policy's dwell.

The job: the small CNN (0.15 M parameters, 0.6 MB of gradients) at batch 32 on 32x32
synthetic images, 0.25 MB DDP buckets, 300 steps, the learning rate decayed to 0 along a
cosine, the same seeds for every choice. Why the decay: at a constant rate the held-out loss of
uncompressed training reached its noise floor a third into the run and then moved ±0.1
between evaluations around a trend of 0.04, so the first evaluation below the target (its
value at 90 % of the steps) was decided by which run dipped first; decayed, it falls to the
end and evaluations near the target differ by ~0.01.

Every choice runs once on each of ``--seeds`` (0-4 by default; ``--repeats`` times each),
each run is judged against its own seed's target (``targets_by_seed``; ``target`` is the first
seed's), and the run at the median time to target stands for the choice (``repeats`` lists each
run's figures, ``final_vs_none`` is the median of each run's final against its seed's
uncompressed final: the median of the seed's judged ``none`` run and its reference runs, below). Why seeds: one seed's trajectory decides the finish near the target (fp16, whose error
is 2e-4, reached it on three seeds of five, its final −1.1 % to +2.0 % off ``none``'s;
``benchmarks/results/adaptive_seeds.md``). With one seed a fixed choice's loss curve repeats
exactly (``none_curve_spread`` checks it for ``none`` where a seed ran twice; null otherwise),
but one run's step times moved by up to 17 % between runs on this machine; the median over
seeds absorbs both.

Judged by time to target. Every run checkpoints every :data:`EVAL_EVERY` steps (the same
cost for every run); after the run each checkpoint's model is evaluated on the first 512 held-out
samples, outside the timed run. The scenario's target is the held-out loss uncompressed
training (``none``) reaches at 90 % of its steps: by default that of ``--references`` (3) runs of
``none`` a seed of their own, with the seed's initial weights and held-out set and another order
of the training samples (the median of theirs; ``target_from``), so the judged ``none`` run
meets a draw of the trajectory like every other choice rather than its own value at 90 % of the
steps, which it meets by construction (``against_own_none`` keeps that judgement too;
``--references 0`` judges by it alone). A run's ``time_to_target_s`` is the wall time of its first
evaluation at or below the target (null: never). Wall times come from rank 0's
telemetry, from the end of step 1 (start-up, model build and the first probe left out;
later probes, the quality signal, the policy and the checkpoints are in, for every run alike).

Fixed steps, not fixed time: each phase of a schedule is a number of training steps; the
driver follows rank 0's telemetry and changes the rate when a report shows the phase's last
step done, so every run does the same work under each rate.

The machine is shared: every run records the cores other processes kept busy meanwhile
(``foreign_cores``; with ``--cluster`` the cluster's own processes are not foreign) and is repeated once when that exceeded :data:`BUSY_CORES`; the run with
the least foreign load is kept (``foreign_cores_runs`` lists every attempt's).

JSON (``--json-out``)::

    {"scenarios": {"<name>": {"target": x, "targets_by_seed": {...}, "target_from": "...", "schedule": [...],
        "verdict": {...}, "seeds": [...], "none_curve_spread": x or null,
        "references": [{"seed": s, "shuffle_seed": n, "eval": [[step, wall_s, x], ...], ...}],
        "against_own_none": {"targets_by_seed": {...}, "verdict": {...}, "hit_steps": {...}},
        "runs": {"<label>": {"time_to_target_s": t or null, "total_s": t, "final_eval": x,
                              "eval": [[step, wall_s, x], ...], "switches": [...], "seed": s, "target": x,
                              "hit_step": n or null, "final_vs_none": x, "first_run": {...},
                              "repeats": [{"seed": s, "time_to_target_s": t, ...}], ...}}}},
     "verdict": {"worst_ratio_to_best_fixed": {...}, "worst_ratio_against_own_none": {...}}, "job": {...}}

    python -m benchmarks.adaptive --json-out benchmarks/results/adaptive.json          # every scenario
    python -m benchmarks.adaptive --quick --json-out benchmarks/results/adaptive_quick.json  # fast-slow-fast only

Needs root (network namespaces); every timed run holds ``/tmp/gradwire-bench.lock``.

Modules: :mod:`.scenarios` (scenarios, schedules, the shared job), :mod:`.jobs` (one job on the
testbed, the ranks' entry, held-out evaluation), :mod:`.on_cluster` (one job through the
cluster's coordinator, imported only with ``--cluster``), :mod:`.targets` (each run's target, uncompressed final and time to target),
:mod:`.results` (verdicts), :mod:`.pairing` (times paired by seed, the best fixed choice),
:mod:`.intervals` (rounds or seeds drawn again), :mod:`.finals_floor` and :mod:`.time_floor`
(the finals and time rules on uncompressed runs), :mod:`.together` (which result files can be
judged together), :mod:`.rejudge` (kept runs judged again), :mod:`.merge_seeds` (result files on
other seeds judged together from their figures),
:mod:`.report` (plot, markdown), :mod:`.cli` (the command); the names below are the package's
public interface. The lock, the quiet-wait and the foreign load are :mod:`benchmarks.machine`'s.
"""

from benchmarks.adaptive.cli import compression_of, parse_args, write_results
from benchmarks.adaptive.jobs import HeldOut, JobRun, cap_gso, run_job
from benchmarks.adaptive.scenarios import (
    ADAPTIVE,
    FIXED_CHOICES,
    SCENARIOS,
    Phase,
    boundaries,
    fixed_compression,
    parse_label,
    parse_schedule,
    train_config,
)
from benchmarks.adaptive.targets import target_of, time_to_target

__all__ = [
    "ADAPTIVE", "FIXED_CHOICES", "SCENARIOS", "HeldOut", "JobRun", "Phase", "boundaries", "cap_gso", "compression_of",
    "fixed_compression", "parse_args", "parse_label", "parse_schedule", "run_job", "target_of", "time_to_target",
    "train_config", "write_results",
]
