"""Portal pages through Django's test client: login, roles, tenant scoping (another tenant's objects are
404), form posts without JavaScript, the service's errors next to their field, htmx partials."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.test import Client
from django.utils import timezone

from billing.models import PriceBook, PriceRate
from broker import services as broker
from broker.choices import LeaseState
from broker.models import Allocation, Gpu, Lease, Node
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, AuditEvent, Membership, Quota, SloContract, TenantQuota
from tests.factories import make_user

MIG = {"project": "vision", "gpu.kind": "mig", "gpu.model": "auto", "gpu.profile": "1g.10gb", "gpu.count": "1",
       "gpu.gang": ["false", "true"], "workload_class": "training", "priority": "0", "duration_seconds": "3600"}


def login(client: Client, username: str) -> Client:
    assert client.login(username=username, password=f"pw-{username}")
    return client


def text(response) -> str:
    """The page as a reader sees it: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def field_error(response, key: str) -> str:
    match = re.search(rf'<p class="field-error" id="err-{key}"[^>]*>(.*?)</p>', response.content.decode(), re.S)
    assert match, f"no error shown next to {key}"
    return unescape(match.group(1))


def lease_for(world, tenant="acme", **gpu) -> Lease:
    owner, tenant_obj = (world.member, world.acme) if tenant == "acme" else (world.outsider, world.globex)
    role = Role.MEMBER if tenant == "acme" else Role.OWNER
    project = "vision" if tenant == "acme" else "secret"
    lease, _ = broker.lease_request(actor=Actor(user=owner, tenant=tenant_obj, role=role), project=project,
                                     gpu=gpu or {"kind": "mig", "profile": "1g.10gb"}, duration_seconds=3600)
    return lease


@pytest.fixture
def staff(db):
    return make_user("root", is_staff=True)


def fleet_node(node_id="gpu-node-01", *, mode="mig", model="H100-80GB", gpus=2) -> Node:
    node = Node.objects.create(node_id=node_id, address="http://127.0.0.1:1", secret="s", status="ready")
    for index in range(gpus):
        Gpu.objects.create(node=node, uuid=f"GPU-{node_id}-{index}", index=index, model=model, mode=mode,
                           memory_mib=81559)
    return node


