"""Load benchmark of the coordinator: telemetry ingest at increasing rates, with many jobs and
live-page (SSE) clients, then a check that the store stayed consistent.

Runs ``gradwire serve`` (record-only launcher, SQLite in a temporary data dir) as its own
process, as in production, and drives it from this process over keep-alive HTTP/1.1
connections: one connection per job, as one rank 0 per job reports, each sending its
reports in order with the next step. The load is open-loop: reports are due on a fixed
schedule, and latency is measured from when a report was due (so a server that falls behind
shows it in the latency instead of silently slowing the generator down).

For every phase it records the achieved rate, p50/p99/max latency, errors, and the cores
other users of this shared machine kept busy meanwhile (``foreign_cores``). Afterwards, with
the coordinator stopped, it reads the SQLite file: for every job ``report_seq`` must equal
the reports acknowledged, ``step`` the last step sent, the Prometheus ``step_seconds``
count (read before stopping) the reports acknowledged, and no history row may be there twice.

    python -m benchmarks.load                      # the default campaign (about 2 minutes)
    python -m benchmarks.load --rates 500 1000 --jobs 10 --seconds 10 --json-out out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.machine import machine_busy_s
from benchmarks.outputs import write_whole
from benchmarks.repo import REPO_ROOT
from coordinator.raylocal import free_port

#: The target of issue 17: this many reports per second with p99 below TARGET_P99_MS.
TARGET_RATE = 1000
TARGET_P99_MS = 50.0

PHASES = {"data": 0.001, "forward": 0.004, "backward": 0.009, "exposed_comm": 0.003, "optimizer": 0.001,
          "compress": 0.0005, "communicate": 0.002, "decompress": 0.0004}


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a running process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuAccount:
    """Cores used, over a window, by the coordinator, by this generator, and by everyone else
    on this shared machine (``foreign``: what the figures must be read against)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> "CpuAccount":
        self._t = time.monotonic()
        self._busy = machine_busy_s()
        self._server = _cpu_seconds(self.server_pid)
        self._self = time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(1e-9, time.monotonic() - self._t)
        busy = machine_busy_s() - self._busy
        server = _cpu_seconds(self.server_pid) - self._server
        own = time.process_time() - self._self
        self.server_cores = round(server / wall, 2)
        self.generator_cores = round(own / wall, 2)
        self.foreign_cores = round(max(0.0, busy - server - own) / wall, 2)


def report_body(step: int) -> bytes:
    """A report as rank 0 sends it (the fields workers.loop fills in)."""
    return json.dumps({
        "step": step, "steps": 10_000_000, "loss": 2.0 / (1 + step), "samples_per_second": 640.0,
        "phase_seconds": PHASES, "bytes_sent_per_step": 12345.0, "bandwidth_bytes_per_second": 5e8,
        "latency_seconds": 2e-4, "compressor": "acpsgd", "compressor_rank": 4, "world_size": 2,
        "decision_version": 0, "wall_time": time.time(), "grad_norm": 1.5,
    }, separators=(",", ":")).encode()


@dataclass
class Job:
    id: str
    token: str
    sent: int = 0  # reports acknowledged with 200
    last_step: int = 0


@dataclass
class PhaseResult:
    name: str
    jobs: int
    target_rate: float
    sse_clients: int
    seconds: float
    sent: int = 0
    ok: int = 0
    errors: int = 0
    achieved_rate: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    sse_events: int = 0
    server_cores: float | None = None
    #: Coordinator CPU per acknowledged report: what the rate costs, whatever else runs.
    server_cpu_ms_per_report: float | None = None
    generator_cores: float | None = None
    foreign_cores: float | None = None
    error_samples: list[str] = field(default_factory=list)


