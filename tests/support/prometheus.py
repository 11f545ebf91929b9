"""A real Prometheus server (Debian's /usr/bin/prometheus) scraping given targets."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from coordinator.raylocal import free_port

PROMETHEUS = "/usr/bin/prometheus"


def prometheus_missing() -> str | None:
    """Why the Prometheus tests cannot run here, or None."""
    if not Path(PROMETHEUS).exists() and not shutil.which("prometheus"):
        return f"{PROMETHEUS} not found (Debian package 'prometheus'; `make system-deps` installs it)"
    return None


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[str], scrape_interval_ms: int = 1000) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        # honor_labels keeps our `job` label (the gradwire job id) instead of renaming it
        # `exported_job` in favour of the scrape job's name.
        lines = [
            "global:",
            f"  scrape_interval: {scrape_interval_ms}ms",
            f"  evaluation_interval: {scrape_interval_ms}ms",
            "scrape_configs:",
            "  - job_name: gradwire",
            "    honor_labels: true",
            "    static_configs:",
            f"      - targets: [{', '.join(repr(t) for t in targets)}]",
        ]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> "PrometheusServer":
        exe = PROMETHEUS if Path(PROMETHEUS).exists() else shutil.which("prometheus")
        log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [str(exe), f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_query(self, promql: str, min_series: int = 1, timeout_s: float = 20) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if len(result) >= min_series or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
