"""What the capacity loop's surfaces (API, portal, admin) show, read-only: an adjustment's expected gain in
the units people read (GPU-hours, formatted money), whether someone may decide it (the service's own rule,
so a button is never shown that the service would refuse), the dashboard's advice card, and the warm pools'
holding cost priced at the general price book. Nothing here writes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import Case, QuerySet, When

from billing.core.pricing import format_money
from capacity.choices import OPEN_STATES, AdjustmentKind, AdjustmentState
from capacity.models import Adjustment
from capacity.selectors import builtin_modes, leases_of_tenant, warm_holding
from core.errors import ApplicationError

HOUR = Decimal(3600)
HUNDREDTHS = Decimal("0.01")


def gpu_hours(gpu_seconds: int) -> Decimal:
    """GPU-seconds → GPU-hours with two decimals (half-up), as the API and the pages show them."""
    return (Decimal(gpu_seconds) / HOUR).quantize(HUNDREDTHS, rounding=ROUND_HALF_UP)


def money_text(amount_minor: int, currency: str) -> str:
    """``12.50 USD``; empty where the planner priced nothing (no price book in its currency)."""
    return format_money(amount_minor, currency) if currency else ""


def expected_gain(adjustment: Adjustment) -> dict:
    return {
        "gpu_hours": gpu_hours(adjustment.gain_gpu_seconds),
        "money": {"minor": adjustment.gain_money_minor, "currency": adjustment.currency,
                  "formatted": money_text(adjustment.gain_money_minor, adjustment.currency)},
        "priced_with": adjustment.priced_with,
        "time_to_gpu_seconds": adjustment.gain_time_to_gpu_seconds,
    }


_LEASE_LIST = re.compile(r"lease\(s\) (\d+(?:, \d+)*)")


def _lease_list_seen(text: str, own: set[int]) -> str:
    """``text`` with each "lease(s) 12, 34" naming only ``own`` leases by id and counting the others."""

    def seen(match: re.Match) -> str:
        ids = [int(part) for part in match.group(1).split(", ")]
        mine = [str(i) for i in ids if i in own]
        others = len(ids) - len(mine)
        parts = [", ".join(mine)] if mine else []
        if others:
            parts.append(f"{others} of another tenant" if others == 1 else f"{others} of other tenants")
        return "lease(s) " + " and ".join(parts)

    return _LEASE_LIST.sub(seen, text)


def seen_by(adjustment: Adjustment, tenant_id: int | None) -> dict:
    """The fields that name leases (``risk``, ``reason``, ``outcome``) as the tenant ``tenant_id`` may read
    them (None: staff, everything). A drain that touches the leases of several tenants is seen by each of
    them (``tenant_ids``); each sees its own leases by id and only a count of the others'."""
    fields = {"risk": list(adjustment.risk), "reason": adjustment.reason, "outcome": adjustment.outcome}
    if tenant_id is None or not adjustment.risk or set(adjustment.tenant_ids or ()) <= {tenant_id}:
        return fields
    own = leases_of_tenant(tenant_id, adjustment.risk)
    return {"risk": [lease for lease in adjustment.risk if lease in own],
            "reason": _lease_list_seen(adjustment.reason, own), "outcome": _lease_list_seen(adjustment.outcome, own)}


def may_decide(adjustment: Adjustment, *, user, actor) -> bool:
    """Whether ``user`` (acting as ``actor``, None for staff outside any tenant) may accept or reject this
    adjustment now: it is proposed and the service's rule lets them."""
    from capacity.services.decisions import _may_decide

    if adjustment.state != AdjustmentState.PROPOSED:
        return False
    try:
        _may_decide(adjustment, user=user, actor=actor)
    except ApplicationError:
        return False
    return True


def open_first(rows: QuerySet[Adjustment]) -> QuerySet[Adjustment]:
    """``rows`` (an ``adjustment_list``) with the proposed and applying ones first, newest first in each."""
    return rows.order_by(Case(When(state__in=OPEN_STATES, then=0), default=1), "-proposed_at", "-pk")


# -- policies ----------------------------------------------------------------------------------------------
def default_mode() -> str:
    """The built-in mode of each kind where no policy says otherwise, in words: "auto: mode switch, MIG layout,
    warm pool; advise: idle reclaim, right-sizing advice, quota advice" (``capacity.selectors.builtin_modes``)."""
    by_mode: dict[str, list[str]] = {}
    for kind, mode in builtin_modes().items():
        by_mode.setdefault(mode, []).append(str(AdjustmentKind(kind).label))
    return "; ".join(f"{mode}: {', '.join(kinds)}" for mode, kinds in by_mode.items())


# -- warm pools: what holding them costs the platform -------------------------------------------------------
def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def warm_holding_cost(*, start: datetime, end: datetime) -> dict:
    """``capacity.selectors.warm_holding`` as the pages and the API show it: per pool (model, profile) the
    members held, the GPU-hours held by nobody (two decimals) and their price at the general price book
    (``cost_minor`` None where it has no price for the shape); totals over the pools. ``priced``: every pool
    had a price."""
    currency = settings.LIST_PRICE_CURRENCY
    rows, total_hours, total_minor = [], Decimal(0), 0
    for entry in sorted(warm_holding(start=start, end=end).values(), key=lambda e: (e["model"], e["profile"])):
        cost = entry.get("cost_minor")
        total_hours += entry["gpu_hours"]
        total_minor += cost or 0
        rows.append({"model": entry["model"], "profile": entry["profile"], "members": entry["members"],
                     "gpu_hours": entry["gpu_hours"].quantize(HUNDREDTHS, rounding=ROUND_HALF_UP),
                     "cost_minor": cost, "cost": money_text(cost, currency) if cost is not None else ""})
    return {"start": start, "end": end, "currency": currency, "pools": rows,
            "priced": all(row["cost_minor"] is not None for row in rows),
            "gpu_hours": total_hours.quantize(HUNDREDTHS, rounding=ROUND_HALF_UP), "cost_minor": total_minor,
            "cost": money_text(total_minor, currency)}


# -- rows for the pages --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdjustmentRow:
    """An adjustment as a page lists it: the gain in GPU-hours and money, and whether the reader may
    accept or reject it."""

    adjustment: Adjustment
    gpu_hours: Decimal
    money: str
    can_decide: bool
    reason: str  # as the reader may read it (``seen_by``)
    outcome: str


def adjustment_row(adjustment: Adjustment, *, user, actor) -> AdjustmentRow:
    """``actor``: the tenant reading (None for staff outside any tenant)."""
    money = money_text(adjustment.gain_money_minor, adjustment.currency) if adjustment.gain_money_minor else ""
    seen = seen_by(adjustment, actor.tenant.pk if actor is not None else None)
    return AdjustmentRow(adjustment, gpu_hours(adjustment.gain_gpu_seconds), money,
                         may_decide(adjustment, user=user, actor=actor), seen["reason"], seen["outcome"])


def adjustment_rows(rows, *, user, actor) -> list[AdjustmentRow]:
    return [adjustment_row(row, user=user, actor=actor) for row in rows]


def advice_panel(*, actor) -> dict | None:
    """The tenant dashboard's advice card: how many open items and what following them would save (one
    figure per currency); None when there is nothing open."""
    from capacity.selectors import advice_savings

    savings = advice_savings(actor=actor)
    if not savings["count"]:
        return None
    return {"count": savings["count"],
            "money": [format_money(minor, currency) for currency, minor in sorted(savings["money"].items())]}
