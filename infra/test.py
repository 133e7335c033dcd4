"""``make test``: system packages the tests need, the linter, then the whole pytest suite.

On a Debian machine as root, missing system packages are installed with apt-get; elsewhere the
command says what is missing. A test that needs a missing part is skipped on a developer's machine and
FAILS in CI (``CI=true``), naming the part (tests/real_parts.py): a CI run never goes green without them.

pytest runs on ``-n auto`` pytest-xdist workers (one per core; ``PYTEST_WORKERS=0`` or ``-n 0`` runs in one
process) with ``--dist loadfile`` (a module's tests, and its module-scoped agent or trained model, stay on one
worker) and prints the 25 slowest phases. Each worker has its own test database, Redis database and cache prefix
(infra/pytest_services.py). Arguments after ``make test`` (``PYTEST_ARGS``) go to pytest as they are:
``PYTEST_ARGS="-m 'not e2e'"`` runs the fast tier only (tests/conftest.py says what is e2e).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from infra.services import ROOT, say

# binary -> Debian package. Redis is optional (the tests fall back to a broker in var/), but a real
# one is what production runs, so install it where we can.
SYSTEM_PACKAGES: dict[str, str] = {
    "redis-server": "redis-server",
    "chromium": "chromium",  # portal browser tests (Playwright drives /usr/bin/chromium)
    "prometheus": "prometheus",  # a real Prometheus scrapes the simulated agents (tests/agent)
    "rabbitmq-server": "rabbitmq-server",  # Celery on AMQP in the scale-out test (tests/deploy/test_scaleout.py)
    # a real container engine runs a workload through the agent (tests/agent/test_container_runtime.py): podman
    # with crun (its default) and runc (for hosts with hybrid cgroups, which crun refuses), catatonit for
    # --init, and a static busybox as the whole of the locally built test image (no registry)
    "podman": "podman",
    "crun": "crun",
    "runc": "runc",
    "catatonit": "catatonit",
    "busybox": "busybox-static",
    # the OpenSSH client reaches a lease through the broker's SSH gateway (tests/broker/test_ssh_gateway.py)
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}


def _missing() -> dict[str, str]:
    return {binary: package for binary, package in SYSTEM_PACKAGES.items() if shutil.which(binary) is None}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")  # as tests/real_parts.py


def ensure_system_packages() -> list[str]:
    """Install what is missing where we can; return the binaries still missing afterwards."""
    missing = _missing()
    if not missing:
        return []
    packages = sorted(set(missing.values()))
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"installing system packages: {' '.join(packages)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        update = subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        install = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                                 env=env, check=False)
        if update.returncode != 0 or install.returncode != 0:
            say("apt-get failed")
        missing = _missing()
    if missing:
        what = " ".join(sorted(missing))
        if _in_ci():
            say(f"CI=true and still missing: {what}; a test that needs a part it cannot reach will FAIL, not skip")
        else:
            say(f"missing (install them for the full suite): {what}; a test that needs a part it cannot reach "
                "is skipped")
    return sorted(missing)


def ensure_rabbitmq_running() -> None:
    """Debian's RabbitMQ is a system service: start it (as root, where it is installed and nothing answers on
    5672) so that the scale-out test can use it; it stays up, as a service does. Elsewhere the test says what is
    missing (skipped locally, failed in CI)."""
    from infra.services import RABBITMQ_URL_DEFAULT, _broker_answers

    if os.environ.get("RABBITMQ_URL") or shutil.which("rabbitmq-server") is None:
        return
    if _broker_answers(RABBITMQ_URL_DEFAULT) is None:
        return
    if os.geteuid() == 0 and shutil.which("service"):
        say("starting the rabbitmq-server service")
        subprocess.run(["service", "rabbitmq-server", "start"], check=False)


def pytest_arguments(argv: list[str]) -> list[str]:
    """What ``make test`` adds to the caller's pytest arguments: xdist workers (unless ``-n``/``--numprocesses``
    or ``-p no:xdist`` is given, or ``PYTEST_WORKERS``) and ``--durations=25`` (unless ``--durations`` is)."""
    added: list[str] = []
    given = " ".join(argv)
    workers = os.environ.get("PYTEST_WORKERS", "auto").strip() or "auto"
    if not any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in argv) and "no:xdist" not in given:
        added += ["-n", workers, "--dist", "loadfile"]
    if "--durations" not in given:
        added.append("--durations=25")
    return [*added, *argv]


def main(argv: list[str]) -> int:
    ensure_system_packages()
    ensure_rabbitmq_running()
    bin_dir = os.path.dirname(sys.executable)
    say("ruff check")
    lint = subprocess.run([os.path.join(bin_dir, "ruff"), "check", "."], cwd=ROOT)
    if lint.returncode != 0:
        return lint.returncode
    say("pytest")
    return subprocess.run([sys.executable, "-m", "pytest", *pytest_arguments(argv)], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