# -- login and pages -------------------------------------------------------------------------------------
PAGES = ["/", "/leases/", "/leases/new", "/settings/members", "/settings/tokens", "/ops/fleet", "/ops/queue",
         "/ops/tenants"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_login_required(db, client, path):
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_pages_htmx_poll_after_logout_redirects_the_whole_page(db, client):
    response = client.get("/leases/", headers={"HX-Request": "true", "HX-Target": "lease-table"})
    assert response.status_code == 204 and response["HX-Redirect"].startswith("/accounts/login/")


@pytest.mark.parametrize("path", PAGES[:5])
def test_pages_tenant_pages_render_for_every_role(world, client, path):
    for username in ("alice", "ann", "max", "vic"):
        client.logout()
        response = login(client, username).get(path)
        assert response.status_code == 200, (username, path)
        # the other tenant and its project "Secret" (the request form's "Secrets" box is another word)
        assert "Globex" not in text(response) and not re.search(r"\bSecret\b", text(response))


@pytest.mark.parametrize("path", PAGES[5:])
def test_pages_platform_pages_are_for_staff_only(world, client, staff, path):
    assert login(client, "alice").get(path).status_code == 403
    client.logout()
    assert login(client, "root").get(path).status_code == 200


def test_pages_csrf_is_enforced(world):
    client = login(Client(enforce_csrf_checks=True), "max")
    assert client.post("/leases/new", MIG).status_code == 403
    assert not Lease.objects.exists()


def test_pages_dashboard_quota_bars_and_leases(world, client):
    lease = lease_for(world)
    page = login(client, "max").get("/")
    body = text(page)
    assert "H100-80GB" in body and "0 of 1 guaranteed in use" in body and "limit 2 GPU" in body
    assert f"#{lease.pk}" in body and "Waiting" in body
    partial = client.get("/", headers={"HX-Request": "true", "HX-Target": "dashboard-leases"})
    assert b"<html" not in partial.content and f"#{lease.pk}".encode() in partial.content


# -- request form ----------------------------------------------------------------------------------------
def test_request_form_posts_without_javascript_and_redirects_to_the_lease(world, client):
    response = login(client, "max").post("/leases/new", MIG)
    lease = Lease.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/leases/{lease.pk}"
    assert (lease.kind, lease.profile, lease.count, lease.project.slug, lease.state) == (
        "mig", "1g.10gb", 1, "vision", LeaseState.QUEUED)
    assert lease.created_by == world.member
    page = client.get(response["Location"])
    assert "Queued" in text(page) and "requested: it is in the queue" in text(page)


def test_request_form_asks_host_cpu_and_memory_per_unit(world, client):
    """The form's advanced part: host CPU (millicores) and memory (MiB) per unit, kept on the lease and shown on its
    page."""
    form = {**MIG, "gpu.cpu_milli_per_unit": "4000", "gpu.host_memory_mib_per_unit": "8192"}
    response = login(client, "max").post("/leases/new", form)
    lease = Lease.objects.get()
    assert response.status_code == 302
    assert (lease.cpu_milli_per_unit, lease.host_memory_mib_per_unit) == (4000, 8192)
    assert "1 × MIG 1g.10gb · auto · 4 cores + 8 GiB host" in text(client.get(response["Location"]))
    assert 'name="gpu.cpu_milli_per_unit"' in client.get("/leases/new").content.decode()


def test_request_form_sent_twice_makes_one_lease(world, client):
    login(client, "max")
    form = {**MIG, "idempotency_key": "form-1"}
    first, second = client.post("/leases/new", form), client.post("/leases/new", form)
    assert first["Location"] == second["Location"] and Lease.objects.count() == 1


@pytest.mark.parametrize(("changes", "key", "message"), [
    ({"gpu.profile": "9g.99gb"}, "gpu_profile", "No GPU model offers MIG profile '9g.99gb'."),
    ({"gpu.count": "abc"}, "gpu_count", "gpu.count must be a whole number from 1 to 64."),
    ({"gpu.count": "65"}, "gpu_count", "gpu.count must be a whole number from 1 to 64."),
    ({"gpu.kind": "whole", "gpu.count": "2", "gpu.min_count": "3"}, "gpu_min_count",
     "gpu.min_count must be a whole number from 1 to 2."),
    ({"gpu.kind": "share", "gpu.milli": "1500", "gpu.memory_mib": "1024"}, "gpu_milli",
     "gpu.milli must be a whole number from 1 to 999."),
    ({"gpu.kind": "share", "gpu.milli": "250", "gpu.memory_mib": ""}, "gpu_memory_mib",
     "gpu.memory_mib must be a whole number from 1 to 1048576."),
    ({"gpu.model": "TPU-v5"}, "gpu_model", "unknown GPU model 'TPU-v5'"),
    ({"gpu.cpu_milli_per_unit": "-5"}, "gpu_cpu_milli_per_unit",
     "gpu.cpu_milli_per_unit must be a whole number from 0 to 1024000."),
    ({"priority": "500"}, "priority", "priority must be a whole number from -100 to 100."),
    ({"duration_seconds": "5"}, "duration_seconds", "duration_seconds must be a whole number from 60 to"),
    ({"project": "nope"}, "project", "No project 'nope' in this tenant."),
    ({"gpu.kind": "whole", "gpu.model": "A100-80GB"}, "gpu",
     "Project 'vision' has no quota on A100-80GB whose limit allows this request."),
])
def test_request_form_errors_are_the_apis_next_to_the_field(world, client, changes, key, message):
    response = login(client, "max").post("/leases/new", {**MIG, **changes})
    assert response.status_code in (400, 404, 409)
    assert message in field_error(response, key)
    assert not Lease.objects.exists()
    # what was typed is kept
    for name in ("gpu.count", "gpu.milli", "priority"):
        if name in changes:
            assert re.search(rf'name="{re.escape(name)}"[^>]*value="{re.escape(changes[name])}"',
                             response.content.decode())
    # the API says the same words for the same input
    api = world.client("member").post("/api/v1/leases", _api_body({**MIG, **changes}), format="json")
    assert message in api.json()["detail"]


def _api_body(form: dict) -> dict:
    from django.http import QueryDict

    from portal.forms import lease_request_input

    data = QueryDict(mutable=True)
    for name, value in form.items():
        data.setlist(name, value if isinstance(value, list) else [value])
    return lease_request_input(data)


def test_request_form_viewer_cannot_request(world, client):
    page = login(client, "vic").get("/leases/new")
    assert "does not allow this (needs member or higher)" in text(page)
    assert b'id="request-form"' not in page.content
    response = client.post("/leases/new", MIG)
    assert response.status_code == 403 and "does not allow this" in text(response)
    assert not Lease.objects.exists()
    assert 'href="/leases/new"' not in client.get("/").content.decode()  # no way to it for a viewer


def test_request_form_preview_button_without_javascript(world, client):
    response = login(client, "max").post("/leases/new", {**MIG, "preview": "1", "gpu.count": "3"})
    assert response.status_code == 200 and not Lease.objects.exists()
    body = text(response)
    assert "Waits in the queue at position 1" in body and "Counts 0.43 GPU against H100-80GB" in body
    assert re.search(r'name="gpu.count"[^>]*value="3"', response.content.decode())


def test_request_form_suspended_tenant_cannot_request(world, client):
    from tenants.services import tenant_set_status

    tenant_set_status(tenant=world.acme, status="suspended")
    response = login(client, "max").post("/leases/new", MIG)
    assert response.status_code == 403 and "Tenant 'acme' is suspended" in text(response)


def test_request_preview_says_where_it_stands_without_writing(world, client):
    login(client, "max")
    preview = client.get("/leases/preview", {k: v[-1] if isinstance(v, list) else v for k, v in MIG.items()})
    body = text(preview)
    assert preview.status_code == 200 and b"<html" not in preview.content
    # no GPU in the fleet: it waits, first in the queue, within the guaranteed quota
    assert "Waits in the queue at position 1" in body and "Within the guaranteed quota" in body
    assert "Counts 0.14 GPU against H100-80GB" in body
    assert not Lease.objects.exists()
    fleet_node()
    body = text(client.get("/leases/preview", {"project": "vision", "gpu.kind": "mig", "gpu.profile": "1g.10gb",
                                               "duration_seconds": "3600"}))
    assert "Fits now on H100-80GB, within quota" in body
    over = text(client.get("/leases/preview", {"project": "vision", "gpu.kind": "mig", "gpu.profile": "7g.80gb",
                                               "gpu.count": "2", "gpu.gang": "true", "duration_seconds": "3600"}))
    assert "Over quota" in over and "preemptible" in over
    bad = text(client.get("/leases/preview", {"project": "vision", "gpu.kind": "mig", "gpu.profile": "1g.99gb"}))
    assert "Cannot be requested as it is: No GPU model offers MIG profile '1g.99gb'." in bad


def test_request_preview_shows_the_price_when_one_is_set(world, client):
    login(client, "max")
    two_slices = {"project": "vision", "gpu.kind": "mig", "gpu.profile": "1g.10gb", "gpu.count": "2",
                  "gpu.gang": "true", "workload_class": "interactive"}
    two_h100s = {"project": "vision", "gpu.kind": "mig", "gpu.profile": "7g.80gb", "gpu.count": "2",
                 "gpu.gang": "true", "workload_class": "training"}
    assert "No price set for this shape yet" in text(client.get("/leases/preview", two_slices))

    book = PriceBook.objects.create(name="List prices", currency="USD", effective_from=timezone.now() - timedelta(1),
                                    over_quota_multiplier=Decimal("0.6"), interactive_multiplier=Decimal("1.25"))
    PriceRate.objects.create(book=book, tier="H100-80GB", kind="mig", mig_profile="1g.10gb", per_hour=Decimal("0.70"))
    PriceRate.objects.create(book=book, tier="H100-80GB", kind="whole", mig_profile="", per_hour=Decimal("4.20"))
    # two 1g.10gb slices of interactive work within vision's H100 quota (286 of 1000 milli guaranteed):
    # 2 x 0.70 x 1.25 = 1.75 USD per hour
    body = text(client.get("/leases/preview", two_slices))
    assert "Within the guaranteed quota" in body
    assert "1.75 USD per hour" in body
    assert "2 × 1g.10gb on H100-80GB at 0.875 USD per 1g.10gb instance-hour (interactive rate)" in body
    # two whole-GPU slices, 2000 milli over the 1000 guaranteed: no 7g.80gb rate, so the whole-GPU rate x 7/7
    # slices, at the over-quota rate: 2 x 4.20 x 0.6 = 5.04 USD per hour
    body = text(client.get("/leases/preview", two_h100s))
    assert "Over quota" in body
    assert "5.04 USD per hour" in body and "(over-quota rate)" in body


# -- lease page ------------------------------------------------------------------------------------------
def test_lease_page_of_another_tenant_is_404_by_every_route(world, client):
    theirs = lease_for(world, "globex")
    login(client, "alice")
    for method, path in [("get", f"/leases/{theirs.pk}"), ("post", f"/leases/{theirs.pk}/release"),
                         ("post", f"/leases/{theirs.pk}/renew")]:
        response = getattr(client, method)(path, {"duration_seconds": "3600"} if method == "post" else None)
        assert response.status_code == 404, path
        assert "No such lease." in text(response)
    assert Lease.objects.get(pk=theirs.pk).state == LeaseState.QUEUED
    assert f"#{theirs.pk}" not in text(client.get("/leases/?state=all"))


def test_lease_page_release_without_javascript(world, client):
    lease = lease_for(world)
    page = login(client, "max").get(f"/leases/{lease.pk}")
    assert "Cancel request…" in text(page) and "Take lease" in text(page)
    response = client.post(f"/leases/{lease.pk}/release")
    assert response.status_code == 302
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    page = text(client.get(response["Location"]))
    assert f"Lease {lease.pk} released." in page and "This lease is finished." in page


def test_lease_page_viewer_sees_but_cannot_release_or_renew(world, client):
    lease = lease_for(world)
    page = login(client, "vic").get(f"/leases/{lease.pk}")
    assert page.status_code == 200 and "can look at this lease but not change it" in text(page)
    assert client.post(f"/leases/{lease.pk}/release").status_code == 403
    assert client.post(f"/leases/{lease.pk}/renew", {"duration_seconds": "3600"}).status_code == 403
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.QUEUED


def test_lease_page_renew_error_next_to_the_field(world, client):
    lease = lease_for(world)
    response = login(client, "max").post(f"/leases/{lease.pk}/renew", {"duration_seconds": "3600"})
    assert response.status_code == 409
    assert "Only an active lease can be renewed; this one is queued." in field_error(response, "renew")


def test_lease_page_live_partial_sends_actions_only_when_the_state_moved(world, client):
    lease = lease_for(world)
    login(client, "max")
    headers = {"HX-Request": "true", "HX-Target": "lease-live"}
    same = client.get(f"/leases/{lease.pk}?shown=queued", headers=headers).content.decode()
    assert "<html" not in same and 'id="lease-live"' in same and 'hx-trigger="every 2s"' in same
    assert "hx-swap-oob" not in same
    moved = client.get(f"/leases/{lease.pk}?shown=provisioning", headers=headers).content.decode()
    assert 'id="lease-actions" class="card actions-card" aria-labelledby="h-actions" hx-swap-oob="true"' in moved
    broker.lease_release(lease=lease, actor="test")
    final = client.get(f"/leases/{lease.pk}?shown=queued", headers=headers).content.decode()
    assert "hx-trigger" not in final.split('id="lease-actions"')[0]  # finished: polling stops


def test_lease_page_preemption_banner_counts_down(world, client):
    lease = lease_for(world)
    deadline = timezone.now() + timedelta(seconds=95)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.PREEMPTED, notice_deadline=deadline,
                                             active_at=timezone.now(), over_quota=True)
    page = login(client, "max").get(f"/leases/{lease.pk}")
    body = text(page)
    assert "Preemption notice." in body and "1 min 3" in body and "over quota · preemptible" in body
    assert f'data-countdown-to="{deadline.isoformat()[:19]}' in page.content.decode()


