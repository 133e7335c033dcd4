"""The Django admin of the capacity loop: adjustments are read-only and decided by actions that call the
services (each row's refusal reported), policies are saved and deleted through the services (a refusal is a
message, nothing saved, never a 500)."""

from __future__ import annotations

import pytest

from capacity.models import Adjustment, CapacityPolicy
from tenants.models import AuditEvent
from tests.capacity.test_api import a_lease, adjustment
from tests.factories import make_world


@pytest.fixture
def world(db):
    return make_world()


def shown_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_admin_adjustments_list_filters_search_and_read_only(world, admin_client):
    advice = adjustment(tenant=world.acme, lease=a_lease(world), reason="right-size to 1g.10gb")
    adjustment("warm_pool", reason="keep two warm")
    page = admin_client.get("/admin/capacity/adjustment/?kind__exact=right_size")
    assert page.status_code == 200 and list(page.context["cl"].result_list) == [advice]
    page = admin_client.get("/admin/capacity/adjustment/?q=two+warm")
    assert [row.kind for row in page.context["cl"].result_list] == ["warm_pool"]
    assert admin_client.get("/admin/capacity/adjustment/?state__exact=proposed&mode__exact=advise").status_code == 200
    detail = admin_client.get(f"/admin/capacity/adjustment/{advice.pk}/change/")
    assert detail.status_code == 200 and b"right-size to 1g.10gb" in detail.content
    assert b'name="_save"' not in detail.content  # nothing to edit
    assert admin_client.get("/admin/capacity/adjustment/add/").status_code == 403
    admin_client.post(f"/admin/capacity/adjustment/{advice.pk}/change/", {"state": "applied"})
    assert Adjustment.objects.get(pk=advice.pk).state == "proposed"


def test_admin_accept_and_reject_actions_call_the_services_and_report_each_row(world, admin_client):
    lease = a_lease(world)
    open_advice = adjustment(tenant=world.acme, lease=lease)
    decided = adjustment(tenant=world.acme, lease=lease, state="rejected")
    warm = adjustment("warm_pool", change={"model": "H100-80GB", "profile": "1g.10gb", "slots": [], "remove": []})
    response = admin_client.post("/admin/capacity/adjustment/", {
        "action": "accept", "_selected_action": [open_advice.pk, decided.pk, warm.pk]}, follow=True)
    assert response.status_code == 200
    notes = shown_messages(response)
    assert any(note.startswith(f"Adjustment {open_advice.pk}: applied") for note in notes), notes
    assert any(note.startswith(f"Adjustment {warm.pk}: applied") for note in notes), notes
    assert f"Adjustment {decided.pk}: Adjustment {decided.pk} is rejected; only a proposed one can be accepted." \
        in notes
    assert Adjustment.objects.get(pk=open_advice.pk).applied_by == "user:admin"
    assert AuditEvent.objects.filter(action="adjustment.accept", target=f"adjustment:{open_advice.pk}").exists()

    other = adjustment(tenant=world.acme, lease=lease)
    response = admin_client.post("/admin/capacity/adjustment/", {
        "action": "reject", "_selected_action": [other.pk, open_advice.pk]}, follow=True)
    notes = shown_messages(response)
    other.refresh_from_db()
    assert other.state == "rejected" and other.outcome == "rejected by admin: in the admin"
    assert any("only a proposed one can be rejected" in note for note in notes), notes


def test_admin_policies_save_and_delete_through_the_services(world, admin_client):
    form = {"scope": "pool:H100-80GB", "mode_switch": "", "mig_layout": "", "warm_pool": "auto", "idle_reclaim": "",
            "right_size": "", "quota_advice": "", "idle_rules": "{}", "warm_target_p95_seconds": "",
            "cold_provision_seconds": "", "warm_min_arrivals": "3", "mode_hold_seconds": ""}
    response = admin_client.post("/admin/capacity/capacitypolicy/add/", form, follow=True)
    assert response.status_code == 200
    policy = CapacityPolicy.objects.get()
    assert (policy.scope, policy.warm_pool, policy.warm_min_arrivals) == ("pool:H100-80GB", "auto", 3)
    assert AuditEvent.objects.filter(action="capacity_policy.set", target="capacity_policy:pool:H100-80GB").exists()

    # the service refuses: a message on the form, nothing saved, no 500
    response = admin_client.post("/admin/capacity/capacitypolicy/add/", {**form, "scope": "pool:NOPE"}, follow=True)
    assert response.status_code == 200
    assert any(note.startswith("Not saved — scope: ") for note in shown_messages(response))
    bad_rules = {**form, "idle_rules": '{"training": {"enabled": "yes"}}'}
    response = admin_client.post(f"/admin/capacity/capacitypolicy/{policy.pk}/change/", bad_rules, follow=True)
    assert "Not saved — idle_rules.training.enabled: enabled must be true or false." in shown_messages(response)
    assert CapacityPolicy.objects.get().idle_rules == {}
    # the form's own checks: a taken scope, an unknown mode
    response = admin_client.post("/admin/capacity/capacitypolicy/add/", form)
    assert response.status_code == 200 and response.context["adminform"].form.errors["scope"]
    response = admin_client.post("/admin/capacity/capacitypolicy/add/", {**form, "scope": "", "warm_pool": "always"})
    assert response.status_code == 200 and response.context["adminform"].form.errors["warm_pool"]
    assert CapacityPolicy.objects.count() == 1

    response = admin_client.post(f"/admin/capacity/capacitypolicy/{policy.pk}/change/",
                                 {**form, "warm_pool": "off", "scope": "pool:A100-80GB"}, follow=True)
    policy.refresh_from_db()
    assert (policy.scope, policy.warm_pool) == ("pool:H100-80GB", "off")  # the scope is the policy: read-only
    response = admin_client.post(f"/admin/capacity/capacitypolicy/{policy.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200 and not CapacityPolicy.objects.exists()
    assert AuditEvent.objects.filter(action="capacity_policy.delete").count() == 1
    default = CapacityPolicy.objects.create(scope="")
    assert admin_client.get(f"/admin/capacity/capacitypolicy/{default.pk}/delete/").status_code == 403
    assert "delete_selected" not in admin_client.get("/admin/capacity/capacitypolicy/").content.decode()
