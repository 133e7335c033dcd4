from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.models import ApiToken, Membership, Project, Quota, SloContract, Tenant
from tests.factories import api_client


def test_tenant_bootstrap_creates_tenant_user_and_working_token(db):
    out = StringIO()
    call_command("tenant_bootstrap", "--tenant", "initech", "--user", "peter", "--role", "admin", stdout=out,
                 stderr=StringIO())
    token = out.getvalue().strip()
    response = api_client(token).get("/api/v1/tenant")
    assert response.status_code == 200 and response.json() == response.json() | {"slug": "initech", "role": "admin"}
    # again: same tenant and user, a second token
    out2 = StringIO()
    call_command("tenant_bootstrap", "--tenant", "initech", "--user", "peter", "--scopes", "read", stdout=out2,
                 stderr=StringIO())
    assert out2.getvalue().strip() != token
    assert Tenant.objects.filter(slug="initech").count() == 1
    assert Membership.objects.get(user__username="peter").role == "admin"
    assert ApiToken.objects.filter(user__username="peter").count() == 2


def test_tenant_bootstrap_rejects_bad_input_naming_it(db):
    with pytest.raises(CommandError, match="--scopes"):
        call_command("tenant_bootstrap", "--tenant", "x", "--user", "u", "--scopes", "root", stderr=StringIO())
    with pytest.raises(CommandError, match="slug"):
        call_command("tenant_bootstrap", "--tenant", "Bad Slug", "--user", "u", stderr=StringIO())
    assert not Tenant.objects.exists()


def test_seed_demo_is_idempotent(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    first = StringIO()
    call_command("seed_demo", stdout=first)
    counts = (Tenant.objects.count(), Project.objects.count(), Quota.objects.count(), SloContract.objects.count())
    second = StringIO()
    call_command("seed_demo", stdout=second)
    assert counts == (Tenant.objects.count(), Project.objects.count(), Quota.objects.count(),
                      SloContract.objects.count())
    assert counts == (2, 4, 7, 2)
    assert first.getvalue() == second.getvalue()  # same credentials printed both times
    assert "admin / " in first.getvalue()
