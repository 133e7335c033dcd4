"""``POST /api/v1/quotes``: what a lease request would get, before it is made — fit or queue, quota standing and
preemption risk, the wait, the price and the spend caps' verdict — with nothing written. The portal's live
preview is the same function (``billing.selectors.quotes.lease_quote``): both surfaces give the same answer for the
same input, and the quote refuses exactly what the request refuses, naming the same field."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from billing.api.serializers import QuoteOutput
from billing.core.pricing import format_money
from billing.models import SpendCap
from broker import services
from broker.models import Gpu, Lease, LeaseEvent, Node
from tenants import services as tenant_services
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent
from tests.factories import make_quota, make_world

WHOLE = {"project": "vision", "gpu": {"kind": "whole", "model": "H100-80GB"}, "duration_seconds": 7200}


@pytest.fixture
def world(db, settings):
    settings.LEASE_PREEMPTION_NOTICE_SECONDS = 30
    return make_world()


def fleet(node_id: str = "node-a", *, gpus: int = 1, mode: str = "whole", model: str = "H100-80GB") -> Node:
    node = Node.objects.create(node_id=node_id, address="http://127.0.0.1:1", secret="s", status="ready")
    for index in range(gpus):
        Gpu.objects.create(node=node, uuid=f"GPU-{node_id}-{index}", index=index, model=model, mode=mode,
                           memory_mib=81559)
    return node


def prices(**multipliers) -> None:
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "H100-80GB", "per_hour": "4.00"}], **multipliers)


def quote(world, body: dict, who: str = "member") -> dict:
    response = world.client(who).post("/api/v1/quotes", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def portal_quote(body: dict, username: str = "max") -> tuple[dict, str]:
    """The portal's live preview for the same input, as the form sends it: the quote it rendered (serialized
    as the API serializes it) and the panel's text."""
    import re
    from html import unescape

    params = {"project": body["project"], "workload_class": body.get("workload_class", "training"),
              "priority": str(body.get("priority", 0)), "duration_seconds": str(body.get("duration_seconds", 3600))}
    for key, value in body["gpu"].items():
        params[f"gpu.{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    response = client.get("/leases/preview", params)
    assert response.status_code == 200
    shown = " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())
    return QuoteOutput(response.context["preview"]["quote"]).data, shown


def nothing_written(before: tuple[int, int, int]) -> bool:
    return counts() == before


def counts() -> tuple[int, int, int]:
    """Leases, their events and the audit trail, less its access records: a sign-in and a token's first use of
    the day are audited (issue 34) whatever the request then does; a quote must change nothing else."""
    changes = AuditEvent.objects.exclude(action__startswith="signin.").exclude(action="token.use")
    return Lease.objects.count(), LeaseEvent.objects.count(), changes.count()


# -- one function, two surfaces ---------------------------------------------------------------------------
def test_quote_api_and_portal_preview_agree_in_every_state(world):
    before = counts()
    states = []

    def both(body: dict) -> dict:
        asked = counts()  # the setup between the calls (a node, a price book) writes its own audit rows
        api = quote(world, body)
        portal, shown = portal_quote(body)
        assert nothing_written(asked)
        assert portal == api  # the same outcome, reason, model, quota standing, wait, price and budget
        states.append(api["outcome"])
        return api | {"shown": shown}

    waiting = both(WHOLE)  # no GPU in the fleet, no price book
    assert (waiting["outcome"], waiting["queue_position"], waiting["expected_wait_seconds"]) == ("waits", 1, None)
    assert waiting["price"] is None and "No price book is in force for tenant 'acme' (USD)" in \
        waiting["price_unavailable_reason"] and "No price set for this shape yet" in waiting["shown"]
    assert "Waits in the queue at position 1" in waiting["shown"]

    fleet(gpus=2)
    prices()
    fits = both(WHOLE)
    assert (fits["outcome"], fits["tier"], fits["over_quota"], fits["expected_wait_seconds"]) == \
        ("fits", "H100-80GB", False, 0)
    assert fits["price"]["per_hour"] == "4.0000" and fits["price"]["for_duration"] == "8.00"
    assert "4.00 USD per hour" in fits["shown"] and "8.00 USD for 2 h" in fits["shown"]
    assert "Fits now" in fits["shown"]

    over = both({**WHOLE, "gpu": {"kind": "whole", "model": "H100-80GB", "count": 2}})  # deserved: 1 GPU
    assert (over["outcome"], over["over_quota"], over["units_milli"]) == ("fits", True, 2000)
    assert over["price"]["per_hour"] == "4.8000"  # 2 x 4.00 at the over-quota rate (0.6)
    assert "Over quota" in over["shown"]

    SpendCap.objects.create(tenant=world.acme, monthly_minor=100)  # 1.00 USD; the request costs 8.00
    refused = both(WHOLE)
    assert refused["budget"]["outcome"] == "refuse" and "Would be refused (402)" in refused["shown"]
    assert states == ["waits", "fits", "fits", "fits"]
    assert Lease.objects.count() == before[0] and LeaseEvent.objects.count() == before[1]


def test_quote_the_portal_calls_the_function_the_api_calls(world, monkeypatch):
    """Not a copy of it: replace ``lease_quote`` and both surfaces follow."""
    from billing.selectors import quotes

    calls = []
    real = quotes.lease_quote

    def spy(**kwargs):
        calls.append(kwargs["project"])
        return real(**kwargs)

    monkeypatch.setattr(quotes, "lease_quote", spy)
    quote(world, WHOLE)
    portal_quote(WHOLE)
    assert calls == ["vision", "vision"]


# -- the same validation as the request ---------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    {"project": "vision", "gpu": {"kind": "share", "milli": 0, "memory_mib": 1024}},
    {"project": "vision", "gpu": {"kind": "share", "milli": 250}},
    {"project": "vision", "gpu": {"kind": "whole", "colour": "red"}},
    {"project": "vision", "gpu": {"kind": "mig", "profile": "1g.99gb"}},
    {"project": "vision", "gpu": "a100"},
    {"project": "vision", "gpu": {"kind": "whole"}, "priority": 50},  # above a member's 10: 403
    {"project": "vision", "gpu": {"kind": "whole"}, "workload_class": "mining"},
    {"project": "vision", "gpu": {"kind": "whole"}, "duration_seconds": 10**9},
    {"project": "vision", "gpu": {"kind": "whole"}, "extra": 1},
    {"project": "nowhere", "gpu": {"kind": "whole"}},  # 404
    {"project": "vision", "gpu": {"kind": "whole", "model": "L4"}},  # no L4 quota: 409
    {"project": "vision", "gpu": {"kind": "whole", "count": 3, "model": "H100-80GB"}},  # beyond the limit: 409
    {"project": "vision", "gpu": {"kind": "mig", "profile": "7g.80gb", "count": 2}},  # no node holds 2: 400
])
def test_quote_refuses_what_the_request_refuses_with_the_same_words(world, body):
    fleet()
    make_quota(world.project, deserved=1000, limit=2000)
    before = counts()
    client = world.client("member")
    refused = client.post("/api/v1/leases", body, format="json")
    answered = client.post("/api/v1/quotes", body, format="json")
    assert refused.status_code >= 400 and answered.status_code == refused.status_code, answered.content
    assert answered["Content-Type"] == "application/problem+json"
    assert {k: answered.json()[k] for k in ("field", "detail", "code")} == \
        {k: refused.json()[k] for k in ("field", "detail", "code")}
    assert nothing_written(before)