def test_lease_list_filters_by_state_and_project(world, client):
    queued = lease_for(world)
    released = lease_for(world)
    broker.lease_release(lease=released, actor="test")
    login(client, "max")
    live = text(client.get("/leases/"))
    assert f"#{queued.pk}" in live and f"#{released.pk}" not in live
    finished = text(client.get("/leases/?state=finished"))
    assert f"#{released.pk}" in finished and f"#{queued.pk}" not in finished
    assert "No leases here" in text(client.get("/leases/?state=all&project=other"))
    partial = client.get("/leases/?state=all", headers={"HX-Request": "true", "HX-Target": "lease-table"})
    assert b"<html" not in partial.content and f"#{released.pk}".encode() in partial.content


# -- settings --------------------------------------------------------------------------------------------
def test_tokens_create_shown_once_list_and_revoke(world, client):
    login(client, "max")
    response = client.post("/settings/tokens", {"name": "ci", "scopes": ["read", "write"], "expires_in_days": "30"})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    secret = re.search(r'id="token-secret" class="secret" value="([^"]+)"', response.content.decode()).group(1)
    token = ApiToken.objects.get(name="ci")
    assert secret.startswith("gpub_") and token.prefix in secret and token.scopes == ["read", "write"]
    assert world.client("member").credentials(HTTP_AUTHORIZATION=f"Bearer {secret}") is None
    listing = client.get("/settings/tokens").content.decode()
    assert token.prefix in listing and secret not in listing
    assert client.post(f"/settings/tokens/{token.pk}/revoke").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert "Revoked" in text(client.get("/settings/tokens"))


