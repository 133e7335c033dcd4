"""What the OpenAPI document says beyond what drf-spectacular infers, so a generated client can read every
answer: paginated lists as ``{count, next, previous, results}``, and every error as problem+json.

Which errors an operation documents follows from how the stack works (``tests/api/test_schemathesis.py``
produces each one against a live server):

- every operation: 400 (a NUL in any query parameter, ``config.middleware``), 429 and 503 with
  ``Retry-After`` (throttled; the database cannot be reached, ``core.problems``), 414 and 431 (a request line
  or header fields past gunicorn's limits, answered as problem+json by ``config.gunicorn``);
- with authentication: 401 (no/invalid token), 403 (role or token scope);
- with path parameters: 404 (not found, or another tenant's);
- with a request body: 413 (too large) and 415 (not JSON);
- 401/402/403/404/409 where a view's ``extend_schema`` names them (``problem(...)``).
"""

from __future__ import annotations

from functools import cache

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

PROBLEM_CONTENT_TYPE = "application/problem+json"


PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details; some errors add fields (limit, constraint, the budget's figures).",
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "field": {"type": "string", "nullable": True,
                  "description": "the offending input, dotted for nested fields (gpu.kind, scopes[0], body)"},
        "errors": {"type": "array", "description": "validation errors: every field", "items": {
            "type": "object", "required": ["field", "message", "code"],
            "properties": {"field": {"type": "string", "nullable": True}, "message": {"type": "string"},
                           "code": {"type": "string"}}}},
    },
    "required": ["type", "title", "status", "detail", "code", "field"],
}


def problem(description: str) -> OpenApiResponse:
    """An error response for ``extend_schema(responses=...)``; the hook gives it the problem+json body."""
    return OpenApiResponse(description=description)


PAGE_PARAMETERS = [  # the bounds BoundedLimitOffsetPagination enforces (a value outside them, or empty: 400)
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 500},
                     description="page size (default 50, at most 500)"),
    OpenApiParameter("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                     description="index of the first result (at most 10,000,000)"),
]


@cache
def paginated(serializer_class: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """The page ``LimitOffsetPagination`` answers for a list of ``serializer_class``."""
    name = serializer_class.__name__.removesuffix("Output")
    return inline_serializer(
        name=f"Paginated{name}List",
        fields={
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
        },
    ).__class__


_GENERIC = {
    400: "Invalid input (problem+json names the field)",
    401: "Not authenticated (missing, malformed, revoked or expired token)",
    403: "The role or the token's scopes do not allow this",
    404: "No such object (or it belongs to another tenant)",
    413: "Request body too large",
    414: "Request line (path and query) longer than 4094 bytes (refused by gunicorn, config.gunicorn)",
    415: "The body is not application/json",
    429: "Too many requests; retry after Retry-After seconds",
    431: "More than 100 header fields, or one longer than 8190 bytes (refused by gunicorn, config.gunicorn)",
    503: "The database cannot be reached; retry after Retry-After seconds",
}
# the heartbeat's and the workload report's node is looked up only once its signature verified (unknown: 401)
_NO_NOT_FOUND = {"v1_agents_heartbeat_create", "v1_agents_workloads_create"}
# the heartbeat's body is hashed for its signature, never parsed: no content type is refused (no 415)
_NOT_PARSED = {"v1_agents_heartbeat_create"}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait"}}


def add_error_responses(result, generator, request, public):
    """drf-spectacular post-processing hook: document the errors every operation can answer."""
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    for name, component in result["components"]["schemas"].items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False  # StrictSerializer: unknown fields are a 400
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses = operation.setdefault("responses", {})
            statuses = {400, 414, 429, 431, 503}  # the throttle also counts anonymous callers (by address)
            if any(requirement for requirement in operation.get("security", [])):
                statuses |= {401, 403}
            if any(p.get("in") == "path" for p in operation.get("parameters", [])) and \
                    operation.get("operationId") not in _NO_NOT_FOUND:
                statuses.add(404)
            if "requestBody" in operation:
                statuses |= {413} if operation.get("operationId") in _NOT_PARSED else {413, 415}
            for status in statuses:
                responses.setdefault(str(status), {"description": _GENERIC[status]})
            for status, response in responses.items():
                if int(status) < 400:
                    continue
                response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": problem_ref}}
                if int(status) in (429, 503):
                    response["headers"] = _RETRY_AFTER
    return result
