import types

import pytest
from django.core.cache import cache

from tests.factories import make_world

# A test whose real part (Chromium, Prometheus, Redis, ...) is missing is skipped locally and fails in CI
# (CI=true): the hooks live in tests/real_parts.py, and importing them here registers them for the suite.
from tests.real_parts import pytest_configure, pytest_runtest_setup  # noqa: F401

# Fixtures shared across directories (Prometheus servers, the session's Celery worker); helpers are imported from
# tests/support/ as a library, never from a conftest.
pytest_plugins = ["tests.support.fixtures"]


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing():
    """Django's PBKDF2 takes about a second per password on this machine; tests need no strength."""
    from django.conf import settings
    from django.contrib.auth import hashers

    previous = settings.PASSWORD_HASHERS
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()
    yield
    settings.PASSWORD_HASHERS = previous
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


@pytest.fixture(autouse=True, scope="session")
def _test_client_logins_pass_the_second_factor():
    """The test client's ``login`` and ``force_login`` stand for a finished sign-in, both factors: staff need a
    TOTP code since issue 34 (tenants/otp.py), and the tests that log staff in to reach a page are about that
    page. The real way through (the sign-in form, then a code computed with pyotp; SSO) is tested in
    tests/tenants/test_second_factor.py and tests/tenants/test_sso.py, which post to the form instead."""
    from django.test import Client

    from tenants.otp import SESSION_KEY

    original = Client._login  # what both login() and force_login() end in

    def _login(self, user, backend=None):
        original(self, user, backend)
        session = self.session
        session[SESSION_KEY] = user.pk
        session.save()

    Client._login = _login
    yield
    Client._login = original


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database gets the cache table too, where the shared cache is PostgreSQL's (no Redis)."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        call_command("createcachetable", verbosity=0)


@pytest.fixture(autouse=True)
def _clear_cache(request):
    """Throttle counters and lockouts start from zero in every test (the shared cache outlives a test), and the
    scheduler's demand mix is read from the test's own leases."""
    from django.conf import settings

    from broker.selectors import scheduler_demand_forget

    scheduler_demand_forget()

    if not settings.CACHES["default"]["BACKEND"].endswith("DatabaseCache"):
        cache.clear()  # Redis: only this run's keys (config.cache.PrefixedRedisCache)
    elif {"db", "transactional_db", "live_server", "world"} & set(request.fixturenames):
        request.getfixturevalue("django_db_setup")
        with request.getfixturevalue("django_db_blocker").unblock():
            cache.clear()  # PostgreSQL's cache table (no Redis here)
    yield


@pytest.fixture
def world(db):
    return make_world()


# A test is end-to-end (``-m e2e``; ``-m "not e2e"`` is the fast tier, seconds per directory) when
# * it uses one of these fixtures: each starts, or serves, something outside the test process (the live server's
#   thread, a Celery worker, simulated agents, Chromium, Prometheus) or needs committed data that such a process
#   reads (``transactional_db``, with the database flush after each test). Fixtures built on them (``fleet``,
#   ``worker``, ``loop``, ``api`` ...) are covered through them;
# * or its module starts processes in test bodies: it imports a launcher (``core.processes``, ``subprocess``,
#   tests/support's processes, agents, Prometheus or Celery helpers, tests/api/server.py);
# * or it is marked ``slow`` (real processes, by hand).
E2E_FIXTURES = frozenset({
    "live_server", "transactional_db", "django_db_reset_sequences", "celery_worker", "celery_worker_session",
    "browser", "prometheus_server", "agent",
})
E2E_MODULES = frozenset({
    "subprocess", "core.processes", "tests.support.processes", "tests.support.agents", "tests.support.prometheus",
    "tests.support.celery", "tests.api.server",
})


def _starts_processes(module) -> bool:
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if name in E2E_MODULES:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    modules: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        launches = module is not None and modules.setdefault(module.__name__, _starts_processes(module))
        if launches or E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.e2e)
