"""A test whose real part is missing is skipped on a developer's machine and fails in CI (tests/real_parts.py).

Checked on a tiny test file run by pytest in a subprocess whose PATH has no Prometheus (the fake missing part),
with and without ``CI=true``; the real Prometheus is on this machine's PATH, which the subprocess does not see."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests import real_parts

ROOT = Path(__file__).resolve().parent.parent
TINY = '''
from tests import real_parts

@real_parts.PROMETHEUS
def test_marked_needs_prometheus():
    assert False, "must not run: Prometheus is missing"

def test_calls_require_for_prometheus():
    real_parts.require("Prometheus", real_parts.prometheus_binary() is not None)
    assert False, "must not get here: Prometheus is missing"

@real_parts.real_part("a part that is here", True)
def test_with_its_part_runs():
    pass
'''


def run_tiny(tmp_path: Path, *, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "bin").mkdir(exist_ok=True)  # PATH: an empty folder, so no prometheus or promtool
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # no project settings: no Django, no services
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env |= {"PATH": str(tmp_path / "bin"), "PYTHONPATH": str(ROOT), **({"CI": ci} if ci is not None else {})}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.real_parts", "-p", "no:cacheprovider", "-rA",
         "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_tiny.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_real_parts_missing_part_fails_in_ci(tmp_path):
    result = run_tiny(tmp_path, ci="true")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    # the marked test errors at setup (before its fixtures), the one calling require() fails; both fail the run
    assert "1 failed, 1 passed, 1 error" in out, out
    missing = "Failed: CI=true and a real part this test needs is missing: Prometheus"
    assert f"ERROR test_tiny.py::test_marked_needs_prometheus - {missing}" in out, out
    assert f"FAILED test_tiny.py::test_calls_require_for_prometheus - {missing}" in out, out
    assert "must not run" not in out and "must not get here" not in out, out  # failed before the body
    assert "skipped" not in out.rsplit("short test summary info", 1)[-1], out


def test_real_parts_missing_part_skips_locally_with_its_name(tmp_path):
    result = run_tiny(tmp_path, ci=None)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "1 passed, 2 skipped" in out, out
    assert out.count("real part missing: Prometheus") == 2, out
    assert "CI=true" not in out


def test_real_parts_ci_is_read_as_ci_runners_set_it(monkeypatch):
    for value, expected in [("true", True), ("TRUE", True), ("1", True), ("false", False), ("", False)]:
        monkeypatch.setenv("CI", value)
        assert real_parts.in_ci() is expected, value
    monkeypatch.delenv("CI")
    assert real_parts.in_ci() is False


def _rabbitmq_answers() -> bool:
    from infra import services

    url = os.environ.get("RABBITMQ_URL", "").strip() or services.RABBITMQ_URL_DEFAULT
    return services._broker_answers(url) is None


# Every real part of the suite, in one place: on a CI runner each one must be here (a missing one fails its
# line below, besides the tests that need it); locally a missing one is reported as skipped.
@pytest.mark.parametrize("part", ["Chromium", "Prometheus", "promtool", "Redis", "PostgreSQL", "RabbitMQ"])
def test_real_parts_each_is_here(part):
    available = {
        "Chromium": real_parts.chromium_available,
        "Prometheus": lambda: real_parts.prometheus_binary() is not None,
        "promtool": lambda: real_parts.promtool_binary() is not None,
        "Redis": lambda: settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")),
        "PostgreSQL": lambda: connection.vendor == "postgresql",
        "RabbitMQ": _rabbitmq_answers,  # the scale-out test's second broker (tests/deploy/test_scaleout.py)
    }[part]
    real_parts.require(part, available())
