"""Build the gradwire Grafana dashboard from code: ``dashboards/grafana/gradwire.json``.

Why code and not hand-edited JSON: Grafana's JSON model is large and easy to break by hand
(panel ids, grid positions, datasource references, template variables). The typed builders of
Grafana's own ``grafana-foundation-sdk`` produce a model Grafana accepts, and a reviewer reads
the PromQL here, next to the metric names of ``coordinator/metrics.py``.

    python dashboards/generate.py           # rewrite the committed JSON
    python dashboards/generate.py --check   # exit 1 when the committed JSON is stale (CI)

The JSON is what Grafana loads (provisioning, or ``gradwire dashboards push``), and what the
tests run against a real Prometheus: every target below must return data for a real job.

Label conventions (docs/coordinator.md, "Metrics"): the coordinator labels every job series with ``job`` = the
gradwire job id; Prometheus keeps it because it scrapes with ``honor_labels: true``.
``gradwire_jobs{state}`` has no job label (it counts all jobs of a coordinator).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).resolve().parent / "grafana" / "gradwire.json"

DASHBOARD_UID = "gradwire"
#: The dashboard names its datasource by uid; provisioning and ``gradwire dashboards push``
#: create the Prometheus datasource with this uid, so the panels find it in any Grafana.
DATASOURCE_UID = "gradwire-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)

#: Selector of the jobs picked in the ``job`` variable (multi-select: a regex match).
JOB = 'job=~"$job"'
#: Phases that add up to a step (docs/step.md, "Timing phases"). compress/communicate/decompress run inside
#: ``backward`` (the DDP hook), so stacking them too would count that time twice.
STEP_PHASES = "data|forward|backward|exposed_comm|optimizer"
HOOK_PHASES = "compress|communicate|decompress"


def _mean_per_step(selector: str, by: str) -> str:
    """Mean seconds per step over the window, from a histogram with one observation per
    telemetry report: rate(sum)/rate(count). Unlike a quantile it stays exact with our
    coarse buckets, and unlike the last value it does not jump with each report."""
    return (f"sum by ({by}) (rate(gradwire_step_phase_seconds_sum{{{selector}}}[$__rate_interval]))"
            f" / sum by ({by}) (rate(gradwire_step_phase_seconds_count{{{selector}}}[$__rate_interval]))")


def _query(expr: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    return (prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id)
            .range().datasource(DATASOURCE))


def _timeseries(title: str, description: str, unit: str, *queries: prometheus.Dataquery,
                stacked: bool = False, width: int = 12) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).height(8).span(width)
             .legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
             .line_width(1).fill_opacity(10 if not stacked else 60))
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _panels() -> list[tuple[str, list[Any]]]:
    """The dashboard's rows and their panels, in reading order."""
    step_time = _timeseries(
        "Step time by phase",
        "Mean seconds per step in each phase (data, forward, backward incl. overlapped "
        "communication, exposed communication, optimizer), stacked: the stack is the step time.",
        "s",
        _query(_mean_per_step(f'{JOB}, phase=~"{STEP_PHASES}"', "job, phase"), "{{phase}} ({{job}})"),
        stacked=True)
    exposed = _timeseries(
        "Exposed communication",
        "Seconds per step spent waiting for communication after backward compute ended "
        "(exposed_comm), next to the hook's own compress / communicate / decompress time "
        "(those overlap with backward).",
        "s",
        _query(_mean_per_step(f'{JOB}, phase="exposed_comm"', "job"), "exposed ({{job}})", "A"),
        _query(_mean_per_step(f'{JOB}, phase=~"{HOOK_PHASES}"', "job, phase"), "{{phase}} ({{job}})", "B"))
    step_by_compressor = _timeseries(
        "Step time by compressor",
        "Mean seconds per training step, split by the compressor in use at the time.",
        "s",
        _query(f"sum by (job, compressor) (rate(gradwire_step_seconds_sum{{{JOB}}}[$__rate_interval]))"
               f" / sum by (job, compressor) (rate(gradwire_step_seconds_count{{{JOB}}}[$__rate_interval]))",
               "{{compressor}} ({{job}})"),
        width=24)
    bandwidth = _timeseries(
        "Measured bandwidth",
        "Collective bandwidth the workers measured (active probe, passive estimate between probes).",
        "Bps",
        _query(f"gradwire_network_bandwidth_bytes_per_second{{{JOB}}}", "{{job}}"))
    latency = _timeseries(
        "Measured latency",
        "Per-message latency (alpha of the alpha-beta fit of all-reduce).",
        "s",
        _query(f"gradwire_network_latency_seconds{{{JOB}}}", "{{job}}"))
    compressor = (
        statetimeline.Panel().title("Compressor and rank")
        .description("Which compressor (and rank) each job uses over time; a change is a policy switch.")
        .datasource(DATASOURCE).height(6).span(24)
        .with_target(_query(f"max by (job, compressor, compressor_rank) (gradwire_compressor_info{{{JOB}}})",
                            "{{job}}: {{compressor}} rank {{compressor_rank}}"))
        .mappings([ValueMap(options={"1": ValueMappingResult(text="in use", color="green")})])
        .show_value(common.VisibilityMode.NEVER).merge_values(True).fill_opacity(80))
    wire = _timeseries(
        "Bytes on the wire",
        "Bytes per second all ranks put into collectives.",
        "Bps",
        _query(f"sum by (job, compressor) (rate(gradwire_comm_bytes_total{{{JOB}}}[$__rate_interval]))",
               "{{compressor}} ({{job}})"))
    ratio = _timeseries(
        "Compression ratio",
        "Uncompressed over compressed bytes per step for the compressor in use.",
        "suffix:x",
        _query(f"gradwire_compression_ratio{{{JOB}}}", "{{compressor}} ({{job}})"))
    loss = _timeseries(
        "Training loss", "Latest training loss rank 0 reported.", "none",
        _query(f"gradwire_train_loss{{{JOB}}}", "{{job}}"))
    throughput = _timeseries(
        "Throughput", "Training samples per second over all workers.", "suffix: samples/s",
        _query(f"gradwire_samples_per_second{{{JOB}}}", "{{job}}"))
    jobs = (
        stat.Panel().title("Jobs by state")
        .description("Jobs the coordinator knows, by state (all jobs, not only the selected ones).")
        .datasource(DATASOURCE).height(6).span(24).unit("none")
        .with_target(_query("sum by (state) (gradwire_jobs)", "{{state}}"))
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return [
        ("Step time", [step_time, exposed, step_by_compressor]),
        ("Network", [bandwidth, latency]),
        ("Compression", [compressor, wire, ratio]),
        ("Training", [loss, throughput, jobs]),
    ]


#: Annotation: a mark where a job's compressor changed. The counter only exists once the
#: first switch happened, so a series that just appeared is a switch too (``unless offset``);
#: ``changes()`` catches the later ones.
SWITCH_EXPR = (f"(changes(gradwire_policy_switches_total{{{JOB}}}[$__interval]) > 0)"
               f" or (gradwire_policy_switches_total{{{JOB}}}"
               f" unless gradwire_policy_switches_total{{{JOB}}} offset $__interval)")


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    job_variable = (
        dash.QueryVariable("job").label("Job").description("gradwire job id (the coordinator's `job` label)")
        .datasource(DATASOURCE).query("label_values(gradwire_step_seconds_count, job)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True))
    switches = (
        dash.AnnotationQuery().name("Policy switches").datasource(DATASOURCE).enable(True)
        .icon_color("orange").expr(SWITCH_EXPR))
    builder = (
        dash.Dashboard("gradwire").uid(DASHBOARD_UID)
        .description("Compressed, adaptive data-parallel training: step phases, network, compressor, loss.")
        .tags(["gradwire", "training"]).refresh("10s").time("now-30m", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR).timezone("browser")
        .with_variable(job_variable).annotation(switches))
    next_id = 1
    for title, panels in _panels():
        builder = builder.with_row(dash.Row(title).id(next_id))
        next_id += 1
        for panel in panels:
            builder = builder.with_panel(panel.id(next_id))
            next_id += 1
    model = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    # Prometheus annotation options the SDK's generic AnnotationQuery has no field for.
    for annotation in model["annotations"]["list"]:
        annotation.update({"titleFormat": "compressor switch", "tagKeys": "job", "step": "15s",
                           "useValueForTime": False})
    return model


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default {OUTPUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current == text:
            print(f"{args.output} is up to date")
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "committed", "generated", lineterm="")
        print("\n".join(list(diff)[:60]), file=sys.stderr)
        print(f"{args.output} is stale: run `python dashboards/generate.py`", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
