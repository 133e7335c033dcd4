"""A request that waits because its GPUs are in another mode says so (issue 29: whole-GPU requests on the demo's
all-MIG H100 pool waited with "no node has 1 free H100-80GB GPU" while 20 H100s sat idle in MIG mode)."""

from broker.scheduler import DecisionMode, GpuMode, plan
from tests.scheduler.builders import H100, L4, by_request, mig, quota, snapshot, whole

QUOTAS = [quota("p", model, 100_000, 100_000) for model in (H100, L4)]


def test_a_whole_request_on_an_all_mig_pool_names_the_mode_and_the_idle_gpus():
    snap = snapshot(("n1", H100, 8, GpuMode.MIG), ("n2", H100, 4, GpuMode.MIG), quotas=QUOTAS)
    [decision] = plan(snap, [whole("r", "p")], now=0)
    assert decision.mode == DecisionMode.WAITING
    assert decision.reason == (f"waiting: no node has 1 free {H100} GPU; 12 {H100} are in MIG mode (12 idle): "
                               "the capacity loop can switch one to whole")


def test_the_mode_note_counts_only_idle_gpus_as_idle_and_only_the_requested_model():
    snap = snapshot(("n1", H100, 2, GpuMode.MIG), ("n2", L4, 2, GpuMode.SHARED), quotas=QUOTAS)
    found = by_request(plan(snap, [mig("m", "p", "1g.10gb", submitted_at=1), whole("r", "p", 3, submitted_at=2)],
                            now=0))
    assert found["m"].mode == DecisionMode.PLACED
    assert found["r"].reason == (f"waiting: no node has 3 free {H100} GPUs; 2 {H100} are in MIG mode (1 idle): "
                                 "the capacity loop can switch one to whole")


def test_no_mode_note_where_every_gpu_of_the_model_is_in_the_requested_mode():
    snap = snapshot(("n1", H100, 1, GpuMode.WHOLE), quotas=QUOTAS)
    found = by_request(plan(snap, [whole("a", "p", submitted_at=1), whole("b", "p", submitted_at=2)], now=0))
    assert found["b"].reason == f"waiting: no node has 1 free {H100} GPU"
