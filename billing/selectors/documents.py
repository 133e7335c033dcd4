"""Invoice documents: CSV (one row per line, machine-readable amounts) and PDF (WeasyPrint from an HTML
template). Both are rendered from the stored invoice only, so a finalized invoice always gives the same
document."""

from __future__ import annotations

import csv
import io

from django.template.loader import render_to_string

from billing.core.pricing import format_money, from_minor
from billing.models import Invoice

CSV_COLUMNS = ["invoice", "period", "position", "kind", "description", "project", "model", "mig_profile",
               "workload_class", "over_quota", "quantity", "unit", "unit_price", "amount", "currency",
               "gpu_hours", "engine_active_avg", "memory_used_avg_mib", "idle_gpu_hours"]


def _lines(invoice: Invoice):
    return list(invoice.lines.select_related("project").order_by("position"))


def invoice_csv(invoice: Invoice) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    label = invoice.number or f"draft-{invoice.pk}"
    for line in _lines(invoice):
        writer.writerow([
            label, f"{invoice.period:%Y-%m}", line.position, line.kind, line.description,
            line.project.slug if line.project else "", line.tier, line.mig_profile, line.workload_class,
            "yes" if line.over_quota else "no", line.quantity, line.unit, line.unit_price,
            from_minor(line.amount_minor, invoice.currency), invoice.currency, line.gpu_hours,
            "" if line.engine_active_avg is None else line.engine_active_avg,
            "" if line.memory_used_avg_mib is None else line.memory_used_avg_mib,
            "" if line.idle_gpu_hours is None else line.idle_gpu_hours])
    for name in ("subtotal_minor", "discount_minor", "credit_minor", "total_minor"):
        writer.writerow([label, f"{invoice.period:%Y-%m}", "", name.removesuffix("_minor"), "", "", "", "", "", "",
                         "", "", "", from_minor(getattr(invoice, name), invoice.currency), invoice.currency,
                         "", "", "", ""])
    return out.getvalue()


def invoice_context(invoice: Invoice) -> dict:
    lines = _lines(invoice)
    money = lambda minor: format_money(minor, invoice.currency)  # noqa: E731
    idle = sum((line.idle_gpu_hours or 0) for line in lines)
    return {
        "invoice": invoice, "tenant": invoice.tenant,
        "lines": [{"line": line, "amount": money(line.amount_minor),
                   "active_pct": None if line.engine_active_avg is None
                   else round(float(line.engine_active_avg) * 100, 1)} for line in lines],
        "subtotal": money(invoice.subtotal_minor), "discount": money(invoice.discount_minor),
        "credit": money(invoice.credit_minor), "total": money(invoice.total_minor),
        "idle_gpu_hours": idle,
        "slo_lines": [line for line in lines if line.kind == "slo_credit"],
        # the customer's tax id as the invoice was computed with it (kept on its tax lines: a finalized invoice
        # shows what it was issued with, whatever the profile says later)
        "tax_id": next((line.evidence.get("tax_id") for line in lines if line.kind == "tax"), ""),
    }


def invoice_pdf(invoice: Invoice) -> bytes:
    from weasyprint import HTML

    html = render_to_string("billing/invoice_pdf.html", invoice_context(invoice))
    return HTML(string=html).write_pdf()


def invoice_download(invoice: Invoice, fmt: str):
    """The invoice as an attachment: ``fmt`` is ``pdf`` or ``csv`` (the API and the portal both serve it)."""
    from django.http import HttpResponse

    name = invoice.number or f"draft-{invoice.tenant.slug}-{invoice.period:%Y-%m}"
    if fmt == "csv":
        response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    else:
        response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response
