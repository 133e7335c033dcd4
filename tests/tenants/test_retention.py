"""The retention policy (``tenants.retention``): each kind purged after its age limit, in one audited
transaction, idempotent; the periodic task declared and the command printing what it removed."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from io import StringIO

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command

from billing.models import Invoice, UtilisationUsage
from broker import services as broker
from broker.models import Lease, LeaseEvent
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.choices import Role
from tenants.models import AuditEvent
from tenants.retention import retention_apply, retention_policy

NOW = datetime(2027, 6, 15, 12, tzinfo=UTC)
MIG = {"kind": "mig", "profile": "1g.10gb"}


@pytest.fixture
def aged(world):
    """acme with: a lease finished 200 days ago and one finished 10 days ago (each with its events), audit
    events 8 years and 1 year old, and utilisation samples 500 days old (one in a month still drafted)."""
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    old, recent = (broker.lease_request(actor=actor, project="vision", gpu=MIG)[0] for _ in range(2))
    for lease, age in ((old, 200), (recent, 10)):
        broker.lease_release(lease=lease, actor="test")
        Lease.objects.filter(pk=lease.pk).update(finished_at=NOW - timedelta(days=age))
    with time_machine.travel(NOW - timedelta(days=8 * 365), tick=False):
        ancient = audit_record(tenant=world.acme, by=world.owner, action="project.update", target="ancient")
    with time_machine.travel(NOW - timedelta(days=365), tick=False):
        audit_record(tenant=world.acme, by=world.owner, action="project.update", target="last-year")
    hour = datetime(2026, 1, 10, 3, tzinfo=UTC)  # ≈ 520 days before NOW
    drafted = datetime(2026, 2, 10, 3, tzinfo=UTC)
    for moment in (hour, drafted):
        UtilisationUsage.objects.create(tenant=world.acme, lease=old, hour_start=moment, samples=1, metered_at=moment)
    Invoice.objects.create(tenant=world.acme, period=date(2026, 2, 1), currency="USD", computed_at=drafted)
    return {"old": old, "recent": recent, "ancient": ancient}


def test_retention_purges_each_kind_after_its_limit_and_is_idempotent(aged):
    old_events = LeaseEvent.objects.filter(lease=aged["old"]).count()
    assert old_events and LeaseEvent.objects.filter(lease=aged["recent"]).exists()
    report = retention_apply(now=NOW)
    assert report["removed"] == {"audit_events": 1, "lease_events": old_events, "utilisation_samples": 1}
    assert not LeaseEvent.objects.filter(lease=aged["old"]).exists()
    assert LeaseEvent.objects.filter(lease=aged["recent"]).exists()  # finished 10 days ago: kept whole
    assert Lease.objects.filter(pk=aged["old"].pk).exists()  # the lease itself is a financial record
    assert not AuditEvent.objects.filter(target="ancient").exists()
    assert AuditEvent.objects.filter(target="last-year").exists()
    assert list(UtilisationUsage.objects.values_list("hour_start__month", flat=True)) == [2]  # the draft's month
    purge = AuditEvent.objects.get(action="retention.purge")
    assert purge.tenant is None and purge.data["removed"] == report["removed"]
    again = retention_apply(now=NOW)
    assert again["removed"] == {"audit_events": 0, "lease_events": 0, "utilisation_samples": 0}
    assert AuditEvent.objects.filter(action="retention.purge").count() == 1  # nothing removed: nothing written


def test_retention_dry_run_counts_and_removes_nothing(aged):
    before = (LeaseEvent.objects.count(), AuditEvent.objects.count(), UtilisationUsage.objects.count())
    report = retention_apply(now=NOW, dry_run=True)
    assert report["dry_run"] and report["removed"]["audit_events"] == 1 and report["removed"]["lease_events"] > 0
    assert (LeaseEvent.objects.count(), AuditEvent.objects.count(), UtilisationUsage.objects.count()) == before


def test_retention_limits_come_from_settings(aged, settings):
    settings.RETENTION_AUDIT_DAYS = 300
    assert retention_apply(now=NOW)["removed"]["audit_events"] == 2  # the year-old one too


def test_retention_lease_events_still_refuse_a_plain_delete(aged):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        LeaseEvent.objects.filter(lease=aged["old"]).delete()


def test_retention_policy_lists_every_kind_and_invoices_kept():
    rows = {row["kind"]: row for row in retention_policy()}
    assert set(rows) == {"audit_events", "lease_events", "utilisation_samples", "invoices"}
    assert rows["invoices"]["action"] == "kept"
    assert rows["lease_events"]["days"] == settings.RETENTION_LEASE_EVENT_DAYS


def test_retention_periodic_task_is_declared_and_runs():
    entry = settings.CELERY_BEAT_SCHEDULE["retention-apply"]
    assert entry["task"] == "tenants.retention_apply"
    from config.celery import app

    app.loader.import_default_modules()
    assert "tenants.retention_apply" in app.tasks


def test_retention_command_prints_what_it_removed(aged):
    out = StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("retention_apply", "--dry-run", stdout=out)
    text = out.getvalue()
    assert "audit_events: older than 2555 days, would remove 1" in text
    assert "invoices: kept" in text
    out = StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("retention_apply", "--json", stdout=out)
    assert json.loads(out.getvalue())["removed"]["audit_events"] == 1
    assert not AuditEvent.objects.filter(target="ancient").exists()
