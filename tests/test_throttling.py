"""Login lockout, the failed-token throttle, the shared cache and HTTPS settings (issue 13, items 6 and 13b)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import time_machine
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.cache import cache
from django.test import override_settings

from infra import run
from tests.factories import api_client, make_user
from tests.real_parts import require
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
LIMIT = settings.AXES_FAILURE_LIMIT


def _login(client, username, password, addr="10.1.0.1", path="/accounts/login/"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=addr)


# --- login lockout (django-axes) -------------------------------------------------------------------


def test_login_lockout_per_address_refuses_even_the_right_password(db, client):
    make_user("alice")
    statuses = [_login(client, f"nobody{i}", "wrong").status_code for i in range(100)]
    assert statuses[:LIMIT - 1] == [200] * (LIMIT - 1)  # the form again, with its error
    assert set(statuses[LIMIT:]) == {429}
    locked = _login(client, "alice", "pw-alice")
    assert locked.status_code == 429 and b"Too many failed sign-ins" in locked.content
    assert int(locked["Retry-After"]) == settings.AXES_COOLOFF_TIME.total_seconds()
    assert _login(client, "alice", "pw-alice", addr="10.1.0.2").status_code == 302  # another address


def test_login_lockout_per_account_from_many_addresses(db, client):
    make_user("alice")
    make_user("bob")
    statuses = [_login(client, "alice", "wrong", addr=f"10.2.{i // 250}.{i % 250}").status_code
                for i in range(100)]
    assert set(statuses[LIMIT:]) == {429}
    assert _login(client, "alice", "pw-alice", addr="10.9.9.9").status_code == 429  # a fresh address
    assert _login(client, "bob", "pw-bob", addr="10.9.9.9").status_code == 302  # another account


def test_login_lockout_covers_the_admin_sign_in(db, client):
    make_user("root", is_staff=True, is_superuser=True)
    for _ in range(LIMIT):
        _login(client, "root", "wrong", path="/admin/login/")
    assert _login(client, "root", "pw-root", path="/admin/login/").status_code == 429


def test_login_lockout_ends_when_staff_reset_the_account(db, client):
    from django.core.management import call_command

    make_user("alice")
    for i in range(LIMIT):
        _login(client, "alice", "wrong", addr=f"10.3.0.{i}")
    assert _login(client, "alice", "pw-alice", addr="10.3.1.1").status_code == 429
    call_command("axes_reset_username", "alice")
    assert _login(client, "alice", "pw-alice", addr="10.3.1.1").status_code == 302


def test_login_address_ignores_a_forged_forwarded_for(db, client):
    make_user("alice")
    for i in range(LIMIT):  # one client varying X-Forwarded-For: still one address without a trusted proxy
        client.post("/accounts/login/", {"username": f"x{i}", "password": "wrong"}, REMOTE_ADDR="10.4.0.1",
                    HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    assert _login(client, "alice", "pw-alice", addr="10.4.0.1").status_code == 429


# --- failed API tokens ------------------------------------------------------------------------------


def test_api_bad_tokens_get_429_problem_json_with_retry_after(world):
    # the counter lives in fixed windows of API_TOKEN_FAILURE_WINDOW_SECONDS: the clock stands at the start
    # of one, so the 1,000 requests (seconds of wall time) never straddle a boundary and reset the count
    window = settings.API_TOKEN_FAILURE_WINDOW_SECONDS
    with time_machine.travel((time.time() // window + 1) * window + 1, tick=False):
        _bad_tokens_get_429(world)


def _bad_tokens_get_429(world):
    from tenants.tokens import token_parse_prefix

    bad = api_client("gpub_abcdefgh_" + "x" * 40)
    statuses = [bad.get("/api/v1/projects", REMOTE_ADDR="10.5.0.1").status_code for _ in range(1000)]
    refused = bad.get("/api/v1/projects", REMOTE_ADDR="10.5.0.1")
    limit = settings.API_TOKEN_FAILURE_LIMIT
    assert statuses[:limit] == [401] * limit and set(statuses[limit:]) == {429}
    assert refused["Content-Type"].startswith("application/problem+json")
    assert refused.json()["status"] == 429
    assert 1 <= int(refused["Retry-After"]) <= settings.API_TOKEN_FAILURE_WINDOW_SECONDS
    # a good token from that address waits too; from another address it works
    good = world.client("owner")
    assert token_parse_prefix(world.tokens["owner"]) is not None
    assert good.get("/api/v1/projects", REMOTE_ADDR="10.5.0.1").status_code == 429
    assert good.get("/api/v1/projects", REMOTE_ADDR="10.5.0.2").status_code == 200


def test_api_token_failures_are_counted_in_the_shared_cache(world):
    """The counter lives in the cache every web process uses (Redis or PostgreSQL), not in this process."""
    assert "locmem" not in settings.CACHES["default"]["BACKEND"].lower()
    api_client("gpub_abcdefgh_" + "y" * 40).get("/api/v1/projects", REMOTE_ADDR="10.6.0.1")
    keys = [k for k in _cache_keys() if "token-failures:10.6.0.1" in k]
    assert keys, "no failure counter in the shared cache"


def _cache_keys() -> list[str]:
    backend = settings.CACHES["default"]["BACKEND"]
    if backend.endswith("PrefixedRedisCache"):
        client = cache._cache.get_client()
        return [k.decode() for k in client.scan_iter(match=f"{settings.CACHE_KEY_PREFIX}:*")]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT cache_key FROM django_cache")
        return [row[0] for row in cursor.fetchall()]


def test_cache_clear_keeps_other_keys_of_the_redis_database():
    """The default cache shares the Celery broker's Redis database: clear() must not flush queued tasks."""
    require("Redis (the shared cache is PostgreSQL's here: no Redis answered)",
            settings.CACHES["default"]["BACKEND"].endswith("PrefixedRedisCache"),
            "install redis-server or set CELERY_BROKER_URL=redis://...; make test installs it on Debian as root")
    client = cache._cache.get_client(write=True)
    client.set("not-a-cache-key", "queued task")
    cache.set("mine", 1)
    try:
        cache.clear()
        assert cache.get("mine") is None and client.get("not-a-cache-key") == b"queued task"
    finally:
        client.delete("not-a-cache-key")