def test_tokens_errors_next_to_the_field(world, client):
    login(client, "vic")
    response = client.post("/settings/tokens", {"name": "x", "scopes": ["write"]})
    assert response.status_code == 403
    assert field_error(response, "scopes") == "Viewers can only create tokens with read scope."
    response = client.post("/settings/tokens", {"name": "  ", "scopes": ["read"]})
    assert field_error(response, "name") == "name must not be blank."
    assert not ApiToken.objects.filter(user=world.viewer, revoked_at__isnull=True).exclude(
        name="test").exists()


def test_tokens_of_others_are_404_and_members_see_only_their_own(world, client):
    theirs = ApiToken.objects.filter(tenant=world.globex).first()
    ann_token = ApiToken.objects.filter(user=world.admin).first()
    login(client, "max")
    assert client.post(f"/settings/tokens/{theirs.pk}/revoke").status_code == 404
    assert client.post(f"/settings/tokens/{ann_token.pk}/revoke").status_code == 404  # not visible to a member
    assert ann_token.prefix not in client.get("/settings/tokens").content.decode()
    assert ApiToken.objects.filter(pk__in=[theirs.pk, ann_token.pk], revoked_at__isnull=False).count() == 0


def test_members_roles_change_invite_remove(world, client):
    login(client, "ann")
    max_membership = Membership.objects.get(user=world.member)
    assert client.post(f"/settings/members/{max_membership.pk}/role", {"role": "viewer"}).status_code == 302
    assert Membership.objects.get(pk=max_membership.pk).role == "viewer"
    make_user("nora")
    assert client.post("/settings/members/invite", {"username": "nora", "role": "member"}).status_code == 302
    assert not Membership.objects.filter(tenant=world.acme, user__username="nora").exists()  # until she accepts
    response = client.post("/settings/members/invite", {"username": "nora", "role": "viewer"})
    assert response.status_code == 409 and "has an invitation" in field_error(response, "username")
    response = client.post("/settings/members/invite", {"username": "bob", "role": "owner"})
    assert response.status_code == 403  # admins do not make owners
    assert client.post(f"/settings/members/{max_membership.pk}/remove").status_code == 302
    assert not Membership.objects.filter(pk=max_membership.pk).exists()
    theirs = Membership.objects.get(user=world.outsider)
    assert client.post(f"/settings/members/{theirs.pk}/role", {"role": "viewer"}).status_code == 404


def test_members_member_cannot_manage_and_last_owner_stays(world, client):
    login(client, "max")
    alice = Membership.objects.get(user=world.owner)
    response = client.post(f"/settings/members/{alice.pk}/role", {"role": "viewer"})
    assert response.status_code == 403 and Membership.objects.get(pk=alice.pk).role == "owner"
    client.logout()
    login(client, "alice")
    response = client.post(f"/settings/members/{alice.pk}/role", {"role": "member"})
    assert response.status_code == 409 and "A tenant must keep at least one owner." in text(response)


