"""The pipeline and model-split pages through Django's test client: the stages drawn as a server-rendered SVG
graph with the slices the plan chose and its SLO split, the layers coloured by GPU with memory bars; plan, apply
and release through the services (the leases are one lease group); another tenant's pipeline or split is 404;
a viewer sees the pages without the buttons and is refused (403) when posting."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from broker import extensions
from broker.models import Lease
from pipelines import services as pipelines
from pipelines.models import ModelSplit, PipelinePlan
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import AuditEvent

PRICES = {"H100-80GB": 400, "A100-80GB": 250, "L4": 80}
THREE = {"project": "vision", "name": "video", "slo_ms": 60.0, "rate_rps": 20.0, "tiers": ["H100-80GB"],
         "stages": [{"name": "detect", "architecture": "resnet-50"}, {"name": "embed", "architecture": "vit-b-16"},
                    {"name": "caption", "architecture": "bert-base"}],
         "edges": [["detect", "embed"], ["embed", "caption"]]}
SPLIT_GPUS = [{"id": "h0", "node": "n1", "model": "H100-80GB", "free_mib": 16000},
              {"id": "h1", "node": "n1", "model": "H100-80GB", "free_mib": 16000}]


@pytest.fixture
def prices(db):
    unregister = extensions.list_prices_register(lambda now: PRICES)
    yield
    unregister()


def login(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


def text(response) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def _member(world) -> Actor:
    return Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)


@pytest.fixture
def planned(world, prices):
    pipeline = pipelines.pipeline_create(actor=_member(world), **THREE)
    plan = pipelines.plan_create(actor=_member(world), pipeline=pipeline)
    assert plan.feasible
    return pipeline, plan


def test_pipeline_page_draws_the_stages_with_their_slices_and_the_slo_split(world, planned):
    pipeline, plan = planned
    page = login("max").get(f"/pipelines/{pipeline.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    svg = re.search(r"<svg data-pipeline-graph.*?</svg>", html, re.S).group(0)
    # drawn inline on the server: nothing fetched (a random CSRF token may spell "cdn": the sources are checked)
    sources = " ".join(re.findall(r'(?:src|href)="([^"]*)"', html)).lower()
    assert "cdn" not in sources and "http" not in svg
    for stage in plan.result["stages"]:  # every stage a box naming the slice, batch and instances chosen
        box = re.search(rf'<g data-stage="{stage["stage"]}".*?</g>', svg, re.S).group(0)
        assert f"<title>{stage['stage']}: {stage['slice']}, batch {stage['batch']} × {stage['instances']} · " \
            in unescape(box)
        assert f">{stage['slice']}</text>" in box
    assert svg.count("<path data-edge=") == 2 and 'data-edge="detect → embed"' in svg
    # columns follow the edges: detect left of embed left of caption
    xs = [int(re.search(rf'data-stage="{name}" transform="translate\((\d+),', svg).group(1))
          for name in ("detect", "embed", "caption")]
    assert xs == sorted(xs) and len(set(xs)) == 3
    split = re.search(r"<div class=\"slo-split\" data-slo-split.*?</div>", html, re.S).group(0)
    assert split.count('class="slo-part"') == len(plan.result["split"])
    assert "Apply: lease every stage together" in text(page)


def test_pipeline_page_plans_applies_and_releases_through_the_services(world, planned):
    pipeline, _plan = planned
    client = login("max")
    answer = client.post(f"/pipelines/{pipeline.pk}/plan", {"method": "even_greedy"})
    assert answer.status_code == 302
    plan = PipelinePlan.objects.filter(pipeline=pipeline).order_by("-pk").first()
    assert plan.method == "even_greedy" and answer["Location"] == f"/pipelines/{pipeline.pk}?plan={plan.pk}"
    assert client.post(f"/pipelines/{pipeline.pk}/plans/{plan.pk}/apply").status_code == 302
    plan.refresh_from_db()
    assert plan.state == "applied"
    leases = Lease.objects.filter(pipeline_stage__plan=plan)
    assert leases.count() == 3 and {lease.group_key for lease in leases} == {f"pipeline-plan-{plan.pk}"}
    page = client.get(f"/pipelines/{pipeline.pk}?plan={plan.pk}")
    assert "Release every stage" in text(page) and "Apply:" not in text(page)
    assert client.post(f"/pipelines/{pipeline.pk}/plans/{plan.pk}/release").status_code == 302
    assert set(leases.values_list("state", flat=True)) == {"released"}
    # applying a released plan: the service's refusal is shown, nothing leased
    page = client.post(f"/pipelines/{pipeline.pk}/plans/{plan.pk}/apply", follow=True)
    assert "The plan is released; plan again to apply." in text(page)
    assert Lease.objects.count() == 3
    actions = set(AuditEvent.objects.filter(tenant=world.acme).values_list("action", flat=True))
    assert {"pipeline.plan", "pipeline.apply", "pipeline.release"} <= actions


def test_split_page_colours_layers_by_gpu_and_draws_memory_bars(world, prices):
    split = pipelines.model_split_create(actor=_member(world), architecture_name="llama-2-13b", gpus=SPLIT_GPUS)
    page = login("max").get(f"/model-splits/{split.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    cells = re.findall(r'data-layer="(\d+)" data-gpu="([^"]*)" style="width: [\d.]+%; background: (#[0-9a-f]{6})',
                       html)
    assert [int(index) for index, _, _ in cells] == list(range(42))  # every layer once, in order
    colour_of = {}
    for group in split.result["groups"]:
        for index in range(group["first"], group["last"] + 1):
            _, gpu, colour = cells[index]
            assert gpu == group["gpu"]
            colour_of.setdefault(gpu, colour)
            assert colour == colour_of[gpu]
    assert len(set(colour_of.values())) == len(split.result["groups"]) == 2
    for group in split.result["groups"]:
        bar = re.search(rf'data-memory="{group["gpu"]}".*?</div>\s*</div>', html, re.S).group(0)
        assert f"{group['memory_mib']} of {group['free_mib']} MiB free used" in unescape(bar)
    client = login("max")
    assert client.post(f"/model-splits/{split.pk}/apply", {"project": "vision"}).status_code == 302
    split.refresh_from_db()
    assert split.state == "applied" and split.leases.count() == 2
    assert {link.lease.group_key for link in split.leases.all()} == {f"model-split-{split.pk}"}
    assert "Release every GPU" in text(client.get(f"/model-splits/{split.pk}"))
    assert client.post(f"/model-splits/{split.pk}/release").status_code == 302
    assert set(Lease.objects.values_list("state", flat=True)) == {"released"}


def test_split_apply_in_an_unknown_project_shows_the_services_message(world, prices):
    split = pipelines.model_split_create(actor=_member(world), architecture_name="bert-base", gpus=SPLIT_GPUS)
    page = login("max").post(f"/model-splits/{split.pk}/apply", {"project": "secret"}, follow=True)
    assert "No project 'secret' in this tenant." in text(page)  # globex's project is not acme's
    assert not Lease.objects.exists()


def test_another_tenant_gets_404_and_a_viewer_cannot_apply(world, planned):
    pipeline, plan = planned
    split = pipelines.model_split_create(actor=_member(world), architecture_name="bert-base", gpus=SPLIT_GPUS)
    outsider = login("bob")
    for url in (f"/pipelines/{pipeline.pk}", f"/model-splits/{split.pk}"):
        assert outsider.get(url).status_code == 404
    for url in (f"/pipelines/{pipeline.pk}/plan", f"/pipelines/{pipeline.pk}/plans/{plan.pk}/apply",
                f"/model-splits/{split.pk}/apply"):
        assert outsider.post(url, {"project": "vision"}).status_code == 404
    assert "video" not in text(outsider.get("/pipelines/"))
    viewer = login("vic")
    page = viewer.get(f"/pipelines/{pipeline.pk}")
    assert page.status_code == 200 and "Apply:" not in text(page) and "data-plan>" not in page.content.decode()
    assert "Apply:" not in text(viewer.get(f"/model-splits/{split.pk}"))
    assert viewer.post(f"/pipelines/{pipeline.pk}/plans/{plan.pk}/apply").status_code == 403
    assert viewer.post(f"/model-splits/{split.pk}/apply", {"project": "vision"}).status_code == 403
    assert viewer.post(f"/pipelines/{pipeline.pk}/plan").status_code == 403
    assert not Lease.objects.exists() and ModelSplit.objects.get(pk=split.pk).state == "planned"
    listing = text(viewer.get("/pipelines/"))
    assert "video" in listing and "bert-base" in listing


def test_the_split_form_plans_over_a_tier_or_the_gpus_free_now(world):
    client = login("max")
    page = client.get("/pipelines/")
    assert "data-split-new" in page.content.decode()
    answer = client.post("/model-splits/new", {"architecture": "llama-2-13b", "batch": "1", "source": "tier",
                                               "tier": "H100-80GB", "count": "3", "per_node": "2"})
    split = ModelSplit.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/model-splits/{split.pk}"
    assert split.result["candidates"] == {"source": "tier", "tier": "H100-80GB", "count": 3, "per_node": 2}
    assert [g["node"] for g in split.gpus] == ["H100-80GB-node-0"] * 2 + ["H100-80GB-node-1"]
    # free now: the fleet here has no GPU at all, so the service's 409 comes back naming candidates
    page = client.post("/model-splits/new", {"architecture": "bert-base", "source": "free"}, follow=True)
    assert "candidates: no whole GPU is free now" in text(page)
    # a count that is not a number: the service names the field, as the API would
    page = client.post("/model-splits/new", {"architecture": "bert-base", "source": "tier", "tier": "L4",
                                             "count": "many"}, follow=True)
    assert "candidates.count: count is a whole number" in text(page)
    assert ModelSplit.objects.count() == 1
    # a viewer sees no form and is refused
    assert "data-split-new" not in login("vic").get("/pipelines/").content.decode()
    assert login("vic").post("/model-splits/new", {"source": "tier"}).status_code == 403
