"""The planner plans on the tiers the pipeline's project may lease (issue 29: stages were planned on tiers the
project had no quota for, so applying the plan answered 409). Tiers without quota are left out and named with the
reason, in the API's plan and on its portal page; with none left the plan is refused naming ``tiers``."""

import pytest
from django.test import Client

from broker import extensions
from tests.factories import make_quota, make_world

pytestmark = pytest.mark.django_db

PIPELINE = {"project": "vision", "name": "video", "slo_ms": 200.0, "rate_rps": 20.0,
            "tiers": ["L4", "H100-80GB"],
            "stages": [{"name": "detect", "architecture": "resnet-50"}], "edges": []}


@pytest.fixture
def priced(db):
    unregister = extensions.list_prices_register(lambda now: {"H100-80GB": 400, "A100-80GB": 250, "L4": 80})
    yield make_world()  # the project vision has quota on H100-80GB only
    unregister()


def test_a_plan_leaves_out_tiers_without_quota_says_why_and_applies(priced):
    world = priced
    client = world.client("member")
    pipeline = client.post("/api/v1/pipelines", PIPELINE, format="json").json()
    plan = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans", {}, format="json").json()
    # L4 is the cheaper tier, but the project has quota on H100-80GB only
    assert {stage["tier"] for stage in plan["result"]["stages"]} == {"H100-80GB"}, plan
    assert plan["result"]["tiers_skipped"] == [{"tier": "L4", "reason": "project 'vision' has no quota for L4"}]
    assert "L4" not in plan["result"]["prices"]
    applied = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans/{plan['id']}/apply", {}, format="json")
    assert applied.status_code == 200, applied.json()

    portal = Client()
    assert portal.login(username="max", password="pw-max")
    page = portal.get(f"/pipelines/{pipeline['id']}").content.decode()
    assert "Not planned on L4: project &#x27;vision&#x27; has no quota for L4." in page


def test_a_pipeline_whose_tiers_all_lack_quota_is_refused_naming_tiers(priced):
    client = priced.client("member")
    pipeline = client.post("/api/v1/pipelines", PIPELINE | {"tiers": ["L4"]}, format="json").json()
    answer = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans", {}, format="json")
    assert answer.status_code == 409 and answer.json()["field"] == "tiers", answer.json()
    assert "project 'vision' has no quota for L4" in answer.json()["detail"]
    make_quota(priced.project, tier="L4")
    again = client.post(f"/api/v1/pipelines/{pipeline['id']}/plans", {}, format="json")
    assert again.status_code == 201, again.json()