# -- platform staff --------------------------------------------------------------------------------------
def test_fleet_map_draws_allocations_to_scale_and_cordons(world, client, staff):
    node = fleet_node()
    gpu = node.gpus.get(index=1)
    lease = lease_for(world)
    Allocation.objects.create(lease=lease, gpu=gpu, tier="H100-80GB", kind="mig", mig_profile="3g.40gb", mig_start=4,
                              slots=NumericRange(4, 8), milli=428, memory_mib=40320)
    page = login(client, "root").get("/ops/fleet").content.decode()
    segment = re.search(r'<div class="seg seg-(\w+)"[^>]*style="left: ([\d.]+)%; width: ([\d.]+)%[^"]*"'
                        r'[^>]*data-allocation="alloc-\d+" data-lease="(\d+)" data-tenant="acme" data-slots="4-7"',
                        page)
    assert segment and segment.group(2, 3, 4) == ("50.0", "50.0", str(lease.pk))
    assert f'data-gpu-uuid="{gpu.uuid}"' in page.split(segment.group(0))[0].rsplit('class="gpu"', 1)[1]
    response = client.post(f"/ops/nodes/{node.node_id}/cordon", {"action": "cordon"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.cordoned and AuditEvent.objects.filter(action="node.cordon", target=node.node_id).exists()
    assert "Cordoned" in text(client.get("/ops/fleet"))
    client.post(f"/ops/nodes/{node.node_id}/cordon", {"action": "uncordon"})
    node.refresh_from_db()
    assert not node.cordoned
    assert client.post("/ops/nodes/nope/cordon", {"action": "cordon"}).status_code == 404


def test_queue_shows_waiting_leases_per_pool_with_reasons(world, client, staff):
    auto = lease_for(world)
    pinned = lease_for(world, kind="whole", model="H100-80GB")
    Lease.objects.filter(pk=auto.pk).update(reason="waiting: no 1g.10gb slot free on H100-80GB", queue_position=1)
    body = text(login(client, "root").get("/ops/queue"))
    assert "Any model (auto)" in body and "H100-80GB" in body
    assert f"#{auto.pk}" in body and f"#{pinned.pk}" in body and "no 1g.10gb slot free" in body
    assert "acme / vision" in body


def test_tenant_quotas_edit_with_the_services_errors(world, client, staff):
    login(client, "root")
    page = client.get("/ops/tenants/acme")
    assert page.status_code == 200 and "H100-80GB" in text(page)
    response = client.post("/ops/tenants/acme/tenant-quota", {"form": "tq-H100-80GB", "tier": "H100-80GB",
                                                              "deserved_gpu_milli": "3000", "limit_gpu_milli": "2000"})
    assert response.status_code == 400
    assert "limit_gpu_milli must be >= deserved_gpu_milli." in text(response)
    assert 'value="2000"' in response.content.decode()  # as typed
    response = client.post("/ops/tenants/acme/tenant-quota", {"form": "tq-H100-80GB", "tier": "H100-80GB",
                                                              "deserved_gpu_milli": "500", "limit_gpu_milli": "9000"})
    assert response.status_code == 409 and "already hold 1000 milli-GPU deserved" in text(response)
    response = client.post("/ops/tenants/acme/tenant-quota", {"form": "tq-H100-80GB", "tier": "H100-80GB",
                                                              "deserved_gpu_milli": "6000", "limit_gpu_milli": "9000"})
    assert response.status_code == 302
    assert TenantQuota.objects.get(tenant=world.acme, tier="H100-80GB").deserved_gpu_milli == 6000
    response = client.post("/ops/tenants/acme/project-quota", {
        "form": "pq-vision-H100-80GB", "project": "vision", "tier": "H100-80GB", "deserved_gpu_milli": "7000",
        "limit_gpu_milli": "8000", "over_quota_weight": "2"})
    assert response.status_code == 409 and "exceeds the tenant quota for H100-80GB (6000)" in text(response)
    response = client.post("/ops/tenants/acme/project-quota", {
        "form": "pq-vision-new", "project": "vision", "tier": "A100-80GB", "deserved_gpu_milli": "1000",
        "limit_gpu_milli": "1000", "over_quota_weight": "1"})
    assert response.status_code == 409 and "Tenant has no quota for A100-80GB" in text(response)
    response = client.post("/ops/tenants/acme/project-quota", {
        "form": "pq-vision-H100-80GB", "project": "vision", "tier": "H100-80GB", "deserved_gpu_milli": "2000",
        "limit_gpu_milli": "4000", "over_quota_weight": "x"})
    assert "over_quota_weight must be a whole number from 0 to 1000." in text(response)
    response = client.post("/ops/tenants/acme/project-quota", {
        "form": "pq-vision-H100-80GB", "project": "secret", "tier": "H100-80GB", "deserved_gpu_milli": "1",
        "limit_gpu_milli": "1", "over_quota_weight": "1"})
    assert response.status_code == 404  # globex's project is not acme's
    assert Quota.objects.get(project=world.other_project).deserved_gpu_milli == 1000


def test_tenant_suspend_and_reactivate(world, client, staff):
    login(client, "root")
    client.post("/ops/tenants/acme/status", {"status": "suspended", "reason": "unpaid"})
    world.acme.refresh_from_db()
    assert world.acme.status == "suspended"
    assert AuditEvent.objects.filter(action="tenant.suspended", data__reason="unpaid").exists()
    client.logout()
    assert "This tenant is suspended" in text(login(client, "max").get("/"))
    client.logout()
    login(client, "root").post("/ops/tenants/acme/status", {"status": "active"})
    world.acme.refresh_from_db()
    assert world.acme.status == "active"


SLO = {"name": "Gold", "effective_from": "2030-01-01T00:00", "effective_to": "", "time_to_gpu_p95_seconds": "300",
       "availability_target_pct": "99.5", "preemption_notice_seconds": "120", "max_credit_pct": "50",
       "step-0-metric": "availability", "step-0-threshold": "99.5", "step-0-credit_pct": "10",
       "step-2-metric": "time_to_gpu_p95", "step-2-threshold": "600", "step-2-credit_pct": "5"}


def test_slo_contracts_create_edit_and_validate(world, client, staff):
    login(client, "root")
    assert client.post("/ops/tenants/acme/slo-contracts", SLO).status_code == 302
    contract = SloContract.objects.get(tenant=world.acme)
    assert contract.preemption_notice_seconds == 120 and contract.credit_steps.count() == 2
    page = client.get("/ops/tenants/acme").content.decode()  # the edit form shows the values as typed
    for name, value in [("max_credit_pct", "50"), ("availability_target_pct", "99.5"), ("step-1-threshold", "600"),
                        ("step-0-credit_pct", "10"), ("effective_from", "2030-01-01T00:00")]:
        assert f'id="contract-{contract.pk}-{name}" name="{name}" type="' in page
        assert re.search(rf'id="contract-{contract.pk}-{name}"[^>]*value="{re.escape(value)}"', page), name
    # the third form row was the service's second step: its error is under that row
    response = client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}", {**SLO, "step-2-credit_pct": "150"})
    assert response.status_code == 400
    assert re.search(r'id="contract-\d+-step-2-credit_pct-e">credit_pct must be in \(0, 100\]\.<',
                     response.content.decode())
    response = client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}", {**SLO, "availability_target_pct": "0"})
    assert "availability_target_pct must be in (0, 100]." in text(response)
    response = client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}", {**SLO, "effective_from": "soon"})
    assert "effective_from must be a date and time (YYYY-MM-DD HH:MM, UTC)." in text(response)
    response = client.post("/ops/tenants/acme/slo-contracts", {**SLO, "name": "Silver"})
    assert response.status_code == 409 and "The period overlaps another SLO contract" in text(response)
    edited = {**SLO, "preemption_notice_seconds": "600", "step-2-metric": "", "step-2-threshold": "",
              "step-2-credit_pct": ""}
    assert client.post(f"/ops/tenants/acme/slo-contracts/{contract.pk}", edited).status_code == 302
    contract.refresh_from_db()
    assert contract.preemption_notice_seconds == 600 and contract.credit_steps.count() == 1
    assert SloContract.objects.filter(tenant=world.acme).count() == 1


