"""Shared plumbing below every app: errors, API helpers, audit, Prometheus client, process launching."""
