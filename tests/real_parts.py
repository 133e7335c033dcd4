"""The real parts the tests run against, and what happens when one is missing.

A test that needs a real part (Chromium, a Prometheus server, promtool, Redis, PostgreSQL) and does not find it
is **skipped** on a developer's machine, with the part and how to get it in the reason, and **fails** in CI
(``CI=true``): there a missing part means the suite did not test what it claims, and a green run must not hide
that. ``make test`` installs the parts it can (``infra/test.py``).

Use the marker on a test or module (``@PROMETHEUS``, ``pytestmark = [CHROMIUM]``), decided before any fixture
starts, or call ``require(...)`` where availability is only known inside a test or fixture. The hooks are
registered by ``tests/conftest.py`` (and by ``-p tests.real_parts`` where no conftest is loaded). This module
imports nothing of the project, so it can be loaded as a plugin before Django is set up.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

MARKER = "real_part"
CHROMIUM_PATH = "/usr/bin/chromium"  # Debian's Chromium; Playwright drives it (no downloaded browser)
APT_HINT = "make test installs it with apt-get on Debian as root: infra/test.py SYSTEM_PACKAGES"


def in_ci() -> bool:
    """True on a CI runner (``CI=true``, as GitHub Actions, GitLab CI and most others set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(name: str, available: bool, hint: str = APT_HINT) -> None:
    """Go on when ``available``; else skip the test (locally) or fail it (in CI), naming ``name``."""
    if not available:
        missing(name, hint)


def missing(name: str, hint: str = APT_HINT) -> NoReturn:
    if in_ci():
        pytest.fail(f"CI=true and a real part this test needs is missing: {name} ({hint}). A CI run must not "
                    "skip it: install it on the runner.", pytrace=False)
    pytest.skip(f"real part missing: {name} ({hint})")


def real_part(name: str, available: bool, hint: str = APT_HINT) -> pytest.MarkDecorator:
    """A marker: the test runs when ``available``, else it is skipped locally and fails in CI (reported as an
    error at setup, before its fixtures start)."""
    return getattr(pytest.mark, MARKER)(name=name, available=bool(available), hint=hint)


# -- the parts ---------------------------------------------------------------------------------------------
def chromium_available() -> bool:
    return os.access(CHROMIUM_PATH, os.X_OK)


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def promtool_binary() -> str | None:
    return shutil.which("promtool")


CHROMIUM = real_part(f"Chromium ({CHROMIUM_PATH}, Debian package chromium)", chromium_available())
PROMETHEUS = real_part("Prometheus (the prometheus binary on PATH, Debian package prometheus)",
                       prometheus_binary() is not None)
PROMETHEUS_AND_PROMTOOL = real_part(
    "Prometheus and promtool (on PATH, Debian package prometheus)",
    prometheus_binary() is not None and promtool_binary() is not None)


# -- the hooks ---------------------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(name, available, hint): needs a real part; skipped locally and failed in CI "
                   "(CI=true) where it is missing (tests/real_parts.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of the test starts (a fleet, a worker): a missing part skips or fails it."""
    for marker in item.iter_markers(MARKER):
        require(marker.kwargs["name"], marker.kwargs["available"], marker.kwargs.get("hint", APT_HINT))
