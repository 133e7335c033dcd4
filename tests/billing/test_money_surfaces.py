"""Who sets the money: platform staff set price books and billing terms (API, ops pages, admin), a tenant's
admins set its spend caps (API, the Budgets page). Every change goes through ``billing.services`` and writes
an ``AuditEvent``; members, viewers, read-only tokens and other tenants are refused; bad input is a 400
naming the field, never a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import AllocationUsage, BillingTerms, PriceBook, SpendCap
from broker import services as broker
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent
from tests.factories import make_member, make_token, make_user, make_world

RATES = [{"tier": "H100-80GB", "per_hour": "4.00"}]


@pytest.fixture
def world(db):
    return make_world()


@pytest.fixture
def staff(world):
    """Platform staff with no tenant (acts by session), and one who is also in acme (acts by its tokens)."""
    root = make_user("root", is_staff=True)
    ops = make_member(world.acme, "ops", Role.ADMIN)
    get_user_model().objects.filter(pk=ops.pk).update(is_staff=True)
    client = APIClient()
    assert client.login(username="root", password="pw-root")
    return {"user": root, "client": client, "ops_read": make_token(world.acme, ops, scopes=("read",))[1]}


def token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def portal(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def future(days: int = 30) -> datetime:
    return (timezone.now() + timedelta(days=days)).replace(microsecond=0)


def month_start(now: datetime | None = None) -> datetime:
    return (now or timezone.now()).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def audits(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("pk"))


def metered_hour(world, hour_start: datetime) -> AllocationUsage:
    """One hour of a whole H100 metered for acme's project (a queued lease stands in for the one that ran)."""
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease = broker.lease_request(actor=actor, project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})[0]
    return AllocationUsage.objects.create(
        tenant=world.acme, project=world.project, lease=lease, hour_start=hour_start, seconds=Decimal(3600),
        tier="H100-80GB", kind="whole", gpu_milli=1000, memory_mib=81559, workload_class="training",
        over_quota=False, metered_at=timezone.now())


def problem(response) -> dict:
    assert response["Content-Type"] == "application/problem+json", response.content[:300]
    return response.json()


