"""Settings of the test/demo OpenID provider (``infra/oidc_provider``); nothing here is read by the broker."""

import os
from pathlib import Path

DATA = Path(os.environ["OIDC_PROVIDER_DATA"])

SECRET_KEY = (DATA / "django-secret").read_text().strip()
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "infra.oidc_provider.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [Path(__file__).parent / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA / "provider.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": (DATA / "oidc-rsa.pem").read_text(),
    "OAUTH2_VALIDATOR_CLASS": "infra.oidc_provider.validator.ClaimsValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "E-mail address", "profile": "Name",
               "groups": "Group membership"},
    "PKCE_REQUIRED": False,
    "ID_TOKEN_EXPIRE_SECONDS": 300,
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
}
# quiet: make run's console shows its children's output, and a request line per redirect says nothing there
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "loggers": {"django.server": {"level": "WARNING"}}}
# cookies are per host, not per port: on 127.0.0.1 beside the broker its names must differ from the broker's
# (sessionid, csrftoken), or signing in here would replace the broker's session (and the sign-in's state)
SESSION_COOKIE_NAME = "oidc_provider_session"
CSRF_COOKIE_NAME = "oidc_provider_csrftoken"
