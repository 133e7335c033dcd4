"""A request that waits because its GPUs are in another mode says so (issue 29: whole-GPU requests on the demo's
all-MIG H100 pool waited with "no node has 1 free H100-80GB GPU" while 20 H100s sat idle in MIG mode)."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler import Allocation, DecisionMode, GpuMode, Unit, plan
from broker.scheduler.plan import Scheduler
from gpus.mig import profile_get
from tests.scheduler.builders import FULL, H100, L4, by_request, mig, quota, snapshot, whole

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


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_idle_count_from_the_class_index_is_a_scan_of_every_gpu(data):
    """The reason's idle count comes from the class index (``ClassInfo.idle``, a waiting request costs the live
    classes, not the fleet) and its words are kept while no GPU changes (``ClusterState.changes``): through
    random placements, warm-free removals and closures it equals a count over every GPU."""
    modes = {H100: [GpuMode.MIG, GpuMode.WHOLE, GpuMode.SHARED], L4: [GpuMode.WHOLE, GpuMode.SHARED]}  # no MIG on L4
    models = [data.draw(st.sampled_from([H100, L4])) for _ in range(4)]
    specs = [(f"n{index}", model, data.draw(st.integers(1, 4)), data.draw(st.sampled_from(modes[model])))
             for index, model in enumerate(models)]
    scheduler = Scheduler(snapshot(*specs, quotas=QUOTAS))
    cluster = scheduler.cluster
    for step in range(data.draw(st.integers(0, 12))):
        action = data.draw(st.sampled_from(["place", "remove", "close"]))
        state = data.draw(st.sampled_from(list(cluster.gpus.values())))
        gpu = state.gpu
        if action == "place" and not gpu.closed:
            if gpu.mode == GpuMode.MIG and state.mig_starts(profile_get(gpu.model, "1g.10gb")):
                unit = Unit(gpu.id, 142, 0, "1g.10gb", state.mig_starts(profile_get(gpu.model, "1g.10gb"))[0])
            elif gpu.mode == GpuMode.SHARED and state.fits_share(250, 1024):
                unit = Unit(gpu.id, 250, 1024)
            elif state.fits_whole():
                unit = Unit(gpu.id, FULL, 0)
            else:
                continue
            cluster.apply(Allocation(f"a{step}", "p", "t", gpu.model, gpu.node, (unit,), True))
        elif action == "remove" and cluster.allocations:
            cluster.remove(data.draw(st.sampled_from(sorted(cluster.allocations))))
        elif action == "close":
            cluster.replace_gpus([replace(gpu, closed=not gpu.closed)])
        for tier in (H100, L4):
            for wanted in ("whole", "shared", "mig"):
                words = scheduler._other_modes(tier, wanted)
                assert words == scheduler._other_modes(tier, wanted)  # kept: the same words
                counts: dict[str, list[int]] = {}
                for each in cluster.gpus.values():
                    if each.gpu.model == tier and each.gpu.mode.value != wanted:
                        seen = counts.setdefault(each.gpu.mode.value, [0, 0])
                        seen[0] += 1
                        seen[1] += (not each.gpu.closed and each.units == 0 and each.used_milli == 0
                                    and each.compute_used == 0)
                expected = "; " + ", ".join(
                    f"{total} {tier} {'is' if total == 1 else 'are'} in {'MIG' if mode == 'mig' else mode} mode "
                    f"({idle} idle)" for mode, (total, idle) in sorted(counts.items())
                ) + f": the capacity loop can switch one to {wanted}" if counts else ""
                assert words == expected
