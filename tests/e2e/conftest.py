"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium) against a live server.

Without Chromium these tests are skipped, and say why; in CI (CI=true) a missing browser fails.
"""

import os
import shutil
from collections.abc import Iterator

import pytest

from runtime.net import free_port

# Playwright's sync API runs an event loop in this thread; the ORM calls of the tests are safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


# The live server's address is fixed before any process starts, so that the suite's Celery
# worker registers Label Studio webhooks that reach it (PLATFORM_URL), and on 127.0.0.1 like
# Label Studio, whose session cookie the console hands over (cookies ignore ports).
if "DJANGO_LIVE_TEST_SERVER_ADDRESS" not in os.environ:
    _port = free_port()
    os.environ["DJANGO_LIVE_TEST_SERVER_ADDRESS"] = f"127.0.0.1:{_port}"
    os.environ["PLATFORM_URL"] = f"http://127.0.0.1:{_port}"

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a closed network: no background connections, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def pytest_collection_modifyitems(config, items):
    if os.path.exists(CHROMIUM):
        return
    reason = (
        f"browser tests skipped: Chromium not found at {CHROMIUM} "
        "(install it with `apt-get install chromium`)"
    )
    if os.environ.get("CI"):
        raise pytest.UsageError(f"CI=true and {reason}")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.call_failed = report.failed  # for `page`: a screenshot of what the test saw
    return report


@pytest.fixture
def page(browser, live_server, request):
    context = browser.new_context(base_url=live_server.url, locale="zh-CN")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    if os.environ.get("E2E_SCREENSHOTS") and getattr(request.node, "call_failed", False):
        path = os.path.join(os.environ["E2E_SCREENSHOTS"], f"failed-{request.node.name}.png")
        page.screenshot(path=path, full_page=True)
    context.close()
