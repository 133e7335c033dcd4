"""Taxes (issue 33 item 3): one tax line per rate on the invoice, rounded once per rate; exclusive rates add to
the total, inclusive ones are stated inside it, a reverse charge charges nothing and carries its legal note;
totals add up to the cent in every currency (a hypothesis property over random lines, rates and rounding)."""

from decimal import ROUND_HALF_UP, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing import services as billing
from billing.choices import LineKind
from billing.core.pricing import to_minor
from billing.core.tax import Rate, tax_lines
from billing.models import Invoice, TaxRate
from billing.services.tax import tax_profile_set, tax_rate_create, tax_rate_deactivate
from core.errors import Conflict, ValidationFailed
from tests.billing.test_invoicing import AFTER, JANUARY, two_leases
from tests.billing.test_invoicing import world as world

PERCENT = st.decimals(min_value=Decimal(0), max_value=Decimal(30), places=4, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None)
@given(currency=st.sampled_from(["USD", "EUR", "JPY", "GBP"]),
       amounts=st.lists(st.decimals(min_value=Decimal("-500"), max_value=Decimal("100000"), places=6,
                                    allow_nan=False, allow_infinity=False), min_size=1, max_size=20),
       rates=st.lists(st.tuples(PERCENT, st.booleans()), max_size=4))
def test_property_tax_totals_add_up_to_the_cent(currency, amounts, rates):
    # lines rounded once each to the currency's minor unit, as invoice lines are
    lines = [to_minor(amount, currency) for amount in amounts]
    net = sum(lines)
    taxed = tax_lines(net, [Rate(n, "XX", f"T{n}", p, inc) for n, (p, inc) in enumerate(rates)])
    total = net + sum(t.amount_minor for t in taxed)
    if net <= 0:
        assert taxed == [] and total == net
        return
    assert len(taxed) == len(rates)
    inclusive = sum((p for p, inc in rates if inc), Decimal(0)) / 100
    for line, (percentage, inc) in zip(taxed, rates, strict=True):
        assert isinstance(line.amount_minor, int) and isinstance(line.included_minor, int)
        exact = Decimal(net) * percentage / 100 / ((1 + inclusive) if inc else 1)
        assert abs(Decimal(line.amount_minor + line.included_minor) - exact) <= Decimal("0.5")  # one rounding
        assert (line.amount_minor == 0) if inc else (line.included_minor == 0)
        assert line.amount_minor == (0 if inc else int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP)))
    # the invoice's total is the lines plus the exclusive tax, exactly; the inclusive tax never exceeds the net
    assert total == sum(lines) + sum(t.amount_minor for t in taxed if not t.inclusive)
    assert sum(t.included_minor for t in taxed) <= net


def test_reverse_charge_is_one_zero_line_with_its_note():
    [line] = tax_lines(10_000, [Rate(1, "DE", "VAT", Decimal(19), False)], reverse_charge=True,
                       legal_note="Art. 196 Directive 2006/112/EC")
    assert line.amount_minor == 0 and "Art. 196" in line.description


def test_invoices_carry_a_tax_line_per_rate_and_add_up(world):
    tax_rate_create(tenant=world.acme, jurisdiction="US-CA", name="Sales tax", percentage="7.25")
    tax_rate_create(tenant=world.acme, jurisdiction="US", name="Included levy", percentage="2", inclusive=True)
    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    lines = list(invoice.lines.order_by("position"))
    tax = [line for line in lines if line.kind == LineKind.TAX]
    net = sum(line.amount_minor for line in lines if line.kind != LineKind.TAX)
    assert net == 366  # tests/billing/test_invoicing.py's hand computation
    assert [(t.amount_minor, t.evidence["included_minor"]) for t in tax] == [(27, 0), (0, 7)]  # 26.535 → 27; 7.18
    assert invoice.total_minor == net + 27 == sum(line.amount_minor for line in lines)
    # a finalized invoice keeps its tax: a later rate change does not touch it
    tax_rate_deactivate(rate=TaxRate.objects.get(name="Sales tax"))
    billing.invoice_run(period=JANUARY, now=AFTER)
    assert Invoice.objects.get(pk=invoice.pk).total_minor == 393