# -- price books: the staff API ------------------------------------------------------------------------------------
def test_price_books_api_staff_creates_changes_and_deletes_an_upcoming_book_audited(world, staff):
    api = staff["client"]
    start = future()
    created = api.post("/api/v1/price-books", {
        "name": "List 2027", "currency": "USD", "effective_from": start.isoformat(),
        "rates": [{"tier": "H100-80GB", "per_hour": "4.20"},
                  {"tier": "H100-80GB", "kind": "mig", "mig_profile": "3g.40gb", "per_hour": "2.00"}]}, format="json")
    assert created.status_code == 201, created.content
    book = created.json()
    assert (book["tenant"], book["state"], len(book["rates"])) == (None, "upcoming", 2)
    assert book["over_quota_multiplier"] == "0.6000"  # the defaults
    listed = api.get("/api/v1/price-books").json()
    assert [item["id"] for item in listed["results"]] == [book["id"]]

    changed = api.patch(f"/api/v1/price-books/{book['id']}", {
        "name": "List 2027 (revised)", "interactive_multiplier": "1.5",
        "rates": [{"tier": "A100-80GB", "per_hour": "2.90"}]}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["name"] == "List 2027 (revised)"
    assert [(r["tier"], r["per_hour"]) for r in changed.json()["rates"]] == [("A100-80GB", "2.900000")]
    stored = PriceBook.objects.get(pk=book["id"])
    assert stored.interactive_multiplier == Decimal("1.5") and stored.effective_from == start

    assert api.delete(f"/api/v1/price-books/{book['id']}").status_code == 204
    assert api.get(f"/api/v1/price-books/{book['id']}").status_code == 404
    assert not PriceBook.objects.exists()
    trail = [(e.action, e.actor_id, e.tenant_id, e.target) for e in AuditEvent.objects.filter(
        action__startswith="price_book.").order_by("pk")]
    target = f"price_book:{book['id']}"
    assert trail == [("price_book.create", staff["user"].pk, None, target),
                     ("price_book.update", staff["user"].pk, None, target),
                     ("price_book.delete", staff["user"].pk, None, target)]
    assert audits("price_book.update")[0].data["fields"] == ["interactive_multiplier", "name", "rates"]


def test_price_books_api_a_started_book_is_history(world, staff):
    book = billing.price_book_create(name="List 2026", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                                     rates=RATES)
    api = staff["client"]
    assert api.get(f"/api/v1/price-books/{book.pk}").json()["state"] == "in_force"
    refused = api.patch(f"/api/v1/price-books/{book.pk}", {"rates": [{"tier": "H100-80GB", "per_hour": "9"}]},
                        format="json")
    assert refused.status_code == 409 and problem(refused)["field"] == "effective_from"
    assert "create a new book from a later date" in problem(refused)["detail"].lower()
    assert api.delete(f"/api/v1/price-books/{book.pk}").status_code == 409
    assert [r.per_hour for r in book.rates.all()] == [Decimal("4.000000")]
    # a later book of the scope supersedes it once started; an upcoming one may not move into the past
    later = billing.price_book_create(name="List 2027", currency="USD", effective_from=future(), rates=RATES)
    moved = api.patch(f"/api/v1/price-books/{later.pk}", {"effective_from": "2026-02-01T00:00:00Z"}, format="json")
    assert moved.status_code == 400 and problem(moved)["field"] == "effective_from"
    assert not audits("price_book.update")


def test_price_books_api_refuses_everyone_but_staff(world, staff):
    body = {"name": "x", "currency": "USD", "effective_from": future().isoformat(), "rates": RATES}
    for who in ("owner", "admin", "member"):
        assert token_client(world.tokens[who]).get("/api/v1/price-books").status_code == 403
        assert token_client(world.tokens[who]).post("/api/v1/price-books", body, format="json").status_code == 403
    # a staff member's read-only token reads, never writes
    read_only = token_client(staff["ops_read"])
    assert read_only.get("/api/v1/price-books").status_code == 200
    refused = read_only.post("/api/v1/price-books", body, format="json")
    assert refused.status_code == 403 and problem(refused)["detail"] == "This API token has read scope only."
    assert APIClient().get("/api/v1/price-books").status_code == 401
    assert not PriceBook.objects.exists()


@pytest.mark.parametrize(("change", "field"), [
    ({"rates": [{"tier": "H100-80GB", "per_hour": "4"}, {"tier": "H100-80GB", "per_hour": "-1"}]}, "rates[1].per_hour"),
    ({"rates": [{"tier": "H100-80GB", "kind": "mig", "mig_profile": "9g.1gb", "per_hour": "1"}]},
     "rates[0].mig_profile"),
    ({"rates": [{"tier": "H100-80GB", "mig_profile": "3g.40gb", "per_hour": "1"}]}, "rates[0].mig_profile"),
    ({"rates": [{"tier": "Z80", "per_hour": "1"}]}, "rates[0].tier"),
    ({"rates": [{"tier": "H100-80GB", "per_hour": "1"}, {"tier": "H100-80GB", "per_hour": "2"}]}, "rates[1]"),
    ({"rates": [{"tier": "H100-80GB", "per_hour": "1.1234567"}]}, "rates[0].per_hour"),
    ({"rates": [{"tier": "H100-80GB", "per_hour": "1e30"}]}, "rates[0].per_hour"),
    ({"rates": []}, "rates"),
    ({"currency": "XXX"}, "currency"),
    ({"tenant": "nobody"}, "tenant"),
    ({"tenant": "acme", "currency": "EUR"}, "currency"),
    ({"over_quota_multiplier": "0"}, "over_quota_multiplier"),
    ({"effective_from": "soon"}, "effective_from"),
    ({"colour": "red"}, "colour"),
])
def test_price_books_api_bad_input_names_the_field(world, staff, change, field):
    body = {"name": "x", "currency": "USD", "effective_from": future().isoformat(), "rates": RATES, **change}
    response = staff["client"].post("/api/v1/price-books", body, format="json")
    assert response.status_code == 400, response.content
    assert problem(response)["field"] == field
    assert not PriceBook.objects.exists() and not audits("price_book.create")


def test_price_books_never_reprice_metered_usage(world, staff):
    billing.price_book_create(name="List", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                              rates=RATES)
    hour = month_start() - timedelta(hours=3)
    metered_hour(world, hour)
    body = {"name": "Retro", "currency": "USD", "effective_from": (hour - timedelta(days=1)).isoformat(),
            "rates": [{"tier": "H100-80GB", "per_hour": "1.00"}]}
    refused = staff["client"].post("/api/v1/price-books", body, format="json")
    assert refused.status_code == 400 and problem(refused)["field"] == "effective_from"
    assert f"{hour + timedelta(hours=1):%Y-%m-%d %H:%M}" in problem(refused)["detail"]
    # the same for acme's own book; another currency's general list prices none of acme's usage
    assert staff["client"].post("/api/v1/price-books", {**body, "tenant": "acme"}, format="json").status_code == 400
    assert staff["client"].post("/api/v1/price-books", {**body, "currency": "EUR"}, format="json").status_code == 201
    # from the end of the metered hour on is fine
    after = {**body, "effective_from": (hour + timedelta(hours=1)).isoformat()}
    assert staff["client"].post("/api/v1/price-books", after, format="json").status_code == 201


# -- billing terms: the staff API ------------------------------------------------------------------------------------
def test_billing_terms_api_sets_terms_from_a_month_and_audits(world, staff):
    api, now = staff["client"], timezone.now()
    assert api.get("/api/v1/tenants/acme/billing-terms").json() == {"tenant": "acme", "currency": "USD",
                                                                     "in_force": None, "terms": []}
    saved = api.put("/api/v1/tenants/acme/billing-terms", {"discount_pct": "12.5", "monthly_commit_minor": 50000},
                    format="json")
    assert saved.status_code == 200, saved.content
    this_month = f"{now:%Y-%m}"
    assert saved.json()["in_force"] == {"period": this_month, "effective_from": month_start(now).isoformat().replace(
        "+00:00", "Z"), "discount_pct": "12.50", "monthly_commit_minor": 50000}
    next_month = (month_start(now) + timedelta(days=32)).replace(day=1)
    later = api.put("/api/v1/tenants/acme/billing-terms", {"period": f"{next_month:%Y-%m}", "discount_pct": "20",
                                                           "monthly_commit_minor": 0}, format="json")
    assert [t["period"] for t in later.json()["terms"]] == [f"{next_month:%Y-%m}", this_month]
    assert later.json()["in_force"]["discount_pct"] == "12.50"  # next month's terms are not this invoice's
    # saving this month again replaces its terms
    api.put("/api/v1/tenants/acme/billing-terms", {"discount_pct": "10", "monthly_commit_minor": 1}, format="json")
    terms = BillingTerms.objects.get(tenant=world.acme, effective_from=month_start(now))
    assert (terms.discount_pct, terms.monthly_commit_minor) == (Decimal("10.00"), 1)
    trail = audits("billing_terms.set")
    assert [(e.tenant_id, e.actor_id, e.target) for e in trail] == [
        (world.acme.pk, staff["user"].pk, f"billing_terms:acme/{this_month}"),
        (world.acme.pk, staff["user"].pk, f"billing_terms:acme/{next_month:%Y-%m}"),
        (world.acme.pk, staff["user"].pk, f"billing_terms:acme/{this_month}")]
    assert trail[0].data["discount_pct"] == "12.50" and trail[2].data["created"] is False


@pytest.mark.parametrize(("body", "field"), [
    ({"discount_pct": "100.5", "monthly_commit_minor": 0}, "discount_pct"),
    ({"discount_pct": "-1", "monthly_commit_minor": 0}, "discount_pct"),
    ({"discount_pct": "5", "monthly_commit_minor": -1}, "monthly_commit_minor"),
    ({"discount_pct": "5", "monthly_commit_minor": "100"}, "monthly_commit_minor"),
    ({"discount_pct": "5", "monthly_commit_minor": 0, "period": "2026-13"}, "period"),
    ({"discount_pct": "5", "monthly_commit_minor": 0, "period": "2020-01"}, "period"),
    ({"monthly_commit_minor": 0}, "discount_pct"),
])
def test_billing_terms_api_bad_input_names_the_field(world, staff, body, field):
    response = staff["client"].put("/api/v1/tenants/acme/billing-terms", body, format="json")
    assert response.status_code == 400, response.content
    assert problem(response)["field"] == field
    assert not BillingTerms.objects.exists() and not audits("billing_terms.set")


def test_billing_terms_api_is_for_staff_and_known_tenants(world, staff):
    body = {"discount_pct": "5", "monthly_commit_minor": 0}
    assert token_client(world.tokens["owner"]).get("/api/v1/tenants/acme/billing-terms").status_code == 403
    assert token_client(world.tokens["owner"]).put("/api/v1/tenants/acme/billing-terms", body,
                                                   format="json").status_code == 403
    assert token_client(staff["ops_read"]).put("/api/v1/tenants/acme/billing-terms", body,
                                               format="json").status_code == 403
    missing = staff["client"].put("/api/v1/tenants/nobody/billing-terms", body, format="json")
    assert missing.status_code == 404 and problem(missing)["field"] == "tenant"
    assert not BillingTerms.objects.exists()


# -- spend caps: the tenant API ---------------------------------------------------------------------------------------
def test_spend_caps_api_admins_set_change_and_remove_caps_audited(world):
    admin = token_client(world.tokens["admin"])
    whole = admin.post("/api/v1/spend-caps", {"monthly_minor": 100000, "action": "warn"}, format="json")
    assert whole.status_code == 201, whole.content
    assert whole.json() == {"id": whole.json()["id"], "project": None, "monthly_minor": 100000, "currency": "USD",
                            "action": "warn"}
    vision = admin.post("/api/v1/spend-caps", {"project": "vision", "monthly_minor": 5000}, format="json").json()
    assert (vision["project"], vision["action"]) == ("vision", "refuse")
    again = admin.post("/api/v1/spend-caps", {"monthly_minor": 1}, format="json")
    assert again.status_code == 409 and problem(again)["field"] == "project"
    listed = token_client(world.tokens["viewer"]).get("/api/v1/spend-caps").json()["results"]
    assert [cap["project"] for cap in listed] == [None, "vision"]

    changed = admin.patch(f"/api/v1/spend-caps/{whole.json()['id']}", {"action": "refuse"}, format="json")
    assert changed.status_code == 200 and changed.json()["action"] == "refuse"
    assert changed.json()["monthly_minor"] == 100000  # left out: kept
    assert admin.delete(f"/api/v1/spend-caps/{vision['id']}").status_code == 204
    assert admin.get(f"/api/v1/spend-caps/{vision['id']}").status_code == 404
    trail = [(e.action, e.tenant_id, e.actor_id, e.target)
             for e in AuditEvent.objects.filter(action__startswith="spend_cap.").order_by("pk")]
    assert trail == [("spend_cap.create", world.acme.pk, world.admin.pk, "spend_cap:acme"),
                     ("spend_cap.create", world.acme.pk, world.admin.pk, "spend_cap:acme/vision"),
                     ("spend_cap.update", world.acme.pk, world.admin.pk, "spend_cap:acme"),
                     ("spend_cap.delete", world.acme.pk, world.admin.pk, "spend_cap:acme/vision")]
    assert audits("spend_cap.update")[0].data == {"currency": "USD", "action": "refuse",
                                                  "before": {"monthly_minor": 100000, "action": "warn"}}


def test_spend_caps_api_members_viewers_read_only_tokens_and_outsiders_are_refused(world):
    cap = billing.spend_cap_create(tenant=world.acme, monthly_minor=100000, by_user=world.owner)
    mine = f"/api/v1/spend-caps/{cap.pk}"
    member, viewer = token_client(world.tokens["member"]), token_client(world.tokens["viewer"])
    assert member.get(mine).status_code == 200 and viewer.get(mine).status_code == 200
    body = {"project": "vision", "monthly_minor": 1}
    assert member.post("/api/v1/spend-caps", body, format="json").status_code == 403
    assert member.patch(mine, {"monthly_minor": 1}, format="json").status_code == 403
    assert member.delete(mine).status_code == 403
    refused = viewer.patch(mine, {"monthly_minor": 1}, format="json")
    assert refused.status_code == 403 and problem(refused)["detail"] == "This API token has read scope only."
    owner_read = token_client(world.tokens["owner_read"])
    assert owner_read.delete(mine).status_code == 403
    outsider = token_client(world.tokens["outsider"])
    for method in ("get", "patch", "delete"):
        assert getattr(outsider, method)(mine, {"monthly_minor": 1}, format="json").status_code == 404, method
    assert outsider.get("/api/v1/spend-caps").json()["results"] == []
    # another tenant's project is not found, like one that does not exist
    for slug in ("secret", "nowhere"):
        response = token_client(world.tokens["owner"]).post("/api/v1/spend-caps", {"project": slug,
                                                                                    "monthly_minor": 1}, format="json")
        assert response.status_code == 404 and problem(response)["field"] == "project", slug
    cap.refresh_from_db()
    assert (cap.monthly_minor, cap.action) == (100000, "refuse")
    assert SpendCap.objects.filter(tenant=world.acme).count() == 1
    assert not audits("spend_cap.update") and not audits("spend_cap.delete")


@pytest.mark.parametrize(("body", "field"), [
    ({"monthly_minor": 0}, "monthly_minor"),
    ({"monthly_minor": "100"}, "monthly_minor"),
    ({"monthly_minor": 10**16}, "monthly_minor"),
    ({"monthly_minor": 100, "action": "block"}, "action"),
    ({"action": "warn"}, "monthly_minor"),
    ({"monthly_minor": 100, "tenant": "globex"}, "tenant"),
])
def test_spend_caps_api_bad_input_names_the_field(world, body, field):
    response = token_client(world.tokens["admin"]).post("/api/v1/spend-caps", body, format="json")
    assert response.status_code == 400, response.content
    assert problem(response)["field"] == field
    assert not SpendCap.objects.exists()


def test_a_cap_set_through_the_api_refuses_a_request_over_it(world):
    billing.price_book_create(name="List", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                              rates=RATES)
    token_client(world.tokens["admin"]).post("/api/v1/spend-caps", {"project": "vision", "monthly_minor": 100},
                                             format="json")
    response = token_client(world.tokens["member"]).post("/api/v1/leases", {
        "project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"}, "duration_seconds": 3600}, format="json")
    assert response.status_code == 402 and problem(response)["cap_minor"] == 100


