"""Profiling candidates are slices the fleet can hold in its GPUs' present modes (issue 29: on ``make run``'s
fleet every H100 is in MIG mode, so a whole-H100 candidate could never be placed and each profiling run waited
its 10-minute deadline for it)."""

import pytest

from broker import services as broker
from gpus.performance import slice_from_key
from tiering.profiler import slices_the_fleet_holds

pytestmark = pytest.mark.django_db


def enroll(node_id: str, *gpus: tuple[str, str]) -> None:
    token = broker.enrollment_token_create(uses=1)
    broker.node_enroll(node_id=node_id, token=token, address=f"http://127.0.0.1:9/n/{node_id}", inventory={"gpus": [
        {"index": index, "uuid": f"GPU-{node_id}-{index}", "model": model, "mode": mode,
         "memory_mib": 81920 if model != "L4" else 23034} for index, (model, mode) in enumerate(gpus)]})


def test_only_slices_a_gpu_of_the_fleet_holds_in_its_present_mode_are_candidates():
    enroll("mig-node", ("H100-80GB", "mig"), ("H100-80GB", "mig"))
    enroll("whole-node", ("A100-80GB", "whole"), ("L4", "shared"))
    asked = [slice_from_key(key) for key in ("H100-80GB", "H100-80GB/mig/1g.10gb", "A100-80GB",
                                              "A100-80GB/mig/1g.10gb", "L4/share/250", "L4")]
    assert [s.key for s in slices_the_fleet_holds(asked)] == ["H100-80GB/mig/1g.10gb", "A100-80GB", "L4/share/250"]


def test_a_cordoned_node_holds_nothing():
    enroll("whole-node", ("A100-80GB", "whole"))
    from broker.models import Node

    Node.objects.filter(node_id="whole-node").update(cordoned=True)
    assert slices_the_fleet_holds([slice_from_key("A100-80GB")]) == []


def test_exploring_skips_the_cheaper_slices_the_fleet_cannot_hold(db, monkeypatch):
    """An auto request whose engine explores slices the fleet cannot hold (L4 shares, its one L4 in whole mode)
    profiles the default candidates instead of waiting a run's deadline for them."""
    from datetime import timedelta

    from django.utils import timezone

    from billing import services as billing
    from tests.factories import make_quota, make_world
    from tiering import services
    from tiering.engine.decide import Decision, Option
    from tiering.models import ProfilingRun

    world = make_world()
    for tier in ("A100-80GB", "L4"):
        make_quota(world.project, tier=tier)
    billing.price_book_create(name="list", currency="USD", effective_from=timezone.now() - timedelta(days=1),
                              rates=[{"tier": "A100-80GB", "per_hour": "1.80"}, {"tier": "L4", "per_hour": "0.70"}])
    enroll("node-a", ("A100-80GB", "whole"), ("L4", "whole"))
    client = world.client("member")
    client.post("/api/v1/workloads", {"name": "bert-serving", "architecture": "bert-base", "task": "inference",
                                      "precision": "int8", "batch_size": 8, "seq_len": 128,
                                      "target_throughput": 400.0}, format="json")
    confident = Option(slice_from_key("A100-80GB"), 1.8, 3000.0, 2000, 0.9)
    cheaper = (slice_from_key("L4/share/250"), slice_from_key("L4/share/500"))
    monkeypatch.setattr(services, "workload_predict",
                        lambda **_: Decision(confident, 400.0, True, "cheaper slices might do", cheaper))
    answer = client.post("/api/v1/leases", {"project": "vision", "gpu": {"kind": "auto", "workload": "bert-serving"}},
                         format="json")
    assert answer.status_code == 409 and answer.json()["code"] == "profile_first", answer.json()
    run = ProfilingRun.objects.get(pk=answer.json()["profiling_run"])
    assert sorted(run.leases.values_list("slice_key", flat=True)) == ["A100-80GB", "L4"]
