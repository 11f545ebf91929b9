"""``python -m benchmarks.cluster up|rate|down|scenario|demo``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.adaptive import parse_schedule
from benchmarks.cluster.errors import ClusterError
from benchmarks.cluster.nodes import Cluster, available
from benchmarks.cluster.results import plot, scenario
from benchmarks.cluster.scenario import (
    DEFAULT_SCHEDULE,
    NODE_LOSS_SCHEDULE,
    QUICK_SCHEDULE,
    SCENARIO_ALLOWED,
    SCENARIO_RANK,
    ScenarioOptions,
    run_scenario,
)
from benchmarks.cluster.state import live_states, one_state, sweep_stale
from benchmarks.machine import LOCK_PATH, bench_lock, wait_for_quiet
from benchmarks.outputs import write_json_and_table
from benchmarks.testbed import TestbedError, alive, set_link_rate
from coordinator.client import ApiError, Client

# --------------------------------------------------------------------------- CLI


def markdown(doc: dict[str, Any]) -> str:
    """The run for the README: switches, then one row per phase of the schedule."""
    lines = [f"job `{doc['job_id']}`: {doc['state']}, {doc['wall_s']:.0f} s from submission to the end; "
             f"machine's foreign load {doc['foreign_cores']} cores of {doc['cluster']['machine_cores']}", "",
             "| switch at step | decided at step | from | to | source | reason |", "|---:|---:|---|---|---|---|"]
    for s in doc["switches"]:
        lines.append(f"| {s['step'] if s['step'] is not None else '-'} | {s['decided_at_step']} | {s['from']} | "
                     f"{s['to']} | {s['source']} | {s['reason']} |")
    lines += ["", "| link set | steps | rate changed at step | bandwidth measured | compressor(s) | s | ms/step | "
              "data | forward | backward | exposed comm | optimizer | compress | communicate | decompress |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for phase, change in zip(doc["phases"], doc["rate_changes"]):
        ms = phase["phase_ms"]
        cells = " | ".join(f"{ms.get(k, 0):.1f}" for k in ("data", "forward", "backward", "exposed_comm", "optimizer",
                                                          "compress", "communicate", "decompress"))
        lines.append(f"| {phase['mbit']:g} Mbit/s | {phase['steps']} | {change['step']} | "
                     f"{phase['bandwidth_mbit_seen']} Mbit/s | {', '.join(phase['compressors'])} | {phase['seconds']} | "
                     f"{phase['ms_per_step']} | {cells} |")
    if doc.get("world_sizes"):
        lines += ["", "world size: " + ", ".join(f"{w['world_size']} from step {w['step']}" for w in doc["world_sizes"])]
    if doc.get("restarts"):
        lines += ["restarts: " + ", ".join(f"last step {r['last_step']} -> resumed from {r['resumed_from']} "
                                          f"({r['steps_lost']} steps lost)" for r in doc["restarts"])]
    prom = doc["prometheus"]
    lines += [f"Prometheus: compressors {', '.join(prom['compressors_seen'])}; {prom['phase_series']} phase series "
              f"({', '.join(prom['phases_seen'])}); ranks switched at the same steps: {doc['ranks_switch_at_the_same_step']}",
              "", "verdict: " + json.dumps(doc["verdict"])]
    return "\n".join(lines) + "\n"


def _refuse() -> int | None:
    ok, why = available()
    if not ok:
        print(f"benchmarks.cluster: cannot start the emulated cluster: {why}", file=sys.stderr)
        return 2
    return None


def _up(args: argparse.Namespace) -> int:
    if (code := _refuse()) is not None:
        return code
    with Cluster(nodes=args.nodes, mbit=args.mbit) as cluster:
        print(f"cluster up: {cluster.nodes} nodes at {cluster.mbit:g} Mbit/s, Ray head {cluster.ray_address}")
        print(f"coordinator: {cluster.url}  (GRADWIRE_URL={cluster.url} GRADWIRE_TOKEN={cluster.token})")
        print(f"live page:   {cluster.url}/#token={cluster.token}")
        print(f"prometheus:  {cluster.prometheus_url}")
        print("change a rate: python -m benchmarks.cluster rate MBIT [--node N]; stop: Ctrl-C or "
              "python -m benchmarks.cluster down", flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping the cluster")
    return 0


def _rate(args: argparse.Namespace) -> int:
    state = one_state(args.pid)
    nodes = range(state["nodes"]) if args.node is None else [args.node]
    for node in nodes:
        if str(node) not in state["links"]:
            raise ClusterError(f"node: {node} is not a node of the cluster (0..{state['nodes'] - 1})")
        for ns, dev in state["links"][str(node)]:
            set_link_rate(ns, dev, args.mbit)
    where = "every link" if args.node is None else f"node {args.node}'s link"
    print(f"{where}: {args.mbit:g} Mbit/s")
    return 0


def _down(args: argparse.Namespace) -> int:
    states = live_states() if args.pid is None else [one_state(args.pid)]
    for state in states:
        os.kill(int(state["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(int(state["pid"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"stopped the cluster of process {state['pid']}")
    removed = sweep_stale()
    if removed:
        print(f"removed stale namespaces: {', '.join(removed)}")
    if not states and not removed:
        print("no emulated cluster was running")
    return 0


def _scenario(args: argparse.Namespace) -> int:
    if (code := _refuse()) is not None:
        return code
    default = NODE_LOSS_SCHEDULE if args.kill_node_at is not None else QUICK_SCHEDULE if args.quick else DEFAULT_SCHEDULE
    schedule = parse_schedule(args.schedule or default)
    opts = ScenarioOptions(
        schedule=schedule, model=args.model, batch_size=args.batch_size, start=args.start, allowed=args.allowed,
        min_rank=args.min_rank, max_rank=args.max_rank, gain_threshold=args.gain_threshold,
        min_dwell_s=args.min_dwell_s, probe_interval_s=args.probe_interval_s, probe_budget=args.probe_budget,
        report_interval_s=args.report_interval_s,
        checkpoint_every=args.checkpoint_every if args.kill_node_at is None else (args.checkpoint_every or 50),
        kill_node_at=args.kill_node_at, restore_after_s=args.restore_after_s, timeout_s=args.timeout_s,
    )
    print(f"[cluster] waiting for {LOCK_PATH} (other benchmarks measuring) and a quiet machine", flush=True)
    with bench_lock():
        wait_for_quiet(args.max_wait_quiet_s)
        started = time.monotonic()
        with Cluster(nodes=2, mbit=schedule[0].mbit, keep_workdir=args.keep) as cluster:
            print(f"[cluster] up in {time.monotonic() - started:.0f} s (workdir {cluster.workdir})", flush=True)
            doc = scenario(cluster, opts, log=lambda m: print(m, flush=True))
    doc["total_wall_s"] = round(time.monotonic() - started, 1)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps({k: doc[k] for k in ("state", "switches", "world_sizes", "phases", "verdict")}, indent=1))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_json_and_table(args.json_out, doc, markdown(doc))
        plot(doc, args.plot or args.json_out.with_suffix(".png"))
    print(f"[cluster] done in {doc['total_wall_s']:.0f} s")
    return 0 if doc["state"] == "succeeded" else 1


def _demo(args: argparse.Namespace) -> int:
    """``gradwire demo --network``: the scenario with a live view, for a newcomer.

    The live progress (``coordinator.console.watch``) follows the job while a thread walks
    the rate schedule; the end shows the coordinator's summary and, per phase of the
    schedule, the bandwidth the workers measured, the compressor and the time per phase.
    """
    import threading

    from rich.console import Console
    from rich.table import Table

    from coordinator.console import summary_table, watch

    console = Console()
    ok, why = available()
    if not ok:
        console.print(f"[red]the network demo needs root and network namespaces:[/] {why}\n"
                      "run `gradwire demo` (loopback, no adaptation) or, as root, `gradwire demo --network`")
        return 2
    opts = ScenarioOptions(schedule=parse_schedule(args.schedule))
    submitted = threading.Event()
    holder: dict[str, Any] = {}

    def on_submitted(job_id: str) -> None:
        holder["job_id"] = job_id
        submitted.set()

    def drive(cluster: Cluster) -> None:
        try:
            holder["doc"] = run_scenario(cluster, opts, log=lambda m: console.print(f"[dim]{m}[/]"),
                                         on_submitted=on_submitted)
        except BaseException as exc:  # noqa: BLE001 - shown by the main thread
            holder["error"] = exc
            submitted.set()

    with console.status("starting a 2-node Ray cluster in network namespaces (coordinator, Prometheus)…"):
        cluster = Cluster(nodes=2, mbit=opts.schedule[0].mbit).start()
    try:
        console.print(f"cluster: Ray head {cluster.ray_address}, worker node {cluster.address(1)}, one CPU each, "
                      f"links shaped with tc; schedule {args.schedule} (Mbit/s:steps)")
        thread = threading.Thread(target=drive, args=(cluster,), name="gw-demo-schedule", daemon=True)
        thread.start()
        submitted.wait()
        if "error" in holder:
            raise holder["error"]
        job_id = holder["job_id"]
        console.print(f"live page:  [link]{cluster.url}/?job={job_id}#token={cluster.token}[/link]")
        console.print(f"metrics:    [link]{cluster.url}/metrics[/link]   Prometheus: [link]{cluster.prometheus_url}[/link]")
        client = Client(cluster.url, cluster.token)
        watch(client, job_id, console)
        thread.join()
        if "error" in holder:
            raise holder["error"]
        console.print(summary_table(client.history(job_id)))
        table = Table(title="per phase of the schedule (medians over telemetry reports)")
        for column in ("link set", "measured", "steps", "ms/step", "compressor", "data", "forward", "backward",
                       "exposed comm", "optimizer"):
            table.add_column(column, justify="right")
        for phase in holder["doc"]["phases"]:
            ms = phase["phase_ms"]
            table.add_row(f"{phase['mbit']:g} Mbit/s", f"{phase['bandwidth_mbit_seen'] or 0:g} Mbit/s", str(phase["steps"]),
                          f"{phase['ms_per_step'] or 0:.1f}", ", ".join(phase["compressors"]),
                          *(f"{ms.get(k, 0):.1f}" for k in ("data", "forward", "backward", "exposed_comm", "optimizer")))
        console.print(table)
        client.close()
        if args.keep:
            console.print(f"[bold]--keep[/]: the cluster stays up ({cluster.url}/#token={cluster.token}); Ctrl-C stops it")
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0 if holder["doc"]["state"] == "succeeded" else 1
    finally:
        with console.status("stopping the cluster…"):
            cluster.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C or `down`")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--mbit", type=float, default=1000.0)
    rate = sub.add_parser("rate", help="change the link rate of a running cluster")
    rate.add_argument("mbit", type=float)
    rate.add_argument("--node", type=int, default=None, help="only this node's link (default: every link)")
    rate.add_argument("--pid", type=int, default=None, help="the cluster of this `up` process")
    down = sub.add_parser("down", help="stop running clusters and remove what killed ones left")
    down.add_argument("--pid", type=int, default=None)
    sc = sub.add_parser("scenario", help="the whole loop: REST job, rate schedule, coordinator switches, Prometheus")
    sc.add_argument("--quick", action="store_true", help=f"schedule {QUICK_SCHEDULE} (within 10 minutes)")
    sc.add_argument("--schedule", default=None,
                    help=f"MBIT:STEPS,... (default {DEFAULT_SCHEDULE}; with --kill-node-at {NODE_LOSS_SCHEDULE})")
    sc.add_argument("--model", default="mlp")
    sc.add_argument("--batch-size", type=int, default=32)
    sc.add_argument("--start", default="none", help="the job's first compressor")
    sc.add_argument("--allowed", nargs="+", default=list(SCENARIO_ALLOWED),
                    help="compressors the policy may choose (see SCENARIO_ALLOWED)")
    sc.add_argument("--min-rank", type=int, default=SCENARIO_RANK)
    sc.add_argument("--max-rank", type=int, default=SCENARIO_RANK)
    sc.add_argument("--gain-threshold", type=float, default=0.10)
    sc.add_argument("--min-dwell-s", type=float, default=5.0,
                    help="the policy's dwell, scaled to phases of tens of seconds (job default 30 s)")
    sc.add_argument("--probe-interval-s", type=float, default=3.0)
    sc.add_argument("--probe-budget", type=float, default=0.05,
                    help="probe share of run time, scaled up with the short phases (job default 0.02)")
    sc.add_argument("--report-interval-s", type=float, default=0.5)
    sc.add_argument("--checkpoint-every", type=int, default=0, help="(node loss: default 50)")
    sc.add_argument("--kill-node-at", type=int, default=None,
                    help="kill node 1's Ray processes at this step (workers 1..2), bring it back later")
    sc.add_argument("--restore-after-s", type=float, default=10.0,
                    help="the killed node returns this long after the job has shrunk to the other node")
    sc.add_argument("--timeout-s", type=float, default=900.0)
    sc.add_argument("--max-wait-quiet-s", type=float, default=20.0,
                    help="before the run, wait up to this long for other work to leave the CPUs")
    sc.add_argument("--json-out", type=Path, default=None)
    sc.add_argument("--plot", type=Path, default=None, help="PNG (default: beside --json-out)")
    sc.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    demo = sub.add_parser("demo", help="the scenario with a live view (what `gradwire demo --network` runs)")
    demo.add_argument("--schedule", default=QUICK_SCHEDULE, help=f"MBIT:STEPS,... (default {QUICK_SCHEDULE})")
    demo.add_argument("--keep", action="store_true", help="keep the cluster up after the job, until Ctrl-C")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return {"up": _up, "rate": _rate, "down": _down, "scenario": _scenario, "demo": _demo}[args.cmd](args)
    except (ClusterError, TestbedError, ApiError, ValueError) as exc:
        print(f"benchmarks.cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
