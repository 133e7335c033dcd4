"""Request metrics: one count and one duration per request, labelled by the URL pattern that answered
(``api/v1/leases/<int:pk>``; ``unmatched`` for 404s outside any pattern), never by the raw path."""

from __future__ import annotations

import time

from observability import metrics

SKIP = ("/metrics", "/static/")


def route_of(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    if match.route is not None:
        return "/" + match.route  # the root pattern '' is "/"
    return match.view_name or "unknown"


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(SKIP):
            return self.get_response(request)
        started = time.perf_counter()
        status = 500
        try:
            response = self.get_response(request)
            status = response.status_code
            return response
        finally:
            route = route_of(request)
            method = request.method if request.method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
                                                          "OPTIONS") else "other"
            metrics.HTTP_REQUESTS.labels(route, method, str(status)).inc()
            metrics.HTTP_DURATION.labels(route, method).observe(time.perf_counter() - started)
