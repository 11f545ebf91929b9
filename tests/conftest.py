"""Shared fixtures: one local Ray cluster per test session, and coordinators on free ports.

``ray_head`` starts a Ray head as its own process (the coordinator's own
``coordinator.raylocal``), so coordinators in subprocesses and this process share one
cluster; ``ray_session`` connects this process to it for tests that drive Ray directly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import support` however pytest imports us

# Hermetic settings: a developer's GRADWIRE_TOKEN or GRADWIRE_DATABASE_URL must not leak into
# the coordinators the tests start (each test passes what it needs explicitly).
for _name in [n for n in os.environ if n.startswith("GRADWIRE_")]:
    del os.environ[_name]

# Fast failure detection for Ray Train in tests (read by the Train controller).
RAY_TEST_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_USAGE_STATS_ENABLED": "0"}
os.environ.update(RAY_TEST_ENV)

# Token auth decided before any test module imports Ray (Ray reads the mode at import), the
# same way the coordinator decides it for its own head (coordinator.raylocal.use_token_auth).
from coordinator import raylocal  # noqa: E402  (torch- and Ray-free)

raylocal.use_token_auth()

RAY_TEST_CPUS = 2


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Address (``127.0.0.1:port``) of a Ray head with 2 CPUs, stopped after the session."""
    from coordinator import raylocal

    data_dir = tmp_path_factory.mktemp("ray-head")
    head = raylocal.ensure_head(data_dir, raylocal.free_port(), RAY_TEST_CPUS, env=RAY_TEST_ENV)
    try:
        yield head.address
    finally:
        raylocal.stop_head(data_dir)


@pytest.fixture(scope="session")
def ray_session(ray_head: str) -> Iterator[str]:
    """This test process connected to the session's cluster (``ray.init(address=...)``)."""
    import ray

    ray.init(address=ray_head, namespace="gradwire-tests", log_to_driver=False, ignore_reinit_error=True)
    try:
        yield ray_head
    finally:
        ray.shutdown()


@pytest.fixture
def start_coordinator(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: ``start_coordinator(token=None, **settings)`` -> a started ThreadServer with
    ``.url`` and ``.app``; record-only launcher unless told otherwise. Stopped at teardown."""
    from support.servers import ThreadServer

    from coordinator.app import create_app
    from coordinator.settings import Settings

    servers: list[ThreadServer] = []

    def start(token: str | None = None, **overrides: Any) -> ThreadServer:
        values = {"launcher": "none", "data_dir": tmp_path / f"coord{len(servers)}", "token": token,
                  "metrics_grace_s": 300.0, **overrides}
        app = create_app(Settings(**values))
        server = ThreadServer(app).start()
        server.app = app  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def coordinator(start_coordinator: Callable[..., Any]) -> Any:
    """A record-only coordinator without a token."""
    return start_coordinator()


@pytest.fixture
def serve(ray_head: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: a ``gradwire serve`` subprocess on the session's Ray cluster, in a namespace of
    its own (so one test's reconciliation never touches another test's runners).
    ``start(runner=..., port=None, **env)``; the default runner is the torch-free fake one."""
    import uuid

    import httpx
    from support.api import TERMINAL
    from support.cluster import reclaim_cpus
    from support.servers import CoordinatorProcess

    namespace = f"gradwire-test-{uuid.uuid4().hex[:8]}"
    started: list[Any] = []

    def start(runner: str = "tests.support.fake_runner:run_job", port: int | None = None, **env: str) -> Any:
        proc = CoordinatorProcess(tmp_path / "coordinator", port=port, env={
            "GRADWIRE_RAY_ADDRESS": ray_head, "GRADWIRE_RUNNER": runner, "GRADWIRE_LAUNCHER": "ray",
            "GRADWIRE_RAY_NAMESPACE": namespace, "GRADWIRE_POLL_INTERVAL_S": "0.2",
            "GRADWIRE_HISTORY_INTERVAL_S": "0", **env})
        started.append(proc)
        proc.namespace = namespace  # type: ignore[attr-defined]
        return proc.start(timeout_s=90)

    yield start
    for proc in started:
        try:
            for job in httpx.get(f"{proc.url}/v1/jobs", timeout=5).json():
                if job["state"] not in TERMINAL:
                    httpx.post(f"{proc.url}/v1/jobs/{job['id']}/cancel", timeout=30)
        except httpx.HTTPError:
            pass
        proc.stop()
    leaked = reclaim_cpus(ray_head, RAY_TEST_CPUS)
    if leaked:
        events = [line for proc in started for line in proc.log().splitlines() if " coordinator." in line]
        pytest.fail("this test left the shared Ray cluster's CPUs held (they are freed now, for the "
                    f"next tests): {leaked}\ncoordinator events:\n" + "\n".join(events[-30:]))