# --- HTTPS --------------------------------------------------------------------------------------------


def test_settings_cookies_are_secure_by_default_outside_debug():
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS", "DJANGO_DEBUG")}
    code = ("import json; from django.conf import settings as s; print(json.dumps([s.SESSION_COOKIE_SECURE, "
            "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS]))")
    out = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=ROOT,
                         env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"}, capture_output=True,
                         text=True, check=True).stdout
    session_secure, csrf_secure, hsts = json.loads(out.strip().splitlines()[-1])
    assert session_secure and csrf_secure and hsts >= 86400
    out = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=ROOT,
                         env={**env, "DJANGO_SETTINGS_MODULE": "config.settings", "HTTPS": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1])[:2] == [False, False]  # make run: plain HTTP


@override_settings(SESSION_COOKIE_SECURE=True, CSRF_COOKIE_SECURE=True, SECURE_HSTS_SECONDS=31536000)
def test_login_over_https_sets_secure_cookies_and_hsts(db, client):
    make_user("alice")
    page = client.get("/accounts/login/", secure=True)
    assert page.cookies["csrftoken"]["secure"] and page["Strict-Transport-Security"].startswith("max-age=")
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"}, secure=True)
    assert response.status_code == 302 and response.cookies["sessionid"]["secure"]


# --- end to end: health keeps answering during a burst of bad logins ---------------------------------------


