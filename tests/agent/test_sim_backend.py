"""The simulated backend directly: MIG placement rules for every profile, shares, telemetry and energy."""

import itertools

import pytest

from agent.backend import InstanceSpec
from agent.protocol import Conflict, InvalidRequest, NotFound, Unavailable
from agent.sim import SimBackend, parse_gpu_specs
from gpus.mig import MigPlacement, layout_problem, profiles_for


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def backend(tmp_path, gpus="h100-80gb:1:mig", clock=None):
    return SimBackend(tmp_path, "n1", parse_gpu_specs(gpus), clock=clock or Clock())


@pytest.mark.parametrize("profile", profiles_for("H100-80GB"), ids=lambda p: p.name)
def test_every_profile_is_accepted_exactly_at_its_valid_start_slots(tmp_path, profile):
    sim = backend(tmp_path)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    for start in range(8):
        spec = InstanceSpec("mig", gpu, profile=profile.name, start=start)
        if start in profile.starts:
            sim.create(f"a{start}", spec)
            sim.destroy(f"a{start}")
        else:
            with pytest.raises(InvalidRequest) as error:
                sim.create(f"a{start}", spec)
            assert error.value.field == "start"
    assert sim.inventory()["instances"] == []


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB"])
def test_a_full_layout_then_any_more_is_refused_with_the_rules_reason(tmp_path, model):
    sim = backend(tmp_path, f"{model}:1:mig")
    gpu = sim.inventory()["gpus"][0]["uuid"]
    by_key = {p.shape.key: p for p in profiles_for(model)}
    for index, (key, start) in enumerate((("4g", 0), ("2g", 4), ("1g", 6))):
        sim.create(f"i{index}", InstanceSpec("mig", gpu, profile=by_key[key].name, start=start))
    layout = sim.inventory()["gpus"][0]["mig_layout"]
    assert [(p["start"], p["size"]) for p in layout] == [(0, 4), (4, 2), (6, 1)]
    with pytest.raises(InvalidRequest) as error:
        sim.create("more", InstanceSpec("mig", gpu, profile=by_key["1g"].name, start=7 - 1))
    assert layout_problem([MigPlacement(0, by_key["4g"]), MigPlacement(4, by_key["2g"]),
                           MigPlacement(6, by_key["1g"]), MigPlacement(6, by_key["1g"])])
    assert f"memory slot 6 overlaps {by_key['1g'].name} at slot 6 (allocation 'i2')" in error.value.message
    # slot 7 is free but 7 compute slices are in use
    with pytest.raises(InvalidRequest, match=r"compute slices|cannot start"):
        sim.create("more", InstanceSpec("mig", gpu, profile=by_key["1g"].name, start=7))


def test_one_media_extension_instance_per_gpu(tmp_path):
    sim = backend(tmp_path)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    sim.create("m1", InstanceSpec("mig", gpu, profile="1g.10gb+me", start=0))
    with pytest.raises(InvalidRequest, match=r"\+me"):
        sim.create("m2", InstanceSpec("mig", gpu, profile="1g.10gb+me", start=1))


def test_same_spec_returns_same_instance_other_spec_conflicts(tmp_path):
    sim = backend(tmp_path)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    spec = InstanceSpec("mig", gpu, profile="7g.80gb", start=0)
    first, created = sim.create("a", spec)
    assert created and sim.create("a", spec) == (first, False)
    with pytest.raises(Conflict):
        sim.create("a", InstanceSpec("mig", gpu, profile="3g.40gb", start=0))


def test_fail_next_create_fails_once_and_creates_nothing(tmp_path):
    sim = backend(tmp_path)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    sim.apply_faults({"fail_next_create": "ECC error"})
    with pytest.raises(Unavailable, match="ECC error"):
        sim.create("a", InstanceSpec("mig", gpu, profile="1g.10gb", start=0))
    assert sim.inventory()["instances"] == []
    sim.create("a", InstanceSpec("mig", gpu, profile="1g.10gb", start=0))


def test_dropped_gpu_vanishes_with_its_instances(tmp_path):
    sim = backend(tmp_path, "h100-80gb:2:mig")
    first, second = (g["uuid"] for g in sim.inventory()["gpus"])
    sim.create("a", InstanceSpec("mig", first, profile="1g.10gb", start=0))
    sim.create("b", InstanceSpec("mig", second, profile="1g.10gb", start=0))
    sim.apply_faults({"drop_gpu": first})
    inventory = sim.inventory()
    assert [g["uuid"] for g in inventory["gpus"]] == [second]
    assert [i["allocation_id"] for i in inventory["instances"]] == ["b"]
    sim.apply_faults({"drop_instance": "b"})
    assert sim.inventory()["instances"] == []
    # and that survives a restart
    again = SimBackend(tmp_path, "n1", parse_gpu_specs("h100-80gb:2:mig"))
    assert again.inventory() == sim.inventory()


