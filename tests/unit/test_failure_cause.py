"""``workers.failure_cause`` on Ray's own exception types, as Ray Train v2 nests them.

The end-to-end path (a worker really killed by Ray's memory monitor) is
``tests/ray/test_out_of_memory.py``; these check the branches that run does not reach: other
ranks, a controller-side failure, a raylet message in a format this module does not know,
and failures that are not about memory at all.
"""

from __future__ import annotations

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")
from ray.train import ControllerError, WorkerGroupError  # noqa: E402
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError  # noqa: E402

from workers.failure_cause import out_of_memory_kill  # noqa: E402

#: The raylet's message, in the format of Ray 2.60's memory monitor (two of its lines).
RAYLET = ("2 worker(s) were killed due to the node running low on memory. Memory on the node "
          "(IP: 10.0.0.7, ID: 155ac110bd81ddd4ce6a) was 22.85GB used / 23.54GB limit (0.970700)\n"
          "OOM kill reason: Memory usage 24534000000B exceeded threshold of 23000000000B "
          "(95.0% of 25276059648B limit)\n"
          "Selected to kill: (Actor(58af): task name=RayTrainWorker.__init__, pid=4711, "
          "actual memory used=9.87GB, worker ID=7fa5)")


def health_check(pid: int, failure: BaseException) -> WorkerHealthCheckFailedError:
    return WorkerHealthCheckFailedError(
        f"A worker health check failed.\nWorker info: Worker(metadata=ActorMetadata(node_ip='10.0.0.7', pid={pid}))",
        failure=failure)


def test_names_the_rank_the_worker_and_the_nodes_memory():
    error = WorkerGroupError("rank 2 died", {
        0: health_check(4700, RuntimeError("connection reset by peer")),
        2: health_check(4711, ray_exceptions.OutOfMemoryError(RAYLET)),
    })
    kill = out_of_memory_kill(error)
    assert kill is not None and (kill.rank, kill.pid) == (2, 4711)
    assert kill.describe() == (
        "out of memory: Ray killed training worker rank 2 (pid 4711, 9.87 GB resident) on node "
        "10.0.0.7 (155ac110bd81): the node's memory was 22.85GB used / 23.54GB limit, above Ray's "
        "kill threshold of 95.0%. Use less memory per worker (a smaller batch_size, seq_len or "
        "model) or fewer workers per node, or give the node more memory.")


def test_a_controller_side_kill_and_an_unknown_message_format_still_say_out_of_memory():
    error = ControllerError(ray_exceptions.OutOfMemoryError("Task was killed: memory pressure\nmore"))
    kill = out_of_memory_kill(error)
    assert kill is not None and kill.rank is None
    assert kill.describe().startswith(
        "out of memory: Ray killed a process of this job; Ray said: Task was killed: memory pressure. Use less memory")


def test_failures_that_are_not_about_memory_are_left_alone():
    crashed = WorkerGroupError("boom", {0: health_check(1, ray_exceptions.ActorDiedError())})
    assert out_of_memory_kill(crashed) is None
    try:
        try:
            raise ValueError("bad batch")
        except ValueError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert out_of_memory_kill(outer) is None
