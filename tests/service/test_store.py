"""The store: one transaction per write, refused moves leave no trace, bounded history."""

import pytest
from sqlalchemy.exc import IntegrityError
from support.api import SMALLEST_SPEC

from coordinator.decisions import DecisionLoop
from coordinator.schemas import JobSpec, TelemetryPoint
from coordinator.store import InvalidTransition, Store


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield s
    s.close()


def create(store, job_id="aaaaaaaaaaaa", now=1.0):
    spec = JobSpec.model_validate(SMALLEST_SPEC)
    return store.create_job(job_id=job_id, spec=spec, worker_token="t", policy_mode="fixed",
                            decision=DecisionLoop.initial(spec.compression, now), now=now)


def test_create_is_all_or_nothing(store):
    create(store)
    with pytest.raises(IntegrityError):
        create(store)  # same id: the job insert fails, so must its event and decision
    assert len(store.list_jobs()) == 1
    assert len(store.events_after("aaaaaaaaaaaa", 0)) == 2  # queued + decision v0, once
    assert [d.version for d in store.decisions("aaaaaaaaaaaa")] == [0]


def test_illegal_transitions_are_refused_without_a_trace(store):
    create(store)
    store.transition("aaaaaaaaaaaa", "running", "go", 2.0)
    store.transition("aaaaaaaaaaaa", "succeeded", "done", 3.0, summary={"steps": 40})
    with pytest.raises(InvalidTransition, match="job aaaaaaaaaaaa is succeeded; it cannot become running"):
        store.transition("aaaaaaaaaaaa", "running", "again", 4.0)
    job = store.get_job("aaaaaaaaaaaa")
    assert (job.state, job.started_at, job.finished_at, job.summary) == ("succeeded", 2.0, 3.0, {"steps": 40})
    assert [(t.from_state, t.to_state) for t in store.transitions("aaaaaaaaaaaa")] == [
        (None, "queued"), ("queued", "running"), ("running", "succeeded")]


def test_expect_guards_against_races(store):
    create(store)
    store.transition("aaaaaaaaaaaa", "cancelled", "operator", 2.0)
    with pytest.raises(InvalidTransition):
        store.transition("aaaaaaaaaaaa", "running", "launched", 3.0, expect="queued")


def test_history_is_thinned_past_its_bound(store):
    create(store)
    for step in range(1, 101):
        store.record_report("aaaaaaaaaaaa", snapshot={"step": step}, history=TelemetryPoint(at=step, step=step),
                            decision=None, start_running=True, now=float(step), max_rows=40)
    steps = [p.step for p in store.telemetry("aaaaaaaaaaaa")]
    assert len(steps) <= 40
    assert steps[0] == 1 and steps[-1] == 100 and steps == sorted(steps)


def test_data_survives_a_new_store_on_the_same_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = Store(url)
    create(first)
    first.close()
    again = Store(url)
    assert again.get_job("aaaaaaaaaaaa").name == "demo"
    again.close()