def test_quote_a_viewer_and_a_read_only_token_may_ask_the_outsider_finds_nothing(world):
    """A quote writes nothing, so `view` is enough: a viewer's read-only token gets one (its request would be
    a 403); another tenant's project is not found; no token is a 401."""
    assert quote(world, WHOLE, who="viewer")["outcome"] == "waits"
    assert quote(world, WHOLE, who="owner_read")["outcome"] == "waits"
    assert world.client("viewer").post("/api/v1/leases", WHOLE, format="json").status_code == 403
    outsider = world.client("outsider").post("/api/v1/quotes", WHOLE, format="json")
    assert outsider.status_code == 404 and outsider.json()["field"] == "project"
    from tests.factories import api_client

    assert api_client().post("/api/v1/quotes", WHOLE, format="json").status_code == 401
    # the viewer is still held to the request's rules: a priority above a member's is not theirs to send
    high = world.client("viewer").post("/api/v1/quotes", {**WHOLE, "priority": 50}, format="json")
    assert high.status_code == 403 and high.json()["field"] == "priority"
    assert not Lease.objects.exists()


# -- price -----------------------------------------------------------------------------------------------------
def test_quote_price_says_why_when_no_book_prices_the_shape(world):
    fleet()
    billing.price_book_create(name="list", currency="USD", effective_from=datetime(2025, 1, 1, tzinfo=UTC),
                              rates=[{"tier": "A100-80GB", "per_hour": "2.00"}])
    answer = quote(world, WHOLE)
    assert answer["price"] is None
    assert answer["price_unavailable_reason"] == "The price book 'list' has no rate for a whole GPU on H100-80GB."


