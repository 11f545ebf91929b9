"""``python -m benchmarks.load`` keeps working: a short run against a real `gradwire serve` process,
with the store found consistent afterwards (no figures asserted)."""

import json
import subprocess
import sys

from support.servers import REPO_ROOT


def test_the_load_benchmark_runs_and_checks_the_store(tmp_path):
    out = tmp_path / "load.json"
    for command in (["-m", "benchmarks.load"],):
        result = subprocess.run([sys.executable, *command, "--rates", "40", "--jobs", "2", "--seconds", "1",
                                 "--sse-clients", "1", "--json-out", str(out)],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        results = json.loads(out.read_text())
        consistency = results["consistency"]["this tree"]
        assert consistency["consistent"], consistency
        assert consistency["reports_acknowledged"] == sum(p["ok"] for p in results["phases"]) > 0
        assert [p["errors"] for p in results["phases"]] == [0, 0]
