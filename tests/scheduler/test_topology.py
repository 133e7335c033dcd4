"""NVLink domains and host resources in the scheduling core (issue 32 item 4).

A multi-GPU request goes where one NVLink domain holds it whenever any node has that room (``node_options`` picks
one domain on a node, ``Policy.placement_score`` ranks a placement that spans domains below every one that does
not), under every policy; host CPU and memory asked by a request are placed within a node's and held while it
runs (a later request sees them taken)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler import DecisionMode, GpuMode, Kind, Node, Request, Shape, Snapshot
from broker.scheduler.placement import POLICIES
from broker.scheduler.plan import Scheduler
from tests.scheduler.builders import H100, held, node_gpus, outcome, whole

DETERMINISTIC = sorted(name for name, policy in POLICIES.items() if not policy.uses_random)


def _two_domain_node(node: str, count: int = 8, size: int = 4) -> tuple:
    """``count`` H100s on ``node`` in NVLink domains of ``size`` (``nvl0``, ``nvl1``, as the sim agent names them)."""
    return tuple(replace(gpu, nvlink_domain=f"nvl{gpu.index // size}") for gpu in node_gpus(node, H100, count))


def _domains(snap: Snapshot, decision) -> set[str]:
    by_id = {gpu.id: gpu for gpu in snap.gpus}
    return {by_id[unit.gpu].nvlink_domain for unit in decision.allocation.units}


@pytest.mark.parametrize("policy", DETERMINISTIC)
def test_topology_gang_takes_the_domain_with_room_on_its_node(policy):
    """One GPU of domain nvl0 is taken: a 4-GPU gang goes to nvl1 whole, not to the 3 left in nvl0 plus one more."""
    gpus = _two_domain_node("n1")
    snap = Snapshot((Node("n1"),), gpus, (held("a", "p", "n1-g0"),), enforce_quotas=False)
    (decision,) = Scheduler(snap, policy=policy).schedule([whole("r", "p", 4)], now=0.0)
    assert decision.mode == DecisionMode.PLACED
    assert _domains(snap, decision) == {"nvl1"}


@pytest.mark.parametrize("policy", DETERMINISTIC)
def test_topology_gang_prefers_a_node_whose_domain_holds_it(policy):
    """n1 (the lowest id, which wins ties) has 4 GPUs free but 2 in each domain; n2 has 4 free in one domain: the
    gang goes to n2 under every policy."""
    gpus = _two_domain_node("n1") + _two_domain_node("n2")
    taken = (held("a", "p", ("n1-g0", "n1-g1")), held("b", "p", ("n1-g4", "n1-g5")),
             held("c", "p", ("n2-g0", "n2-g1", "n2-g2", "n2-g3")))
    snap = Snapshot((Node("n1"), Node("n2")), gpus, taken, enforce_quotas=False)
    (decision,) = Scheduler(snap, policy=policy).schedule([whole("r", "p", 4)], now=0.0)
    assert decision.allocation.node == "n2"
    assert _domains(snap, decision) == {"nvl1"}


def test_topology_gang_spans_domains_when_no_domain_has_room():
    """The preference is a preference: with 2 + 2 free on the only node, the gang still runs, over both domains."""
    gpus = _two_domain_node("n1")
    taken = (held("a", "p", ("n1-g0", "n1-g1")), held("b", "p", ("n1-g4", "n1-g5")))
    snap = Snapshot((Node("n1"),), gpus, taken, enforce_quotas=False)
    (decision,) = Scheduler(snap).schedule([whole("r", "p", 4)], now=0.0)
    assert decision.mode == DecisionMode.PLACED
    assert _domains(snap, decision) == {"nvl0", "nvl1"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(used=st.lists(st.lists(st.booleans(), min_size=8, max_size=8), min_size=1, max_size=5),
       count=st.integers(2, 4), size=st.sampled_from([2, 4]), policy=st.sampled_from(DETERMINISTIC))
def test_topology_gang_spans_domains_only_when_no_node_has_one_with_room(used, count, size, policy):
    """On random fleets of 8-GPU nodes in domains of ``size``: a placed gang spans several domains only when no node
    had a domain with ``count`` free GPUs."""
    nodes, gpus, taken = [], [], []
    for number, pattern in enumerate(used):
        node = f"n{number}"
        nodes.append(Node(node))
        gpus += _two_domain_node(node, 8, size)
        busy = [f"{node}-g{index}" for index, is_used in enumerate(pattern) if is_used]
        if busy:
            taken.append(held(f"h{number}", "p", busy))
    snap = Snapshot(tuple(nodes), tuple(gpus), tuple(taken), enforce_quotas=False)
    (decision,) = Scheduler(snap, policy=policy).schedule([whole("r", "p", count)], now=0.0)
    room = any(sum(1 for index in range(start, start + size) if not pattern[index]) >= count
               for pattern in used for start in range(0, 8, size))
    if decision.mode != DecisionMode.PLACED:  # no node had count GPUs free at all
        assert not any(sum(not u for u in pattern) >= count for pattern in used)
        return
    if room:
        assert len(_domains(snap, decision)) == 1


def test_topology_host_cpu_and_memory_held_by_running_work_are_not_placed_again():
    """A node of 32 cores and 256 GiB runs a lease holding 24 cores: a request for 16 cores does not fit there (it
    goes to the other node, though n1 has the lower id and GPUs free); one for 8 cores does."""
    nodes = (Node("n1", cpu_milli=32_000, memory_mib=262_144), Node("n2", cpu_milli=32_000, memory_mib=262_144))
    gpus = node_gpus("n1", H100, 4) + node_gpus("n2", H100, 4)
    running = replace(held("a", "p", "n1-g0", preemptible=False), cpu_milli=24_000, host_memory_mib=65_536)
    snap = Snapshot(nodes, gpus, (running,), enforce_quotas=False)

    def ask(cpu: int, memory: int = 0) -> Request:
        return Request(f"r{cpu}-{memory}", "p", "acme", Shape(Kind.WHOLE, 1, models=(H100,), cpu_milli=cpu,
                                                              host_memory_mib=memory))

    (big,) = Scheduler(snap).schedule([ask(16_000)], now=0.0)
    assert big.allocation.node == "n2"
    assert (big.allocation.cpu_milli, big.allocation.host_memory_mib) == (16_000, 0)
    (small,) = Scheduler(snap, policy="best-fit").schedule([ask(8_000)], now=0.0)
    assert small.allocation.node == "n1"
    # memory the same way: 256 GiB less the 64 GiB held leaves 192 GiB on n1
    (memory,) = Scheduler(snap).schedule([ask(0, 200_000)], now=0.0)
    assert memory.allocation.node == "n2"
    # and what is placed in one cycle is held for the next: both nodes' CPU used up, a third request waits
    first = Scheduler(snap).schedule([ask(16_000)], now=0.0)
    after = replace(snap, allocations=tuple(replace(a, preemptible=False)
                                            for a in outcome(snap, first).allocations.values()))
    (third,) = Scheduler(after).schedule([ask(16_001)], now=1.0)
    assert third.mode == DecisionMode.WAITING


def test_topology_untracked_host_takes_any_cpu_request():
    """A node whose agent reports no host CPU or memory (0: an older agent) is not checked for them."""
    snap = Snapshot((Node("n1"),), node_gpus("n1", H100, 1, GpuMode.WHOLE), enforce_quotas=False)
    request = Request("r", "p", "acme", Shape(Kind.WHOLE, 1, models=(H100,), cpu_milli=999_000,
                                              host_memory_mib=1 << 22))
    (decision,) = Scheduler(snap).schedule([request], now=0.0)
    assert decision.mode == DecisionMode.PLACED
