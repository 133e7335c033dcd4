"""Using a lease (issue 29): one environment per node whose CUDA_VISIBLE_DEVICES lists every device of a gang
lease (the page printed one ``export`` line per device, the last one winning), the host to reach the node by, and
what the node enforces (share limits, isolation), in the API and on the lease page; another tenant gets 404."""

from __future__ import annotations

from django.test import Client

from agent.protocol import instances_env
from broker import services
from broker.models import Allocation
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota


def _gang(world, *, kind="whole", gpu_extra=None):
    token = services.enrollment_token_create()
    services.node_enroll(node_id="n-gang", token=token, address="http://10.1.2.7:7070/", hostname="gpu-7",
                         inventory={"gpus": [
                             {"index": 0, "uuid": "GPU-aaaa", "model": "L4", "mode": "shared" if kind == "share"
                              else "whole", "memory_mib": 23034},
                             {"index": 1, "uuid": "GPU-bbbb", "model": "L4", "mode": "shared" if kind == "share"
                              else "whole", "memory_mib": 23034}]})
    make_quota(world.project, tier="L4", deserved=4000, limit=4000)
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    gpu = {"kind": "whole", "model": "L4", "count": 2, "gang": True} if kind == "whole" else \
        {"kind": "share", "model": "L4", "count": 2, "milli": 500, "memory_mib": 8192, "gang": True}
    lease, _ = services.lease_request(actor=actor, project=world.project.slug, gpu=gpu)
    services.schedule_cycle()
    for allocation in Allocation.objects.filter(lease=lease).select_related("gpu").order_by("pk"):
        access = {"CUDA_VISIBLE_DEVICES": allocation.gpu.uuid}
        if kind == "share":
            access |= {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
        services.allocation_ready(allocation=allocation, instance={"device_uuid": allocation.gpu.uuid,
                                                                   "access": access}, now=lease.requested_at)
    lease.refresh_from_db()
    assert lease.state == "active", lease.reason
    return lease


def test_lease_access_gang_lease_gets_one_cuda_visible_devices_in_api_and_page(world):
    lease = _gang(world)
    answer = world.client("member").get(f"/api/v1/leases/{lease.pk}")
    assert answer.status_code == 200
    [node] = answer.json()["access"]
    assert node["node"] == "n-gang" and node["host"] == "gpu-7" and node["ready"]
    assert node["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert node["share_enforcement"] is None and node["share_limits"] == []
    assert node["isolation"] == "unknown"  # the node does not report it (yet): said, not guessed
    client = Client()
    assert client.login(username="max", password="pw-max")
    page = client.get(f"/leases/{lease.pk}").content.decode()
    assert page.count("export CUDA_VISIBLE_DEVICES=") == 1
    assert "export CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in page and "one process sees all 2 devices" in page
    assert "host <code>gpu-7</code>" in page
    # the other tenant sees nothing of it
    assert world.client("outsider").get(f"/api/v1/leases/{lease.pk}").status_code == 404
    outsider = Client()
    assert outsider.login(username="bob", password="pw-bob")
    assert outsider.get(f"/leases/{lease.pk}").status_code == 404


def test_lease_access_shares_say_their_limits_and_whether_they_are_enforced(world):
    lease = _gang(world, kind="share")
    [node] = world.client("member").get(f"/api/v1/leases/{lease.pk}").json()["access"]
    assert node["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M,1=8192M"}
    assert node["share_limits"] == [{"instance_id": f"alloc-{a}", "milli": 500, "memory_mib": 8192}
                                    for a in lease.allocations.order_by("pk").values_list("pk", flat=True)]
    # the GPUs' agents reported no MPS (share_enforcement_of): the lease is told its limits do not hold
    assert node["share_enforcement"] == "none" and "not enforced" in node["share_enforcement_text"]


def test_lease_access_instances_env_joins_devices_and_share_limits():
    whole = {"kind": "whole", "memory_mib": 23034, "access": {"CUDA_VISIBLE_DEVICES": "GPU-a"}}
    share = {"kind": "share", "memory_mib": 4096, "access": {"CUDA_VISIBLE_DEVICES": "GPU-b",
                                                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}}
    assert instances_env([whole, share]) == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=4096M"}
    layers = {"access": {"CUDA_VISIBLE_DEVICES": "GPU-c", "GPUB_LAYERS": "0-11"}}
    assert instances_env([layers, {"access": {"CUDA_VISIBLE_DEVICES": "GPU-d", "GPUB_LAYERS": "0-11"}}]) == {
        "CUDA_VISIBLE_DEVICES": "GPU-c,GPU-d", "GPUB_LAYERS": "0-11"}


def test_lease_access_interactive_url_in_api_and_page_for_a_workload_with_a_port(world, settings):
    """A workload with a port: ``access[0].interactive`` names the broker URL that reaches it (the interactive proxy,
    docs/leasing.md "Interactive access") and the lease page links it; none without a proxy URL or a port."""
    from broker.models import Workload

    lease = _gang(world)
    node = Allocation.objects.filter(lease=lease).first().gpu.node
    workload = Workload.objects.create(lease=lease, spec={"command": ["jupyter", "lab"], "port": 8888}, state="running",
                                       node=node, agent_workload_id=f"lease-{lease.pk}-a1", placements=1)
    settings.INTERACTIVE_PROXY_URL = "https://gpus.example.com/i"
    [entry] = world.client("member").get(f"/api/v1/leases/{lease.pk}").json()["access"]
    url = f"https://gpus.example.com/i/leases/{lease.pk}/port/"
    assert entry["interactive"]["url"] == url and entry["interactive"]["websocket_url"] == "wss" + url[5:]
    assert entry["interactive"]["port"] == 8888 and entry["interactive"]["running"] is True
    client = Client()
    assert client.login(username="max", password="pw-max")
    page = client.get(f"/leases/{lease.pk}").content.decode()
    assert f'href="{url}"' in page
    assert f'curl -H "Authorization: Bearer $GPUBROKER_TOKEN" {url}' in page
    settings.INTERACTIVE_PROXY_URL = ""  # no proxy: no URL offered
    assert world.client("member").get(f"/api/v1/leases/{lease.pk}").json()["access"][0]["interactive"] is None
    settings.INTERACTIVE_PROXY_URL = "https://gpus.example.com/i"
    workload.spec = {"command": ["python", "train.py"], "port": None}
    workload.save()
    assert world.client("member").get(f"/api/v1/leases/{lease.pk}").json()["access"][0]["interactive"] is None