def test_quote_price_for_the_duration_and_the_interactive_rate(world):
    fleet()
    prices()
    answer = quote(world, {**WHOLE, "workload_class": "interactive", "duration_seconds": 5400})
    price = answer["price"]
    assert (price["per_hour"], price["for_duration"], price["for_duration_minor"]) == ("5.0000", "7.50", 750)
    assert price["formatted"] == "5.00 USD per hour, 7.50 USD for 1 h 30 min"
    assert "interactive rate" in price["description"] and price["book"] == "list"


# -- quota, preemption risk, queue and wait ---------------------------------------------------------------------
def test_quote_over_quota_names_the_preemption_notice_of_the_tenants_contract(world):
    from decimal import Decimal

    fleet(gpus=2)
    body = {**WHOLE, "gpu": {"kind": "whole", "model": "H100-80GB", "count": 2}}
    answer = quote(world, body)
    assert answer["over_quota"] and answer["preemption_notice_seconds"] == 30
    assert "can be preempted" in answer["preemption_risk"] and "30 s" in answer["preemption_risk"]
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=timezone.now() - timezone.timedelta(days=1),
        effective_to=None, time_to_gpu_p95_seconds=600, availability_target_pct=Decimal(99),
        preemption_notice_seconds=300, credit_steps=[])
    assert quote(world, body)["preemption_notice_seconds"] == 300
    within = quote(world, WHOLE)
    assert not within["over_quota"] and within["preemption_notice_seconds"] is None
    assert within["preemption_risk"] == "Within the guaranteed quota: it is not preempted."


def test_quote_waits_behind_the_queue_with_its_position_and_no_invented_wait(world):
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    for _ in range(2):
        services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"})
    answer = quote(world, WHOLE)
    assert (answer["outcome"], answer["queue_position"], answer["expected_wait_seconds"]) == ("waits", 3, None)
    assert answer["reason"]  # the scheduler's reason


def test_quote_reclaims_waits_at_most_the_victims_notice(world, settings):
    """globex's in-quota request would reclaim acme's over-quota GPU: it waits at most the notice acme is
    promised (its SLO contract's 120 s here), and nothing of acme's is named."""
    from decimal import Decimal

    settings.LEASE_MIN_RUNTIME_SECONDS = 0
    fleet()
    tenant_services.quota_set(project=world.project, tier="H100-80GB", deserved_gpu_milli=0, limit_gpu_milli=1000)
    over, _ = services.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                     project="vision", gpu={"kind": "whole"})
    services.schedule_cycle()
    services.allocation_ready(allocation=over.allocations.get(), instance={}, now=timezone.now())
    tenant_services.slo_contract_create(
        tenant=world.acme, name="gold", effective_from=timezone.now() - timezone.timedelta(days=1),
        effective_to=None, time_to_gpu_p95_seconds=600, availability_target_pct=Decimal(99),
        preemption_notice_seconds=120, credit_steps=[])
    answer = quote(world, {"project": "secret", "gpu": {"kind": "whole"}}, who="outsider")
    assert (answer["outcome"], answer["over_quota"], answer["expected_wait_seconds"]) == ("reclaims", False, 120)
    assert "vision" not in str(answer)
    assert not re.search(rf"\b{over.pk}\b", answer["reason"]), answer["reason"]  # (a whole number: "H100" holds a 1)
    assert Lease.objects.get(pk=over.pk).state == "active"  # nobody was given notice


