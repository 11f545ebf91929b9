"""Fixtures shared by the distributed tests."""

from __future__ import annotations

import pytest

from benchmarks import cluster as cl


@pytest.fixture
def emulated_cluster_available() -> None:
    """Skip, with the reason, where the emulated Ray cluster cannot be made here (no root, no
    ``ip netns``, Ray or Prometheus missing): a test module that needs it names it in
    ``pytestmark`` (``pytest.mark.usefixtures``)."""
    ok, why = cl.available()
    if not ok:
        pytest.skip(f"emulated cluster unavailable: {why}")