def test_a_bar_chart_of_zeros_says_all_zero_not_a_made_up_highest():
    from django.template.loader import render_to_string

    from portal.presenters import bar_chart

    zeros = render_to_string("portal/partials/_bar_chart.html",
                             {"chart": bar_chart([("2026-10", 0.0), ("2026-11", 0.0)], label="Revenue", unit="EUR")})
    assert "all zero" in zeros and "highest" not in zeros
    some = render_to_string("portal/partials/_bar_chart.html",
                            {"chart": bar_chart([("2026-10", 0.0), ("2026-11", 2.5)], label="Revenue", unit="EUR")})
    assert "highest 2.50 EUR" in some


# -- workloads (docs/leasing.md "Workloads"; the real-fleet page and log: test_workload_pages.py) -----------
WORKLOAD = {"workload.command": "python 'train model.py' --name \"run 1\"", "workload.args": "--epochs 3",
            "workload.env": "WANDB_MODE=offline\n\n# a comment\nOPTS=a=b c\n",
            "workload.workdir": "/srv/gpubroker/acme/vision",
            "workload.checkpoint_dir": "/srv/gpubroker/acme/vision/run-1",
            "workload.restart_policy": "on-failure", "workload.max_restarts": "2", "workload.port": "8888"}


def test_request_form_with_a_workload_stores_what_the_api_would(world, client):
    from broker.models import Workload

    response = login(client, "max").post("/leases/new", {**MIG, **WORKLOAD})
    lease = Lease.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/leases/{lease.pk}"
    spec = Workload.objects.get(lease=lease).spec
    assert spec == {"command": ["python", "train model.py", "--name", "run 1"], "image": "", "args": ["--epochs", "3"],
                    "env": {"WANDB_MODE": "offline", "OPTS": "a=b c"}, "secret_env": [], "scope": "acme/vision",
                    "workdir": "/srv/gpubroker/acme/vision", "checkpoint_dir": "/srv/gpubroker/acme/vision/run-1",
                    "restart_policy": "on-failure", "max_restarts": 2,
                    "port": None}  # a training lease: the port is the interactive class's only
    page = text(client.get(f"/leases/{lease.pk}"))
    assert "Workload state Pending" in page and "python 'train model.py' --name 'run 1' --epochs 3" in page
    assert "at most 2" in page
    # the API takes the same body the form made
    api = world.client("member").post("/api/v1/leases", _api_body({**MIG, **WORKLOAD}), format="json")
    assert api.status_code == 201
    detail = world.client("member").get(f"/api/v1/leases/{api.json()['id']}").json()
    assert detail["workload"]["spec"] == spec


