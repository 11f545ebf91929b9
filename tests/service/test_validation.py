"""Bad input is refused with the field named, nothing is stored, and the server keeps serving."""

import httpx
import pytest
from support.api import SMALLEST_SPEC, report, submit, telemetry, worker_headers


def spec(**changes):
    return {**SMALLEST_SPEC, **changes}


SECTIONED_SPEC = {
    "name": "demo", "steps": 40, "workers": 2, "model": {"name": "mlp"},
    "data": {"dataset": "synthetic", "batch_size": 32},
    "compression": {"mode": "fixed", "compressor": "acpsgd", "compressor_rank": 4},
}


def sectioned(**changes):
    return {**SECTIONED_SPEC, **changes}


@pytest.mark.parametrize(
    ("body", "loc", "msg"),
    [
        (spec(model="gpt-5"), ["body", "model", "name"],
         "Value error, unknown model 'gpt-5'; choose one of mlp, cnn, resnet18, resnet50, resnet152, vgg16, "
         "bert-base, bert-large or give an import path 'package.module:factory'"),
        (spec(steps=-5), ["body", "steps"], "Input should be greater than or equal to 1"),
        (spec(compression={"mode": "fixed", "compressor": "acpsgd", "rank": 0}),
         ["body", "compression", "rank"], "Input should be greater than or equal to 1"),
        (spec(colour="red"), ["body", "colour"], "Extra inputs are not permitted"),
        (spec(compression={"mode": "fixed", "compressor": "acpsgd", "rank": 4, "level": 9}),
         ["body", "compression", "level"], "Extra inputs are not permitted"),
        (spec(batch_size="lots"), ["body", "data", "batch_size"],
         "Input should be a valid integer, unable to parse string as an integer"),
        (spec(batch_size=1.5), ["body", "data", "batch_size"],
         "Input should be a valid integer, got a number with a fractional part"),
        (spec(use_gpu="yes"), ["body", "use_gpu"], "Input should be a valid boolean"),
        (spec(steps=10**30), ["body", "steps"], "Input should be less than or equal to 10000000"),
        (spec(batch_size=2**63), ["body", "data", "batch_size"], "Input should be less than or equal to 65536"),
        (spec(workers="4..2"), ["body", "workers"],
         "Value error, must be between 1 and 1024 with min <= max, got (4, 2)"),
        (spec(compression={"mode": "sometimes"}), ["body", "compression", "mode"],
         "Input should be 'fixed' or 'adaptive'"),
        (spec(compression={"compressor": "zip"}), ["body", "compression", "compressor"],
         "Value error, unknown compressor 'zip'; choose one of none, fp16, bf16, signsgd, topk, powersgd, acpsgd"),
        (spec(epochs=3), ["body"], "Value error, give steps or epochs, not both"),
        # the sectioned form: the same rules, the same section paths
        (sectioned(data={"batch_size": 0}), ["body", "data", "batch_size"], "Input should be greater than or equal to 1"),
        (sectioned(probing={"budget": 1.5}), ["body", "probing", "budget"], "Input should be less than 1"),
        (spec(probe_budget=1.5), ["body", "probing", "budget"], "Input should be less than 1"),
        (spec(compression={"compressor": "acpsgd", "compressor_rank": 0}),
         ["body", "compression", "compressor_rank"], "Input should be greater than or equal to 1"),
        (spec(data={"batch_size": 8}), ["body"],
         "Value error, batch_size: given twice, flat and as data.batch_size; give it once"),
        (sectioned(optimizer={"name": "lion"}), ["body", "optimizer", "name"], "Input should be 'sgd' or 'adamw'"),
        (spec(shuffle_seed=-1), ["body", "data", "shuffle_seed"], "Input should be greater than or equal to 0"),
    ],
    ids=["unknown-model", "negative-steps", "rank-0", "extra-field", "extra-nested", "string-for-int",
         "fraction-for-int", "string-for-bool", "huge-steps", "huge-batch", "bad-range", "bad-mode",
         "unknown-compressor", "steps-and-epochs", "section-batch", "section-probing", "flat-probing",
         "compressor-rank-0", "flat-and-section", "section-optimizer", "negative-shuffle-seed"],
)
def test_bad_job_spec_is_422_with_the_field_named(coordinator, body, loc, msg):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["loc"] == loc
    assert detail[0]["msg"] == msg
    assert httpx.get(f"{coordinator.url}/v1/jobs").json() == []


