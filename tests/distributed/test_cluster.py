"""The emulated multi-node Ray cluster and gradwire's whole loop on it (``benchmarks.cluster``).

Real parts only: network namespaces joined by ``tc``-shaped veths, a Ray head and a Ray
worker node (one CPU each, one Ray Train worker on each), ``gradwire serve`` beside the
head, Debian's Prometheus scraping it, jobs submitted over REST. Skipped, with the reason,
where namespaces cannot be made (no root, no ``ip netns``) or Ray/Prometheus are missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest

from benchmarks import cluster as cl
from benchmarks.adaptive import parse_schedule
from benchmarks.machine import wait_for_quiet
from benchmarks.testbed import list_namespaces
from coordinator import raylocal

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("emulated_cluster_available")]


def leftovers(pid: int, workdir: Path | None = None) -> dict[str, list[str]]:
    """What a cluster created by process ``pid`` could have left behind."""
    namespaces = [ns for ns in list_namespaces() if ns.startswith(f"gw-{pid}-")]
    processes = []
    if workdir is not None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if str(workdir).encode() in (entry / "cmdline").read_bytes():
                        processes.append(entry.name)
                except OSError:
                    pass
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    state = cl.STATE_DIR / f"{pid}.json"
    return {"namespaces": namespaces, "processes": processes,
            "state": [str(state)] if state.exists() else [],
            "workdir": [str(workdir)] if workdir is not None and workdir.exists() else [],
            "links": [line for line in links.splitlines() if workdir is not None and str(pid) in line and "gwm" in line]}


def nothing(found: dict[str, list[str]]) -> bool:
    return not any(found.values())


def ray_nodes(cluster: cl.Cluster) -> int:
    """Alive Ray nodes, as the head's GCS reports them (`ray status` inside node 0)."""
    out = subprocess.run(["ip", "netns", "exec", cluster.namespace(0), raylocal._ray_executable(), "status",
                          f"--address={cluster.ray_address}"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "RAY_AUTH_MODE": "token"}).stdout
    active = out.split("Active:", 1)[1].split("Pending:", 1)[0]
    return sum(1 for line in active.splitlines() if "node_" in line)


def test_the_cluster_comes_up_with_every_part_and_leaves_nothing_behind() -> None:
    with cl.Cluster(nodes=2, mbit=500) as cluster:
        workdir = cluster.workdir
        assert ray_nodes(cluster) == 2
        health = httpx.get(f"{cluster.url}/healthz", timeout=5).json()
        assert health["ray"] == "connected"
        # /v1 needs the token: the coordinator listens beyond loopback
        assert httpx.get(f"{cluster.url}/v1/jobs", timeout=5).status_code == 401
        assert httpx.get(f"{cluster.url}/v1/jobs", headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=5).status_code == 200
        # Prometheus scrapes the coordinator for real
        deadline = time.monotonic() + 20
        while True:
            up = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": "up"}, timeout=5).json()
            values = [r["value"][1] for r in up["data"]["result"]]
            if values == ["1"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert values == ["1"]
        # one link's rate, then every link's, as tc shows it on both ends
        cluster.set_rate(50, node=1)
        for ns, dev in cluster.testbed.link_ends(1):
            assert "rate 50Mbit" in subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                                                   capture_output=True, text=True).stdout
        state = json.loads((cl.STATE_DIR / f"{os.getpid()}.json").read_text())
        assert state["url"] == cluster.url and set(state["links"]) == {"0", "1"}
    assert nothing(leftovers(os.getpid(), workdir)), leftovers(os.getpid(), workdir)


def _start_up(tmp_path: Path, name: str) -> tuple[subprocess.Popen, dict]:
    """``python -m benchmarks.cluster up`` as its own process; wait for its state file."""
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.cluster", "up", "--nodes", "2", "--mbit", "200"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    path = cl.STATE_DIR / f"{proc.pid}.json"
    deadline = time.monotonic() + 180
    while not path.exists():
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        assert time.monotonic() < deadline, "`up` did not come up"
        time.sleep(0.5)
    time.sleep(0.5)  # the file is written whole, then the command prints its URLs
    return proc, json.loads(path.read_text())


