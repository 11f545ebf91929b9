"""The headless Chromium page the browser tests drive."""

import pytest
from support.browser import launch


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        tab = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.errors = errors
        yield tab
        browser.close()