# -- the Budgets page ----------------------------------------------------------------------------------------------
def test_budgets_page_shows_this_months_spend_against_the_cap_and_admins_set_it(world):
    billing.price_book_create(name="List", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                              rates=RATES)
    metered_hour(world, month_start())  # 1 GPU-hour at 4.00
    ann = portal("ann")
    page = ann.get("/settings/budgets")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-budget="tenant"' in text and 'data-budget="vision"' in text
    assert "data-spent>4.00 USD<" in text and "data-cap>no cap<" in text

    response = ann.post("/settings/budgets", {"project": "", "monthly": "250.00", "action": "warn"})
    assert response.status_code == 302
    cap = SpendCap.objects.get(tenant=world.acme, project=None)
    assert (cap.monthly_minor, cap.action) == (25000, "warn")
    ann.post("/settings/budgets", {"project": "", "monthly": "1,000", "action": "refuse"})
    assert SpendCap.objects.get(pk=cap.pk).monthly_minor == 100000  # the same cap changed
    ann.post("/settings/budgets", {"project": "vision", "monthly": "10", "action": "refuse"})
    text = ann.get("/settings/budgets").content.decode()
    assert "data-cap>10.00 USD<" in text and "data-cap>1,000.00 USD<" in text
    assert 'name="monthly" inputmode="decimal" value="1000"' in text  # the form holds what one types

    refused = ann.post("/settings/budgets", {"project": "vision", "monthly": "ten", "action": "refuse"})
    assert refused.status_code == 400
    assert "monthly_minor must be an amount in USD" in refused.content.decode()
    refused = ann.post("/settings/budgets", {"project": "vision", "monthly": "0", "action": "refuse"})
    assert refused.status_code == 400 and "monthly_minor must be a whole number" in refused.content.decode()
    assert SpendCap.objects.get(project=world.project).monthly_minor == 1000

    vision = SpendCap.objects.get(project=world.project)
    assert ann.post(f"/settings/budgets/{vision.pk}/delete").status_code == 302
    assert not SpendCap.objects.filter(project=world.project).exists()
    assert [e.action for e in AuditEvent.objects.filter(action__startswith="spend_cap.").order_by("pk")] == [
        "spend_cap.create", "spend_cap.update", "spend_cap.create", "spend_cap.delete"]
    assert {e.actor_id for e in AuditEvent.objects.filter(action__startswith="spend_cap.")} == {world.admin.pk}


