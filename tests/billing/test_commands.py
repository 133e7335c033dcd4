"""The money that staff set, from the command line: price books, billing terms and spend caps go through the
same services as the portal and the API (validated, audited, nothing half-written)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.models import BillingTerms, PriceBook, SpendCap
from tenants.models import AuditEvent
from tests.factories import make_world

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_price_book_create_from_a_file_is_audited(tmp_path):
    world = make_world()
    path = tmp_path / "book.json"
    path.write_text(json.dumps({"name": "Acme 2027", "currency": world.acme.currency, "tenant": "acme",
                                "effective_from": "2027-01-01T00:00:00Z",
                                "rates": [{"tier": "H100-80GB", "kind": "whole", "per_hour": "3.10"}]}))
    out = run("price_book_create", str(path))
    book = PriceBook.objects.get(name="Acme 2027")
    assert book.tenant == world.acme and book.rates.count() == 1 and f"price book {book.pk}" in out
    assert AuditEvent.objects.filter(action="price_book.create", target=f"price_book:{book.pk}").exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "currency": "USD", "effective_from": "2027-01-01T00:00:00Z",
      "rates": [{"tier": "H100-80GB", "kind": "whole", "per_hour": "-1"}]}, "rates"),
    ({"name": "x", "currency": "USD", "effective_from": "2027-01-01",
      "rates": []}, "effective_from"),
    ({"name": "x", "currency": "USD", "effective_from": "2027-01-01T00:00:00Z", "rates": [], "colour": 1}, "colour"),
    ({"name": "x", "currency": "USD", "effective_from": "2027-01-01T00:00:00Z", "rates": [], "tenant": "nope"},
     "tenant"),
])
def test_price_book_create_refuses_bad_input_naming_the_field(tmp_path, body, field):
    make_world()
    path = tmp_path / "book.json"
    path.write_text(json.dumps(body))
    before = PriceBook.objects.count()
    with pytest.raises(CommandError) as error:
        run("price_book_create", str(path))
    assert str(error.value).startswith(field), str(error.value)
    assert PriceBook.objects.count() == before


def test_billing_terms_set_and_refused_discount():
    world = make_world()
    out = run("billing_terms_set", "acme", "--discount-pct", "12.5", "--monthly-commit-minor", "100000",
              "--period", "2027-02")
    terms = BillingTerms.objects.get(tenant=world.acme)
    assert str(terms.discount_pct) == "12.50" and terms.monthly_commit_minor == 100000 and "2027-02-01" in out
    assert AuditEvent.objects.filter(action="billing_terms.set").exists()
    with pytest.raises(CommandError, match=r"^discount_pct"):
        run("billing_terms_set", "acme", "--discount-pct", "120")


def test_spend_cap_set_creates_changes_and_removes():
    world = make_world()
    run("spend_cap_set", "acme", "--project", "vision", "--monthly-minor", "50000", "--action", "warn")
    cap = SpendCap.objects.get(tenant=world.acme)
    assert cap.project.slug == "vision" and cap.monthly_minor == 50000 and cap.action == "warn"
    run("spend_cap_set", "acme", "--project", "vision", "--monthly-minor", "70000")
    cap.refresh_from_db()
    assert cap.monthly_minor == 70000 and cap.action == "warn"
    with pytest.raises(CommandError, match=r"^monthly_minor"):
        run("spend_cap_set", "acme", "--monthly-minor", "-5")
    run("spend_cap_set", "acme", "--project", "vision", "--remove")
    assert not SpendCap.objects.exists()
    actions = set(AuditEvent.objects.filter(action__startswith="spend_cap.").values_list("action", flat=True))
    assert actions == {"spend_cap.create", "spend_cap.update", "spend_cap.delete"}
