"""The shared test cluster handed back whole after each coordinator test.

Every coordinator test runs its jobs on the session's one Ray head. A test whose jobs leave
CPUs reserved (a placement group nobody removed, a Train controller that outlived its runner)
would otherwise starve every later test, which then time out far from the cause, with
nothing in their output about it. :func:`reclaim_cpus` makes the test that leaked fail at
its own teardown, with the cluster's state in the message, and frees the CPUs for the next.
"""

from __future__ import annotations

from typing import Any

from support.servers import wait_for


def _cpus_free() -> float:
    import ray

    return ray.available_resources().get("CPU", 0.0)


def _live_groups() -> dict[str, Any]:
    import ray.util

    return {pg_id: info for pg_id, info in ray.util.placement_group_table().items() if info.get("state") != "REMOVED"}


def job_leftovers(runner_name: str, namespace: str) -> list[str]:
    """What the job whose runner actor is ``runner_name`` still holds on the cluster: every
    actor the runner created, directly or through its children (the Ray Train controller,
    its workers), that is not dead, and every placement group one of them created that is
    not removed. Read from the GCS tables (no dashboard needed), by owner: an actor's owner
    is the worker process that created it, a group's creator is an actor.

    Detached actors other than the runner are left out: Ray Train's own helpers, which hold
    no resources — the cluster-wide ``AutoscalingCoordinator`` (created by the first Train
    run, shared by all), and the run's ``PlacementGroupCleaner``, which polls the dashboard's
    state API and, on a head without a dashboard, never learns that its controller died."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    accessor = state._connect_and_get_accessor()
    actors = [gcs_pb2.ActorTableData.FromString(raw) for raw in accessor.get_actor_table(None, None)]
    tree = {a.actor_id: a for a in actors if a.name == runner_name and a.ray_namespace == namespace}
    grown = True
    while grown:
        workers = {a.address.worker_id for a in tree.values() if a.address.worker_id}
        children = {a.actor_id: a for a in actors if a.owner_address.worker_id in workers}
        grown = not children.keys() <= tree.keys()
        tree.update(children)
    held = [f"actor {a.class_name} {a.actor_id.hex()} {gcs_pb2.ActorTableData.ActorState.Name(a.state)}"
            for a in tree.values()
            if a.state != gcs_pb2.ActorTableData.DEAD and (a.name == runner_name or not a.is_detached)]
    for raw in accessor.get_placement_group_table():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        if pg.creator_actor_id in tree and pg.state != gcs_pb2.PlacementGroupTableData.REMOVED:
            held.append(f"placement group {pg.placement_group_id.hex()} "
                        f"{gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(pg.state)} of "
                        f"{tree[pg.creator_actor_id].class_name} {pg.creator_actor_id.hex()}")
    return held


def reclaim_cpus(address: str, total_cpus: float, timeout_s: float = 60.0) -> str | None:
    """Wait until every CPU of the cluster at ``address`` is free again; None when they are.

    Otherwise remove the placement groups still alive (no test is running jobs at this
    point) and return what was held: the free CPUs and each group's id, state and bundles.
    """
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    connected_here = not ray.is_initialized()
    if connected_here:
        ray.init(address=address, namespace="gradwire-tests-cleanup", log_to_driver=False)
    try:
        try:
            wait_for(lambda: _cpus_free() >= total_cpus, timeout_s, "every CPU free", interval_s=0.5)
            return None
        except TimeoutError:
            pass
        groups = _live_groups()
        report = (f"{_cpus_free():g} of {total_cpus:g} CPUs free {timeout_s:.0f} s after the test's coordinator "
                  f"stopped; live placement groups: "
                  + ("; ".join(f"{pg_id} {info.get('state')} bundles={info.get('bundles')}"
                               for pg_id, info in groups.items()) or "none"))
        for pg_id in groups:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        return report
    finally:
        if connected_here:
            ray.shutdown()
