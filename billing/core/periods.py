"""Invoice periods: calendar months in UTC (the input rule for a period, ``period_parse``, is in
``billing.services.invoicing``: it answers in the API's words)."""

from __future__ import annotations

from datetime import UTC, date, datetime


def period_bounds(period: date) -> tuple[datetime, datetime]:
    start = datetime(period.year, period.month, 1, tzinfo=UTC)
    following = date(period.year + (period.month == 12), period.month % 12 + 1, 1)
    return start, datetime(following.year, following.month, 1, tzinfo=UTC)