def test_quote_reclaims_across_modes_as_the_cycle_would(world):
    """The only GPU is in MIG mode and idle: an in-quota whole-GPU request would have it switched by the cycle (reclaim
    across modes, the loop's mode switch on ``auto`` by default); the quote says so, and writes nothing. With the
    pool's switch only advised, it waits as before."""
    from capacity import services as capacity_services

    fleet(mode="mig")
    before = counts()
    answer = quote(world, WHOLE)
    assert answer["outcome"] == "reclaims" and "switched to whole mode for it" in answer["reason"], answer
    assert "an idle GPU" in answer["reason"] and nothing_written(before)
    capacity_services.policy_set(scope="pool:H100-80GB", values={"mode_switch": "advise"})
    assert quote(world, WHOLE)["outcome"] == "waits"


# -- budget ----------------------------------------------------------------------------------------------------
def test_quote_budget_refuse_has_the_figures_the_request_refuses_with(world):
    fleet()
    prices()
    assert quote(world, WHOLE)["budget"] == {"outcome": "ok", "message": "", "currency": "USD", "cap_scope": None,
                                             "cap_minor": None, "spent_minor": None, "request_minor": None,
                                             "forecast_minor": None}
    SpendCap.objects.create(tenant=world.acme, project=world.project, monthly_minor=100)
    budget = quote(world, WHOLE)["budget"]
    refused = world.client("member").post("/api/v1/leases", WHOLE, format="json")
    assert refused.status_code == 402 and budget["outcome"] == "refuse"
    problem = refused.json()
    assert budget["message"] == problem["detail"] and budget["cap_scope"] == "project"
    assert {k: budget[k] for k in ("cap_minor", "spent_minor", "request_minor", "forecast_minor")} == \
        {k: problem[k] for k in ("cap_minor", "spent_minor", "request_minor", "forecast_minor")}
    assert not Lease.objects.exists()


def test_quote_budget_warn_is_the_warning_the_request_records(world):
    fleet()
    prices()
    SpendCap.objects.create(tenant=world.acme, monthly_minor=100, action="warn")
    SpendCap.objects.create(tenant=world.acme, project=world.project, monthly_minor=10_000, action="warn")
    budget = quote(world, WHOLE)["budget"]
    assert budget["outcome"] == "warn" and budget["cap_scope"] == "tenant"  # the tighter of the two
    assert budget["request_minor"] == 800 and budget["forecast_minor"] == budget["spent_minor"] + 800
    assert f"forecast {format_money(budget['forecast_minor'], 'USD')}" in budget["message"]
    lease, _ = services.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER), **WHOLE)
    assert lease.events.order_by("pk").first().reason == f"requested; {budget['message']}"


def test_quote_budget_counts_the_request_as_the_request_does_not_at_the_cheaper_rate(world):
    """Over quota the price is the cheaper over-quota rate, but the request's guard counts it at the in-quota
    rate (it cannot know at request time where it will run): the quote's budget follows the guard, so a
    quote never says "ok" for a request that is then refused."""
    fleet(gpus=2)
    prices()
    body = {**WHOLE, "gpu": {"kind": "whole", "model": "H100-80GB", "count": 2}}  # over quota: 4.80 per hour
    SpendCap.objects.create(tenant=world.acme, monthly_minor=1200)  # 12.00: 2 h at 4.80 fits, at 8.00 does not
    answer = quote(world, body)
    assert answer["over_quota"] and answer["price"]["for_duration"] == "9.60"
    assert answer["budget"]["outcome"] == "refuse" and answer["budget"]["request_minor"] == 1600
    assert world.client("member").post("/api/v1/leases", body, format="json").status_code == 402


def test_quote_is_in_the_openapi_document(db):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operation = schema["paths"]["/api/v1/quotes"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/LeaseCreateInputRequest")  # the lease request's body
    assert {"200", "400", "401", "403", "404", "409"} <= set(operation["responses"])
    assert "402" not in operation["responses"]  # a budget refusal is an answer here, not an error


def test_an_interactive_quote_beyond_the_guarantee_waits_and_is_never_over_quota(world):
    """Interactive work never borrows: two whole H100s where one is deserved wait (not 'fits, over quota'),
    and the quote says why; the same as training fits over quota."""
    fleet(gpus=2)
    body = {**WHOLE, "gpu": {"kind": "whole", "model": "H100-80GB", "count": 2}}
    interactive = quote(world, {**body, "workload_class": "interactive"})
    assert (interactive["outcome"], interactive["over_quota"]) == ("waits", False), interactive
    assert "interactive work runs only within the guaranteed quota" in interactive["reason"]
    training = quote(world, body)
    assert (training["outcome"], training["over_quota"]) == ("fits", True)
