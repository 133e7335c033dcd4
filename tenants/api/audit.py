"""``GET /api/v1/audit-events``: the tenant's audit trail for its admins and owners, as JSON pages (cursor
pagination: a page stays stable while new events arrive) or as one CSV (``?format=csv`` or
``Accept: text/csv``). Read through ``tenants.audit.audit_event_list`` (``restrict``): another tenant's events
are never in it."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

from django.http import Http404, HttpResponse
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

from core.errors import ValidationFailed
from core.openapi import problem
from core.parsers import parse_integer
from tenants.audit import audit_event_list
from tenants.models import AuditEvent

CSV_MAX_ROWS = 100_000
CSV_COLUMNS = ["id", "created_at", "actor", "kind", "object", "data"]


class CsvRenderer(BaseRenderer):
    """``text/csv`` for content negotiation (``?format=csv`` or ``Accept: text/csv``). The view writes the CSV
    itself; what reaches this renderer is an error's problem body, written as JSON."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode()


class AuditEventCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request):
        """``limit`` bounded and named as every list's (core.pagination): 1 to 500, else 400, never clamped."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        return parse_integer(raw, field=self.page_size_query_param, low=1, high=self.max_page_size)

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:  # DRF answers a bad cursor with 404; it is a bad parameter
            raise ValidationFailed("cursor is not a cursor this list gave out.", field="cursor") from None


class AuditEventOutput(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", allow_null=True, default=None,
                                  help_text="who made the change; null: the platform (a task, staff, a command)")
    kind = serializers.CharField(source="action", help_text="a dotted verb: token.create, member.role, signin.failed")
    object = serializers.CharField(source="target", help_text="what it was done to")

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "kind", "object", "data"]


AuditEventPage = inline_serializer("AuditEventPage", fields={
    "next": serializers.URLField(allow_null=True), "previous": serializers.URLField(allow_null=True),
    "results": AuditEventOutput(many=True)})

_DATE_OR_TIME = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]}


def moment_param(request, name: str) -> datetime | None:
    """An ISO 8601 date or date-time query parameter (UTC when it names no zone); None when absent."""
    raw = (request.query_params if hasattr(request, "query_params") else request.GET).get(name)
    if raw is None:
        return None
    try:
        value = parse_datetime(raw)
        day = parse_date(raw) if value is None else None
    except ValueError:
        value = day = None
    if value is None:
        if day is None:
            raise ValidationFailed(f"{name} must be an ISO 8601 date or date-time.", field=name)
        value = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _csv(events) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for event in events[:CSV_MAX_ROWS]:
        writer.writerow([event.pk, event.created_at.isoformat(), event.actor.username if event.actor else "",
                         event.action, event.target, json.dumps(event.data, sort_keys=True)])
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit-events.csv"'
    return response


class AuditEventListApi(APIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:  # DRF answers an unknown ?format= with 404; it is a bad parameter
            raise ValidationFailed("format must be json or csv.", field="format") from None

    @extend_schema(
        operation_id="v1_audit_events_list", summary="The tenant's audit trail (admins and owners)",
        description="Newest first. JSON pages with a cursor (`next`, `previous`), or every matching event as CSV "
                    f"(`?format=csv` or `Accept: text/csv`, at most {CSV_MAX_ROWS:,} rows). Members, viewers "
                    "and tokens limited to projects get 403.",
        parameters=[
            OpenApiParameter("actor", str, description="username of who made the change"),
            OpenApiParameter("kind", str, description="an action (token.create) or a dotted prefix (token)"),
            OpenApiParameter("object", str, description="what it was done to (exact)"),
            OpenApiParameter("since", _DATE_OR_TIME, description="from (inclusive)"),
            OpenApiParameter("until", _DATE_OR_TIME, description="to (exclusive)"),
            OpenApiParameter("cursor", str, description="the page: a `next` or `previous` link's cursor"),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 500},
                             description="page size (default 50, at most 500)"),
            OpenApiParameter("format", str, enum=["json", "csv"], description="csv: the whole list as CSV"),
        ],
        responses={(200, "application/json"): AuditEventPage, (200, "text/csv"): OpenApiTypes.STR,
                   403: problem("Not an admin or owner of the tenant")})
    def get(self, request):
        since, until = moment_param(request, "since"), moment_param(request, "until")
        if since is not None and until is not None and until <= since:
            raise ValidationFailed("until must be after since.", field="until")
        events = audit_event_list(actor=request.actor, username=request.query_params.get("actor", ""),
                                  kind=request.query_params.get("kind", ""),
                                  target=request.query_params.get("object", ""), since=since, until=until)
        if request.accepted_renderer.format == "csv":
            return _csv(events)
        paginator = AuditEventCursorPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(AuditEventOutput(page, many=True).data)