def test_budgets_page_is_read_only_below_admin_and_another_tenants_cap_is_not_found(world):
    cap = billing.spend_cap_create(tenant=world.acme, monthly_minor=5000, by_user=world.owner)
    for username in ("max", "vic"):
        client = portal(username)
        page = client.get("/settings/budgets")
        assert page.status_code == 200 and "Admins and owners set the caps." in page.content.decode()
        assert "Set cap" not in page.content.decode() and "Remove cap" not in page.content.decode()
        assert client.post("/settings/budgets", {"project": "", "monthly": "1", "action": "warn"}).status_code == 403
        assert client.post(f"/settings/budgets/{cap.pk}/delete").status_code == 403
    assert portal("bob").post(f"/settings/budgets/{cap.pk}/delete").status_code == 404
    assert SpendCap.objects.get(pk=cap.pk).monthly_minor == 5000


# -- staff pages: price books and the tenant's terms ------------------------------------------------------------------
def book_form(**fields) -> dict:
    start = future()
    return {"name": "List 2027", "currency": "USD", "tenant": "", "effective_from": f"{start:%Y-%m-%dT%H:%M}",
            "over_quota_multiplier": "0.6", "interactive_multiplier": "1.25", "energy_per_kwh": "",
            "rate-0-tier": "H100-80GB", "rate-0-kind": "whole", "rate-0-mig_profile": "", "rate-0-per_hour": "4.20",
            "rate-1-tier": "", "rate-1-kind": "whole", "rate-1-mig_profile": "", "rate-1-per_hour": "",
            "rate-2-tier": "H100-80GB", "rate-2-kind": "mig", "rate-2-mig_profile": "3g.40gb",
            "rate-2-per_hour": "2.00", **fields}


