"""User code in a JobSpec as the coordinator sees it: the form of an import path is checked at
submission (422 naming the field), the code itself is never imported here; worker-group
restarts reported by the workers land in the job's history; external jobs."""

import sys

import httpx
import pytest
from support.api import SMALLEST_SPEC, history_of, job_of, report, submit, telemetry, worker_headers

USER_SPEC = {**SMALLEST_SPEC, "name": "mine", "model": "nowhere_pkg.models:make_model",
             "dataset": "nowhere_pkg.data:make_data", "loss": "nowhere_pkg.losses:make_loss",
             "runtime_env": {"working_dir": "/srv/my-code", "env_vars": {"MY_FLAG": "1"}}}


@pytest.mark.parametrize(
    ("changes", "loc", "msg"),
    [
        ({"model": "nowhere_pkg..models:make"}, ["body", "model", "name"],
         "Value error, import path 'nowhere_pkg..models:make' is malformed: write 'package.module:factory' "
         "(dotted Python identifiers, one colon)"),
        ({"model": "nowhere_pkg.models:make:model"}, ["body", "model", "name"],
         "Value error, import path 'nowhere_pkg.models:make:model' is malformed: write 'package.module:factory' "
         "(dotted Python identifiers, one colon)"),
        ({"dataset": "nowhere_pkg/data:make"}, ["body", "data", "dataset"],
         "Value error, import path 'nowhere_pkg/data:make' is malformed: write 'package.module:factory' "
         "(dotted Python identifiers, one colon)"),
        ({"loss": "cross_entropy"}, ["body", "model", "loss"],
         "Value error, import path 'cross_entropy' is malformed: write 'package.module:factory' "
         "(dotted Python identifiers, one colon)"),
        ({"runtime_env": {"conda": "env.yaml"}}, ["body", "runtime_env", "conda"], "Extra inputs are not permitted"),
        ({"runtime_env": {"pip": []}}, ["body", "runtime_env", "pip"], "List should have at least 1 item after validation, not 0"),
        ({"runtime_env": {"env_vars": {"1BAD": "x"}}}, ["body", "runtime_env", "env_vars"],
         "Value error, environment variable name '1BAD' is not valid"),
    ],
    ids=["double-dot", "two-colons", "slash", "loss-no-colon", "runtime-env-conda", "empty-pip", "bad-env-name"],
)
def test_a_malformed_import_path_or_runtime_env_is_422_naming_the_field(coordinator, changes, loc, msg):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json={**USER_SPEC, **changes})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert (detail["loc"], detail["msg"]) == (loc, msg)
    assert httpx.get(f"{coordinator.url}/v1/jobs").json() == []


def test_a_user_dataset_with_a_built_in_model_is_refused(coordinator):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json={**USER_SPEC, "model": "mlp"})
    assert response.status_code == 422
    assert "dataset 'nowhere_pkg.data:make_data' is your own: give your own model too" in response.text


def test_well_formed_paths_are_stored_as_given_and_never_imported(coordinator):
    job = submit(coordinator.url, USER_SPEC)
    spec = job_of(coordinator.url, job["id"])["spec"]
    assert (spec["model"]["name"], spec["data"]["dataset"], spec["model"]["loss"]) == (
        USER_SPEC["model"], USER_SPEC["dataset"], USER_SPEC["loss"])
    assert spec["runtime_env"] == {"working_dir": "/srv/my-code", "py_modules": None, "pip": None,
                                   "env_vars": {"MY_FLAG": "1"}}
    assert "nowhere_pkg" not in sys.modules  # the coordinator checked the form only


def test_defaults_checkpoint_and_survive_failures(coordinator):
    spec = job_of(coordinator.url, submit(coordinator.url)["id"])["spec"]
    assert spec["checkpoints"]["every"] is None  # chosen from the run's length by the workers
    assert spec["checkpoints"]["max_failures"] == 3


def test_a_new_worker_group_is_recorded_as_a_restart(coordinator):
    url = coordinator.url
    job = submit(url)
    assert report(url, job, 5, worker_group="g1").status_code == 200
    assert report(url, job, 18, worker_group="g1").status_code == 200
    assert report(url, job, 11, worker_group="g2", resumed_from_step=10).status_code == 200
    assert report(url, job, 14, worker_group="g2", resumed_from_step=10).status_code == 200
    groups = history_of(url, job["id"])["worker_groups"]
    assert [(g["worker_group"], g["restart"], g["resumed_from_step"], g["last_reported_step"]) for g in groups] == [
        ("g1", False, None, 0), ("g2", True, 10, 18)]


def test_an_external_job_is_not_launched_and_ends_with_its_last_report(coordinator):
    url = coordinator.url
    job = submit(url, {**SMALLEST_SPEC, "name": "script", "model": "train:Net", "dataset": "external",
                       "external": True, "steps": 20})
    assert job_of(url, job["id"])["state"] == "queued"
    assert report(url, job, 10, steps=20, worker_group="w").status_code == 200
    assert job_of(url, job["id"])["state"] == "running"
    assert report(url, job, 20, steps=20, worker_group="w").status_code == 200
    done = job_of(url, job["id"])
    assert (done["state"], done["reason"]) == ("succeeded", "training finished (reported by the external job's workers)")
    late = httpx.post(f"{url}/v1/jobs/{job['id']}/telemetry", json=telemetry(20), headers=worker_headers(job))
    assert late.status_code == 409


def test_external_and_its_dataset_go_together(coordinator):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json={**SMALLEST_SPEC, "external": True})
    assert response.status_code == 422
    assert "dataset 'external' is for external jobs (external: true) only" in response.text
