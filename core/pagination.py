"""The API's page: DRF's limit/offset, with both bounded and a bad value named (400), not passed to SQL.

An offset past PostgreSQL's bigint was a 500 ("bigint out of range", found by Schemathesis); an empty
``?limit=`` was taken as the default although the document says an integer (Schemathesis, ST201).
"""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from core.errors import ValidationFailed
from core.parsers import parse_integer

MAX_OFFSET = 10_000_000


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 500

    def _bounded(self, request, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = request.query_params.get(name)
        if raw is None:
            return default  # an empty value (``?limit=``) is not a number: 400 like any other
        try:  # ASCII digits only: int() alone also reads " 5", "+5", "5_0" and "٥"
            return parse_integer(raw, field=name, low=low, high=high)
        except ValidationFailed:
            raise ValidationError({name: [f"Must be a whole number from {low} to {high}."]}) from None

    def get_limit(self, request):
        return self._bounded(request, self.limit_query_param, self.default_limit, 1, self.max_limit)

    def get_offset(self, request):
        return self._bounded(request, self.offset_query_param, 0, 0, MAX_OFFSET)
