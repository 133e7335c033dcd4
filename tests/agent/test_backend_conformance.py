"""One conformance suite for every agent backend: ``sim`` and ``nvml`` on a fake NVML that answers as the real
H100 of issue 28 did (``tests/agent/data/h100_nvml.json``: NVIDIA H100 80GB HBM3, driver 580.159.04, MIG
disabled, MIG changes off as on a default node).

Each test runs against both and asserts the same answer: inventory shape, memory (nameplate, the driver's
reservation, usable), ``device_uuid``, the MIG current/pending mode, error classes, statuses and fields of
the refusals. A difference between the backends is a failing test here, not a surprise on the first real
node. Both take ``allow_mig_changes`` (off here, as on a default real node; the sim's default is on). What only
one backend has (the sim's fault switches) is tested beside it, in ``test_sim_backend.py`` and
``test_nvml_backend.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agent.backend import Backend, InstanceSpec
from agent.nvml_backend import NvmlBackend
from agent.protocol import AgentError, AgentHTTPError, Conflict, InvalidRequest, NotFound
from agent.sim import RECORDED_RESERVED_MIB, SimBackend, reserved_mib, usable_mib
from gpus.catalogue import model_get
from tests.agent.test_nvml_backend import RECORDED_H100, RECORDING, recorded_nvml, served

# what every GPU of an inventory carries (docs/agent-protocol.md, "GET /v1/inventory"); "shares" only in
# shared mode
GPU_KEYS = {"nvlink_domain", "index", "uuid", "model", "name", "memory_mib", "memory_total_mib", "memory_reserved_mib",
            "mig_capable", "mig_mode", "mode", "mig_layout"}
INSTANCE_KEYS = {"allocation_id", "kind", "gpu", "gpu_index", "profile", "start", "milli", "memory_mib",
                 "gpu_instance_id", "compute_instance_id", "device_uuid", "created_at", "notice", "access", "state"}
TOTAL, RESERVED = RECORDING["memory"]["total_mib"], RECORDING["memory"]["reserved_mib"]
USABLE = TOTAL - RESERVED  # 81,079: what CUDA could allocate on the real GPU


@dataclass
class Node:
    backend: Backend
    gpu: str  # the one GPU's UUID


@pytest.fixture(params=["sim", "nvml-recorded-h100"])
def node(request, tmp_path) -> Iterator[Node]:
    if request.param == "sim":
        backend = SimBackend(tmp_path, "node-a", [("H100-80GB", 1, "whole")], allow_mig_changes=False)
        gpu = backend.inventory()["gpus"][0]["uuid"]
    else:
        backend = NvmlBackend(tmp_path, "node-a", nvml=recorded_nvml())  # allow_mig_changes off, as deployed
        gpu = RECORDED_H100
    yield Node(backend, gpu)
    backend.close()


def refusal(call, *args) -> tuple[type[AgentError], int, str | None]:
    """(error class, HTTP status, field) of a refused backend call."""
    with pytest.raises(AgentError) as refused:
        call(*args)
    return type(refused.value), refused.value.status, refused.value.field


def test_backend_inventory_is_the_h100s_as_its_driver_reports_it(node):
    (gpu,) = node.backend.inventory()["gpus"]

    assert set(gpu) == GPU_KEYS
    assert (gpu["index"], gpu["uuid"], gpu["model"], gpu["name"]) == (0, node.gpu, "H100-80GB", "NVIDIA H100 80GB HBM3")
    assert (gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["memory_mib"]) == (TOTAL, RESERVED, USABLE)
    assert gpu["mig_capable"] is True
    assert gpu["mig_mode"] == RECORDING["device"]["mig_mode"] == {"current": "disabled", "pending": "disabled"}
    assert (gpu["mode"], gpu["mig_layout"]) == ("whole", [])
    assert node.backend.gpu(node.gpu) == gpu


def test_backend_inventory_over_http_is_the_same_shape(node):
    with served(node.backend) as client:
        inventory = client.inventory()
    (gpu,) = inventory["gpus"]
    assert set(gpu) == GPU_KEYS
    assert (gpu["memory_mib"], gpu["memory_reserved_mib"]) == (USABLE, RESERVED)
    assert inventory["instances"] == []


def test_backend_whole_instance_is_the_gpu_by_its_uuid_with_its_usable_memory(node):
    whole, created = node.backend.create("w1", InstanceSpec("whole", node.gpu))

    assert created and set(whole) == INSTANCE_KEYS
    assert (whole["kind"], whole["gpu"], whole["gpu_index"], whole["device_uuid"]) == ("whole", node.gpu, 0, node.gpu)
    assert (whole["milli"], whole["memory_mib"], whole["state"], whole["notice"]) == (1000, USABLE, "active", None)
    assert (whole["profile"], whole["start"], whole["gpu_instance_id"], whole["compute_instance_id"]) == (
        "", None, None, None)
    assert whole["access"] == {"CUDA_VISIBLE_DEVICES": node.gpu}
    assert node.backend.create("w1", InstanceSpec("whole", node.gpu)) == (whole, False)  # idempotent
    assert node.backend.inventory()["instances"] == [whole]
    assert node.backend.instance("w1") == whole

    assert refusal(node.backend.create, "w1", InstanceSpec("share", node.gpu, milli=1, memory_mib=1)) == (
        Conflict, 409, "allocation_id")  # the same id with another spec
    assert refusal(node.backend.create, "w2", InstanceSpec("whole", node.gpu)) == (Conflict, 409, "gpu")
    assert refusal(node.backend.create, "s1", InstanceSpec("share", node.gpu, milli=1, memory_mib=1)) == (
        InvalidRequest, 422, "kind")  # a whole-mode GPU takes no share
    assert refusal(node.backend.set_mode, node.gpu, "shared") == (Conflict, 409, "gpu")  # held: never reset

    assert node.backend.destroy("w1") is True
    assert node.backend.destroy("w1") is False  # already gone: success
    assert node.backend.inventory()["instances"] == []


def test_backend_shares_are_sized_on_usable_memory(node):
    entry = node.backend.set_mode(node.gpu, "shared")
    assert entry == node.backend.gpu(node.gpu)
    assert (entry["mode"], entry["shares"]) == ("shared", {"milli_used": 0, "memory_used_mib": 0})
    assert set(entry) == GPU_KEYS | {"shares"}

    with pytest.raises(InvalidRequest) as too_big:
        node.backend.create("s1", InstanceSpec("share", node.gpu, milli=500, memory_mib=USABLE + 1))
    assert too_big.value.field == "memory_mib"
    assert f"has {USABLE} MiB free" in too_big.value.message  # not the nameplate's 81,559
    share, _ = node.backend.create("s1", InstanceSpec("share", node.gpu, milli=500, memory_mib=40_000))
    assert set(share) == INSTANCE_KEYS
    assert (share["device_uuid"], share["milli"], share["memory_mib"], share["start"]) == (node.gpu, 500, 40_000, None)
    assert share["access"] == {"CUDA_VISIBLE_DEVICES": node.gpu, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                               "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40000M"}
    assert refusal(node.backend.create, "s2", InstanceSpec("share", node.gpu, milli=501, memory_mib=1)) == (
        InvalidRequest, 422, "milli")
    assert refusal(node.backend.create, "s2", InstanceSpec("share", node.gpu, milli=500, memory_mib=41_080)) == (
        InvalidRequest, 422, "memory_mib")
    node.backend.create("s2", InstanceSpec("share", node.gpu, milli=500, memory_mib=USABLE - 40_000))  # exactly full
    assert node.backend.gpu(node.gpu)["shares"] == {"milli_used": 1000, "memory_used_mib": USABLE}
    assert refusal(node.backend.create, "w1", InstanceSpec("whole", node.gpu)) == (InvalidRequest, 422, "kind")
    assert refusal(node.backend.set_mode, node.gpu, "whole") == (Conflict, 409, "gpu")

    node.backend.destroy("s1")
    node.backend.destroy("s2")
    assert node.backend.set_mode(node.gpu, "whole")["mode"] == "whole"


def test_backend_mode_changes_and_their_refusals(node):
    before = node.backend.inventory()
    assert node.backend.set_mode(node.gpu, "whole") == before["gpus"][0]  # the mode it is in: changes nothing
    assert node.backend.inventory() == before
    assert refusal(node.backend.set_mode, "GPU-nope", "whole") == (NotFound, 404, "gpu")
    assert refusal(node.backend.create, "w1", InstanceSpec("whole", "GPU-nope")) == (InvalidRequest, 422, "gpu")
    assert refusal(node.backend.create, "m1", InstanceSpec("mig", node.gpu, profile="3g.40gb", start=0)) == (
        InvalidRequest, 422, "kind")  # MIG is disabled on the device
    assert node.backend.inventory() == before


def test_backend_notice_and_lookup_of_an_unknown_allocation(node):
    assert refusal(node.backend.notice, "nope", 1.0, "x") == (NotFound, 404, "allocation_id")
    assert refusal(node.backend.instance, "nope") == (NotFound, 404, "allocation_id")
    node.backend.create("w1", InstanceSpec("whole", node.gpu))
    noticed = node.backend.notice("w1", 1_800_000_000.0, "preempted")
    assert noticed["notice"] == {"deadline": 1_800_000_000.0, "reason": "preempted"}
    assert noticed == node.backend.instance("w1")


def test_backend_readings_count_what_processes_use_not_the_reservation(node):
    (idle,) = node.backend.readings(1_800_000_000.0).gpus
    assert (idle.uuid, idle.model, idle.allocation_id) == (node.gpu, "H100-80GB", "")
    assert (idle.fb_used_mib, idle.fb_free_mib) == (0, USABLE)  # nvidia-smi showed 0 on the idle H100

    node.backend.create("w1", InstanceSpec("whole", node.gpu))
    (held,) = node.backend.readings(1_800_000_000.0).gpus
    assert held.allocation_id == "w1"
    assert held.fb_used_mib + held.fb_free_mib == USABLE


def test_backend_refusals_have_the_same_status_over_http(node):
    with served(node.backend) as client:
        with pytest.raises(AgentHTTPError) as unknown:
            client.set_gpu_mode("GPU-nope", "whole")
        assert (unknown.value.status, unknown.value.problem["field"]) == (404, "gpu")
        client.set_gpu_mode(node.gpu, "shared")
        with pytest.raises(AgentHTTPError) as too_big:
            client.create("s1", {"kind": "share", "gpu": node.gpu, "milli": 100, "memory_mib": USABLE + 1})
        assert (too_big.value.status, too_big.value.problem["field"]) == (422, "memory_mib")
        assert client.create("s1", {"kind": "share", "gpu": node.gpu, "milli": 100, "memory_mib": USABLE})[
            "device_uuid"] == node.gpu


def test_sim_reservation_is_the_recorded_h100s_and_estimates_the_rest():
    assert RECORDED_RESERVED_MIB["H100-80GB"] == reserved_mib("H100-80GB") == RESERVED
    assert usable_mib("H100-80GB") == USABLE
    # other models: the recorded fraction of their nameplate (an estimate until a device is recorded)
    l4 = model_get("L4").memory_mib
    assert reserved_mib("L4") == round(l4 * RESERVED / TOTAL) == 136
    assert usable_mib("L4") == l4 - 136


def test_backend_refuses_mig_changes_when_they_are_off(node):
    """A default real node (allow_mig_changes off): turning MIG on and a MIG instance are refused 403 naming the
    field, the GPU left as it was; whole <-> shared, which sets nothing on the device, goes through."""
    from agent.protocol import NotPermitted

    assert refusal(node.backend.set_mode, node.gpu, "mig") == (NotPermitted, 403, "mode")
    assert node.backend.gpu(node.gpu)["mode"] == "whole"
    assert node.backend.set_mode(node.gpu, "shared")["mode"] == "shared"
    assert node.backend.set_mode(node.gpu, "whole")["mode"] == "whole"
