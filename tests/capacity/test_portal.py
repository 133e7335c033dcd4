"""The capacity loop's pages: the tenant's advice page (open first, accept/reject in place where allowed) and
dashboard panel; the staff page (pools, warm instances, holding cost, recent actions, the review queue, the
policies, a planner run). Through Django's test client, with CSRF enforced where a button posts."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.test import Client
from django.utils import timezone

from billing import services as billing
from broker.models import Allocation, Gpu, Node
from capacity.models import Adjustment, CapacityPolicy
from tests.capacity.test_api import a_lease, adjustment
from tests.factories import make_user, make_world


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def staff(db):
    return make_user("root", is_staff=True)


def login(username: str, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=username, password=f"pw-{username}")
    return client


def text(response) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def csrf_token(page) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)


def row_html(response, pk: int, prefix: str = "adj") -> str:
    match = re.search(rf'<tr id="{prefix}-{pk}".*?</tr>', response.content.decode(), re.S)
    assert match, f"no row {prefix}-{pk}"
    return match.group(0)


@pytest.fixture
def advice(world):
    """acme: right-sizing advice on a lease (open), a pool change that touched its lease (open), an old rejected
    one; globex: its own advice."""
    lease = a_lease(world)
    return {
        "right_size": adjustment(tenant=world.acme, lease=lease, gain_money_minor=4200),
        "touching": adjustment("mode_switch", tenant_ids=[world.acme.pk], risk=[lease.pk], gain_money_minor=0,
                               reason="switch g1 to MIG for the queue"),
        "old": adjustment(tenant=world.acme, lease=lease, state="rejected", reason="old advice",
                          proposed_at=timezone.now() + timedelta(minutes=1)),  # newest, but decided
        "globex": adjustment(tenant=world.globex, lease=a_lease(world, "globex"), reason="globex advice"),
    }


# -- tenants ---------------------------------------------------------------------------------------------------
def test_advice_page_names_only_the_tenants_own_leases_in_a_drain_that_touches_another_tenant(world):
    mine, theirs = a_lease(world), a_lease(world, "globex")
    row = adjustment("mode_switch", tenant_ids=[world.acme.pk, world.globex.pk], risk=[mine.pk, theirs.pk],
                     gain_money_minor=0, state="applying",
                     reason=f"drain over-quota lease(s) {mine.pk}, {theirs.pk}, then switch",
                     outcome=f"draining lease(s) {mine.pk}, {theirs.pk}; the switch follows once they have left")
    cell = unescape(re.search(r'<td class="reason">(.*?)</td>', row_html(login("ann").get("/advice"), row.pk),
                              re.S).group(1))
    assert f"drain over-quota lease(s) {mine.pk} and 1 of another tenant, then switch" in cell
    assert f"draining lease(s) {mine.pk} and 1 of another tenant; the switch follows" in cell
    assert re.findall(r"\d+", cell) == [str(mine.pk), "1", str(mine.pk), "1"]  # no other lease id anywhere


def test_advice_page_lists_the_tenants_items_open_first_with_buttons_where_allowed(world, advice):
    page = login("ann").get("/advice")  # acme's admin
    assert page.status_code == 200
    html = page.content.decode()
    order = [int(pk) for pk in re.findall(r'<tr id="adj-(\d+)"', html)]
    assert order[-1] == advice["old"].pk and set(order) == {advice[n].pk for n in ("right_size", "touching", "old")}
    assert "globex advice" not in html
    assert "1 open advice item · following it would save 42.00 USD" in text(page)  # the pool change is no advice
    assert f'id="accept-{advice["right_size"].pk}"' in row_html(page, advice["right_size"].pk)
    assert "42.00 USD" in row_html(page, advice["right_size"].pk) and "1.50 GPU-h" in text(page)
    assert "accept-" not in row_html(page, advice["touching"].pk)  # a pool change: the platform decides
    assert "accept-" not in row_html(page, advice["old"].pk)  # decided already
    member = login("max").get("/advice")  # a member may not decide right-sizing
    assert member.status_code == 200 and 'id="accept-' not in member.content.decode()
    assert 'href="/advice"' in member.content.decode()  # in the navigation


def test_advice_accept_with_htmx_swaps_the_row_and_checks_csrf(world, advice):
    pk = advice["right_size"].pk
    client = login("ann", csrf=True)
    page = client.get("/advice")
    assert client.post(f"/advice/{pk}/accept").status_code == 403  # no CSRF token
    response = client.post(f"/advice/{pk}/accept", headers={"HX-Request": "true", "X-CSRFToken": csrf_token(page)})
    assert response.status_code == 200 and b"<html" not in response.content
    assert 'data-state="applied"' in response.content.decode() and "accept-" not in response.content.decode()
    assert Adjustment.objects.get(pk=pk).state == "applied"
    again = client.post(f"/advice/{pk}/accept", headers={"HX-Request": "true", "X-CSRFToken": csrf_token(page)})
    assert again.status_code == 200 and "only a proposed one can be accepted" in text(again)


def test_advice_reject_without_javascript_redirects_with_the_outcome(world, advice):
    pk = advice["right_size"].pk
    client = login("ann")
    response = client.post(f"/advice/{pk}/reject", {"reason": "needed for the demo"})
    assert response.status_code == 302 and response["Location"] == f"/advice#adj-{pk}"
    assert Adjustment.objects.get(pk=pk).outcome == "rejected by ann: needed for the demo"
    assert f"Adjustment {pk} rejected." in text(client.get(response["Location"]))


def test_advice_refusals_member_viewer_and_other_tenant(world, advice):
    pk = advice["right_size"].pk
    member = login("max")
    assert member.post(f"/advice/{pk}/accept").status_code == 302  # a member: the service wants an admin
    assert "Your role 'member' in tenant 'acme' does not allow this" in text(member.get("/advice"))
    assert Adjustment.objects.get(pk=pk).state == "proposed"
    assert login("vic").post(f"/advice/{pk}/accept").status_code == 403  # a viewer changes nothing
    assert login("bob").post(f"/advice/{pk}/accept").status_code == 404  # globex's owner
    assert login("ann").post(f"/advice/{advice['globex'].pk}/accept").status_code == 404
    assert login("ann").post(f"/advice/{advice['touching'].pk}/accept", headers={"HX-Request": "true"}).content \
        .decode().count("Only platform staff decide this adjustment.") == 1


def test_dashboard_advice_panel_counts_open_items_and_their_saving(world, advice):
    adjustment(tenant=world.acme, lease=advice["right_size"].lease, gain_money_minor=800)
    panel = re.search(r"<section[^>]*data-advice-panel.*?</section>", login("vic").get("/").content.decode(), re.S)
    assert panel, "no advice panel"
    body = " ".join(unescape(re.sub(r"<[^>]+>", " ", panel.group(0))).split())
    assert "2 open advice items" in body and "would save 50.00 USD" in body  # 42.00 + 8.00; the pool change: none
    assert 'href="/advice"' in panel.group(0)
    globex = text(login("bob").get("/"))
    assert "1 open advice item from the capacity loop: following it would save 12.50 USD" in globex
    Adjustment.objects.filter(tenant=world.acme).update(state="expired")
    assert "data-advice-panel" not in login("vic").get("/").content.decode()  # hidden when there is none


# -- staff -------------------------------------------------------------------------------------------------------
@pytest.fixture
def warm(world):
    node = Node.objects.create(node_id="node-w", address="http://127.0.0.1:1", secret="s", status="ready")
    gpu = Gpu.objects.create(node=node, uuid="GPU-w", index=0, model="H100-80GB", mode="mig", memory_mib=81559)
    Gpu.objects.create(node=node, uuid="GPU-x", index=1, model="H100-80GB", mode="whole", memory_mib=81559)
    return Allocation.objects.create(lease=None, gpu=gpu, tier="H100-80GB", kind="mig", mig_profile="1g.10gb",
                                     mig_start=0, slots=NumericRange(0, 1), milli=142, memory_mib=9856,
                                     state="warm", warm_at=timezone.now() - timedelta(hours=7))


def test_ops_capacity_shows_pools_warm_instances_holding_cost_and_the_review_queue(world, staff, warm, advice):
    billing.price_book_create(name="list", currency="USD", effective_from=timezone.now() - timedelta(days=400),
                              rates=[{"tier": "H100-80GB", "per_hour": "7.00"}])
    proposal = adjustment("warm_pool", change={"model": "H100-80GB", "profile": "1g.10gb", "slots": [], "remove": []},
                          reason="keep one 1g.10gb warm")
    page = login("root").get("/ops/capacity")
    assert page.status_code == 200
    html, body = page.content.decode(), text(page)
    pool = re.search(r'<tr data-pool="H100-80GB">.*?</tr>', html, re.S).group(0)
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", pool)).split() == \
        ["H100-80GB", "2", "1", "1", "0", "0", "1g.10gb:", "1", "/", "0"]
    assert f'data-warm-instance="{warm.pk}"' in html and "node-w / 0" in body
    # held 7 h this month (or since the 1st): 142 milli = 0.142 GPU per hour; 1g.10gb costs 7.00 x 1/7 an hour
    held = re.search(r"([\d.]+) GPU-hours · ([\d.,]+) USD at the general price book", body)
    assert held, body
    hours = min(7, (timezone.now() - timezone.now().replace(day=1, hour=0, minute=0, second=0)).total_seconds() / 3600)
    assert abs(float(held.group(1)) - 0.142 * hours) < 0.02 and abs(float(held.group(2)) - hours) < 0.02
    review = row_html(page, proposal.pk, "review")
    assert f'id="accept-{proposal.pk}"' in review and "keep one 1g.10gb warm" in review
    assert f'data-recent="{proposal.pk}"' in html and 'id="plan-run"' in html and 'id="policy-new"' in html
    partial = login("root").get("/ops/capacity", headers={"HX-Request": "true", "HX-Target": "capacity-live"})
    assert b"<html" not in partial.content and b'data-pool="H100-80GB"' in partial.content
    assert login("alice").get("/ops/capacity").status_code == 403


def test_ops_review_queue_accepts_and_rejects_in_place(world, staff, advice):
    proposal = adjustment("warm_pool", change={"model": "H100-80GB", "profile": "1g.10gb", "slots": [], "remove": []})
    client = login("root", csrf=True)
    token = csrf_token(client.get("/ops/capacity"))
    response = client.post(f"/ops/capacity/adjustments/{proposal.pk}/accept",
                           headers={"HX-Request": "true", "X-CSRFToken": token})
    assert response.status_code == 200 and 'data-state="applied"' in response.content.decode()
    assert Adjustment.objects.get(pk=proposal.pk).applied_by == "user:root"
    response = client.post(f"/ops/capacity/adjustments/{advice['touching'].pk}/reject",
                           {"reason": "not now", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and response["Location"] == "/ops/capacity#review"
    assert Adjustment.objects.get(pk=advice["touching"].pk).outcome == "rejected by root: not now"
    again = client.post(f"/ops/capacity/adjustments/{proposal.pk}/accept",
                        headers={"HX-Request": "true", "X-CSRFToken": token})
    assert "only a proposed one can be applied" in text(again)


def test_ops_policies_add_edit_delete_with_the_services_errors(world, staff):
    client = login("root")
    response = client.post("/ops/capacity/policies", {"scope": "pool:NOPE", "warm_pool": "auto"})
    assert response.status_code == 400
    error = re.search(r'id="policy-new-scope-e">([^<]+)<', response.content.decode())
    assert error and unescape(error.group(1)).startswith("scope: "), response.content.decode()[-3000:]
    assert 'value="pool:NOPE"' in response.content.decode()  # as typed
    assert not CapacityPolicy.objects.exists()
    response = client.post("/ops/capacity/policies", {"scope": "pool:H100-80GB", "warm_pool": "auto",
                                                      "warm_min_arrivals": "4", "idle_rules": ""})
    assert response.status_code == 302
    policy = CapacityPolicy.objects.get(scope="pool:H100-80GB")
    assert (policy.warm_pool, policy.mode_switch, policy.warm_min_arrivals) == ("auto", "", 4)
    url = f"/ops/capacity/policies/{policy.pk}"
    response = client.post(url, {"warm_pool": "auto", "warm_min_arrivals": "many"})
    assert response.status_code == 400
    error = re.search(rf'id="policy-{policy.pk}-warm_min_arrivals-e">([^<]+)<', response.content.decode())
    assert error and "warm_min_arrivals must be an integer" in error.group(1)
    response = client.post(url, {"warm_pool": "", "idle_rules": '{"training": {"enabled": "yes"}}'})
    assert response.status_code == 400
    assert re.search(rf'id="policy-{policy.pk}-idle_rules-e">[^<]*enabled must be true or false',
                     response.content.decode())
    response = client.post(url, {"warm_pool": "", "idle_rules": "{not json"})
    assert response.status_code == 400 and "idle_rules is not JSON" in text(response)
    response = client.post(url, {"warm_pool": "off", "mode_switch": "advise",
                                 "idle_rules": '{"training": {"notice_seconds": 60}}'})
    assert response.status_code == 302
    policy.refresh_from_db()
    assert (policy.warm_pool, policy.mode_switch, policy.idle_rules) == ("off", "advise",
                                                                         {"training": {"notice_seconds": 60}})
    assert client.post(f"{url}/delete").status_code == 302 and not CapacityPolicy.objects.exists()
    default = CapacityPolicy.objects.create(scope="")
    response = client.post(f"/ops/capacity/policies/{default.pk}/delete")
    assert response.status_code == 400 and "The default policy cannot be deleted" in text(response)


def test_ops_run_the_planner_now(world, staff, settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"
    client = login("root")
    response = client.post("/ops/capacity/run")
    assert response.status_code == 302 and response["Location"] == "/ops/capacity"
    assert "Planner run: 0 proposed, 0 new, 0 expired, 0 applied, 0 failed." in text(client.get("/ops/capacity"))
