"""Login lockout, the failed-token throttle, the shared cache and HTTPS settings (issue 13, items 6 and 13b)."""

from __future__ import annotations

import json
import os
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

from tests.api import server
from tests.factories import api_client, make_user
from tests.real_parts import require

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


def test_login_lockout_attack_from_one_address_does_not_lock_the_user_out_elsewhere(db, client):
    """Issue 27 item 7: ten wrong passwords used to lock any known account, staff too, out from every address."""
    make_user("root", is_staff=True, is_superuser=True)
    statuses = [_login(client, "root", "wrong", addr="10.2.0.66").status_code for _ in range(3 * LIMIT)]
    assert set(statuses[LIMIT:]) == {429}  # the attacker's address is refused
    assert _login(client, "root", "pw-root", addr="10.2.0.66").status_code == 429
    assert _login(client, "root", "pw-root", addr="10.2.0.7").status_code == 302  # the real user, elsewhere
    assert _login(client, "root", "pw-root", addr="10.2.0.8", path="/admin/login/").status_code == 302


def test_login_lockout_per_account_at_one_address(db, client):
    make_user("alice")
    make_user("bob")
    statuses = [_login(client, "alice", "wrong", addr="10.2.1.1").status_code for _ in range(LIMIT + 5)]
    assert set(statuses[LIMIT:]) == {429}
    assert _login(client, "alice", "pw-alice", addr="10.2.1.1").status_code == 429
    # guesses spread over many addresses lock no address (each below the limit) and not the account
    for i in range(3 * LIMIT):
        _login(client, "bob", "wrong", addr=f"10.2.2.{i}")
    assert _login(client, "bob", "pw-bob", addr="10.2.3.1").status_code == 302


def test_login_lockout_ends_when_staff_reset_the_account(db, client):
    from django.core.management import call_command

    make_user("alice")
    for _ in range(LIMIT):
        _login(client, "alice", "wrong", addr="10.3.0.1")
    assert _login(client, "alice", "pw-alice", addr="10.3.0.1").status_code == 429
    call_command("axes_reset_username", "alice")
    assert _login(client, "alice", "pw-alice", addr="10.3.0.1").status_code == 302


def _unlock_link(client, mailoutbox, username, addr):
    sent = client.post("/accounts/unlock/", {"username": username}, REMOTE_ADDR=addr)
    assert sent.status_code == 202
    assert len(mailoutbox) == 1
    [link] = [word for word in mailoutbox[0].body.split() if "/accounts/unlock/" in word]
    return link.split("testserver", 1)[1]


def test_login_unlock_link_lets_the_real_user_in_once(db, client, mailoutbox):
    """Someone at the user's own address (a shared NAT) locks them out there; the mailed link lets that browser
    sign in with the password, once; the guesser's browser stays locked out."""
    from django.test import Client

    make_user("alice", email="alice@acme.test")
    attacker = Client()
    for _ in range(LIMIT):
        _login(attacker, "alice", "wrong", addr="10.7.0.1")
    locked = _login(client, "alice", "pw-alice", addr="10.7.0.1")
    assert locked.status_code == 429 and b"unlock link" in locked.content
    path = _unlock_link(client, mailoutbox, "alice", "10.7.0.1")
    assert mailoutbox[0].to == ["alice@acme.test"]
    assert client.get(path, REMOTE_ADDR="10.7.0.1").status_code == 302
    assert _login(client, "alice", "pw-alice", addr="10.7.0.1").status_code == 302
    assert _login(attacker, "alice", "pw-alice", addr="10.7.0.1").status_code == 429  # the cookie is per browser
    again = Client().get(path, REMOTE_ADDR="10.7.0.9")
    assert again.status_code == 409 and b"already been used" in again.content
    # the link never signs in by itself: without the password the unlocked browser is refused
    client.logout()
    assert _login(client, "alice", "wrong", addr="10.7.0.1").status_code in (200, 429)
    assert "_auth_user_id" not in client.session


def test_login_unlock_link_expires(db, client, mailoutbox):
    make_user("alice", email="alice@acme.test")
    with time_machine.travel(time.time(), tick=False) as clock:
        for _ in range(LIMIT):
            _login(client, "alice", "wrong", addr="10.8.0.1")
        path = _unlock_link(client, mailoutbox, "alice", "10.8.0.1")
        clock.shift(settings.LOGIN_UNLOCK_LINK_SECONDS + 1)
        expired = client.get(path, REMOTE_ADDR="10.8.0.1")
    assert expired.status_code == 400 and b"expired" in expired.content
    assert "login_unlock" not in expired.cookies


def test_login_unlock_request_tells_nothing_and_floods_no_mailbox(db, client, mailoutbox):
    make_user("alice", email="alice@acme.test")
    answers = {client.post("/accounts/unlock/", {"username": name}, REMOTE_ADDR="10.8.1.1").content
               .split(b"<section", 1)[1].split(b"</section>", 1)[0] for name in ("alice", "nobody", "alice", "alice")}
    assert len(answers) == 1  # the same page for a real account, a missing one, and a repeat
    assert len(mailoutbox) == 1  # one mail per account per LOGIN_UNLOCK_RESEND_SECONDS
    forged = client.get("/accounts/unlock/" + "x" * 40, REMOTE_ADDR="10.8.1.1")
    assert forged.status_code == 400


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
    # a valid token from that address keeps working (issue 27 item 7: it used to wait with the bad ones)
    good = world.client("owner")
    assert token_parse_prefix(world.tokens["owner"]) is not None
    assert good.get("/api/v1/projects", REMOTE_ADDR="10.5.0.1").status_code == 200
    assert good.get("/api/v1/projects", REMOTE_ADDR="10.5.0.2").status_code == 200


