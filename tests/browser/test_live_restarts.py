"""A worker-group restart shows on the live page: in the snapshot and live, as it happens."""

import pytest
from support.api import SMALLEST_SPEC, report, submit
from support.browser import chromium_missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")]

FACTS = "document.querySelector('#job-facts').textContent"


def test_the_live_page_shows_worker_group_restarts(start_coordinator, page):
    url = start_coordinator(history_interval_s=0).url
    job = submit(url, {**SMALLEST_SPEC, "name": "restarting"})
    report(url, job, 8, worker_group="first")
    report(url, job, 18, worker_group="first")

    page.goto(f"{url}/?job={job['id']}")
    page.wait_for_function(f"{FACTS}.includes('18 / 40')", timeout=10_000)
    assert "restarts0" in page.inner_text("#job-facts").replace("\n", "").replace("\t", "")

    report(url, job, 11, worker_group="second", resumed_from_step=10)  # arrives over the event stream
    page.wait_for_function(f"{FACTS}.includes('resumed from checkpoint at step 10')", timeout=10_000)
    assert "1 (last: resumed from checkpoint at step 10, was at step 18)" in page.inner_text("#job-facts")

    page.reload()  # and from the stored history
    page.wait_for_function(f"{FACTS}.includes('resumed from checkpoint at step 10')", timeout=10_000)
    assert not page.errors
