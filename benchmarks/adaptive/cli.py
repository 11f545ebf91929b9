"""``python -m benchmarks.adaptive``: every scenario with every choice, under the lock, then the outputs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Sequence

from benchmarks.adaptive.finals_floor import scenario_floor
from benchmarks.adaptive.jobs import Backend, HeldOut, JobRun, LocalBackend, rank_entry
from benchmarks.adaptive.report import markdown, plot
from benchmarks.adaptive.results import (
    combine_repeats,
    eval_points,
    none_curve_spread,
    overall_verdict,
    run_result,
    scenario_verdict,
)
from benchmarks.adaptive.scenarios import (
    ADAPTIVE,
    BUSY_CORES,
    DEFAULT_REFERENCES,
    DEFAULT_SEEDS,
    EVAL_EVERY,
    FIXED_CHOICES,
    HELD_OUT_SAMPLES,
    QUICK_REFERENCES,
    QUICK_SCENARIOS,
    QUICK_SEEDS,
    SCENARIOS,
    Phase,
    fixed_compression,
    parse_schedule,
    reference_shuffle_seed,
    train_config,
)
from benchmarks.adaptive.targets import judge_by_seed, target_of
from benchmarks.adaptive.time_floor import uncompressed_time_floor
from benchmarks.machine import bench_lock, foreign_load, wait_for_quiet
from benchmarks.outputs import write_json_and_table
from benchmarks.repo import commit
from benchmarks.testbed import Testbed
from planning.sections import LR_SCHEDULES, CompressionConfig

# --------------------------------------------------------------------------- main


def compression_of(choice: str, args: argparse.Namespace) -> dict[str, Any]:
    """``adaptive``: the policy with its DEFAULT bounds (every compressor, ranks 1..64) and the
    benchmark's scaled dwell, starting where an adaptive job starts by default unless ``--start``
    names a compressor; else a fixed label's block."""
    if choice == ADAPTIVE:
        block: dict[str, Any] = {"mode": "adaptive", "min_dwell_s": args.min_dwell_s}
        return {**block, "compressor": args.start} if args.start else block
    return fixed_compression(choice)


def run_choice(backend: Backend, args: argparse.Namespace, choice: str, phases: Sequence[Phase], workdir: Path,
               held_out: HeldOut) -> tuple[JobRun, list[tuple[int, float]], list[float]]:
    """One run under the lock, repeated once if other users kept the machine busy; the run
    with the least foreign load is kept. Returns it, its held-out curve and every load seen."""
    loads: list[float] = []
    kept: JobRun | None = None
    for attempt in range(1 + args.busy_repeats):
        cfg = train_config(args, compression_of(choice, args), sum(p.steps for p in phases), checkpoint_every=EVAL_EVERY)
        load: dict[str, float] = {}
        workdir_attempt = workdir / f"{choice}-{attempt}"
        with bench_lock():
            wait_for_quiet(args.max_wait_quiet_s, own_pids=backend.own_pids)
            with foreign_load(load, own_pids=backend.own_pids):
                run = backend.run(cfg, phases, workdir_attempt, label=choice)
        run.foreign_cores = load.get("foreign_cores")
        loads.append(run.foreign_cores or 0.0)
        if kept is None or (run.foreign_cores or 0.0) < (kept.foreign_cores or 0.0):
            kept = run
        if (run.foreign_cores or 0.0) <= BUSY_CORES or attempt == args.busy_repeats:
            break
        print(f"[adaptive] {choice}: foreign load {run.foreign_cores} cores > {BUSY_CORES}: repeating", flush=True)
    assert kept is not None and kept.checkpoint is not None
    return kept, held_out.curve(kept.checkpoint.parent), loads


