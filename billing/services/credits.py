"""Prepaid credits (Lago's wallets, Stripe's credit grants): staff grant a tenant an amount in a currency, with
an expiry and a priority; each invoice draws down the grants at its finalisation, lowest priority first, then
the soonest expiry, then the oldest, never beyond a grant (the database checks it: migration 0008) nor beyond
the invoice's total. The monthly commitment's shortfall line is an invoice line like any other, so credits pay
it too. A grant that expires soon with a balance left is announced once through the notification outbox."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing.core.pricing import format_money
from billing.models import CreditDraw, CreditGrant, Invoice
from billing.services.credit_notes import MAX_MINOR
from core.errors import ValidationFailed
from tenants.audit import audit_record
from tenants.models import Tenant


def credit_grant_create(*, tenant: Tenant, amount_minor: int, reason: str, currency: str | None = None,
                        priority: int = 0, expires_at: datetime | None = None, by_user=None,
                        now: datetime | None = None) -> CreditGrant:
    """Grant ``amount_minor`` of prepaid credit (the tenant's currency unless told). Errors name the field."""
    now = now or timezone.now()
    if isinstance(amount_minor, bool) or not isinstance(amount_minor, int) or not 0 < amount_minor < MAX_MINOR:
        raise ValidationFailed("amount_minor must be a positive whole number of minor units.", field="amount_minor")
    currency = (currency or tenant.currency).upper()
    if currency != tenant.currency:
        raise ValidationFailed(f"currency must be the tenant's invoice currency, {tenant.currency}.", field="currency")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 1000:
        raise ValidationFailed("priority must be a whole number from 0 (drawn first) to 1000.", field="priority")
    if expires_at is not None and expires_at <= now:
        raise ValidationFailed("expires_at must be in the future.", field="expires_at")
    reason = reason.strip() if isinstance(reason, str) else ""
    if not reason or len(reason) > 300:
        raise ValidationFailed("reason is required (at most 300 characters).", field="reason")
    with transaction.atomic():
        grant = CreditGrant.objects.create(
            tenant=tenant, currency=currency, amount_minor=amount_minor, priority=priority, expires_at=expires_at,
            granted_at=now, reason=reason, granted_by=by_user if getattr(by_user, "is_authenticated", False) else None)
        audit_record(tenant=tenant, by=by_user, action="billing.credit_grant_create", target=f"grant {grant.pk}",
                     data={"amount_minor": amount_minor, "currency": currency, "priority": priority,
                           "expires_at": expires_at.isoformat() if expires_at else None, "reason": reason})
    return grant


def credits_draw(*, invoices: list[Invoice], now: datetime) -> list[CreditDraw]:
    """Draw the invoices' tenants' grants down for these just-finalized invoices, inside the caller's
    transaction (the finalisation's): grants locked in primary-key order, then drawn in priority order.
    Expired grants, grants of another currency and invoices of no positive total draw nothing."""
    due = [invoice for invoice in invoices if invoice.total_minor > 0]
    if not due:
        return []
    grants = list(CreditGrant.objects.select_for_update().filter(
        tenant_id__in={invoice.tenant_id for invoice in due}, granted_at__lte=now)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now)).order_by("pk"))
    if not grants:
        return []
    drawn = dict(CreditDraw.objects.filter(grant__in=grants).values("grant").annotate(s=Sum("amount_minor"))
                 .values_list("grant", "s"))
    left = {grant.pk: grant.amount_minor - drawn.get(grant.pk, 0) for grant in grants}
    by_tenant: dict[tuple[int, str], list[CreditGrant]] = defaultdict(list)
    far = now + timedelta(days=365 * 1000)
    for grant in sorted(grants, key=lambda g: (g.priority, g.expires_at or far, g.granted_at, g.pk)):
        by_tenant[(grant.tenant_id, grant.currency)].append(grant)
    draws = []
    for invoice in sorted(due, key=lambda i: (i.period, i.pk)):
        owed = invoice.total_minor
        for grant in by_tenant.get((invoice.tenant_id, invoice.currency), []):
            take = min(owed, left[grant.pk])
            if take <= 0:
                continue
            left[grant.pk] -= take
            owed -= take
            draws.append(CreditDraw(grant=grant, invoice=invoice, amount_minor=take, drawn_at=now))
            if owed == 0:
                break
    CreditDraw.objects.bulk_create(draws)
    return draws


def credit_expiry_notify(*, now: datetime | None = None) -> int:
    """Announce once each grant that expires within ``BILLING_CREDIT_EXPIRY_NOTICE_DAYS`` with a balance left:
    an audit row and a ``credit.expiring`` notification through the outbox (the tenant's webhooks subscribed to
    it). Returns how many grants were announced. Idempotent: ``expiry_notified_at`` is set."""
    from billing.events import tell

    now = now or timezone.now()
    horizon = now + timedelta(days=settings.BILLING_CREDIT_EXPIRY_NOTICE_DAYS)
    announced = 0
    candidates = list(CreditGrant.objects.filter(expiry_notified_at__isnull=True, expires_at__gt=now,
                                                 expires_at__lte=horizon).values_list("pk", flat=True))
    for grant_id in candidates:
        with transaction.atomic():
            grant = CreditGrant.objects.select_for_update().select_related("tenant").get(pk=grant_id)
            if grant.expiry_notified_at is not None:
                continue
            left = grant.amount_minor - (grant.draws.aggregate(s=Sum("amount_minor"))["s"] or 0)
            CreditGrant.objects.filter(pk=grant.pk).update(expiry_notified_at=now)
            if left <= 0:
                continue
            data = {"grant": grant.pk, "remaining_minor": left, "currency": grant.currency,
                    "remaining": format_money(left, grant.currency), "expires_at": grant.expires_at.isoformat()}
            audit_record(tenant=grant.tenant, by=None, action="billing.credit_expiring", target=f"grant {grant.pk}",
                         data=data)
            tell(tenant=grant.tenant, kind="credit.expiring", data=data, key=f"grant_{grant.pk}",
                               now=now)
            announced += 1
    return announced
