"""Taxes (Stripe's tax rates, Lago's taxes): a tenant's tax profile (tax id, reverse charge with its legal
note) and its tax rates (jurisdiction, percentage, inclusive or exclusive), set by platform staff, audited.
Invoices get one tax line per rate (``billing.core.tax``: rounded once per rate, half up), computed with the
other lines, so a draft follows a change and a finalized invoice keeps what it was issued with."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from billing.core import tax as taxcore
from billing.models import TaxProfile, TaxRate
from core.errors import Conflict, ValidationFailed
from tenants.audit import audit_record
from tenants.models import Tenant


def _label(value, field: str, limit: int) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not text or len(text) > limit:
        raise ValidationFailed(f"{field} is required (at most {limit} characters).", field=field)
    return text


def tax_rate_create(*, tenant: Tenant, jurisdiction: str, name: str, percentage, inclusive: bool = False,
                    by_user=None, now: datetime | None = None) -> TaxRate:
    """Add a rate to the tenant's invoices (drafts from the next run on). Errors name the field."""
    now = now or timezone.now()
    jurisdiction, name = _label(jurisdiction, "jurisdiction", 40), _label(name, "name", 60)
    try:
        value = Decimal(str(percentage).strip())
    except (InvalidOperation, ValueError):
        raise ValidationFailed("percentage must be a decimal number.", field="percentage") from None
    if not value.is_finite() or not 0 <= value <= 100 or value != value.quantize(Decimal("0.0001")):
        raise ValidationFailed("percentage must be from 0 to 100 with at most 4 decimal places.", field="percentage")
    with transaction.atomic():
        if TaxRate.objects.filter(tenant=tenant, jurisdiction=jurisdiction, name=name, active=True).exists():
            raise Conflict(f"{name} ({jurisdiction}) is already an active rate of {tenant.slug}: deactivate it "
                           f"first.", field="name")
        rate = TaxRate.objects.create(tenant=tenant, jurisdiction=jurisdiction, name=name, percentage=value,
                                      inclusive=bool(inclusive), created_at=now)
        audit_record(tenant=tenant, by=by_user, action="billing.tax_rate_create", target=f"{name} {jurisdiction}",
                     data={"rate": rate.pk, "percentage": str(value), "inclusive": bool(inclusive)})
    return rate


def tax_rate_deactivate(*, rate: TaxRate, by_user=None) -> TaxRate:
    with transaction.atomic():
        TaxRate.objects.filter(pk=rate.pk).update(active=False)
        audit_record(tenant=rate.tenant, by=by_user, action="billing.tax_rate_deactivate",
                     target=f"{rate.name} {rate.jurisdiction}", data={"rate": rate.pk})
    rate.refresh_from_db()
    return rate


def tax_profile_set(*, tenant: Tenant, tax_id: str = "", reverse_charge: bool = False, legal_note: str = "",
                    by_user=None) -> TaxProfile:
    """The tenant's tax id and reverse charge (which needs its legal note). Errors name the field."""
    tax_id = tax_id.strip() if isinstance(tax_id, str) else ""
    legal_note = legal_note.strip() if isinstance(legal_note, str) else ""
    if len(tax_id) > 40:
        raise ValidationFailed("tax_id has at most 40 characters.", field="tax_id")
    if reverse_charge and not legal_note:
        raise ValidationFailed("A reverse charge needs its legal note (printed on the invoice).", field="legal_note")
    if reverse_charge and not tax_id:
        raise ValidationFailed("A reverse charge needs the customer's tax id.", field="tax_id")
    if len(legal_note) > 300:
        raise ValidationFailed("legal_note has at most 300 characters.", field="legal_note")
    with transaction.atomic():
        profile, _ = TaxProfile.objects.update_or_create(tenant=tenant, defaults={
            "tax_id": tax_id, "reverse_charge": bool(reverse_charge), "legal_note": legal_note})
        audit_record(tenant=tenant, by=by_user, action="billing.tax_profile_set", target=tenant.slug,
                     data={"tax_id": tax_id, "reverse_charge": bool(reverse_charge), "legal_note": legal_note})
    return profile


def tax_setup_for(tenant_ids: list[int]) -> dict[int, tuple[list[taxcore.Rate], TaxProfile | None]]:
    """Each tenant's active rates and profile, read in two queries (the invoice run's batches)."""
    setup: dict[int, tuple[list[taxcore.Rate], TaxProfile | None]] = {pk: ([], None) for pk in tenant_ids}
    for rate in TaxRate.objects.filter(tenant_id__in=tenant_ids, active=True).order_by("tenant_id", "pk"):
        setup[rate.tenant_id][0].append(taxcore.Rate(rate.pk, rate.jurisdiction, rate.name, rate.percentage,
                                                     rate.inclusive))
    for profile in TaxProfile.objects.filter(tenant_id__in=tenant_ids):
        setup[profile.tenant_id] = (setup[profile.tenant_id][0], profile)
    return setup