def test_reverse_charge_on_the_invoice(world):
    tax_rate_create(tenant=world.acme, jurisdiction="DE", name="VAT", percentage="19")
    tax_profile_set(tenant=world.acme, tax_id="DE123456789", reverse_charge=True,
                    legal_note="Reverse charge: VAT due by the recipient (Art. 196 Directive 2006/112/EC)")
    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    invoice = Invoice.objects.get(tenant=world.acme, period=JANUARY)
    [line] = invoice.lines.filter(kind=LineKind.TAX)
    assert line.amount_minor == 0 and "Art. 196" in line.description and line.evidence["tax_id"] == "DE123456789"
    assert invoice.total_minor == 366


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"percentage": "101"}, "percentage"), ({"percentage": "1.00001"}, "percentage"), ({"percentage": "x"},
                                                                                          "percentage"),
    ({"jurisdiction": ""}, "jurisdiction"), ({"name": " "}, "name")])
def test_bad_tax_rates_name_the_field(world, kwargs, field):
    with pytest.raises(ValidationFailed) as error:
        tax_rate_create(tenant=world.acme, **{"jurisdiction": "DE", "name": "VAT", "percentage": "19", **kwargs})
    assert error.value.field == field and not TaxRate.objects.exists()


def test_tax_profile_and_duplicate_rates_are_refused_by_name(world):
    with pytest.raises(ValidationFailed) as error:
        tax_profile_set(tenant=world.acme, tax_id="DE1", reverse_charge=True)
    assert error.value.field == "legal_note"
    tax_rate_create(tenant=world.acme, jurisdiction="DE", name="VAT", percentage="19")
    with pytest.raises(Conflict):
        tax_rate_create(tenant=world.acme, jurisdiction="DE", name="VAT", percentage="7")


def test_jpy_tax_rounds_to_whole_yen():
    [line] = tax_lines(1_235, [Rate(1, "JP", "Consumption tax", Decimal(10), False)])
    assert line.amount_minor == 124  # 123.5 → 124, half up


def test_staff_set_taxes_over_http(world):
    from rest_framework.test import APIClient

    from tests.factories import make_user

    make_user("root", is_staff=True)
    staff = APIClient()
    assert staff.login(username="root", password="pw-root")
    added = staff.post("/api/v1/tenants/acme/tax", {"jurisdiction": "DE", "name": "VAT", "percentage": "19"},
                       format="json")
    assert added.status_code == 201, added.content
    [rate] = added.json()["rates"]
    assert (rate["percentage"], rate["inclusive"], rate["active"]) == ("19.0000", False, True)
    bad = staff.put("/api/v1/tenants/acme/tax", {"tax_id": "DE1", "reverse_charge": True}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "legal_note"
    bad = staff.post("/api/v1/tenants/acme/tax", {"jurisdiction": "DE", "name": "X", "percentage": "250"},
                     format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "percentage"
    done = staff.put("/api/v1/tenants/acme/tax", {"tax_id": "DE1", "reverse_charge": True, "legal_note": "Art. 196"},
                     format="json").json()
    assert (done["tax_id"], done["reverse_charge"]) == ("DE1", True)
    assert staff.delete(f"/api/v1/tenants/acme/tax/rates/{rate['id']}").status_code == 204
    assert staff.get("/api/v1/tenants/acme/tax").json()["rates"][0]["active"] is False
    assert staff.delete("/api/v1/tenants/globex/tax/rates/{}".format(rate["id"])).status_code == 404
    assert world.client("owner").get("/api/v1/tenants/acme/tax").status_code == 403
