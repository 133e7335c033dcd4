"""A project's suspension from the staff page and the Django admin (the staff API's is in test_staff_api.py): one
service, ``project_set_status``, audited in the staff user's name; the suspended project takes no lease request
and the tenant's other projects still do."""

from __future__ import annotations

from django.test import Client

from tenants.models import AuditEvent, Project
from tests.factories import make_project, make_quota, make_user

LEASE = {"gpu": {"kind": "mig", "profile": "1g.10gb"}}


def _staff() -> tuple[Client, object]:
    user = make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client, user


def test_project_suspension_from_the_staff_page(world):
    client, user = _staff()
    page = client.get("/ops/tenants/acme").content.decode()
    assert 'data-project-status="vision"' in page and "Suspend project" in page
    done = client.post("/ops/tenants/acme/projects/vision/status", {"status": "suspended", "reason": "review"})
    assert done.status_code == 302
    assert Project.objects.get(pk=world.project.pk).status == "suspended"
    event = AuditEvent.objects.get(action="project.suspended", target="vision")
    assert event.actor == user and event.data == {"reason": "review"}
    assert "Reactivate project" in client.get("/ops/tenants/acme").content.decode()
    member = world.client("member")
    refused = member.post("/api/v1/leases", {"project": "vision", **LEASE}, format="json")
    assert refused.status_code == 403 and refused.json()["field"] == "project"
    other = make_project(world.acme, "nlp")  # the tenant's other project still takes requests
    make_quota(other)
    assert member.post("/api/v1/leases", {"project": "nlp", **LEASE}, format="json").status_code == 201
    bad = client.post("/ops/tenants/acme/projects/vision/status", {"status": "closed"})
    assert bad.status_code == 400 and "status must be one of" in bad.content.decode()
    assert client.post("/ops/tenants/acme/projects/nope/status", {"status": "active"}).status_code == 404
    client.post("/ops/tenants/acme/projects/vision/status", {"status": "active"})
    assert member.post("/api/v1/leases", {"project": "vision", **LEASE}, format="json").status_code == 201


def test_project_suspension_from_the_admin(world):
    client, user = _staff()
    answer = client.post("/admin/tenants/project/", {"action": "suspend", "_selected_action": [world.project.pk]})
    assert answer.status_code == 302
    assert Project.objects.get(pk=world.project.pk).status == "suspended"
    assert AuditEvent.objects.get(action="project.suspended", target="vision").actor == user
    client.post("/admin/tenants/project/", {"action": "activate", "_selected_action": [world.project.pk]})
    assert Project.objects.get(pk=world.project.pk).status == "active"
    assert AuditEvent.objects.filter(action="project.active", target="vision").count() == 1
