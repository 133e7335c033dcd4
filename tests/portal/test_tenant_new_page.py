"""The new-tenant page (/ops/new-tenant): staff create a tenant through ``tenant_create``, audited in their name;
a refusal comes back under its field with the values as typed and writes nothing. Non-staff: test_routes.py."""

from __future__ import annotations

from django.test import Client

from tenants.models import AuditEvent, Tenant
from tests.factories import make_user


def _staff() -> tuple[Client, object]:
    user = make_user("root", is_staff=True)
    client = Client()
    client.force_login(user)
    return client, user


def test_tenant_new_page_creates_a_tenant(world):
    client, user = _staff()
    page = client.get("/ops/tenants")
    assert 'href="/ops/new-tenant"' in page.content.decode()
    form = client.get("/ops/new-tenant")
    assert form.status_code == 200 and 'name="billing_email"' in form.content.decode()
    created = client.post("/ops/new-tenant", {"name": "Initech", "slug": "initech",
                                              "billing_email": "ap@initech.example", "currency": "EUR"})
    assert created.status_code == 302 and created["Location"] == "/ops/tenants/initech"
    tenant = Tenant.objects.get(slug="initech")
    assert (tenant.name, tenant.currency, tenant.status) == ("Initech", "EUR", "active")
    assert AuditEvent.objects.get(action="tenant.create", target="initech").actor == user
    assert "Tenant Initech created" in client.get("/ops/tenants/initech").content.decode()


def test_tenant_new_page_refusals_name_the_field_and_write_nothing(world):
    client, _ = _staff()
    bad = client.post("/ops/new-tenant", {"name": "X", "slug": "Bad Slug", "billing_email": "a@b.example"})
    assert bad.status_code == 400
    html = bad.content.decode()
    assert 'id="err-slug"' in html and "slug must be lowercase letters" in html and 'value="Bad Slug"' in html
    taken = client.post("/ops/new-tenant", {"name": "Acme 2", "slug": "acme", "billing_email": "a@b.example"})
    assert taken.status_code == 409 and "already exists" in taken.content.decode()
    email = client.post("/ops/new-tenant", {"name": "Y", "slug": "y", "billing_email": "nope"})
    assert email.status_code == 400 and 'id="err-email"' in email.content.decode()
    assert set(Tenant.objects.values_list("slug", flat=True)) == {"acme", "globex"}
