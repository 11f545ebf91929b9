"""Which result files of the benchmark can be judged together: the same job but its seeds, on
seeds of their own.

Why a module of its own: the rejudge (``benchmarks.adaptive.rejudge --also``), which evaluates
the kept runs again, and the merge from stored figures (``benchmarks.adaptive.merge_seeds``)
must refuse the same mixtures before they judge anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

#: Job fields that may differ between runs judged together: the seeds are the point; the rest
#: says when, where, how long and on which commit (listed by the merge, not checked: a change
#: to the benchmarks or the docs leaves the runs comparable, and the README says which code ran).
JOB_FIELDS_FREE = frozenset({"seeds", "date", "wall_s", "cpu_cores", "cluster", "merged_from", "commit"})


def seeds_of(scenario: dict[str, Any]) -> set[Any]:
    """The seeds a scenario's stored runs ran on (None: a one-seed file of before session 19)."""
    return {stored.get("seed") for entry in scenario["runs"].values() for stored in entry.get("repeats") or [entry]}


def check_together(names: Sequence[str], files: Sequence[tuple[Path, dict[str, Any]]], same_targets: bool = True) -> None:
    """Result files are judged together only where every one holds every one of ``names`` and
    ran the same job (but its seeds), schedule and labels, on seeds of its own; with
    ``same_targets`` also by the same target rule (the merge takes the stored times as they
    are; the rejudge judges every run anew, so it need not). A ValueError naming the files if
    not."""
    (first, model_doc), others = files[0], files[1:]
    for path, doc in others:
        mine = {k: v for k, v in doc.get("job", {}).items() if k not in JOB_FIELDS_FREE}
        theirs = {k: v for k, v in model_doc.get("job", {}).items() if k not in JOB_FIELDS_FREE}
        if mine != theirs:
            differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            raise ValueError(f"{path} ran another job than {first} (differs in {', '.join(differ)})")
    compared = {"schedule_text": "ran"}
    if same_targets:
        compared["target_from"] = "took its targets from"
    for name in names:
        where: dict[Any, Path] = {}
        for path, doc in files:
            if name not in doc["scenarios"]:
                raise ValueError(f"{name}: not in {path}; name the scenarios every file holds with --scenario")
            scenario, model = doc["scenarios"][name], model_doc["scenarios"][name]
            for key, what in compared.items():
                if scenario.get(key) != model.get(key):
                    raise ValueError(f"{name}: {path} {what} {scenario.get(key)!r}, {first} {model.get(key)!r}")
            if set(scenario["runs"]) != set(model["runs"]):
                raise ValueError(f"{name}: {path} ran {sorted(scenario['runs'])}, {first} {sorted(model['runs'])}")
            seeds = seeds_of(scenario)
            if len(files) > 1 and None in seeds:
                raise ValueError(f"{name}: {path} does not record its runs' seeds; it can only be judged alone")
            for seed in seeds:
                if seed in where:
                    raise ValueError(f"{name}: seed {seed} is in both {where[seed]} and {path}")
                where[seed] = path
