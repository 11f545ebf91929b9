"""The live page in headless Chromium: a job with telemetry shows up and updates live."""

import httpx
import pytest
from support.api import ADAPTIVE_SPEC, PROFILE, report, submit
from support.browser import chromium_missing
from support.servers import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")]

ARTIFACTS = REPO_ROOT / "test-artifacts"


def test_live_page_shows_a_job_with_telemetry_and_updates(start_coordinator, page):
    url = start_coordinator(history_interval_s=0).url  # keep every report in the history
    job = submit(url, {**ADAPTIVE_SPEC, "name": "browser-demo"})
    for step in (4, 8, 12):
        report(url, job, step, bandwidth_bytes_per_second=0.5e9 / 8)
    report(url, job, 16, bandwidth_bytes_per_second=40e9 / 8, profile=PROFILE)  # the policy picks "none"

    page.goto(f"{url}/?job={job['id']}")
    page.wait_for_selector("#job:not([hidden])", timeout=10_000)
    page.wait_for_function("document.querySelector('#job-facts').textContent.includes('16 / 40')", timeout=10_000)

    assert page.inner_text("#job-title") == f"browser-demo ({job['id']})"
    facts = page.inner_text("#job-facts")
    for text in ("running", "acpsgd r4", "40 Gb/s", "adaptive", "v1"):
        assert text in facts, text
    assert "browser-demo" in page.inner_text("#jobs tbody")
    legend = page.inner_text("#legend-phases")
    for phase in ("data", "forward", "backward", "exposed_comm", "optimizer", "in the hook: compress"):
        assert phase in legend, phase
    assert page.locator("#chart-phases rect").count() >= 4 * 5  # 4 reports x 5 stacked phases
    assert page.locator("#chart-bandwidth path").count() == 1
    assert page.locator("#chart-loss path").count() == 1
    assert "acpsgd r4" in page.text_content("#chart-rank")
    decisions = page.inner_text("#decisions tbody")
    assert "none predicted" in decisions and "vs acpsgd-r4" in decisions
    assert " %" in decisions  # the predicted gain

    # a new report arrives over the event stream without reloading
    report(url, job, 24, compressor="none", compressor_rank=None, bandwidth_bytes_per_second=40e9 / 8, loss=0.01)
    page.wait_for_function("document.querySelector('#job-facts').textContent.includes('24 / 40')", timeout=10_000)
    assert "none" in page.text_content("#chart-rank")
    assert page.locator("#chart-phases rect").count() >= 5 * 5

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)
    assert page.errors == []

    # the job ends: the page says so
    httpx.post(f"{url}/v1/jobs/{job['id']}/cancel")
    page.wait_for_function("document.querySelector('#job-facts').textContent.includes('cancelled')", timeout=10_000)


def test_live_page_without_jobs_says_how_to_start(coordinator, page):
    page.goto(coordinator.url)
    page.wait_for_selector("#no-jobs:not([hidden])", timeout=10_000)
    assert "gradwire submit" in page.inner_text("#no-jobs")
    assert page.inner_text("#conn") == "live"


def test_live_page_with_token_in_the_fragment(start_coordinator, page):
    server = start_coordinator(token="page-token")
    job = submit(server.url, token="page-token")
    report(server.url, job, 3)
    page.goto(f"{server.url}/#token=page-token")
    page.wait_for_function("document.querySelector('#job-facts') && "
                           "document.querySelector('#job-facts').textContent.includes('3 / 40')", timeout=10_000)
    assert page.errors == []