def test_ops_price_books_create_edit_and_delete_an_upcoming_book(world, staff):
    root = portal("root")
    assert root.get("/ops/price-books").status_code == 200
    refused = root.post("/ops/price-books", book_form(**{"rate-2-per_hour": "-1"}))
    assert refused.status_code == 400
    shown = 'id="book-new-rate-2-per_hour-e">rates[1].per_hour must be a non-negative number.'
    assert shown in refused.content.decode()
    assert 'value="List 2027"' in refused.content.decode()  # what was typed comes back
    assert not PriceBook.objects.exists()

    created = root.post("/ops/price-books", book_form(tenant="acme"))
    book = PriceBook.objects.get()
    assert created.status_code == 302 and created["Location"] == f"/ops/price-books/{book.pk}"
    assert book.tenant == world.acme
    assert sorted((r.kind, r.mig_profile, r.per_hour) for r in book.rates.all()) == [
        ("mig", "3g.40gb", Decimal("2.000000")), ("whole", "", Decimal("4.200000"))]
    detail = root.get(f"/ops/price-books/{book.pk}").content.decode()
    assert "Change this book" in detail and "Upcoming" in detail

    changed = root.post(f"/ops/price-books/{book.pk}", book_form(name="List 2027b", **{"rate-2-tier": "",
                                                                                       "rate-2-per_hour": ""}))
    assert changed.status_code == 302
    book.refresh_from_db()
    assert book.name == "List 2027b" and [r.kind for r in book.rates.all()] == ["whole"]
    copy = root.get(f"/ops/price-books?copy={book.pk}").content.decode()
    assert 'value="List 2027b (new)"' in copy and 'name="rate-0-per_hour" inputmode="decimal" value="4.2"' in copy

    assert root.post(f"/ops/price-books/{book.pk}/delete").status_code == 302
    assert not PriceBook.objects.exists()
    assert [(e.action, e.actor_id, e.tenant_id) for e in AuditEvent.objects.filter(
        action__startswith="price_book.").order_by("pk")] == [
        ("price_book.create", staff["user"].pk, world.acme.pk), ("price_book.update", staff["user"].pk, world.acme.pk),
        ("price_book.delete", staff["user"].pk, world.acme.pk)]


