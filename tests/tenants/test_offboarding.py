"""A tenant leaving (``tenants.offboarding``): the export of everything it owns (a zip with a manifest of
SHA-256s, built by a real Celery worker, downloaded by an owner) and the closure (refused while leases run; the
final invoice issued; personal data removed; financial records kept)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction

from billing.choices import InvoiceStatus
from billing.models import AllocationUsage, Invoice
from billing.services import price_book_create
from broker import services as broker
from broker.choices import LeaseState
from broker.models import Allocation, Lease
from core.processes import wait_until
from tenants import offboarding, services
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.choices import Role, TenantStatus
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Tenant, TenantExport
from tests.factories import api_client, make_member

MIG = {"kind": "mig", "profile": "1g.10gb"}


def _owner(world) -> Actor:
    return Actor(user=world.owner, tenant=world.acme, role=Role.OWNER)


def _zip(content: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(content))


@pytest.fixture
def exports_dir(settings, tmp_path):
    settings.EXPORT_DIR = tmp_path / "exports"
    return settings.EXPORT_DIR


def _invoiced(world) -> Invoice:
    """A finalized invoice of acme (its PDF goes into the export)."""
    invoice = Invoice.objects.create(tenant=world.acme, period=datetime(2026, 1, 1).date(), currency="USD",
                                     computed_at=datetime(2026, 2, 1, tzinfo=UTC))
    from billing.services.invoicing import invoice_finalize

    return invoice_finalize(invoice=invoice, now=datetime(2026, 2, 2, tzinfo=UTC))


def test_export_zip_holds_everything_with_a_manifest(world, exports_dir):
    lease = broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                 project="vision", gpu=MIG)[0]
    invoice = _invoiced(world)
    export = offboarding.tenant_export_request(actor=_owner(world))
    assert export.state == "pending"
    built = offboarding.tenant_export_build(export_id=export.pk)
    assert built.state == "ready" and built.size_bytes > 0
    content = offboarding.export_path(built).read_bytes()
    assert hashlib.sha256(content).hexdigest() == built.sha256
    archive = _zip(content)
    manifest = json.loads(archive.read("manifest.json"))
    names = {entry["path"] for entry in manifest["files"]}
    assert {"tenant.json", "members.csv", "projects.json", "api_tokens.csv", "audit_events.csv", "leases.csv",
            "lease_events.csv", "usage.csv", f"invoices/{invoice.number}.pdf",
            f"invoices/{invoice.number}.csv"} <= names
    assert set(archive.namelist()) == names | {"manifest.json"}
    for entry in manifest["files"]:  # every file is what the manifest says
        assert hashlib.sha256(archive.read(entry["path"])).hexdigest() == entry["sha256"]
    assert archive.read(f"invoices/{invoice.number}.pdf").startswith(b"%PDF")
    members = list(csv.DictReader(io.StringIO(archive.read("members.csv").decode())))
    assert {m["username"] for m in members} == {"alice", "ann", "max", "vic"}  # not globex's bob
    leases = list(csv.DictReader(io.StringIO(archive.read("leases.csv").decode())))
    assert [int(row["id"]) for row in leases] == [lease.pk]
    tokens = archive.read("api_tokens.csv").decode()
    assert "gpub_" not in tokens and not any(t.secret_hash in tokens for t in ApiToken.objects.all())
    assert b"secret" not in archive.read("projects.json")  # globex's project
    exported = AuditEvent.objects.filter(tenant=world.acme, action__in=["tenant.export", "tenant.export_ready"])
    assert exported.count() == 2
    again = offboarding.tenant_export_build(export_id=export.pk)  # idempotent
    assert again.sha256 == built.sha256


def test_export_through_the_api_and_a_real_worker(world, celery_worker):
    client = world.client("owner")
    response = client.post("/api/v1/tenant/exports", format="json")
    assert response.status_code == 202, response.content
    export_id = response.json()["id"]
    assert response.json()["archive"] is None
    wait_until(lambda: TenantExport.objects.get(pk=export_id).state != "pending", timeout=60)
    shown = client.get(f"/api/v1/tenant/exports/{export_id}").json()
    assert shown["state"] == "ready", shown
    download = client.get(shown["archive"])
    assert download.status_code == 200 and download["Content-Type"] == "application/zip"
    content = b"".join(download.streaming_content)
    assert hashlib.sha256(content).hexdigest() == shown["sha256"] == download["X-Content-SHA256"]
    assert "manifest.json" in _zip(content).namelist()
    assert [e["id"] for e in client.get("/api/v1/tenant/exports").json()["results"]] == [export_id]
    # not the outsider's, not a non-owner's
    assert world.client("outsider").get(f"/api/v1/tenant/exports/{export_id}").status_code == 404
    assert world.client("outsider").get(f"/api/v1/tenant/exports/{export_id}/archive").status_code == 404
    for who in ("admin", "member", "viewer"):
        assert world.client(who).get(f"/api/v1/tenant/exports/{export_id}/archive").status_code == 403, who
    offboarding.export_path(TenantExport.objects.get(pk=export_id)).unlink()


@pytest.mark.parametrize("who", ["admin", "member", "viewer", "owner_read"])
def test_export_request_refused_for_non_owners(world, who, exports_dir):
    response = world.client(who).post("/api/v1/tenant/exports", format="json")
    assert response.status_code == 403
    assert not TenantExport.objects.exists()


def test_export_archive_not_ready_is_409(world, exports_dir):
    export = offboarding.tenant_export_request(actor=_owner(world))
    response = world.client("owner").get(f"/api/v1/tenant/exports/{export.pk}/archive")
    assert response.status_code == 409 and response.json()["field"] == "export"


def test_close_refused_while_leases_run_nothing_changed(world):
    lease = broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                 project="vision", gpu=MIG)[0]
    response = world.client("owner").post("/api/v1/tenant/close", {"confirm": "acme"}, format="json")
    assert response.status_code == 409
    assert f"leases not finished ({lease.pk})" in response.json()["detail"]
    tenant = Tenant.objects.get(pk=world.acme.pk)
    assert tenant.closed_at is None and tenant.status == TenantStatus.ACTIVE
    assert Membership.objects.filter(tenant=world.acme).count() == 4


@pytest.mark.parametrize("body,field", [({"confirm": "globex"}, "confirm"), ({}, "confirm"),
                                        ({"confirm": "acme", "x": 1}, "x")])
def test_close_needs_the_slug_confirmed(world, body, field):
    response = world.client("owner").post("/api/v1/tenant/close", body, format="json")
    assert response.status_code == 400 and response.json()["field"] == field
    assert Tenant.objects.get(pk=world.acme.pk).closed_at is None


@pytest.mark.parametrize("who", ["admin", "member", "viewer", "owner_read"])
def test_close_refused_for_non_owners(world, who):
    response = world.client(who).post("/api/v1/tenant/close", {"confirm": "acme"}, format="json")
    assert response.status_code == 403
    assert Tenant.objects.get(pk=world.acme.pk).closed_at is None


def test_close_issues_final_invoice_removes_personal_data_keeps_financial_records(world):
    price_book_create(name="list", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                      rates=[{"tier": "H100-80GB", "per_hour": "4.00"}])
    token = broker.enrollment_token_create()
    broker.node_enroll(node_id="n1", token=token, address="http://127.0.0.1:9/n/n1", inventory={"gpus": [
        {"index": 0, "uuid": "GPU-h100-0", "model": "H100-80GB", "mode": "whole", "memory_mib": 81559}]})
    both = make_member(world.globex, "sam", Role.MEMBER)  # also a member of acme: keeps their identity
    Membership.objects.create(user=both, tenant=world.acme, role=Role.MEMBER)
    member_actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    today = datetime.now(UTC)  # after the world's tokens were created (a token is revoked after its creation)
    start = datetime(today.year, today.month, today.day, 8, tzinfo=UTC) + timedelta(days=1)
    with time_machine.travel(start, tick=False):
        lease = broker.lease_request(actor=member_actor, project="vision", gpu={"kind": "whole"},
                                     duration_seconds=4 * 3600)[0]
        broker.schedule_cycle()
        audit_record(tenant=world.acme, by=world.owner, action="member.add", target="max")
    for allocation in Allocation.objects.filter(lease=lease):
        with time_machine.travel(start, tick=False):
            broker.allocation_ready(allocation=allocation, instance={"device_uuid": "X"}, now=start)
    end = start + timedelta(hours=2, minutes=30)
    with time_machine.travel(end, tick=False):
        broker.lease_release(lease=Lease.objects.get(pk=lease.pk), actor="user:max", now=end)
        broker.allocations_free(lease=Lease.objects.get(pk=lease.pk), now=end, to=LeaseState.RELEASED,
                                reason="released")
    client = world.client("owner")
    assert client.post("/api/v1/tenant/invitations", {"username": "bob", "role": "viewer"},
                       format="json").status_code == 201  # a pending invitation: a username, nothing to join
    with time_machine.travel(end + timedelta(minutes=5), tick=False):
        closed = client.post("/api/v1/tenant/close", {"confirm": "acme"}, format="json")
        assert closed.status_code == 200, closed.json()
    tenant = Tenant.objects.get(pk=world.acme.pk)
    assert tenant.closed_at is not None and tenant.status == TenantStatus.SUSPENDED
    assert tenant.billing_email.endswith("@closed.invalid") and tenant.name == "Acme"
    # the final invoice: this month's, finalized, charging the lease's 2.5 hours (the last half hour included)
    invoice = Invoice.objects.get(tenant=tenant, period=date(end.year, end.month, 1))
    assert invoice.status == InvoiceStatus.FINALIZED and invoice.number and invoice.total_minor > 0
    assert sum(row.seconds for row in AllocationUsage.objects.filter(lease=lease)) == 9000
    closing = AuditEvent.objects.get(tenant=tenant, action="tenant.close")
    assert closing.data["final_invoices"] == [invoice.number]
    # personal data: acme-only users pseudonymised and deactivated; sam (also globex's) only left acme
    users = get_user_model().objects
    for name in ("alice", "ann", "max", "vic"):
        assert not users.filter(username=name).exists()
    max_now = users.get(pk=world.member.pk)
    assert (max_now.username, max_now.email, max_now.is_active) == (f"closed-{tenant.pk}-{world.member.pk}", "",
                                                                   False)
    assert not max_now.has_usable_password()
    assert users.get(pk=both.pk).username == "sam" and users.get(pk=both.pk).is_active
    assert Membership.objects.filter(user=both, tenant=world.globex).exists()
    assert not Membership.objects.filter(tenant=tenant).exists()
    assert not Invitation.objects.filter(tenant=tenant).exists()
    assert world.client("outsider").get("/api/v1/invitations").json()["results"] == []
    assert not ApiToken.objects.filter(tenant=tenant, revoked_at__isnull=True).exists()
    assert not AuditEvent.objects.filter(tenant=tenant, target="max").exists()  # replaced by the pseudonym
    assert AuditEvent.objects.filter(tenant=tenant, target=max_now.username, action="member.add").exists()
    # financial records kept; the tokens no longer work; a closed tenant is not reactivated
    assert Lease.objects.filter(pk=lease.pk).exists() and Invoice.objects.filter(tenant=tenant).exists()
    assert api_client(world.tokens["owner"]).get("/api/v1/tenant").status_code == 401
    from core.errors import Conflict

    with pytest.raises(Conflict):
        services.tenant_set_status(tenant=tenant, status=TenantStatus.ACTIVE)
    # globex untouched
    assert users.get(pk=world.outsider.pk).username == "bob"


def test_close_audit_pseudonymising_is_refused_outside_the_closure(world):
    event = audit_record(tenant=world.acme, by=world.owner, action="member.add", target="max")
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE tenants_auditevent SET target = 'x' WHERE id = %s", [event.pk])
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL gpubroker.audit_pseudonymise = 'on'")  # even then: never who, what or when
        cursor.execute("UPDATE tenants_auditevent SET action = 'x' WHERE id = %s", [event.pk])


def test_portal_export_and_close_for_owners(world, exports_dir):
    from django.test import Client

    owner = Client()
    owner.force_login(world.owner)
    assert owner.post("/settings/exports").status_code == 302
    export = TenantExport.objects.get(tenant=world.acme)
    offboarding.tenant_export_build(export_id=export.pk)
    page = owner.get("/settings/exports").content.decode()
    assert f"/api/v1/tenant/exports/{export.pk}/archive" in page
    download = owner.get(f"/api/v1/tenant/exports/{export.pk}/archive")  # the session authenticates the API
    assert download.status_code == 200
    wrong = owner.post("/settings/close", {"confirm": "acme-typo"})
    assert wrong.status_code == 400 and "confirm must be" in wrong.content.decode()
    assert Tenant.objects.get(pk=world.acme.pk).closed_at is None
    admin = Client()
    admin.force_login(world.admin)
    assert admin.get("/settings/exports").status_code == 403
    assert admin.post("/settings/close", {"confirm": "acme"}).status_code == 403
    closed = owner.post("/settings/close", {"confirm": "acme"})
    assert closed.status_code == 302 and closed["Location"].startswith("/accounts/login/")
    assert Tenant.objects.get(pk=world.acme.pk).closed_at is not None