def test_request_form_interactive_workload_keeps_its_port_and_a_bare_lease_has_none(world, client):
    from broker.models import Workload

    login(client, "max")
    client.post("/leases/new", {**MIG, **WORKLOAD, "workload_class": "interactive", "workload.restart_policy": "never"})
    workload = Workload.objects.get()
    spec = workload.spec
    assert (spec["port"], spec["restart_policy"], spec["max_restarts"]) == (8888, "never", 3)
    page = client.get(f"/leases/{workload.lease_id}")
    assert "port 8888, on a host port of its node once it runs" in text(page)
    # running on a node: the page and the API's lease detail give the same host:port (Workload.endpoint), the
    # node's host port its placement was given, not the port the workload asked for
    from broker.models import WorkloadPlacement

    node = fleet_node()
    Workload.objects.filter(pk=workload.pk).update(node=node, state="running", placements=1)
    WorkloadPlacement.objects.create(workload=workload, number=1, node=node, node_name=node.node_id,
                                     agent_workload_id="lease-x-a1", host_port=20007)
    assert "Endpoint 127.0.0.1:20007 (its port 8888" in text(client.get(f"/leases/{workload.lease_id}"))
    detail = world.client("member").get(f"/api/v1/leases/{workload.lease_id}").json()
    assert detail["workload"]["endpoint"] == "127.0.0.1:20007"
    blank = {name: "" for name in WORKLOAD} | {"workload.restart_policy": "never", "workload.max_restarts": "3"}
    response = client.post("/leases/new", {**MIG, **blank})
    assert response.status_code == 302 and Lease.objects.count() == 2 and Workload.objects.count() == 1
    assert 'id="workload-status"' not in client.get(response["Location"]).content.decode()


def test_request_form_takes_an_image_as_the_api_does(world, client):
    from broker.models import Workload

    login(client, "max")
    image = {"workload.image": "nvcr.io/nvidia/pytorch:24.05-py3", "workload.command": "",
             "workload.args": "python train.py"}
    response = client.post("/leases/new", {**MIG, **WORKLOAD, **image})
    assert response.status_code == 302
    spec = Workload.objects.get().spec
    assert spec["image"] == "nvcr.io/nvidia/pytorch:24.05-py3" and spec["command"] == []
    assert spec["args"] == ["python", "train.py"]
    api = world.client("member").post("/api/v1/leases", _api_body({**MIG, **WORKLOAD, **image}), format="json")
    assert api.status_code == 201, api.json()
    assert Workload.objects.get(lease_id=api.json()["id"]).spec == spec
    # a bad reference: the form shows the message the API gives, under the field it names
    bad = {**image, "workload.image": "nvcr.io/nvidia/py torch"}
    response = client.post("/leases/new", {**MIG, **WORKLOAD, **bad})
    assert response.status_code == 400
    api = world.client("member").post("/api/v1/leases", _api_body({**MIG, **WORKLOAD, **bad}), format="json")
    assert api.status_code == 400 and api.json()["field"] == "workload.image"
    assert field_error(response, "workload_image") == api.json()["detail"]
    assert Workload.objects.count() == 2


@pytest.mark.parametrize(("changes", "key", "message"), [
    ({"workload.command": ""}, "workload_command", "command must name the program to run"),
    ({"workload.command": "python 'train.py"}, "workload_command",
     "workload.command cannot be split into words: No closing quotation."),
    ({"workload.workdir": "/etc"}, "workload_workdir",
     "workdir '/etc' is outside the allowed roots: /srv/gpubroker/acme/vision"),
    ({"workload.workdir": "/srv/gpubroker/globex/secret"}, "workload_workdir",
     "workdir '/srv/gpubroker/globex/secret' is outside the allowed roots: /srv/gpubroker/acme/vision"),
    ({"workload.env": "HF_TOKEN=hf_x"}, "workload_env", "env HF_TOKEN looks like a credential: put it in secret_env"),
    ({"workload.checkpoint_dir": "/srv/gpubroker/../etc"}, "workload_checkpoint_dir",
     "checkpoint_dir must be a normalised path"),
    ({"workload.env": "CUDA_VISIBLE_DEVICES=0"}, "workload_env",
     "env CUDA_VISIBLE_DEVICES is set by the platform"),
    ({"workload.env": "A=1\njust words"}, "workload_env", "workload.env line 2 is not NAME=value."),
    ({"workload.env": "X=" + "x" * 40_000}, "workload_env", "env is 40003 bytes; at most 32768"),
    ({"workload.max_restarts": "many"}, "workload_max_restarts", "max_restarts must be an integer 0.."),
    ({"workload_class": "interactive", "workload.port": "80"}, "workload_port", "port must be an integer 1024..65535"),
    ({"gpu.count": "2", "gpu.gang": "false"}, "workload", "A workload runs on one node"),
])
def test_request_form_workload_errors_are_named_under_their_field(world, client, changes, key, message):
    from broker.models import Workload

    response = login(client, "max").post("/leases/new", {**MIG, **WORKLOAD, **changes})
    assert response.status_code == 400
    assert message in field_error(response, key)
    assert not Lease.objects.exists() and not Workload.objects.exists()
    assert re.search(r'<details class="workload" id="workload" open>', response.content.decode())  # shown open
    # the live preview says the same (lease_quote checks the workload as the request does)
    preview = client.get("/leases/preview", {k: v[-1] if isinstance(v, list) else v
                                             for k, v in {**MIG, **WORKLOAD, **changes}.items()})
    assert preview.status_code == 200 and "Cannot be requested as it is:" in text(preview)
    assert message in unescape(preview.content.decode())