def test_unknown_fault_is_named(tmp_path):
    with pytest.raises(InvalidRequest) as error:
        backend(tmp_path).apply_faults({"explode": True})
    assert error.value.field == "explode"


def test_energy_grows_monotonically_and_power_follows_activity(tmp_path):
    clock = Clock()
    sim = backend(tmp_path, "h100-80gb:1:whole", clock)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    idle = sim.readings(clock.now).gpus[0]
    assert idle.power_w == 70.0 and idle.util_pct == 0.0
    sim.create("w", InstanceSpec("whole", gpu))
    energies, powers = [], []
    for _ in range(2000):  # ~33 hours at 60 s: wraps the replayed series
        clock.now += 60
        reading = sim.readings(clock.now).gpus[0]
        energies.append(reading.energy_mj)
        powers.append(reading.power_w)
    assert all(b >= a for a, b in itertools.pairwise(energies))
    assert max(powers) > 70.0 and min(powers) >= 70.0 and max(powers) <= 700.0
    # the counter is the integral of power: between idle-only and full-power bounds
    span = 2000 * 60
    assert 70 * span * 1000 <= energies[-1] - idle.energy_mj <= 700 * span * 1000
    sim.destroy("w")  # settles the counter; it keeps growing at idle power
    after = sim.readings(clock.now + 10).gpus[0].energy_mj
    assert after >= energies[-1] + 70 * 10 * 1000 - 1


def test_telemetry_is_deterministic_per_allocation(tmp_path):
    clock = Clock()
    one = backend(tmp_path / "a", clock=clock)
    two = backend(tmp_path / "b", clock=clock)
    for sim in (one, two):
        gpu = sim.inventory()["gpus"][0]["uuid"]
        sim.create("same-id", InstanceSpec("mig", gpu, profile="3g.40gb", start=0))
    clock.now += 3600
    a, b = one.readings(clock.now).instances[0], two.readings(clock.now).instances[0]
    assert (a.engine_active, a.fb_used_mib) == (b.engine_active, b.fb_used_mib)
    assert a.fb_used_mib + a.fb_free_mib == 40_320


def test_gpu_spec_errors_name_the_part():
    with pytest.raises(ValueError, match=r"'l4:2:mig'.*no MIG"):
        parse_gpu_specs("h100-80gb:8:mig,l4:2:mig")
    with pytest.raises(ValueError, match="unknown GPU model"):
        parse_gpu_specs("b200:8")
    with pytest.raises(ValueError, match="MODEL:COUNT"):
        parse_gpu_specs("h100")


def test_a_pinned_instance_draws_constant_power_and_the_energy_counter_follows_it(tmp_path):
    clock = Clock()
    sim = backend(tmp_path, "h100-80gb:1:whole", clock)
    gpu = sim.inventory()["gpus"][0]["uuid"]
    sim.create("w", InstanceSpec("whole", gpu))
    start = sim.readings(clock.now).gpus[0].energy_mj

    sim.apply_faults({"pin_activity": {"instance": "w", "engine_active": 1.0}})
    clock.now += 100
    busy = sim.readings(clock.now).gpus[0]
    assert (busy.power_w, busy.util_pct) == (700.0, 100.0)
    assert busy.energy_mj - start == 700 * 100 * 1000  # 100 s at full power, to the millijoule

    sim.apply_faults({"pin_activity": {"instance": "w", "engine_active": 0.0}})  # settles the busy 100 s
    clock.now += 50
    idle = sim.readings(clock.now).gpus[0]
    assert idle.power_w == 70.0 and idle.energy_mj - busy.energy_mj == 70 * 50 * 1000

    restarted = SimBackend(tmp_path, "n1", parse_gpu_specs("h100-80gb:1:whole"), clock=clock)
    assert restarted.readings(clock.now).gpus[0] == idle  # the pin and the settled counter were saved
    sim.apply_faults({"unpin_activity": "w"})
    clock.now += 60
    assert sim.readings(clock.now).gpus[0].energy_mj >= idle.energy_mj + 70 * 60 * 1000


def test_the_sim_owes_its_latency_only_for_what_it_changed(tmp_path):
    sim = SimBackend(tmp_path, "n1", parse_gpu_specs("h100-80gb:2:mig"), clock=Clock(),
                     create_latency_seconds=2.0, mode_change_latency_seconds=30.0)
    first, second = (g["uuid"] for g in sim.inventory()["gpus"])
    spec = InstanceSpec("mig", first, profile="1g.10gb", start=0)
    sim.create("a", spec)
    assert sim.take_latency() == 2.0 and sim.take_latency() == 0.0
    sim.create("a", spec)  # the same instance again
    assert sim.take_latency() == 0.0
    answers = sim.create_many({"a": spec, "b": InstanceSpec("mig", first, profile="1g.10gb", start=1),
                               "c": InstanceSpec("mig", first, profile="1g.10gb", start=2),
                               "d": InstanceSpec("mig", first, profile="1g.10gb", start=8)})
    assert [answers[i]["status"] for i in "abcd"] == [200, 201, 201, 422]
    assert sim.take_latency() == 4.0  # once per instance created
    sim.set_mode(second, "mig")  # already
    assert sim.take_latency() == 0.0
    sim.set_mode(second, "shared")
    assert sim.take_latency() == 30.0
    with pytest.raises(Conflict):
        sim.set_mode(first, "whole")
    assert sim.take_latency() == 0.0
    with pytest.raises(ValueError, match=r"create_latency_seconds must be 0\.\.600"):
        SimBackend(tmp_path / "other", "n2", parse_gpu_specs("l4:1"), create_latency_seconds=-1)


