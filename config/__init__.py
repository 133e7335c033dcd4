"""The composition root: settings, URLs, the WSGI/ASGI entry points (the web and the agents' ingress), the Celery app,
and what only they use (middleware, logging set-up, health probes, the cache backend, reading the environment,
gunicorn hooks). Shared plumbing the apps use lives in ``core``."""

from config.celery import app as celery_app

__all__ = ("celery_app",)