def test_lease_log_partial_is_the_tenants_own_and_says_when_there_is_nothing_yet(world, client):
    from broker.models import Workload

    theirs = broker.lease_request(actor=Actor(user=world.outsider, tenant=world.globex, role=Role.OWNER),
                                   project="secret", gpu={"kind": "mig", "profile": "1g.10gb"},
                                   workload={"command": ["python", "secret.py"]})[0]
    ours = broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                 project="vision", gpu={"kind": "mig", "profile": "1g.10gb"},
                                 workload={"command": ["python", "train.py"]})[0]
    bare = lease_for(world)
    login(client, "vic")  # a viewer reads the log of the tenant's leases
    assert client.get(f"/leases/{theirs.pk}/log").status_code == 404
    assert "secret.py" not in text(client.get(f"/leases/{theirs.pk}"))
    assert "This lease has no workload." in text(client.get(f"/leases/{bare.pk}/log"))
    assert client.get(f"/leases/{bare.pk}/log").status_code == 404
    log = client.get(f"/leases/{ours.pk}/log", headers={"HX-Request": "true"})
    assert log.status_code == 200 and b"<html" not in log.content
    assert "No output yet: the workload starts once the lease is active." in text(log)
    assert 'hx-trigger="every 3s"' in log.content.decode()  # polls while the lease lives
    page = client.get(f"/leases/{ours.pk}").content.decode()
    assert f'hx-get="/leases/{ours.pk}/log"' in page and 'hx-trigger="load"' in page
    # placed on a node that does not answer: said in the panel, not an error page
    node = fleet_node()
    Workload.objects.filter(lease=ours).update(node=node, agent_workload_id=f"lease-{ours.pk}-a1", state="running")
    log = client.get(f"/leases/{ours.pk}/log?stream=stderr")
    assert log.status_code == 200 and "does not answer right now" in text(log)
    assert 'data-stream="stderr"' in log.content.decode()
    broker.lease_release(lease=ours, actor="test")
    assert "hx-trigger" not in client.get(f"/leases/{ours.pk}/log").content.decode()  # finished: no polling


def test_lease_log_partial_shows_an_earlier_placements_kept_log(world, client):
    from django.utils import timezone

    from broker.models import Workload, WorkloadPlacement

    ours = broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                 project="vision", gpu={"kind": "mig", "profile": "1g.10gb"},
                                 workload={"command": ["python", "train.py"]})[0]
    first, second = fleet_node("gpu-node-01"), fleet_node("gpu-node-02")
    workload = Workload.objects.get(lease=ours)
    Workload.objects.filter(pk=workload.pk).update(node=second, agent_workload_id=f"lease-{ours.pk}-a9",
                                                   state="running", placements=2)
    WorkloadPlacement.objects.create(workload=workload, number=1, node=first, node_name="gpu-node-01",
                                     agent_workload_id=f"lease-{ours.pk}-a1", state="preempted",
                                     ended_at=timezone.now(), log_stdout="step 1\nSIGTERM <b>bye</b>\n",
                                     log_offsets={"stdout": {"first_offset": 100, "size": 126}},
                                     log_kept_at=timezone.now())
    WorkloadPlacement.objects.create(workload=workload, number=2, node=second, node_name="gpu-node-02",
                                     agent_workload_id=f"lease-{ours.pk}-a9")
    login(client, "vic")
    log = client.get(f"/leases/{ours.pk}/log?placement=1")
    body = log.content.decode()
    assert log.status_code == 200 and "SIGTERM <b>bye</b>" in text(log) and "<b>bye" not in body
    assert "kept when placement 1 ended" in text(log) and "hx-trigger" not in body  # a kept log does not change
    assert "Placement 1 (gpu-node-01, preempted)" in text(log) and "Current (gpu-node-02)" in text(log)
    current = client.get(f"/leases/{ours.pk}/log")  # the current one, from its node (which does not answer)
    assert "does not answer right now" in text(current) and 'hx-trigger="every 3s"' in current.content.decode()
    page = text(client.get(f"/leases/{ours.pk}"))
    assert "Placements # Node Ended as" in page and "gpu-node-01 preempted" in page
    # the same through the API; another tenant gets 404 and not a byte
    api = world.client("viewer").get(f"/api/v1/leases/{ours.pk}/logs?placement=1&tail=9")
    assert world.client("outsider").get(f"/api/v1/leases/{ours.pk}/logs?placement=1").status_code == 404
    assert api.status_code == 200 and api.json()["kept"] is True
    assert api.json()["data"] == "step 1\nSIGTERM <b>bye</b>\n"[-9:] and api.json()["offset"] == 100 + 26 - 9
    client.logout()
    login(client, "bob")
    outsider = client.get(f"/leases/{ours.pk}/log?placement=1")
    assert outsider.status_code == 404 and "bye" not in outsider.content.decode()


def test_request_form_secret_environment_is_write_only(world, client):
    """Issue 27: the form's Secrets box goes to ``secret_env``; the lease page shows the names, never a value,
    and a refused form comes back with the box empty (the value is not echoed)."""
    from broker.models import Workload

    login(client, "max")
    refused = client.post("/leases/new", {**MIG, **WORKLOAD, "workload.secret_env": "HF_TOKEN=hf_planted_value",
                                          "workload.workdir": "/etc"})
    assert refused.status_code == 400 and "hf_planted_value" not in refused.content.decode()
    assert "outside the allowed roots" in text(refused)
    client.post("/leases/new", {**MIG, **WORKLOAD, "workload.secret_env": "HF_TOKEN=hf_planted_value"})
    workload = Workload.objects.get()
    assert workload.spec["secret_env"] == ["HF_TOKEN"] and "hf_planted_value" not in str(workload.spec)
    page = client.get(f"/leases/{workload.lease_id}").content.decode()
    assert "HF_TOKEN" in page and "hf_planted_value" not in page
    bad = client.post("/leases/new", {**MIG, **WORKLOAD, "workload.secret_env": "GPUB_X=1"})
    assert "secret_env GPUB_X is set by the platform" in text(bad)