def test_ops_a_started_book_shows_no_form_and_refuses_changes(world, staff):
    book = billing.price_book_create(name="List 2026", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                                     rates=RATES)
    root = portal("root")
    listing = root.get("/ops/price-books").content.decode()
    assert 'data-state="in_force"' in listing and "General list, USD" in listing
    detail = root.get(f"/ops/price-books/{book.pk}").content.decode()
    assert "Change this book" not in detail and "it cannot change" in detail
    refused = root.post(f"/ops/price-books/{book.pk}", book_form(**{"rate-0-per_hour": "9"}))
    assert refused.status_code == 409 and "Create a new book from a later date" in refused.content.decode()
    deleted = root.post(f"/ops/price-books/{book.pk}/delete", follow=True)
    assert "cannot change" in deleted.content.decode() and PriceBook.objects.filter(pk=book.pk).exists()
    assert [r.per_hour for r in book.rates.all()] == [Decimal("4.000000")]


def test_ops_tenant_page_sets_billing_terms(world, staff):
    root = portal("root")
    page = root.get("/ops/tenants/acme").content.decode()
    assert "Billing terms" in page and "No terms: list prices, no commitment." in page
    now = timezone.now()
    saved = root.post("/ops/tenants/acme/billing-terms", {"period": f"{now:%Y-%m}", "discount_pct": "7.5",
                                                          "monthly_commit": "500.00"})
    assert saved.status_code == 302
    terms = BillingTerms.objects.get(tenant=world.acme)
    assert (terms.effective_from, terms.discount_pct, terms.monthly_commit_minor) == (
        month_start(now), Decimal("7.50"), 50000)
    page = root.get("/ops/tenants/acme").content.decode()
    assert "500.00 USD" in page and "this month's invoice" in page
    refused = root.post("/ops/tenants/acme/billing-terms", {"period": "2020-01", "discount_pct": "1",
                                                            "monthly_commit": "0"})
    assert refused.status_code == 400 and 'id="terms-period-e">period must be this month' in refused.content.decode()
    refused = root.post("/ops/tenants/acme/billing-terms", {"period": "", "discount_pct": "1",
                                                            "monthly_commit": "lots"})
    assert refused.status_code == 400 and 'id="terms-commit-e">monthly_commit_minor must be an amount in USD' in \
        refused.content.decode()
    assert BillingTerms.objects.count() == 1 and len(audits("billing_terms.set")) == 1
    assert audits("billing_terms.set")[0].actor_id == staff["user"].pk