def test_a_lost_gpu_has_no_mode_to_change(tmp_path):
    sim = backend(tmp_path, "h100-80gb:2:mig")
    first = sim.inventory()["gpus"][0]["uuid"]
    sim.apply_faults({"drop_gpu": first})
    with pytest.raises(NotFound) as error:
        sim.set_mode(first, "whole")
    assert error.value.field == "gpu"


def test_sim_nvlink_domains_follow_the_model_and_the_domain_size(tmp_path):
    """An NVLink model's GPUs are one domain per group (an HGX board), a PCIe model's none; ``nvlink_domain_size``
    splits them (two domains of 4 on an 8-GPU node), 0 turns NVLink off. The names are the node's own."""
    def domains(name, gpus, size=None):
        sim = SimBackend(tmp_path / name, "n1", parse_gpu_specs(gpus), nvlink_domain_size=size)
        return [gpu["nvlink_domain"] for gpu in sim.inventory()["gpus"]]

    assert domains("hgx", "h100-80gb:8:whole") == ["nvl0"] * 8
    assert domains("split", "h100-80gb:8:whole", 4) == ["nvl0"] * 4 + ["nvl1"] * 4
    assert domains("mixed", "h100-80gb:2:whole,l4:2,a100-80gb:3:whole", 2) == ["nvl0", "nvl0", "", "", "nvl1",
                                                                               "nvl1", "nvl2"]
    assert domains("off", "h100-80gb:4:whole", 0) == [""] * 4
    with pytest.raises(ValueError, match="nvlink_domain_size"):
        domains("bad", "h100-80gb:4:whole", 65)


def test_sim_host_resources_default_per_gpu_or_as_configured(tmp_path):
    """A simulated host reports 14 cores and 256 GiB per GPU unless configured."""
    sim = SimBackend(tmp_path / "a", "n1", parse_gpu_specs("h100-80gb:8:whole"))
    assert sim.host() == {"cpu_milli": 112_000, "memory_mib": 8 * 262_144}
    sized = SimBackend(tmp_path / "b", "n1", parse_gpu_specs("l4:2"), host_cpu_milli=16_000, host_memory_mib=65_536)
    assert sized.host() == {"cpu_milli": 16_000, "memory_mib": 65_536}


def test_backend_host_resources_read_this_machine(tmp_path):
    """A real node's host: the CPUs the agent may use and MemTotal of /proc/meminfo (a file it reads)."""
    import os

    from agent.backend import host_resources

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65843720 kB\nMemFree:         1000 kB\n")
    no_cgroup = str(tmp_path / "no-cgroup")
    host = host_resources(str(meminfo), no_cgroup)
    assert host == {"cpu_milli": len(os.sched_getaffinity(0)) * 1000, "memory_mib": 65843720 // 1024}
    assert host_resources(str(tmp_path / "absent"), no_cgroup)["memory_mib"] > 0  # the physical pages instead


def test_backend_host_resources_capped_by_the_agents_cgroup(tmp_path):
    """An agent in a container hands out no more than its cgroup allows: cgroup v2 cpu.max / memory.max, else
    v1's CFS quota and memory limit; "max" (v2) and v1's huge "no limit" count as none."""
    from agent.backend import cgroup_limits, host_resources

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65843720 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    (v2 / "memory.max").write_text(str(8 << 30) + "\n")
    assert cgroup_limits(str(v2)) == {"cpu_milli": 1500, "memory_mib": 8192}
    host = host_resources(str(meminfo), str(v2))
    cpus = len(__import__("os").sched_getaffinity(0))
    assert host["memory_mib"] == 8192 and host["cpu_milli"] == min(1500, cpus * 1000)
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_limits(str(v2)) == {"cpu_milli": 0, "memory_mib": 0}
    assert host_resources(str(meminfo), str(v2))["memory_mib"] == 65843720 // 1024
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "memory").mkdir()
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limits(str(v1)) == {"cpu_milli": 4000, "memory_mib": 0}
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2 << 30) + "\n")
    assert cgroup_limits(str(v1)) == {"cpu_milli": 0, "memory_mib": 2048}
