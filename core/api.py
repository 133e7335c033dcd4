"""Helpers every app's REST views use: one page of a queryset, and validated input (errors become the
project's problem+json through ``core.problems``)."""

from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.views import APIView


def paginate(view: APIView, request, queryset, serializer_class, **kwargs):
    """The page of ``queryset`` the request asks for, serialised, with the paginator's links."""
    paginator = api_settings.DEFAULT_PAGINATION_CLASS()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True, **kwargs).data)


def parse(serializer_class, request, **kwargs) -> dict:
    """The request body validated by ``serializer_class`` (400 problem+json naming the field otherwise)."""
    serializer = serializer_class(data=request.data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
