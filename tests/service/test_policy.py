"""PUT /v1/jobs/{id}/policy: pin a compressor, release back to adaptive."""

import httpx
import pytest
from support.api import ADAPTIVE_SPEC, PROFILE, report, submit, worker_headers


def put(url, job, body):
    return httpx.put(f"{url}/v1/jobs/{job['id']}/policy", json=body)


def test_pin_and_release(coordinator):
    url = coordinator.url
    job = submit(url, ADAPTIVE_SPEC)
    assert httpx.get(f"{url}/v1/jobs/{job['id']}/policy").json() == {
        "mode": "adaptive", "compressor": "acpsgd", "params": {"warmup_steps": 0, "rank": 4}, "decision_version": 0,
        "last_verdict": None}

    pinned = put(url, job, {"mode": "pinned", "compressor": "powersgd", "rank": 8})
    assert pinned.status_code == 200
    assert pinned.json() == {"mode": "pinned", "compressor": "powersgd", "params": {"rank": 8}, "decision_version": 1,
                             "last_verdict": None}
    decision = httpx.get(f"{url}/v1/jobs/{job['id']}/decision", headers=worker_headers(job)).json()
    assert isinstance(decision.pop("at"), float)
    assert decision == {"version": 1, "compressor": "powersgd", "params": {"rank": 8},
                        "reason": "pinned by operator: powersgd-r8", "predicted_gain": None, "source": "pinned"}

    # pinned: a very fast network does not move it
    assert report(url, job, 5, bandwidth_bytes_per_second=40e9 / 8, profile=PROFILE).json()["version"] == 1
    assert httpx.get(f"{url}/v1/jobs/{job['id']}/policy").json()["last_verdict"] is None

    released = put(url, job, {"mode": "adaptive"})
    assert released.json() == {"mode": "adaptive", "compressor": "powersgd", "params": {"rank": 8},
                               "decision_version": 1, "last_verdict": None}
    # adaptive again: the next report may switch at once (no dwell after a release)
    answer = report(url, job, 6, bandwidth_bytes_per_second=40e9 / 8).json()
    assert (answer["version"], answer["compressor"]) == (2, "none")
    # the policy's verdict on that report is the switch's reason, with what it compared
    verdict = httpx.get(f"{url}/v1/jobs/{job['id']}/policy").json()["last_verdict"]
    assert verdict == answer["reason"] and verdict.startswith("none predicted") and "powersgd-r8" in verdict
    status = httpx.get(f"{url}/v1/jobs/{job['id']}").json()
    assert (status["policy_mode"], status["decision_version"]) == ("adaptive", 2)


def test_the_last_verdict_is_the_policys_latest_reason_and_a_pin_and_release_clear_it(coordinator):
    url = coordinator.url
    job = submit(url, ADAPTIVE_SPEC)
    policy = f"{url}/v1/jobs/{job['id']}/policy"
    assert httpx.get(policy).json()["last_verdict"] is None  # no report yet
    report(url, job, 5, bandwidth_bytes_per_second=20e6 / 8, profile=PROFILE)  # a slow link: keep ACP-SGD r4
    kept = httpx.get(policy).json()
    assert kept["decision_version"] == 0 and "acpsgd-r4" in kept["last_verdict"]
    put(url, job, {"mode": "pinned", "compressor": "fp16"})
    assert httpx.get(policy).json()["last_verdict"] is None
    put(url, job, {"mode": "adaptive"})
    assert httpx.get(policy).json()["last_verdict"] is None  # the verdict of before the pin is stale
    report(url, job, 6, bandwidth_bytes_per_second=20e6 / 8)
    assert httpx.get(policy).json()["last_verdict"]


def test_pin_topk_ratio_on_a_fixed_job(coordinator):
    job = submit(coordinator.url)
    answer = put(coordinator.url, job, {"mode": "pinned", "compressor": "topk", "ratio": 0.05})
    assert answer.json() == {"mode": "pinned", "compressor": "topk", "params": {"ratio": 0.05}, "decision_version": 1,
                             "last_verdict": None}


@pytest.mark.parametrize(
    ("body", "loc", "msg"),
    [
        ({"mode": "pinned", "compressor": "powersgd", "rank": 0}, ["body", "pinned", "rank"],
         "Input should be greater than or equal to 1"),
        ({"mode": "pinned", "compressor": "topk", "ratio": 1.5}, ["body", "pinned", "ratio"],
         "Input should be less than or equal to 1"),
        ({"mode": "pinned", "compressor": "lz4"}, ["body", "pinned", "compressor"],
         "Value error, unknown compressor 'lz4'; choose one of none, fp16, bf16, signsgd, topk, powersgd, acpsgd"),
        ({"mode": "pinned", "compressor": "topk", "rank": 2}, ["body", "pinned"],
         "Value error, rank: not a parameter of 'topk' (it takes min_compress_numel, ratio, seed, warmup_steps)"),
        ({"mode": "pinned"}, ["body", "pinned", "compressor"], "Field required"),
        ({"mode": "adaptive", "compressor": "none"}, ["body", "adaptive", "compressor"], "Extra inputs are not permitted"),
        ({"mode": "frozen"}, ["body"],
         "Input tag 'frozen' found using 'mode' does not match any of the expected tags: 'pinned', 'adaptive'"),
    ],
    ids=["rank-0", "ratio-above-1", "unknown-compressor", "rank-for-topk", "no-compressor", "extra", "bad-mode"],
)
def test_bad_policy_is_422_and_changes_nothing(coordinator, body, loc, msg):
    job = submit(coordinator.url, ADAPTIVE_SPEC)
    response = put(coordinator.url, job, body)
    assert response.status_code == 422
    assert (response.json()["detail"][0]["loc"], response.json()["detail"][0]["msg"]) == (loc, msg)
    policy = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}/policy").json()
    assert (policy["mode"], policy["decision_version"]) == ("adaptive", 0)


def test_policy_of_a_finished_job_cannot_change(coordinator):
    job = submit(coordinator.url, ADAPTIVE_SPEC)
    httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel")
    response = put(coordinator.url, job, {"mode": "adaptive"})
    assert response.status_code == 409
    assert response.json() == {"detail": f"job {job['id']} is cancelled; its policy cannot change"}
