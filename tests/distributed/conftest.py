"""Fixtures shared by the distributed tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def emulated_cluster_available() -> None:
    """Skip, with the reason, where the emulated Ray cluster cannot be made here (no root, no
    ``ip netns``, Ray or Prometheus missing): a test module that needs it names it in
    ``pytestmark`` (``pytest.mark.usefixtures``). Imported here, not at the top: the other
    distributed tests do not need the cluster's modules."""
    from benchmarks import cluster as cl

    ok, why = cl.available()
    if not ok:
        pytest.skip(f"emulated cluster unavailable: {why}")
