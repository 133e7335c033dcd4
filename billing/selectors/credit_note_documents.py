"""Credit note documents: CSV (one row per line, then the total) and PDF (WeasyPrint from an HTML template),
rendered from the stored, immutable credit note only: the same note always gives the same document."""

from __future__ import annotations

import csv
import io

from django.http import HttpResponse
from django.template.loader import render_to_string

from billing.core.pricing import format_money, from_minor
from billing.models import CreditNote

CSV_COLUMNS = ["credit_note", "invoice", "issued_at", "reason", "line", "invoice_line_position", "description",
               "amount", "currency"]


def credit_note_csv(note: CreditNote) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    head = [note.number, note.invoice.number, note.issued_at.isoformat(), note.reason]
    for index, line in enumerate(note.lines.select_related("invoice_line").order_by("pk"), start=1):
        writer.writerow([*head, index, line.invoice_line.position if line.invoice_line else "", line.description,
                         from_minor(line.amount_minor, note.currency), note.currency])
    writer.writerow([*head, "", "", "total", from_minor(note.amount_minor, note.currency), note.currency])
    return out.getvalue()


def credit_note_pdf(note: CreditNote) -> bytes:
    from weasyprint import HTML

    lines = [{"line": line, "amount": format_money(line.amount_minor, note.currency)}
             for line in note.lines.select_related("invoice_line").order_by("pk")]
    html = render_to_string("billing/credit_note_pdf.html", {
        "note": note, "tenant": note.tenant, "invoice": note.invoice, "lines": lines,
        "total": format_money(note.amount_minor, note.currency)})
    return HTML(string=html).write_pdf()


def credit_note_download(note: CreditNote, fmt: str) -> HttpResponse:
    """The credit note as an attachment: ``fmt`` is ``pdf`` or ``csv``."""
    if fmt == "csv":
        response = HttpResponse(credit_note_csv(note), content_type="text/csv; charset=utf-8")
    else:
        response = HttpResponse(credit_note_pdf(note), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{note.number}.{fmt}"'
    return response