class Coordinator:
    """``python -m coordinator.cli serve`` on a free port with a fresh data dir."""

    def __init__(self, data_dir: Path, extra_env: dict[str, str], root: Path = REPO_ROOT) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
        env.update({"GRADWIRE_DATA_DIR": str(data_dir), "GRADWIRE_PORT": str(self.port),
                    "GRADWIRE_LAUNCHER": "none", "PYTHONPATH": str(root), **extra_env})
        self.log = open(data_dir / "coordinator.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve"], cwd=root, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited: {(data_dir / 'coordinator.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the coordinator did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    match = re.search(rb"(?i)content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(match.group(1))) if match else b""
    return status, body


async def _reporter(job: Job, port: int, start: float, interval: float, until: float,
                    latencies: list[float], result: PhaseResult) -> None:
    """One job's rank 0: a report every ``interval`` seconds on one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    path = f"/v1/jobs/{job.id}/telemetry".encode()
    prefix = (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + job.token.encode() + b"\r\nContent-Length: ")
    due = start
    try:
        while due < until:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            body = report_body(job.last_step + 1)
            writer.write(prefix + str(len(body)).encode() + b"\r\n\r\n" + body)
            result.sent += 1
            try:
                status, answer = await _read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                result.errors += 1
                result.error_samples.append(f"{type(exc).__name__}")
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                due += interval
                continue
            latencies.append(time.monotonic() - due)
            if status == 200:
                result.ok += 1
                job.sent += 1
                job.last_step += 1
            else:
                result.errors += 1
                if len(result.error_samples) < 5:
                    result.error_samples.append(f"{status}: {answer[:200]!r}")
            due += interval
    finally:
        writer.close()


async def _sse_client(port: int, job: Job, until: float, counter: list[int]) -> None:
    """A live page: the job's event stream, read and counted until ``until``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /v1/jobs/{job.id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
                 .encode())
    try:
        while time.monotonic() < until:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=max(0.01, until - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if not line:
                break
            if line.startswith(b"event:"):
                counter[0] += 1
    finally:
        writer.close()


async def _phase(jobs: list[Job], port: int, server_pid: int, rate: float, seconds: float, sse_clients: int,
                 name: str) -> PhaseResult:
    result = PhaseResult(name=name, jobs=len(jobs), target_rate=rate, sse_clients=sse_clients, seconds=seconds)
    latencies: list[float] = []
    interval = len(jobs) / rate
    start = time.monotonic() + 0.2
    until = start + seconds
    sse_count = [0]
    tasks = [_reporter(job, port, start + interval * i / len(jobs), interval, until, latencies, result)
             for i, job in enumerate(jobs)]
    tasks += [_sse_client(port, jobs[i % len(jobs)], until, sse_count) for i in range(sse_clients)]
    with CpuAccount(server_pid) as cpu:
        began = time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - max(began, start)
    result.server_cores, result.generator_cores, result.foreign_cores = (
        cpu.server_cores, cpu.generator_cores, cpu.foreign_cores)
    result.achieved_rate = round(result.ok / max(elapsed, 1e-9), 1)
    if result.ok:
        result.server_cpu_ms_per_report = round(1e3 * cpu.server_cores * elapsed / result.ok, 3)
    result.sse_events = sse_count[0]
    if latencies:
        ordered = sorted(latencies)
        result.p50_ms = round(1e3 * statistics.median(ordered), 2)
        result.p99_ms = round(1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)
        result.max_ms = round(1e3 * ordered[-1], 2)
    return result


def _submit_jobs(url: str, count: int, prefix: str) -> list[Job]:
    jobs = []
    with httpx.Client(timeout=30) as http:
        for i in range(count):
            spec = {"name": f"{prefix}-{i}", "steps": 10_000_000, "workers": 2,
                    "compression": {"mode": "fixed", "compressor": "acpsgd", "rank": 4}}
            answer = http.post(f"{url}/v1/jobs", json=spec)
            answer.raise_for_status()
            body = answer.json()
            jobs.append(Job(id=body["id"], token=body["worker_token"]))
    return jobs


def _step_seconds_counts(url: str) -> dict[str, int]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts: dict[str, int] = {}
    for match in re.finditer(r'^gradwire_step_seconds_count\{[^}]*job="([^"]+)"[^}]*\} ([0-9.e+]+)$', text, re.M):
        counts[match.group(1)] = counts.get(match.group(1), 0) + int(float(match.group(2)))
    return counts


def check_consistency(db: Path, jobs: list[Job], metric_counts: dict[str, int]) -> dict[str, Any]:
    """Compare what the store holds with what the generator had acknowledged."""
    problems: list[str] = []
    with sqlite3.connect(db) as conn:
        rows = {job_id: (seq, step) for job_id, seq, step in conn.execute("SELECT id, report_seq, step FROM jobs")}
        duplicates = conn.execute(
            "SELECT job_id, step, COUNT(*) FROM telemetry GROUP BY job_id, step HAVING COUNT(*) > 1").fetchall()
        history_rows = conn.execute("SELECT COUNT(*) FROM telemetry").fetchone()[0]
    for job in jobs:
        seq, step = rows.get(job.id, (None, None))
        if seq != job.sent:
            problems.append(f"job {job.id}: report_seq {seq}, acknowledged {job.sent}")
        if step != job.last_step:
            problems.append(f"job {job.id}: step {step}, last acknowledged {job.last_step}")
        if metric_counts.get(job.id, 0) != job.sent:
            problems.append(f"job {job.id}: step_seconds count {metric_counts.get(job.id, 0)}, "
                            f"acknowledged {job.sent}")
    problems += [f"job {job_id}: history step {step} stored {n} times" for job_id, step, n in duplicates]
    return {"jobs": len(jobs), "reports_acknowledged": sum(j.sent for j in jobs), "history_rows": history_rows,
            "duplicate_history_rows": len(duplicates), "problems": problems[:20], "consistent": not problems}


def _campaign(servers: dict[str, Coordinator], rates: list[float], job_counts: list[int], seconds: float,
              sse_clients: int) -> tuple[list[PhaseResult], dict[str, list[Job]]]:
    """Every phase on every server in turn (side by side: the same foreign load for both)."""
    phases: list[PhaseResult] = []
    jobs_of: dict[str, list[Job]] = {label: [] for label in servers}
    batches: dict[tuple[str, int], list[Job]] = {}
    plan = [(count, rate, 0) for count in job_counts for rate in rates]
    if sse_clients:
        plan.append((job_counts[0], max(rates), sse_clients))
    for count, rate, sse in plan:
        for label, server in servers.items():
            if (label, count) not in batches:  # one set of jobs per job count, reused across rates
                batches[label, count] = _submit_jobs(server.url, count, f"load{count}")
                jobs_of[label] += batches[label, count]
            name = f"{count} jobs @ {rate:g}/s" + (f" + {sse} SSE clients" if sse else "")
            if len(servers) > 1:
                name = f"[{label}] {name}"
            result = asyncio.run(_phase(batches[label, count], server.port, server.proc.pid, rate, seconds, sse,
                                        name))
            phases.append(result)
            print(_line(result), flush=True)
    return phases, jobs_of


def run(rates: list[float], job_counts: list[int], seconds: float, sse_clients: int,
        extra_env: dict[str, str], baseline: Path | None = None) -> dict[str, Any]:
    roots = {"this tree": REPO_ROOT, **({"baseline": baseline} if baseline else {})}
    with tempfile.TemporaryDirectory(prefix="gradwire-load-") as tmp:
        servers: dict[str, Coordinator] = {}
        consistency: dict[str, Any] = {}
        try:
            for i, (label, root) in enumerate(roots.items()):
                data_dir = Path(tmp) / f"server{i}"
                data_dir.mkdir()
                servers[label] = Coordinator(data_dir, extra_env, root)
            phases, jobs_of = _campaign(servers, rates, job_counts, seconds, sse_clients)
            counts = {label: _step_seconds_counts(server.url) for label, server in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
        for label, server in servers.items():
            consistency[label] = check_consistency(server.data_dir / "gradwire.db", jobs_of[label], counts[label])
            c = consistency[label]
            print(f"[{label}] store consistency: {'OK' if c['consistent'] else 'BROKEN'} "
                  f"({c['reports_acknowledged']} reports, {c['history_rows']} history rows, "
                  f"{c['duplicate_history_rows']} duplicated) {c['problems'][:3]}")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "target": {"rate": TARGET_RATE, "p99_ms": TARGET_P99_MS},
            "phases": [asdict(p) for p in phases], "consistency": consistency,
            "command": "python -m benchmarks.load " + " ".join(sys.argv[1:])}


def _line(r: PhaseResult) -> str:
    sse = f", {r.sse_events} SSE events" if r.sse_clients else ""
    return (f"{r.name:<36} achieved {r.achieved_rate:7.1f}/s  p50 {r.p50_ms:6.1f} ms  p99 {r.p99_ms:7.1f} ms  "
            f"max {r.max_ms:7.1f} ms  errors {r.errors}{sse}  (server {r.server_cpu_ms_per_report} ms CPU/report; "
            f"cores: server {r.server_cores}, "
            f"generator {r.generator_cores}, foreign {r.foreign_cores})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[250, 500, 1000, 1250],
                        help="target reports per second, one phase each")
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 50], help="jobs reporting at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--sse-clients", type=int, default=20, help="event-stream clients in the last phase")
    parser.add_argument("--env", nargs="*", default=[], help="extra GRADWIRE_X=Y settings for the coordinator")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout (e.g. /work/main) whose coordinator runs every phase too, "
                             "side by side with this tree's")
    parser.add_argument("--json-out", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)
    results = run(args.rates, args.jobs, args.seconds, args.sse_clients, extra, args.baseline)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.json_out, json.dumps(results, indent=2) + "\n")
    return 0 if all(c["consistent"] for c in results["consistency"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