@pytest.fixture
def web_server(transactional_db):
    """gunicorn as make run starts it (infra.run.web_command), on the test database."""
    from tests.support.processes import test_database_url

    url = test_database_url()  # the test database, over TCP or the embedded server's Unix socket
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(run.web_command(port=port), cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    site = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{site}/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and process.poll() is None, "gunicorn did not start"
            time.sleep(0.2)
        yield site
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_healthz_answers_at_once_during_a_burst_of_bad_logins(web_server):
    user = make_user("alice")
    user.password = PBKDF2PasswordHasher().encode("pw-alice", "somesalt12345678")  # as in production: ~1 s
    user.save(update_fields=["password"])
    session = requests.Session()
    page = session.get(f"{web_server}/accounts/login/", timeout=10)
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    cookies = dict(session.cookies)

    def bad_login(i):
        return requests.post(f"{web_server}/accounts/login/", timeout=60, cookies=cookies,
                             data={"csrfmiddlewaretoken": token, "username": "alice" if i % 2 else f"u{i}",
                                   "password": "wrong"}).status_code

    latencies = []
    done = threading.Event()

    def probe():
        while not done.is_set():
            started = time.monotonic()
            assert requests.get(f"{web_server}/healthz", timeout=10).status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [pool.submit(bad_login, i) for i in range(100)]
        time.sleep(0.05)
        prober.start()
        statuses = [f.result() for f in futures]
    time.sleep(0.5)
    done.set()
    prober.join()
    assert 429 in statuses and set(statuses) <= {200, 429}
    # without the limit every probe waits behind dozens of ~1 s password checks (tens of seconds); with it they
    # answer at once — a median under 0.5 s and no probe over 3 s holds on a busy 2-core machine too
    assert len(latencies) >= 5 and statistics.median(latencies) < 0.5 and max(latencies) < 3.0, latencies
    print(f"healthz during the burst: {len(latencies)} probes, max {max(latencies) * 1000:.0f} ms; "
          f"logins: {statuses.count(200)} checked, {statuses.count(429)} refused")


# --- the API request budget (tenants.throttling.TenantRateThrottle) ----------------------------------------


def _budget_statuses(world, count: int) -> list:
    client = world.client("owner")
    return [client.get("/api/v1/projects") for _ in range(count)]


@pytest.mark.parametrize("backend", ["configured", "generic"])
def test_api_request_budget_is_a_sliding_window_with_retry_after(world, monkeypatch, backend):
    """3 requests a minute per token: the 4th is a 429 problem+json with Retry-After; the next window still
    counts the previous one's requests by the share of it inside the sliding minute; another token has its
    own budget. ``generic``: the cache's add/incr path (PostgreSQL's cache, where no Redis answers)."""
    from tenants.throttling import TenantRateThrottle

    monkeypatch.setattr(TenantRateThrottle, "rate", "3/min", raising=False)
    if backend == "generic":
        monkeypatch.setattr(TenantRateThrottle, "allow_request", _generic_allow(TenantRateThrottle.allow_request))
    start = (time.time() // 60 + 1) * 60
    with time_machine.travel(start + 1, tick=False):
        answers = _budget_statuses(world, 4)
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        refused = answers[-1]
        assert refused["Content-Type"].startswith("application/problem+json") and refused.json()["status"] == 429
        assert 1 <= int(refused["Retry-After"]) <= 60
        assert world.client("member").get("/api/v1/projects").status_code == 200  # its own budget
    with time_machine.travel(start + 60 + 15, tick=False):  # 3 × 45/60 = 2.25 still count: one more fits
        assert [a.status_code for a in _budget_statuses(world, 2)] == [200, 429]
    with time_machine.travel(start + 120 + 1, tick=False):  # the first window is out of the sliding minute
        assert [a.status_code for a in _budget_statuses(world, 1)] == [200]


def _generic_allow(allow):
    def allow_request(self, request, view):
        class NoScripts:  # the cache without a Redis client: add/incr
            def __getattr__(self, name):
                if name in ("_cache", "make_and_validate_key"):
                    raise AttributeError(name)
                return getattr(cache, name)
        self.cache = NoScripts()
        return allow(self, request, view)
    return allow_request
