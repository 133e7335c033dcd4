"""The tenants' audit trail: ``GET /api/v1/audit-events`` (filters, cursor pages, CSV), who may read it, what is
recorded (sign-ins, token creation and use, role changes) and the database refusing to rewrite it."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.test import Client

from tenants import services
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.choices import Role
from tenants.models import AuditEvent, Membership
from tests.factories import api_client, make_token


def _kinds(response) -> list[str]:
    return [event["kind"] for event in response.json()["results"]]


def test_audit_events_admin_reads_own_tenant_only(world):
    audit_record(tenant=world.globex, by=world.outsider, action="project.create", target="secret-thing")
    audit_record(tenant=None, by=None, action="node.enroll", target="node-1")  # the platform's own
    response = world.client("admin").get("/api/v1/audit-events")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"next", "previous", "results"}
    targets = {event["object"] for event in body["results"]}
    assert "secret-thing" not in targets and "node-1" not in targets
    assert "token.create" in _kinds(response)  # the world's tokens were created through the service
    assert all(set(event) == {"id", "created_at", "actor", "kind", "object", "data"} for event in body["results"])


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_audit_events_members_and_viewers_get_403(world, who):
    response = world.client(who).get("/api/v1/audit-events")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"


def test_audit_events_read_only_owner_token_reads(world):
    assert world.client("owner_read").get("/api/v1/audit-events").status_code == 200


def test_audit_events_filters_actor_kind_object_time(world):
    with time_machine.travel(datetime(2026, 3, 1, 12, tzinfo=UTC), tick=False):
        audit_record(tenant=world.acme, by=world.admin, action="project.update", target="vision")
    client = world.client("owner")
    only_ann = client.get("/api/v1/audit-events", {"actor": "ann"}).json()["results"]
    assert only_ann and {event["actor"] for event in only_ann} == {"ann"}
    tokens = client.get("/api/v1/audit-events", {"kind": "token"}).json()["results"]
    assert tokens and all(event["kind"].startswith("token.") for event in tokens)
    assert client.get("/api/v1/audit-events", {"kind": "tok"}).json()["results"] == []  # a dotted prefix only
    vision = client.get("/api/v1/audit-events", {"object": "vision"}).json()["results"]
    assert [event["kind"] for event in vision] == ["project.update"]
    window = client.get("/api/v1/audit-events", {"since": "2026-03-01", "until": "2026-03-02"}).json()["results"]
    assert [event["kind"] for event in window] == ["project.update"]
    assert client.get("/api/v1/audit-events", {"since": "2026-03-02T00:00:00Z"}).json()["results"] != window


@pytest.mark.parametrize("query,field", [({"since": "yesterday"}, "since"), ({"until": "2026-13-01"}, "until"),
                                         ({"since": "2026-03-02", "until": "2026-03-01"}, "until"),
                                         ({"cursor": "not-a-cursor"}, "cursor"), ({"format": "xml"}, "format")])
def test_audit_events_bad_parameter_is_400_naming_it(world, query, field):
    response = world.client("owner").get("/api/v1/audit-events", query)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_audit_events_cursor_pages_hold_every_event_once(world):
    for number in range(7):
        audit_record(tenant=world.acme, by=world.owner, action="project.update", target=f"p{number}")
    client = world.client("owner")
    seen, url = [], "/api/v1/audit-events?kind=project.update&limit=3"
    while url:
        body = client.get(url).json()
        assert len(body["results"]) <= 3
        seen += [event["object"] for event in body["results"]]
        url = body["next"]
    assert seen == [f"p{number}" for number in reversed(range(7))]


@pytest.mark.parametrize("how", ["query", "accept"])
def test_audit_events_csv(world, how):
    audit_record(tenant=world.acme, by=world.owner, action="project.update", target="vision", data={"name": "V"})
    client = world.client("owner")
    if how == "query":
        response = client.get("/api/v1/audit-events?format=csv&kind=project")
    else:
        response = client.get("/api/v1/audit-events?kind=project", HTTP_ACCEPT="text/csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["id", "created_at", "actor", "kind", "object", "data"]
    assert rows[1][2:] == ["alice", "project.update", "vision", '{"name": "V"}']


def test_audit_events_csv_refusal_is_problem(world):
    response = world.client("member").get("/api/v1/audit-events?format=csv")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


def test_audit_records_role_change_and_token_use(world):
    membership = Membership.objects.get(tenant=world.acme, user=world.member)
    services.membership_change_role(actor=Actor(user=world.owner, tenant=world.acme, role=Role.OWNER),
                                    membership=membership, role=Role.VIEWER)
    token, secret = make_token(world.acme, world.admin, name="ci")
    assert api_client(secret).get("/api/v1/tenant").status_code == 200
    assert api_client(secret).get("/api/v1/tenant").status_code == 200
    events = AuditEvent.objects.filter(tenant=world.acme)
    role = events.get(action="member.role", target=str(world.member.pk))
    assert role.data == {"old": "member", "new": "viewer"} and role.actor == world.owner
    assert events.filter(action="token.use", target=token.prefix).count() == 1  # the use, not each request
    with time_machine.travel(datetime.now(UTC) + timedelta(days=2)):
        assert api_client(secret).get("/api/v1/tenant").status_code == 200
    assert events.filter(action="token.use", target=token.prefix).count() == 2  # a day later: in use again


def test_audit_records_portal_sign_in_success_and_failure(world):
    client = Client()
    refused = client.post("/accounts/login/", {"username": "ann", "password": "wrong"})
    assert refused.status_code == 200
    assert client.post("/accounts/login/", {"username": "ann", "password": "pw-ann"}).status_code == 302
    rows = AuditEvent.objects.filter(tenant=world.acme, target="ann", action__startswith="signin.")
    assert sorted(rows.values_list("action", flat=True)) == ["signin.failed", "signin.success"]
    assert rows.get(action="signin.failed").actor is None and rows.get(action="signin.success").actor == world.admin
    assert not AuditEvent.objects.filter(tenant=world.globex, target="ann").exists()
    listed = world.client("owner").get("/api/v1/audit-events", {"kind": "signin"}).json()["results"]
    assert {event["kind"] for event in listed} == {"signin.success", "signin.failed"}


def test_audit_events_are_append_only_in_the_database(world):
    event = audit_record(tenant=world.acme, by=world.owner, action="project.update", target="vision")
    for statement in ("UPDATE tenants_auditevent SET target = 'x' WHERE id = %s",
                      "DELETE FROM tenants_auditevent WHERE id = %s"):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, [event.pk])
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(target="x")
    # the purge's setting lets a DELETE through, never an UPDATE
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL gpubroker.retention_purge = 'on'")
        cur.execute("UPDATE tenants_auditevent SET target = 'x' WHERE id = %s", [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).target == "vision"


def test_audit_events_portal_page_for_admins(world):
    client = Client()
    client.force_login(world.admin)
    page = client.get("/settings/audit")
    assert page.status_code == 200
    assert b"token.create" in page.content
    viewer = Client()
    viewer.force_login(world.viewer)
    assert viewer.get("/settings/audit").status_code == 403
