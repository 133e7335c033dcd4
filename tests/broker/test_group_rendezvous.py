"""A lease group spread over nodes runs as one distributed job (docs/leasing.md, "Multi-node groups"): on the
simulated fleet (two nodes of one A100 each, real agents over HTTP running the workloads as real processes, a real
Celery worker), a group of two one-GPU leases is placed on both nodes and each member's workload gets MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, NNODES, NODE_RANK and the node list; the two processes meet through
them over TCP (rank 0 listens, rank 1 connects), as torch.distributed's env:// rendezvous would."""

from __future__ import annotations

import sys

from broker import services
from broker.models import Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota
from tests.support.processes import wait_until

RENDEZVOUS = """
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world} local {os.environ['LOCAL_RANK']} node {os.environ['NODE_RANK']} of "
      f"{os.environ['NNODES']} nodes {os.environ['GPUBROKER_GROUP_NODES']} master {addr}:{port}", flush=True)
deadline = time.time() + 60
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    met = []
    while len(met) < world - 1:
        peer, _ = server.accept()
        met.append(peer.recv(64).decode())
        peer.sendall(b"welcome from rank 0")
        peer.close()
    print("rank 0 met", ", ".join(sorted(met)), flush=True)
else:
    while True:
        try:
            peer = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    peer.sendall(f"rank {rank}".encode())
    print(f"rank {rank} got:", peer.recv(64).decode(), flush=True)
"""


def test_group_rendezvous_two_nodes_meet_through_the_environment(worker, workload_fleet, api, world, shared):
    make_quota(world.project, "A100-80GB", deserved=2000, limit=2000, tenant_deserved=2000, tenant_limit=4000)
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
    members = [services.lease_request(actor=actor, project="vision", gpu={"kind": "whole", "model": "A100-80GB"},
                                      group="ddp", workload={"command": [sys.executable, "-c", RENDEZVOUS]})[0]
               for _ in range(2)]
    client = api("member")

    def log(lease: Lease) -> str:
        return client.call("GET", f"/leases/{lease.pk}/logs?tail=100000")[1].get("data", "")

    wait_until(lambda: "rank 0 met rank 1" in log(members[0]), timeout=90)
    wait_until(lambda: "rank 1 got: welcome from rank 0" in log(members[1]), timeout=30)
    nodes = [Lease.objects.get(pk=m.pk).allocations.get().gpu.node.node_id for m in members]
    assert len(set(nodes)) == 2  # one member per node
    first, last = 29500, 30499
    port = first + members[0].pk % (last - first + 1)
    for rank, member in enumerate(members):
        assert (f"rank {rank} of 2 local 0 node {rank} of 2 nodes {nodes[0]},{nodes[1]} master 127.0.0.1:{port}"
                in log(member))
    # another tenant reads neither member's logs
    assert api("outsider").call("GET", f"/leases/{members[0].pk}/logs")[0] == 404
