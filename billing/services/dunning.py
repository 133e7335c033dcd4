"""Dunning (Stripe's smart retries and reminders, Lago's dunning campaigns): a failed payment of an invoice
opens a case; reminders go out on the schedule of the tenant's dunning terms (else the settings' defaults);
after the grace period the tenant's new lease requests are refused (402 ``payment_overdue``) while running
leases keep running, unless the terms say to release them; the case resolves, and requests are admitted again,
when the invoice is settled (paid, or its balance credited or voided to zero). Each step is audited and
notified (``dunning.reminder``, ``dunning.restricted``, ``dunning.resolved``) in its own transaction."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from billing.choices import DunningState, InvoiceStatus
from billing.core.pricing import format_money
from billing.models import DunningCase, DunningTerms, Invoice
from core.errors import ApplicationError, ValidationFailed
from tenants.audit import audit_record
from tenants.models import Tenant

UNRESOLVED = (DunningState.OPEN, DunningState.RESTRICTED)


class PaymentOverdue(ApplicationError):
    """The tenant has an invoice unpaid past its grace period: new lease requests are refused until it is."""

    status = 402
    code = "payment_overdue"
    title = "Payment overdue"


def _schedule(tenant: Tenant) -> tuple[list[int], int, bool]:
    terms = DunningTerms.objects.filter(tenant=tenant).first()
    if terms is not None:
        return sorted(terms.reminder_days), terms.grace_days, terms.stop_running_leases
    return list(settings.BILLING_DUNNING_REMINDER_DAYS), settings.BILLING_DUNNING_GRACE_DAYS, False


def dunning_terms_set(*, tenant: Tenant, reminder_days: list[int], grace_days: int,
                      stop_running_leases: bool = False, by_user=None) -> DunningTerms:
    """Set the tenant's dunning schedule (platform staff). Errors name the field. Open cases keep the schedule
    they started with."""
    if (not isinstance(reminder_days, list) or len(reminder_days) > 10
            or any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= 365 for d in reminder_days)
            or len(set(reminder_days)) != len(reminder_days)):
        raise ValidationFailed("reminder_days must be a list of up to 10 distinct whole days from 0 to 365.",
                               field="reminder_days")
    if isinstance(grace_days, bool) or not isinstance(grace_days, int) or not 0 <= grace_days <= 365:
        raise ValidationFailed("grace_days must be a whole number of days from 0 to 365.", field="grace_days")
    with transaction.atomic():
        terms, _ = DunningTerms.objects.update_or_create(tenant=tenant, defaults={
            "reminder_days": sorted(reminder_days), "grace_days": grace_days,
            "stop_running_leases": bool(stop_running_leases)})
        audit_record(tenant=tenant, by=by_user, action="billing.dunning_terms_set", target=tenant.slug,
                     data={"reminder_days": sorted(reminder_days), "grace_days": grace_days,
                           "stop_running_leases": bool(stop_running_leases)})
    return terms


def _notify(case: DunningCase, kind: str, data: dict, key: str, now: datetime) -> None:
    from billing.events import tell

    tell(tenant=case.tenant, kind=kind, key=f"{case.invoice_id}_{key}", now=now, data={
        "invoice": case.invoice.number, "invoice_id": case.invoice_id, "state": case.state,
        "grace_ends_at": case.grace_ends_at.isoformat(), **data})


def dunning_start(*, invoice: Invoice, reason: str, now: datetime | None = None) -> DunningCase | None:
    """A payment of ``invoice`` failed: open its case (idempotent: an unresolved case is left as it is; a
    resolved one opens again). Joins the caller's transaction (the webhook's). None for a settled invoice."""
    now = now or timezone.now()
    if invoice.status != InvoiceStatus.FINALIZED:
        return None
    with transaction.atomic():
        case = DunningCase.objects.select_for_update().filter(invoice=invoice).first()
        if case is not None and case.state in UNRESOLVED:
            return case
        days, grace, stop = _schedule(invoice.tenant)
        values = {"tenant": invoice.tenant, "state": DunningState.OPEN, "started_at": now, "reminder_days": days,
                  "reminders_sent": 0, "next_reminder_at": now + timedelta(days=days[0]) if days else None,
                  "grace_ends_at": now + timedelta(days=grace), "stop_running_leases": stop, "restricted_at": None,
                  "resolved_at": None}
        case, _ = DunningCase.objects.update_or_create(invoice=invoice, defaults=values)
        audit_record(tenant=invoice.tenant, by=None, action="billing.dunning_start", target=invoice.number,
                     data={"reason": reason[:300], "reminder_days": days,
                           "grace_ends_at": case.grace_ends_at.isoformat()})
    return case


def dunning_advance(*, now: datetime | None = None) -> dict:
    """Periodic: send the reminders that are due and restrict the tenants whose grace period has passed (then,
    where their terms say so, release their running leases). Idempotent; returns what it did."""
    now = now or timezone.now()
    done = {"reminders": 0, "restricted": 0, "released_leases": 0}
    due = list(DunningCase.objects.filter(state__in=UNRESOLVED, next_reminder_at__lte=now).values_list("pk", flat=True))
    for case_id in due:
        with transaction.atomic():
            case = DunningCase.objects.select_for_update().select_related("tenant", "invoice").get(pk=case_id)
            if case.state not in UNRESOLVED or case.next_reminder_at is None or case.next_reminder_at > now:
                continue
            sent = case.reminders_sent + 1
            later = case.reminder_days[sent:]
            case.reminders_sent = sent
            case.next_reminder_at = case.started_at + timedelta(days=later[0]) if later else None
            case.save(update_fields=["reminders_sent", "next_reminder_at"])
            from billing.selectors.balances import invoice_balance

            owed = invoice_balance(invoice=case.invoice)["balance_due_minor"]
            audit_record(tenant=case.tenant, by=None, action="billing.dunning_reminder", target=case.invoice.number,
                         data={"reminder": sent, "balance_due_minor": owed})
            _notify(case, "dunning.reminder", {"reminder": sent, "balance_due_minor": owed,
                                               "balance_due": format_money(owed, case.invoice.currency)},
                    f"r{sent}", now)
            done["reminders"] += 1
    overdue = list(DunningCase.objects.filter(state=DunningState.OPEN, grace_ends_at__lte=now)
                   .values_list("pk", flat=True))
    for case_id in overdue:
        with transaction.atomic():
            case = DunningCase.objects.select_for_update().select_related("tenant", "invoice").get(pk=case_id)
            if case.state != DunningState.OPEN:
                continue
            case.state, case.restricted_at = DunningState.RESTRICTED, now
            case.save(update_fields=["state", "restricted_at"])
            audit_record(tenant=case.tenant, by=None, action="billing.dunning_restrict", target=case.invoice.number,
                         data={"stop_running_leases": case.stop_running_leases})
            _notify(case, "dunning.restricted", {"stop_running_leases": case.stop_running_leases}, "restricted", now)
            done["restricted"] += 1
        if case.stop_running_leases:
            done["released_leases"] += _release_running(case.tenant, now)
    return done


def _release_running(tenant: Tenant, now: datetime) -> int:
    from broker import services as broker
    from broker.choices import HOLDING_STATES, LeaseState
    from broker.models import Lease

    released = 0
    for lease in Lease.objects.filter(tenant=tenant, state__in=[*HOLDING_STATES, LeaseState.QUEUED,
                                                                 LeaseState.REQUESTED]).order_by("pk"):
        broker.lease_release(lease=lease, actor="system:dunning", reason="released: an invoice is unpaid past its "
                                                                          "grace period", now=now)
        released += 1
    return released


def dunning_settle(*, invoice: Invoice, why: str, now: datetime | None = None) -> DunningCase | None:
    """Resolve the invoice's case when it is settled: paid, or its balance due at or below zero (credited,
    voided, paid by transfer). Joins the caller's transaction. None when no unresolved case."""
    from billing.selectors.balances import invoice_balance

    now = now or timezone.now()
    case = DunningCase.objects.select_for_update().select_related("tenant", "invoice").filter(
        invoice=invoice, state__in=UNRESOLVED).first()
    if case is None:
        return None
    status = Invoice.objects.values_list("status", flat=True).get(pk=invoice.pk)
    if status not in (InvoiceStatus.PAID, InvoiceStatus.VOID) and invoice_balance(invoice=invoice)[
            "balance_due_minor"] > 0:
        return None
    was = case.state
    case.state, case.resolved_at, case.next_reminder_at = DunningState.RESOLVED, now, None
    case.save(update_fields=["state", "resolved_at", "next_reminder_at"])
    audit_record(tenant=case.tenant, by=None, action="billing.dunning_resolve", target=case.invoice.number,
                 data={"why": why, "was": was})
    _notify(case, "dunning.resolved", {"why": why}, f"resolved_{int(now.timestamp())}", now)
    return case


def dunning_admit_request(admission) -> str:
    """Leasing's admission check (``broker.extensions``): refuse a tenant's new request while one of its invoices
    is restricted. Renewals and running leases are not touched here."""
    case = (DunningCase.objects.filter(tenant=admission.actor.tenant, state=DunningState.RESTRICTED)
            .select_related("invoice").order_by("restricted_at").first())
    if case is None:
        return ""
    raise PaymentOverdue(
        f"Invoice {case.invoice.number} is unpaid past its grace period (since "
        f"{case.grace_ends_at:%Y-%m-%d %H:%M} UTC): new lease requests are refused until it is paid. Running "
        f"leases keep running.", field="tenant",
        extra={"invoice": case.invoice.number, "restricted_at": case.restricted_at.isoformat()})


def dunning_restricted_exists():
    """When ``dunning_admit_request`` applies: the request's tenant has a restricted case (an ``Exists``)."""
    return Exists(DunningCase.objects.filter(tenant=OuterRef("tenant_id"), state=DunningState.RESTRICTED))
