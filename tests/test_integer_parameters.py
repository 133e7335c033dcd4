"""Whole numbers read from query parameters and form fields (``core.parsers.parse_integer``): ASCII digits
within bounds, else 400 naming the parameter. Unicode digits (``"²"``: ``str.isdigit()`` says yes, ``int()``
says no) and a twenty-digit day count were nine 500s (issue 27, item 6); each is replayed here, through the
API and the portal, and a fuzz over the same parameters never sees a 5xx."""

from __future__ import annotations

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import services as broker
from core.errors import ValidationFailed
from core.parsers import parse_integer
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_user

ODD = ["²", "١٢", "𝟙", " 1", "1 ", "+1", "1_0", "0x1", "1e3", "-1", "-0", "", "99999999999999999999", "9" * 5000]


@pytest.mark.parametrize("raw", ODD)
def test_parse_integer_refuses_what_is_not_ascii_digits_in_bounds(raw):
    with pytest.raises(ValidationFailed) as refused:
        parse_integer(raw, field="tail", low=0, high=1000)
    assert refused.value.field == "tail" and "tail must be a whole number from 0 to 1000" in refused.value.message


@pytest.mark.parametrize(("raw", "low", "high", "value"),
                         [("0", 0, 5, 0), ("5", 0, 5, 5), ("007", 0, 10, 7), ("-3", -5, 5, -3), ("366", 1, 366, 366)])
def test_parse_integer_reads_ascii_digits_within_bounds(raw, low, high, value):
    assert parse_integer(raw, field="n", low=low, high=high) == value


def _workload_lease(world):
    return broker.lease_request(actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER),
                                project="vision", gpu={"kind": "mig", "profile": "1g.10gb"},
                                workload={"command": ["python", "train.py"]})[0]


def _login(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


@pytest.fixture
def pipeline(world):
    from broker import extensions
    from pipelines import services as pipelines

    unregister = extensions.list_prices_register(lambda now: {"H100-80GB": 400})
    yield pipelines.pipeline_create(
        actor=Actor(user=world.member, tenant=world.acme, role=Role.MEMBER), project="vision", name="video",
        slo_ms=60.0, rate_rps=20.0, tiers=["H100-80GB"], stages=[{"name": "detect", "architecture": "resnet-50"}],
        edges=[])
    unregister()


@pytest.mark.parametrize("name", ["offset", "tail", "limit", "follow", "placement"])
def test_lease_logs_api_refuses_unicode_digits_naming_the_parameter(world, name):
    lease = _workload_lease(world)
    for raw in ("²", "99999999999999999999"):
        response = world.client("viewer").get(f"/api/v1/leases/{lease.pk}/logs", {name: raw})
        assert response.status_code == 400, (name, raw, response.status_code)
        assert response["Content-Type"] == "application/problem+json" and response.json()["field"] == name


def test_portal_log_placement_refuses_unicode_digits(world):
    lease = _workload_lease(world)
    response = _login("vic").get(f"/leases/{lease.pk}/log", {"placement": "²"})
    assert response.status_code == 400 and "placement must be a whole number" in response.content.decode()


def test_portal_pipeline_plan_refuses_unicode_digits(world, pipeline):
    response = _login("vic").get(f"/pipelines/{pipeline.pk}", {"plan": "²"})
    assert response.status_code == 400 and "plan must be a whole number" in response.content.decode()


@pytest.mark.parametrize("days", ["²", "99999999999999999999", "367", "0", "-1"])
def test_portal_token_form_refuses_odd_day_counts_next_to_the_field(world, days):
    from tenants.models import ApiToken

    before = ApiToken.objects.count()
    response = _login("max").post("/settings/tokens", {"name": "ci", "scopes": ["read"], "expires_in_days": days})
    assert response.status_code == 400
    assert 'id="err-expires_at"' in response.content.decode() and "number of days" in response.content.decode()
    assert ApiToken.objects.count() == before


def test_staff_price_book_copy_refuses_unicode_digits(db):
    make_user("root", is_staff=True)
    for raw in ("²", "99999999999999999999"):
        response = _login("root").get("/ops/price-books", {"copy": raw})
        assert response.status_code == 400 and "copy must be a whole number" in response.content.decode()


ANY_TEXT = st.one_of(st.sampled_from(ODD), st.text(max_size=30), st.integers().map(str))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(placement=ANY_TEXT, plan=ANY_TEXT, copy=ANY_TEXT, days=ANY_TEXT)
def test_portal_integer_parameters_fuzz_never_a_server_error(world, pipeline, placement, plan, copy, days):
    if not hasattr(world, "fuzz"):  # once per test, not per example
        make_user("root", is_staff=True)
        world.fuzz = (_workload_lease(world), _login("max"), _login("root"))
    lease, member, staff = world.fuzz
    assert member.get(f"/leases/{lease.pk}/log", {"placement": placement}).status_code in (200, 400)
    assert member.get(f"/pipelines/{pipeline.pk}", {"plan": plan}).status_code in (200, 400)
    assert member.post("/settings/tokens", {"name": "fuzz", "scopes": ["read"],
                                            "expires_in_days": days}).status_code in (201, 400)
    assert staff.get("/ops/price-books", {"copy": copy}).status_code in (200, 400, 404)  # 404: no such book