def round_order(choices: Sequence[str], round_index: int) -> list[str]:
    """The choices in the order round ``round_index`` runs them: turned one place each round,
    so over as many rounds as choices each runs once in every position.

    Why: the machine's pace drifts within a round (a 2-core VM shared with its host), and a
    choice that always runs in one place takes that place's drift in every round. In session
    23's steady-fast runs adaptive, always last, ran fp16's steps 5 % slower than fixed fp16
    did in the same rounds (1.022 against 0.970 of ``none``'s time per step), where adaptive on
    ``none``, third of three, had run 1.006× ``none``: with a fixed order the job and its
    place cannot be told apart.
    """
    turn = round_index % len(choices) if choices else 0
    return [*choices[turn:], *choices[:turn]]


def run_references(backend: Backend, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """``--references`` runs of ``none`` a seed (and a step count the scenarios have), each with
    the seed's initial weights and held-out set and another order of the training samples
    (:func:`reference_shuffle_seed`), on the fastest link the scenarios have: ``none``'s
    trajectory does not depend on the link, and these runs' times are not judged. Their held-out
    loss at 90 % of the steps sets each seed's target (``targets.reference_targets``), and their
    finals count in its uncompressed final (``targets.uncompressed_finals``).
    Kept as ``workdir/reference/<steps>steps/seed<S>-order<K>/none-0``."""
    totals = sorted({sum(p.steps for p in parse_schedule(text)) for text in args.scenarios.values()})
    fastest = max(p.mbit for text in args.scenarios.values() for p in parse_schedule(text))
    out: list[dict[str, Any]] = []
    for steps in totals:
        for seed in args.seeds:
            seeded = argparse.Namespace(**{**vars(args), "seed": seed, "busy_repeats": 0})
            held_out = HeldOut(train_config(seeded, fixed_compression("none"), steps), HELD_OUT_SAMPLES)
            for index in range(args.references):
                order = reference_shuffle_seed(seed, index)
                ordered = argparse.Namespace(**{**vars(seeded), "shuffle_seed": order})
                run, curve, loads = run_choice(backend, ordered, "none", [Phase(fastest, steps)],
                                               workdir / "reference" / f"{steps}steps" / f"seed{seed}-order{index}", held_out)
                evals = eval_points(run, curve)
                out.append({"seed": seed, "shuffle_seed": order, "steps": steps, "eval": evals, "final_eval": evals[-1][2],
                            "foreign_cores": run.foreign_cores})
                print(f"[adaptive] reference none (seed {seed}, order {order}, {steps} steps): held-out "
                      f"{target_of(evals, [Phase(fastest, steps)])} at 90 %, final {evals[-1][2]:.4f}", flush=True)
    return out


def judged_runs(repeats: dict[str, list[dict[str, Any]]], phases: Sequence[Phase],
                references: Sequence[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[Any, float]]:
    """Every choice's entry with its runs judged against the ``references``' targets and finals
    (none: ``none``'s own), on copies: the same runs are judged both ways."""
    judged = copy.deepcopy(repeats)
    used = judge_by_seed(judged, phases, references)
    return {choice: combine_repeats(results) for choice, results in judged.items()}, used


def run_scenario(backend: Backend, args: argparse.Namespace, name: str, workdir: Path,
                 references: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Every choice once per seed (and repeat), in an order that turns each round
    (:func:`round_order`); then the runs judged against each seed's target.

    The target and the uncompressed final: from the reference runs of ``none`` with this
    scenario's step count (:func:`run_references`; the final: with the judged ``none`` runs'),
    else ``none``'s own runs (``--references 0``). With references the verdict against ``none``'s
    own target and final is kept beside (``against_own_none``).

    Why several seeds: one seed's trajectory decides the outcome near the target. On seed 0 fp16,
    whose error is 2e-4, ended 2.0 % above ``none`` and reached the target by one evaluation's
    dip; over seeds 0-4 it missed the target twice and its final ranged from −1.1 % to +2.0 %
    (``adaptive_seeds.md``). Each run is judged against its own seed's target.
    """
    phases = parse_schedule(args.scenarios[name])
    steps = sum(p.steps for p in phases)
    order = ["none", *[c for c in args.choices if c != "none"]]
    repeats: dict[str, list[dict[str, Any]]] = {choice: [] for choice in order}
    for seed_index, seed in enumerate(args.seeds):
        seeded = argparse.Namespace(**{**vars(args), "seed": seed})
        held_out = HeldOut(train_config(seeded, fixed_compression("none"), steps), HELD_OUT_SAMPLES)
        for repeat in range(args.repeats):
            for choice in round_order(order, seed_index * args.repeats + repeat):
                run, curve, loads = run_choice(backend, seeded, choice, phases, workdir / name / f"seed{seed}-repeat{repeat}",
                                               held_out)
                result = run_result(run, phases, curve)
                result["seed"] = seed
                result["foreign_cores_runs"] = loads
                origin = run.wall_at(1)
                result["rate_changes_s"] = [[round(wall - origin, 3), mbit] for _, wall, mbit in run.rate_changes]
                repeats[choice].append(result)
                print(f"[adaptive] {name} {choice} (seed {seed}, repeat {repeat + 1}/{args.repeats}): total "
                      f"{result['total_s']:.2f} s, final held-out {result['final_eval']:.4f}, "
                      f"switches {[(s['to'], s['at_s']) for s in result['switches']]}, foreign load {loads} cores, "
                      f"quality overhead {result['quality_overhead']}", flush=True)
    mine = [r for r in references if r["steps"] == steps]
    runs, targets = judged_runs(repeats, phases, mine)
    scenario = {"schedule_text": args.scenarios[name], "schedule": [{"mbit": p.mbit, "steps": p.steps} for p in phases],
                "seeds": args.seeds, "repeats": args.repeats,
                "target_from": "reference none runs" if mine else "none's own runs",
                "target": targets[args.seeds[0]], "targets_by_seed": {str(seed): t for seed, t in targets.items()},
                "none_curve_spread": none_curve_spread(repeats["none"]), "runs": runs}
    scenario["verdict"] = scenario_verdict(runs)
    if mine:
        scenario["references"] = mine
        scenario["uncompressed_floor"] = scenario_floor(scenario)
        scenario["uncompressed_time_floor"] = uncompressed_time_floor(mine)
        own_runs, own = judged_runs(repeats, phases, ())
        scenario["against_own_none"] = {"targets_by_seed": {str(seed): t for seed, t in own.items()},
                                        "verdict": scenario_verdict(own_runs),
                                        "hit_steps": {choice: [r["hit_step"] for r in entry["repeats"]]
                                                      for choice, entry in own_runs.items()}}
    return scenario


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_SCENARIOS)}: within 15 minutes")
    parser.add_argument("--scenario", action="append", default=None, metavar="NAME[=MBIT:STEPS,...]",
                        help=f"scenarios to run (default all: {', '.join(SCENARIOS)})")
    parser.add_argument("--choices", nargs="+", default=[*FIXED_CHOICES, ADAPTIVE],
                        help=f"fixed labels and {ADAPTIVE} (the policy with default bounds)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length (BERT models)")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25,
                        help="DDP bucket cap; small, so the CNN's buckets overlap backward")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="cosine",
                        help="cosine (to 0 at the last step): at a constant rate the held-out loss of "
                             "uncompressed training reaches its noise floor a third into the run, and the "
                             "first evaluation below the target is a matter of which run dips first; linear "
                             "(session 43) reached the target on more seeds but told runs apart no better by the "
                             "time rule and worse by the finals rule")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="run every choice once per seed (and --repeats times each); each run is judged "
                             "against its own seed's target, and the run at the median time to target stands "
                             "for the choice: one seed's trajectory decides the finish (see adaptive_seeds.md). "
                             "Default 0-4: a cast's final ranges from -1.7 %% to +2.7 %% of none's over them, so "
                             "'within 1 %%' on fewer seeds is a matter of which; 0-2 with --quick (15 minutes)")
    parser.add_argument("--references", type=int, default=None,
                        help=f"reference runs of none a seed, each with another order of the training samples; "
                             f"their median held-out loss at 90 %% of the steps is the seed's target, so none is "
                             f"judged like every other choice (default {DEFAULT_REFERENCES}, {QUICK_REFERENCES} "
                             f"with --quick; 0: the target is the judged none run's own)")
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--report-interval-s", type=float, default=0.1,
                        help="telemetry cadence (the policy decides on each report); rates change on reports")
    parser.add_argument("--probe-interval-s", type=float, default=2.0,
                        help="probes (and error estimates) come at most this often, within the budget")
    parser.add_argument("--probe-budget", type=float, default=0.05,
                        help="share of run time probes may take (estimates: half of it); scaled up like the "
                             "dwell, as phases here last seconds, not minutes (the job default is 0.02)")
    parser.add_argument("--start", default=None,
                        help="the adaptive run's first compressor (default: an adaptive job's own, registry.adaptive_start)")
    parser.add_argument("--min-dwell-s", type=float, default=2.0,
                        help="the policy's minimum dwell, scaled to the schedule's seconds-long phases "
                             "(the job default, 30 s, suits links that change over minutes)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every choice this often per seed (the same curve, other step times: one "
                             "run's step times vary by up to 17 %% run to run)")
    parser.add_argument("--busy-repeats", type=int, default=1,
                        help=f"repeat a run this often while it saw more than {BUSY_CORES} foreign cores")
    parser.add_argument("--max-wait-quiet-s", type=float, default=20.0,
                        help="before each run, wait up to this long for other work to leave the CPUs")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --json-out)")
    parser.add_argument("--md-out", type=Path, default=None, help="markdown tables (default: next to --json-out)")
    parser.add_argument("--include", type=Path, action="append", default=None,
                        help="add the scenarios of an earlier result JSON that this run does not measure, judged again "
                             "by this code's verdict")
    parser.add_argument("--merge-only", action="store_true",
                        help="measure nothing: write the --include files' scenarios as one result (also: re-render one "
                             "result file under the current verdict)")
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's telemetry, checkpoints and logs here")
    parser.add_argument("--cluster", action="store_true",
                        help="run each job over REST through the coordinator of an emulated 2-node Ray cluster "
                             "(benchmarks.cluster) instead of two local processes")
    args = parser.parse_args(argv)
    chosen: dict[str, str] = {}
    for item in args.scenario or (QUICK_SCENARIOS if args.quick else SCENARIOS):
        name, _, schedule = item.partition("=")
        if not schedule and name not in SCENARIOS:
            parser.error(f"--scenario: unknown {name!r}; known: {', '.join(SCENARIOS)}, or NAME=MBIT:STEPS,...")
        chosen[name] = schedule or SCENARIOS[name]
        try:
            total = sum(p.steps for p in parse_schedule(chosen[name]))
        except ValueError as exc:
            parser.error(f"--scenario {name}: {exc}")
        if round(0.9 * total) % EVAL_EVERY or total % EVAL_EVERY:
            parser.error(f"--scenario {name}: {total} steps; the total and 90 % of it must be multiples of {EVAL_EVERY}")
    args.scenarios = chosen
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    if args.seeds is None:
        args.seeds = list(QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds: each seed once, got {args.seeds}")
    args.seed = args.seeds[0]  # the job builder's (train_config) seed outside a seeded run
    args.shuffle_seed = None  # every judged run's samples come in its seed's order
    if args.references is None:
        args.references = QUICK_REFERENCES if args.quick else DEFAULT_REFERENCES
    if args.references < 0:
        parser.error(f"--references: must be >= 0, got {args.references}")
    if args.merge_only and not args.include:
        parser.error("--merge-only: name the results to merge with --include")
    return args


def write_results(args: argparse.Namespace, doc: dict[str, Any], table: str) -> Path | None:
    """Write ``--json-out`` and the markdown table (``--md-out``, default beside the JSON);
    return where the plot goes (``--plot``, default beside the JSON; None: no plot)."""
    write_json_and_table(args.json_out, doc, table, args.md_out)
    return args.plot or (args.json_out.with_suffix(".png") if args.json_out else None)


#: Makes where the jobs run, for the run's arguments and first rate (a context manager: the
#: testbed or cluster is torn down at the end).
BackendFactory = Callable[[argparse.Namespace, float], ContextManager[Backend]]


@contextmanager
def local_backend(args: argparse.Namespace, first_rate: float) -> Iterator[Backend]:
    """Two local processes on a testbed of two namespaces."""
    with Testbed(hosts=2, mbit=first_rate) as tb:
        yield LocalBackend(tb)


def main(argv: Sequence[str] | None = None, backends: BackendFactory = local_backend) -> int:
    """The command. ``backends``: where the jobs run; ``--cluster`` needs the factory of
    ``benchmarks.adaptive.__main__``, which alone imports the cluster (``benchmarks.cluster``
    builds on this package, so this module does not import it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_rank"]:
        return rank_entry(argv[1:])
    args = parse_args(argv)
    started = time.monotonic()
    doc: dict[str, Any] = {"scenarios": {}}
    where = "(merged)"
    if args.merge_only:
        args.scenarios = {}
    else:
        ok, why = Testbed.available()
        if not ok:
            print(f"testbed unavailable: {why}", file=sys.stderr)
            return 2
        first_rate = parse_schedule(next(iter(args.scenarios.values())))[0].mbit
        if args.cluster and backends is local_backend:
            print("--cluster: run it as `python -m benchmarks.adaptive --cluster`", file=sys.stderr)
            return 2
        with ExitStack() as stack:
            try:
                backend = stack.enter_context(backends(args, first_rate))
            except RuntimeError as exc:  # ClusterError, TestbedError: the reason it cannot start here
                print(f"cannot start where the jobs run: {exc}", file=sys.stderr)
                return 2
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gw-adaptive-"))
            where = backend.where
            references = run_references(backend, args, Path(args.keep or tmp))
            for name in args.scenarios:
                doc["scenarios"][name] = run_scenario(backend, args, name, Path(args.keep or tmp), references)
    for path in args.include or []:  # scenarios measured by another run of this command
        for name, scenario in json.loads(path.read_text())["scenarios"].items():
            # judged again by this code's rules (the best fixed choice changed in session 18)
            doc["scenarios"].setdefault(name, {**scenario, "verdict": scenario_verdict(scenario["runs"]), "from": str(path),
                                               "uncompressed_floor": scenario_floor(scenario),
                                               "uncompressed_time_floor": uncompressed_time_floor(scenario.get("references") or [])})
    doc["verdict"] = overall_verdict(doc)
    doc["job"] = {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size, "lr": args.lr,
                  "lr_schedule": args.lr_schedule,
                  "bucket_cap_mb": args.bucket_cap_mb, "workers": 2, "seeds": args.seeds, "repeats": args.repeats, "eval_every": EVAL_EVERY,
                  "references": args.references,
                  "probe_interval_s": args.probe_interval_s, "probe_budget": args.probe_budget,
                  "sync_every": args.sync_every, "report_interval_s": args.report_interval_s,
                  "cluster": where,
                  ADAPTIVE: compression_of(ADAPTIVE, args),
                  "adaptive_start": CompressionConfig.model_validate(compression_of(ADAPTIVE, args)).compressor,
                  "cpu_cores": os.cpu_count(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
                  "wall_s": round(time.monotonic() - started)}
    if args.merge_only:
        doc["job"] = {**json.loads(args.include[0].read_text())["job"], "merged_from": [str(p) for p in args.include]}
    table = markdown(doc)
    print(table)
    print(json.dumps(doc["verdict"], indent=2))
    plot_path = write_results(args, doc, table)
    if plot_path:
        plot(doc, plot_path)
    print(f"[adaptive] done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