# -- the Django admin -------------------------------------------------------------------------------------------------
def shown_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def admin_book(start: datetime, **fields) -> dict:
    return {"name": "Admin list", "currency": "USD", "tenant": "", "effective_from_0": f"{start:%Y-%m-%d}",
            "effective_from_1": f"{start:%H:%M:%S}", "over_quota_multiplier": "0.6", "interactive_multiplier": "1.25",
            "profiling_multiplier": "0.5", "energy_per_kwh": "", "rates-TOTAL_FORMS": "2", "rates-INITIAL_FORMS": "0",
            "rates-MIN_NUM_FORMS": "0",
            "rates-MAX_NUM_FORMS": "1000", "rates-0-tier": "H100-80GB", "rates-0-kind": "whole",
            "rates-0-mig_profile": "", "rates-0-per_hour": "4.5", "rates-1-tier": "", "rates-1-kind": "whole",
            "rates-1-mig_profile": "", "rates-1-per_hour": "", **fields}


def test_admin_price_books_save_and_delete_through_the_services(world, admin_client):
    start = future()
    refused = admin_client.post("/admin/billing/pricebook/add/", admin_book(start, **{
        "rates-0-kind": "mig", "rates-0-mig_profile": "9g.1gb"}), follow=True)
    assert refused.status_code == 200
    assert any(note.startswith("Not saved — rates[0].mig_profile: ") for note in shown_messages(refused))
    assert not PriceBook.objects.exists() and not audits("price_book.create")

    response = admin_client.post("/admin/billing/pricebook/add/", admin_book(start), follow=True)
    assert response.status_code == 200
    book = PriceBook.objects.get()
    assert (book.effective_from, [r.per_hour for r in book.rates.all()]) == (start, [Decimal("4.500000")])
    assert [(e.actor.username, e.target) for e in audits("price_book.create")] == [("admin", f"price_book:{book.pk}")]

    rate = book.rates.get()
    change = admin_book(start, name="Admin list b", **{
        "rates-INITIAL_FORMS": "1", "rates-0-id": str(rate.pk), "rates-0-book": str(book.pk),
        "rates-0-per_hour": "5", "rates-1-tier": "L4", "rates-1-per_hour": "0.8"})
    change.pop("currency")
    change.pop("tenant")
    response = admin_client.post(f"/admin/billing/pricebook/{book.pk}/change/", change, follow=True)
    assert response.status_code == 200, response.content[:500]
    book.refresh_from_db()
    assert book.name == "Admin list b"
    assert sorted((r.tier, r.per_hour) for r in book.rates.all()) == [("H100-80GB", Decimal("5.000000")),
                                                                        ("L4", Decimal("0.800000"))]
    assert audits("price_book.update")[0].data["fields"] == [
        "effective_from", "energy_per_kwh", "interactive_multiplier", "name", "over_quota_multiplier",
        "profiling_multiplier", "rates"]
    assert book.profiling_multiplier == Decimal("0.5")  # the profiling rate, set in the admin

    response = admin_client.post(f"/admin/billing/pricebook/{book.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200 and not PriceBook.objects.exists()
    assert len(audits("price_book.delete")) == 1


def test_admin_a_started_book_is_read_only(world, admin_client):
    book = billing.price_book_create(name="List 2026", currency="USD", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                                     rates=RATES)
    page = admin_client.get(f"/admin/billing/pricebook/{book.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert admin_client.post(f"/admin/billing/pricebook/{book.pk}/change/", {"name": "x"}).status_code == 403
    assert admin_client.get(f"/admin/billing/pricebook/{book.pk}/delete/").status_code == 403
    assert "delete_selected" not in admin_client.get("/admin/billing/pricebook/").content.decode()
    assert PriceBook.objects.get().name == "List 2026"


def test_admin_terms_and_caps_save_and_delete_through_the_services(world, admin_client):
    start = month_start()
    terms = {"tenant": str(world.acme.pk), "effective_from_0": f"{start:%Y-%m-%d}", "effective_from_1": "00:00:00",
             "discount_pct": "5", "monthly_commit_minor": "1000"}
    admin_client.post("/admin/billing/billingterms/add/", terms, follow=True)
    saved = BillingTerms.objects.get()
    assert (saved.discount_pct, saved.monthly_commit_minor) == (Decimal("5.00"), 1000)
    assert [(e.actor.username, e.tenant_id) for e in audits("billing_terms.set")] == [("admin", world.acme.pk)]
    past = (start - timedelta(days=1)).replace(day=1)
    refused = admin_client.post("/admin/billing/billingterms/add/", {**terms, "effective_from_0": f"{past:%Y-%m-%d}"},
                                follow=True)
    assert any(note.startswith("Not saved — period: period must be this month") for note in shown_messages(refused))
    assert BillingTerms.objects.count() == 1

    cap = {"tenant": str(world.acme.pk), "project": "", "monthly_minor": "5000", "action": "warn"}
    admin_client.post("/admin/billing/spendcap/add/", cap, follow=True)
    created = SpendCap.objects.get()
    assert (created.monthly_minor, created.action) == (5000, "warn")
    refused = admin_client.post("/admin/billing/spendcap/add/", {**cap, "project": str(world.other_project.pk)},
                                follow=True)
    assert any("Not saved — project: " in note for note in shown_messages(refused))
    admin_client.post(f"/admin/billing/spendcap/{created.pk}/change/", {"monthly_minor": "7000", "action": "refuse"},
                      follow=True)
    created.refresh_from_db()
    assert (created.monthly_minor, created.action) == (7000, "refuse")
    admin_client.post(f"/admin/billing/spendcap/{created.pk}/delete/", {"post": "yes"}, follow=True)
    assert not SpendCap.objects.exists()
    assert [(e.action, e.actor.username) for e in AuditEvent.objects.filter(
        action__startswith="spend_cap.").order_by("pk")] == [
        ("spend_cap.create", "admin"), ("spend_cap.update", "admin"), ("spend_cap.delete", "admin")]
