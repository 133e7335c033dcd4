"""Right-sizing advice from a day of metered series in a real Prometheus (history written with promtool),
priced from the lease's tenant's own price book; the loop's rows: one per fingerprint, refreshed while
proposed again, expired when no longer proposed; policies validated by field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services as billing
from billing.core.pricing import to_minor
from broker import services
from broker.models import Allocation
from capacity import services as capacity_services
from capacity.models import Adjustment, CapacityPolicy
from capacity.selectors import policies_in_force
from core.errors import ValidationFailed
from notifications.models import Notification
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_world
from tests.support.prometheus import needs_prometheus

NOW = datetime.now(tz=UTC).replace(microsecond=0)
QUIET = {"mode_switch": "off", "mig_layout": "off", "warm_pool": "off", "idle_reclaim": "off", "quota_advice": "off"}


@pytest.fixture
def world(db):
    return make_world()


def a_whole_h100_lease(world, since: datetime):
    token = services.enrollment_token_create(uses=1, now=since - timedelta(hours=1))
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a",
                         now=since - timedelta(hours=1),
                         inventory={"gpus": [{"index": 0, "uuid": "GPU-h100", "model": "H100-80GB", "mode": "whole",
                                              "memory_mib": 81559}]})
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    lease, _ = services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "H100-80GB"},
                                      now=since, duration_seconds=3 * 86400)
    services.schedule_cycle(now=since)
    allocation = Allocation.objects.get(lease=lease)
    services.allocation_ready(allocation=allocation, instance={}, now=since)
    return lease, allocation


def history(instance: str, start: datetime, end: datetime) -> str:
    """OpenMetrics: the lease busy 8-10 % of its engine with 3,000 MiB of framebuffer, one sample a minute."""
    lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
    engine, memory = [], []
    moment, index = start, 0
    while moment <= end:
        labels = f'{{allocation_id="{instance}",gpu="0",Hostname="node-a"}}'
        engine.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{labels} {0.08 + 0.02 * (index % 2)} {moment.timestamp():.0f}")
        memory.append(f"DCGM_FI_DEV_FB_USED{labels} 3000 {moment.timestamp():.0f}")
        moment += timedelta(minutes=1)
        index += 1
    return "\n".join([lines[0], *engine, lines[1], *memory, "# EOF"]) + "\n"


@needs_prometheus
@pytest.mark.slow
def test_right_sizing_advice_is_priced_from_the_tenants_own_book(world, prometheus_server, settings):
    since = NOW - timedelta(hours=26)
    billing.price_book_create(name="general", currency="USD", effective_from=since - timedelta(days=30),
                              rates=[{"tier": "H100-80GB", "per_hour": "7.00"}])
    billing.price_book_create(name="acme contract", currency="USD", effective_from=since - timedelta(days=30),
                              tenant=world.acme, rates=[{"tier": "H100-80GB", "per_hour": "14.00"}])
    lease, allocation = a_whole_h100_lease(world, since)
    server = prometheus_server()
    server.backfill(history(allocation.instance_id, since, NOW - timedelta(minutes=1)))
    server.start()
    settings.PROMETHEUS_URL = server.url
    settings.CAPACITY_SERIES_STEP_SECONDS = 60
    capacity_services.policy_set(scope="", values={**QUIET, "right_size": "advise"})

    counts = capacity_services.plan_run(now=NOW)
    assert counts["prometheus"] == "ok"
    advice = Adjustment.objects.get(kind="right_size")
    assert advice.lease_id == lease.pk and advice.tenant_id == world.acme.pk and advice.state == "proposed"
    # p95 of 10 % engine + 20 % headroom = 120 milli, 3,600 MiB: the smallest H100 profile, 1g.10gb
    assert advice.change["profile"] == "1g.10gb" and advice.change["model"] == "H100-80GB"
    # priced with acme's book: 14.00 now, 1g.10gb pro rata 14 x 1/7 = 2.00, over the evidence's hours
    seconds = int(advice.evidence["end"] - advice.evidence["start"])
    assert seconds >= 86400
    expected = to_minor((Decimal("14.00") - Decimal("2.00")) * Decimal(seconds) / 3600, "USD")
    assert advice.gain_money_minor == expected and advice.currency == "USD"
    assert advice.evidence["priced_with"] == "acme contract"
    assert advice.priced_with == "acme contract" and "acme contract" not in advice.reason  # a field, not text
    # the tenant is told once, however often the loop runs
    assert Notification.objects.filter(kind="advice", tenant=world.acme).count() == 1
    capacity_services.plan_run(now=NOW + timedelta(seconds=30))
    assert Adjustment.objects.filter(kind="right_size").count() == 1
    assert Notification.objects.filter(kind="advice", tenant=world.acme).count() == 1
    # Prometheus down: the run says so and leaves the advice open (it could not judge it)
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"
    blind = capacity_services.plan_run(now=NOW + timedelta(seconds=45))
    assert "did not answer" in blind["prometheus"]
    advice.refresh_from_db()
    assert advice.state == "proposed"
    settings.PROMETHEUS_URL = server.url
    # the lease ends: the advice is no longer proposed and expires
    services.lease_release(lease=lease, actor="test")
    services.allocations_free(lease=lease, now=timezone.now(), to="released", reason="test")
    capacity_services.plan_run(now=NOW + timedelta(seconds=60))
    advice.refresh_from_db()
    assert advice.state == "expired" and "no longer proposed" in advice.outcome


def test_policies_merge_over_the_default_and_refuse_bad_input_by_field(world):
    capacity_services.policy_set(scope="", values={"warm_pool": "auto",
                                                "idle_rules": {"interactive": {"window_seconds": 600}}})
    capacity_services.policy_set(scope="pool:H100-80GB", values={"warm_pool": "off", "warm_min_arrivals": 9})
    policies = {p.scope: p for p in policies_in_force()}
    # the rest are the built-in modes: auto for idle capacity, advise for what touches a lease
    assert policies[""].warm_pool == "auto" and policies[""].mode_switch == "auto"
    assert policies[""].idle_reclaim == "advise"
    assert policies["pool:H100-80GB"].warm_pool == "off" and policies["pool:H100-80GB"].warm_min_arrivals == 9
    interactive = dict(policies["pool:H100-80GB"].idle_rules)["interactive"]
    assert interactive.window_seconds == 600 and interactive.notice_seconds == 900  # the rest inherited
    for scope, values, field in [
        ("pool:NOPE", {}, "scope"), ("project:999999", {}, "scope"), ("cluster", {}, "scope"),
        ("", {"warm_pool": "sometimes"}, "warm_pool"), ("", {"colour": "red"}, "colour"),
        ("", {"warm_min_arrivals": -1}, "warm_min_arrivals"),
        ("", {"idle_rules": {"gaming": {}}}, "idle_rules.gaming"),
        ("", {"idle_rules": {"interactive": {"window_seconds": "long"}}}, "idle_rules.interactive.window_seconds"),
        ("", {"idle_rules": {"interactive": {"threshold_permille": 5000}}},
         "idle_rules.interactive.threshold_permille"),
    ]:
        with pytest.raises(ValidationFailed) as raised:
            capacity_services.policy_set(scope=scope, values=values)
        assert raised.value.field == field, (scope, values)
    with pytest.raises(ValidationFailed):
        capacity_services.policy_delete(policy=CapacityPolicy.objects.get(scope=""))