@pytest.mark.parametrize(
    ("content", "content_type", "error_type"),
    [
        (b"steps=40&model=mlp", "application/x-www-form-urlencoded", "model_attributes_type"),
        (b"{not json", "application/json", "json_invalid"),
        (b'{"lr": 1e999, "steps": 4}', "application/json", "finite_number"),
        (b"[1, 2, 3]", "application/json", "model_attributes_type"),
        (b"", "application/json", "missing"),
    ],
    ids=["form-body", "broken-json", "infinite-number", "json-array", "empty"],
)
def test_non_json_or_malformed_bodies_are_422(coordinator, content, content_type, error_type):
    response = httpx.post(f"{coordinator.url}/v1/jobs", content=content, headers={"content-type": content_type})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == error_type
    assert httpx.get(f"{coordinator.url}/v1/jobs").json() == []
    assert httpx.get(f"{coordinator.url}/healthz").status_code == 200


def test_oversized_body_is_413_before_parsing(coordinator):
    response = httpx.post(f"{coordinator.url}/v1/jobs", content=b"{" + b" " * 2_000_000 + b"}",
                          headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json() == {"detail": "request body too large (limit 1000000 bytes)"}
    assert httpx.get(f"{coordinator.url}/v1/jobs").json() == []


def test_smallest_spec_is_accepted_as_written(coordinator):
    job = submit(coordinator.url)
    assert job["state"] == "queued"
    assert (job["name"], job["steps"], job["compressor"], job["compressor_rank"]) == ("demo", 40, "acpsgd", 4)
    assert len(job["id"]) == 12 and job["worker_token"]


def test_the_flat_and_the_sectioned_spec_are_the_same_job(coordinator):
    """The README's flat smallest spec and its sectioned form store the same sectioned spec."""
    flat = submit(coordinator.url)
    sectioned = submit(coordinator.url, SECTIONED_SPEC)
    assert flat["spec"] == sectioned["spec"]
    assert flat["spec"]["data"]["batch_size"] == 32 and flat["spec"]["compression"]["compressor_rank"] == 4
    assert "batch_size" not in flat["spec"] and "rank" not in flat["spec"]["compression"]


def test_unknown_job_is_404(coordinator):
    for method, path in [("GET", "/v1/jobs/0123456789ab"), ("POST", "/v1/jobs/0123456789ab/cancel"),
                         ("GET", "/v1/jobs/0123456789ab/policy"), ("GET", "/v1/jobs/0123456789ab/events"),
                         ("GET", "/v1/jobs/0123456789ab/history")]:
        response = httpx.request(method, f"{coordinator.url}{path}")
        assert response.status_code == 404, path
        assert response.json() == {"detail": "job 0123456789ab not found"}


@pytest.mark.parametrize(
    ("changes", "loc", "msg"),
    [
        ({"step": -1}, ["body", "step"], "Input should be greater than or equal to 0"),
        ({"phase_seconds": {"thinking": 0.1}}, ["body", "phase_seconds"],
         "Value error, unknown phase 'thinking'; phases are data, forward, backward, exposed_comm, optimizer, "
         "compress, communicate, decompress"),
        ({"bandwidth_bytes_per_second": 0}, ["body", "bandwidth_bytes_per_second"], "Input should be greater than 0"),
        ({"gpu_temp": 80}, ["body", "gpu_temp"], "Extra inputs are not permitted"),
        ({"profile": {"shapes": [[4, 4], [4]], "buckets": [[0, 7]]}}, ["body", "profile"],
         "Value error, buckets: parameter index 7 out of range for 2 shapes"),
    ],
    ids=["negative-step", "unknown-phase", "zero-bandwidth", "extra-field", "bucket-beyond-shapes"],
)
def test_bad_telemetry_is_422_and_changes_nothing(coordinator, changes, loc, msg):
    job = submit(coordinator.url)
    response = httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/telemetry", json={**telemetry(3), **changes},
                          headers=worker_headers(job))
    assert response.status_code == 422
    assert (response.json()["detail"][0]["loc"], response.json()["detail"][0]["msg"]) == (loc, msg)
    after = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}").json()
    assert (after["state"], after["step"], after["loss"]) == ("queued", 0, None)
    assert report(coordinator.url, job, 3).status_code == 200  # and the server still serves
