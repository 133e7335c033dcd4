"""Small display helpers for the portal templates (no computing beyond looking things up and formatting)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django import template
from django.utils import timezone

from billing.core.pricing import format_money, format_rate

register = template.Library()


@register.filter
def get(mapping, key):
    """``values|get:"gpu.count"``: a dict or QueryDict entry whose key a template cannot spell."""
    if not mapping:
        return ""
    try:
        value = mapping.get(key, "")
    except AttributeError:
        return ""
    return "" if value is None else value


@register.filter
def duration(seconds) -> str:
    """3600 → "1 h", 5400 → "1 h 30 min", 90 → "1 min 30 s", 172800 → "2 d"."""
    if seconds is None or seconds == "":
        return "\u2013"
    seconds = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount} {unit}")
    return " ".join(parts[:2]) or "0 s"


@register.filter
def slot_range(allocation) -> str:
    """MIG memory slots of an allocation: "slot 2", "slots 4–7"."""
    lower, upper = allocation.slots.lower, allocation.slots.upper
    if lower is None or upper is None or upper <= lower:
        return ""
    return f"slot {lower}" if upper - lower == 1 else f"slots {lower}–{upper - 1}"


@register.filter
def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """"just now", "42 s ago", "3 min ago"."""
    if moment is None:
        return "never"
    seconds = int(((now or timezone.now()) - moment).total_seconds())
    if seconds < 5:
        return "just now"
    amount, unit = duration(seconds).split(" ")[:2]  # the largest unit only: "3 min ago"
    return f"{amount} {unit} ago"


@register.filter
def seconds_since(moment: datetime | None, now: datetime | None = None) -> int:
    if moment is None:
        return 0
    return max(0, int(((now or timezone.now()) - moment).total_seconds()))


@register.filter
def seconds_until(moment: datetime | None, now: datetime | None = None) -> int:
    if moment is None:
        return 0
    return max(0, int((moment - (now or timezone.now())).total_seconds()))


@register.filter
def money(amount_minor, currency: str) -> str:
    """``invoice.total_minor|money:invoice.currency`` → "1,234.50 USD" (``billing.core.pricing.format_money``);
    "–" for no amount."""
    if amount_minor is None or amount_minor == "":
        return "\u2013"
    return format_money(int(amount_minor), currency)


@register.filter
def rate(amount, currency: str) -> str:
    """``rate.per_hour|rate:book.currency`` → "0.70 USD" (``billing.core.pricing.format_rate``: a price per unit,
    up to six decimals, none of the trailing zeros beyond the currency's)."""
    if amount is None or amount == "":
        return "\u2013"
    try:
        return format_rate(Decimal(str(amount)), currency)
    except InvalidOperation:
        return str(amount)
