"""The portal in a real browser: Debian's Chromium driven by Playwright (no downloaded browser)."""

import os
import shutil
from pathlib import Path

import pytest

from tests.factories import make_world

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason="Debian's chromium is not installed (make test installs it as root)"
)


@pytest.fixture
def browser():
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield browser
        browser.close()


@pytest.fixture
def _close_server_connections():
    """live_server's request threads may still hold a connection when the test database is dropped."""
    yield
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_close_server_connections")
def test_portal_login_and_dashboard_in_browser(live_server, browser):
    world = make_world()
    page = browser.new_page(viewport={"width": 1100, "height": 700})
    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url  # login required
    page.screenshot(path=str(SCREENSHOTS / "login.png"))

    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").is_visible()  # the error is shown, not hidden

    page.get_by_label("Password").fill("pw-alice")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live_server.url}/")
    assert page.get_by_role("heading", name="Acme").is_visible()
    assert page.get_by_text("vision").first.is_visible()
    assert page.get_by_text("secret").count() == 0  # the other tenant's project
    page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)

    page.get_by_role("button", name="Log out").click()
    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url
    assert world.acme.slug == "acme"