def test_ctrl_c_and_a_killed_run_leave_nothing_and_a_second_up_works(tmp_path: Path) -> None:
    # Ctrl-C on `up`: everything goes
    proc, state = _start_up(tmp_path, "first")
    assert httpx.get(f"{state['url']}/healthz", timeout=5).status_code == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == 0
    assert nothing(leftovers(proc.pid, Path(state["workdir"]))), leftovers(proc.pid, Path(state["workdir"]))

    # SIGKILL: no handler runs, so namespaces (with the Ray nodes in them) stay ...
    proc, state = _start_up(tmp_path, "killed")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert leftovers(proc.pid)["namespaces"], "a hard-killed cluster should have left its namespaces"
    # ... until the next `up` sweeps them by their dead creator, and comes up itself
    second, second_state = _start_up(tmp_path, "second")
    try:
        assert nothing(leftovers(proc.pid, Path(state["workdir"]))), leftovers(proc.pid, Path(state["workdir"]))
        assert httpx.get(f"{second_state['url']}/healthz", timeout=5).json()["ray"] == "connected"
        # `rate` and `down` from another process act on the running cluster
        rate = subprocess.run([sys.executable, "-m", "benchmarks.cluster", "rate", "30", "--pid", str(second.pid)],
                              cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert rate.returncode == 0, rate.stderr
        for ends in second_state["links"].values():
            for ns, dev in ends:
                assert "rate 30Mbit" in subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                                                       capture_output=True, text=True).stdout
        down = subprocess.run([sys.executable, "-m", "benchmarks.cluster", "down", "--pid", str(second.pid)],
                              cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert down.returncode == 0, down.stderr
        second.wait(timeout=60)
        assert nothing(leftovers(second.pid, Path(second_state["workdir"])))
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=60)


def test_the_coordinator_switches_soon_after_a_drop_and_back_after_a_rise() -> None:
    """REST job on two Ray nodes; the coordinator's policy (not the in-process one) must move
    to compression within a few reports of the drop and to a less lossy choice after the rise.

    The rise is only a rise if the CPUs can fill the faster link: with both cores taken by
    other work the workers measure ~500 Mbit/s on the 2000 Mbit/s link, where rank 64 stays
    the faster choice (as it should). So a run without the switch back is repeated once,
    after waiting for a quiet machine, and each attempt records the foreign load it had."""
    opts = cl.ScenarioOptions(schedule=parse_schedule("2000:120,20:80,2000:600"))
    for attempt in range(2):
        wait_for_quiet(30.0)
        with cl.Cluster(nodes=2, mbit=2000) as cluster:
            doc = cl.scenario(cluster, opts, log=lambda m: None)
        if doc["verdict"]["switch_to_less_lossy_after_recovery"] is not None:
            break
        last = doc["verdicts"][-1]["verdict"] if doc["verdicts"] else None
        warnings.warn(f"attempt {attempt + 1}: no switch back after the rise (foreign load "
                      f"{doc['foreign_cores']} cores, bandwidth seen {doc['phases'][-1]['bandwidth_mbit_seen']} Mbit/s; "
                      f"the policy's last verdict: {last})", stacklevel=1)
    verdict = doc["verdict"]
    assert doc["state"] == "succeeded", doc["reason"]
    assert verdict["switch_to_compression_while_slow"] is not None, doc["switches"]
    assert verdict["reports_from_drop_to_switch"] <= 20, doc["switches"]
    assert verdict["switch_to_less_lossy_after_recovery"] is not None, doc["switches"]
    assert verdict["reports_from_rise_to_switch"] <= 40, doc["switches"]
    assert all(s["source"] in ("policy", "config") for s in doc["switches"])
    assert doc["ranks_switch_at_the_same_step"] is True
    assert len(doc["prometheus"]["compressors_seen"]) >= 2
    assert set(doc["prometheus"]["phases_seen"]) >= {"data", "forward", "backward", "exposed_comm", "optimizer"}


@pytest.mark.timeout(1500)
def test_losing_a_node_shrinks_the_job_and_it_grows_back() -> None:
    """workers 1..2: node 1's Ray processes are killed mid-job; the job continues on node 0 from
    its last checkpoint, grows back to 2 when the node returns, and finishes."""
    # 8000 steps, not the CLI's 5000: at world size 1 the MLP runs ~125 steps/s and the group
    # regrew ~34 s after the shrink (step 4401 of 5000 in a run on an idle machine; under the
    # suite's load in CI, session 23, the job finished at world size 1 before it regrew).
    opts = cl.ScenarioOptions(schedule=parse_schedule("1000:8000"), checkpoint_every=50,
                              kill_node_at=325, timeout_s=1200.0)
    with cl.Cluster(nodes=2, mbit=1000) as cluster:
        doc = cl.scenario(cluster, opts, log=lambda m: None)
    assert doc["state"] == "succeeded", doc["reason"]
    sizes = [w["world_size"] for w in doc["world_sizes"]]
    assert 1 in sizes and sizes[0] == 2 and sizes[-1] == 2, doc["world_sizes"]
    assert doc["verdict"]["world_size_down_and_up"], doc["world_sizes"]
    assert doc["restarts"] and doc["verdict"]["steps_lost_within_checkpoint_interval"], doc["restarts"]