def test_api_bad_tokens_from_an_address_do_not_block_a_valid_token(world):
    """Malformed tokens, unknown prefixes, and wrong secrets for a real token's prefix, all from one address:
    each kind is refused past its limit there, and every valid token with another prefix still works from that
    address. (A prefix guessed at is refused from that address only, even with its right secret: the guesser
    learns nothing there for the window.)"""
    from tenants.tokens import token_parse_prefix

    window = settings.API_TOKEN_FAILURE_WINDOW_SECONDS
    limit = settings.API_TOKEN_FAILURE_LIMIT
    prefix = token_parse_prefix(world.tokens["viewer"])
    guessed = api_client(f"gpub_{prefix}_" + "z" * 43)  # the viewer's prefix, a wrong secret
    with time_machine.travel((time.time() // window + 1) * window + 1, tick=False):
        malformed = [api_client(f"junk-{i}").get("/api/v1/projects", REMOTE_ADDR="10.5.1.1").status_code
                     for i in range(limit + 3)]
        unknown = api_client("gpub_zzzzzzzzzz_" + "q" * 43).get("/api/v1/projects", REMOTE_ADDR="10.5.1.1")
        same_prefix = [guessed.get("/api/v1/projects", REMOTE_ADDR="10.5.1.1").status_code
                       for _ in range(limit + 3)]
        good = world.client("owner").get("/api/v1/projects", REMOTE_ADDR="10.5.1.1")
        other = world.client("member").get("/api/v1/projects", REMOTE_ADDR="10.5.1.1")
        targeted = world.client("viewer").get("/api/v1/projects", REMOTE_ADDR="10.5.1.1")
        viewer_elsewhere = world.client("viewer").get("/api/v1/projects", REMOTE_ADDR="10.5.1.2")
        elsewhere = guessed.get("/api/v1/projects", REMOTE_ADDR="10.5.1.2")
    assert malformed[:limit] == [401] * limit and set(malformed[limit:]) == {429}
    assert unknown.status_code == 429  # the address's cap for tokens that name no token
    assert same_prefix[:limit] == [401] * limit and set(same_prefix[limit:]) == {429}
    assert good.status_code == 200, good.content
    assert other.status_code == 200, other.content
    assert targeted.status_code == 429 and viewer_elsewhere.status_code == 200
    assert elsewhere.status_code == 401  # the prefix's counter is per address


def test_api_token_failures_are_counted_in_the_shared_cache(world):
    """The counter lives in the cache every web process uses (Redis or PostgreSQL), not in this process."""
    assert "locmem" not in settings.CACHES["default"]["BACKEND"].lower()
    api_client("gpub_abcdefgh_" + "y" * 40).get("/api/v1/projects", REMOTE_ADDR="10.6.0.1")
    keys = [k for k in _cache_keys() if "token-failures:10.6.0.1:" in k]
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
    with server.production_web_server(server.test_database_url()) as site:
        yield site


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
    """3 requests a minute per tenant: the 4th is a 429 problem+json with Retry-After; the next window still
    counts the previous one's requests by the share of it inside the sliding minute; another tenant has its
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
        assert world.client("outsider").get("/api/v1/projects").status_code == 200  # another tenant's budget
    with time_machine.travel(start + 60 + 15, tick=False):  # 3 × 45/60 = 2.25 still count: one more fits
        assert [a.status_code for a in _budget_statuses(world, 2)] == [200, 429]
    with time_machine.travel(start + 120 + 1, tick=False):  # the first window is out of the sliding minute
        assert [a.status_code for a in _budget_statuses(world, 1)] == [200]


@pytest.mark.parametrize("backend", ["configured", "generic"])
def test_api_request_budget_is_the_tenants_not_each_tokens(world, monkeypatch, backend):
    """The budget is the tenant's (docs/security.md): once the owner's token has spent it, a second token of the
    same tenant, of another member, and a member's portal session on the API are refused too (429), while
    another tenant's token is still served. Issue 27, item 9: a second token kept working."""
    from django.test import Client

    from tenants.throttling import TenantRateThrottle

    monkeypatch.setattr(TenantRateThrottle, "rate", "3/min", raising=False)
    if backend == "generic":
        monkeypatch.setattr(TenantRateThrottle, "allow_request", _generic_allow(TenantRateThrottle.allow_request))
    session = Client()
    assert session.login(username="max", password="pw-max")
    start = (time.time() // 60 + 1) * 60
    with time_machine.travel(start + 1, tick=False):
        assert [a.status_code for a in _budget_statuses(world, 3)] == [200, 200, 200]
        for who in ("owner_read", "member", "viewer"):
            refused = world.client(who).get("/api/v1/projects")
            assert refused.status_code == 429, who
            assert refused.json()["code"] == "throttled" and int(refused["Retry-After"]) >= 1
        assert session.get("/api/v1/projects").status_code == 429
        assert world.client("outsider").get("/api/v1/projects").status_code == 200


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
