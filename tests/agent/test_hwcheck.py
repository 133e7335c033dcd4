"""``python -m agent.hwcheck`` against the simulated backend, as a subprocess, as an operator runs it.

Each run starts a real agent (``python -m agent``) on loopback and drives it through the signed client: a whole
GPU, a workload through the process runtime, ``kill -9`` of the agent and the adoption, a notice, MIG profiles
and MPS shares. The tests read the JSON report and check what it claims against what is on disk.

The contract checks (``CONTRACT_*`` below) hold the agent to what hwcheck verifies on a real node: the memory
fields, each instance's ``device_uuid``, share enforcement and the workloads' own uid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.hwcheck import process_group_alive
from agent.nvml_backend import model_for_device_name
from agent.sim import RECORDED_RESERVED_MIB
from core.processes import ROOT
from gpus.catalogue import model_get
from gpus.mig import profiles_for

DEFAULT_CHECKS = ("agent_start", "inventory", "inventory_memory_fields", "inventory_share_enforcement",
                  "inventory_host_topology",
                  "telemetry_idle", "whole_instance", "instance_device_uuid", "telemetry_load", "workload",
                  "workload_uid", "agent_kill9_adoption", "notice_sigterm_checkpoint", "instances_release", "cleanup")
# contracts of other wave-9 branches: FAIL with "agent does not report ..." until they are merged
CONTRACT_MEMORY = "inventory_memory_fields"  # wave9-nodefix: memory_total_mib, memory_reserved_mib, memory_mib
CONTRACT_SHARES = "inventory_share_enforcement"  # wave9-engine: share_enforcement per GPU (agent/mps.py)
CONTRACT_UID = "workload_uid"  # wave9-isolate: an agent running as root runs workloads as another uid
CONTRACTS = (CONTRACT_MEMORY, CONTRACT_SHARES, CONTRACT_UID)


def hwcheck(*args: str, timeout: float = 200) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agent.hwcheck", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return done, time.monotonic() - started


def checks_of(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One default run (``--backend sim``), its state kept for the tests to read."""
    base = tmp_path_factory.mktemp("hwcheck")
    done, seconds = hwcheck("--backend", "sim", "--json", str(base / "report.json"), "--state-dir", str(base / "run"))
    report = json.loads((base / "report.json").read_text())
    return done, seconds, report, base


def test_hwcheck_default_checks_pass_on_sim(default_run):
    done, _, report, _ = default_run
    checks = checks_of(report)
    assert tuple(checks) == DEFAULT_CHECKS, done.stdout
    not_passed = {name: (c["status"], c["detail"]) for name, c in checks.items()
                  if c["status"] != "PASS" and name not in CONTRACTS}
    assert not_passed == {}, done.stdout + done.stderr
    assert report["truth"] == "sim" and report["backend"] == "sim"
    assert report["gpu"]["uuid"].startswith("GPU-") and report["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
    assert report["gpu"]["driver"] == "sim"
    assert all(isinstance(c["seconds"], float | int) and c["seconds"] >= 0 for c in report["checks"])
    # one printed line per check, in the order of the report
    lines = [line.split()[:2] for line in done.stdout.splitlines() if line.split()[:1] in (["PASS"], ["FAIL"],
                                                                                          ["SKIP"])]
    assert [name for _, name in lines] == list(DEFAULT_CHECKS)


def test_hwcheck_exit_status_follows_the_report(default_run):
    done, _, report, _ = default_run
    failed = [c["name"] for c in report["checks"] if c["status"] == "FAIL"]
    assert report["passed"] is (not failed)
    assert done.returncode == (1 if failed else 0)


def test_hwcheck_notice_checkpoint_and_adoption_on_disk(default_run):
    """What the report claims is on disk: one start of the workload across the agent's kill -9, and a
    checkpoint holding the notice's deadline."""
    _, _, report, base = default_run
    checks = checks_of(report)
    trap = base / "run" / "work" / "trap"
    assert (trap / "starts").read_text().split() and len((trap / "starts").read_text().split()) == 1
    checkpoint = json.loads((trap / "checkpoint.json").read_text())
    assert float(checkpoint["deadline"]) > 0 and checkpoint["step"] > 0
    assert "adopted, started once" in checks["agent_kill9_adoption"]["detail"]
    state = json.loads((base / "run" / "state" / "workloads.json").read_text())["workloads"]
    assert state["hwcheck-trap"]["state"] == "preempted" and len(state["hwcheck-trap"]["runs"]) == 1
    assert state["hwcheck-trap"]["runs"][0]["exit_code"] == 0
    # the simulated load: perf_workload.py reported its throughput to the check's receiver
    assert "throughput sample(s) received" in checks["telemetry_load"]["detail"]
    assert checks["telemetry_load"]["data"]["util_pct"] > 0


def test_hwcheck_leaves_no_instance_and_no_process(default_run):
    _, _, report, base = default_run
    sim = json.loads((base / "run" / "state" / "sim-state.json").read_text())
    assert sim["instances"] == {}
    assert [g["mode"] for g in sim["gpus"]] == ["whole", "shared"]  # as declared: nothing switched by default
    workloads = json.loads((base / "run" / "state" / "workloads.json").read_text())["workloads"]
    groups = [run["pid"] for w in workloads.values() for run in w["runs"]]  # each run leads its process group
    assert len(groups) == 2 and [pid for group in groups for pid in process_group_alive(group)] == []
    assert checks_of(report)["cleanup"]["status"] == "PASS"


def test_hwcheck_contract_memory_fields(default_run):
    _, _, report, _ = default_run
    check = checks_of(report)[CONTRACT_MEMORY]
    assert check["status"] == "PASS", check["detail"]


def test_hwcheck_contract_share_enforcement(default_run):
    _, _, report, _ = default_run
    check = checks_of(report)[CONTRACT_SHARES]
    assert check["status"] == "PASS", check["detail"]


def test_hwcheck_contract_workload_uid(default_run):
    _, _, report, _ = default_run
    check = checks_of(report)[CONTRACT_UID]
    assert check["status"] == "PASS", check["detail"]


def test_hwcheck_contract_checks_say_what_is_missing(default_run):
    """Today's contract failures name the missing field (the lead's signal); a PASS once merged is fine."""
    _, _, report, _ = default_run
    checks = checks_of(report)
    for name, field in ((CONTRACT_MEMORY, "memory_total_mib"), (CONTRACT_SHARES, "share_enforcement")):
        if checks[name]["status"] == "FAIL":
            assert checks[name]["detail"].startswith(f"agent does not report {field}"), checks[name]


def test_hwcheck_mig_and_mps_opt_in_cycle_profiles_and_restore_the_mode(tmp_path):
    done, _ = hwcheck("--backend", "sim", "--allow-mig-changes", "--mps", "--json", str(tmp_path / "r.json"),
                      "--state-dir", str(tmp_path / "run"))
    report = json.loads((tmp_path / "r.json").read_text())
    checks = checks_of(report)
    assert list(checks)[-4:] == ["mps_shares", "mps_memory_cap", "mig_profiles", "cleanup"], done.stdout
    mig = checks["mig_profiles"]
    assert mig["status"] == "PASS", done.stdout + done.stderr
    expected = sum(len(p.starts) for p in profiles_for("H100-80GB"))
    assert mig["data"]["placements"] == expected == 25
    assert mig["data"]["mode_found"] == mig["data"]["mode_after"] == "whole"
    assert "refused (409)" in mig["detail"]
    # on disk: the GPU is back in whole mode with no instance; the shared one untouched
    sim = json.loads((tmp_path / "run" / "state" / "sim-state.json").read_text())
    assert [g["mode"] for g in sim["gpus"]] == ["whole", "shared"] and sim["instances"] == {}
    assert checks["mps_shares"]["status"] == "PASS", checks["mps_shares"]["detail"]
    # a simulated GPU enforces nothing (or the field is not there yet): never a PASS without a real cap
    assert checks["mps_memory_cap"]["status"] in ("SKIP", "FAIL")
    assert checks["cleanup"]["status"] == "PASS"


def test_hwcheck_without_nvml_fails_with_the_reason_and_exits_1(tmp_path):
    """This machine has no NVIDIA driver: the default backend's agent cannot start, and the check says why."""
    done, _ = hwcheck("--json", str(tmp_path / "r.json"), timeout=90)
    report = json.loads((tmp_path / "r.json").read_text())
    checks = checks_of(report)
    assert done.returncode == 1 and report["passed"] is False
    assert checks["agent_start"]["status"] == "FAIL"
    assert "NVML is not available" in checks["agent_start"]["detail"]
    assert report["truth"] == "nvidia-smi" and list(checks) == list(DEFAULT_CHECKS)
    assert {c["status"] for name, c in checks.items() if name not in ("agent_start", "cleanup")} == {"SKIP"}
    assert checks["inventory"]["detail"] == "not run: the agent did not start"


def test_hwcheck_whole_run_is_bounded_and_cleans_up_when_it_runs_out(tmp_path):
    """--timeout 5: the watchdog ends the check in progress as a FAIL, cleanup still runs, nothing is left."""
    done, seconds = hwcheck("--backend", "sim", "--timeout", "5", "--json", str(tmp_path / "r.json"),
                            "--state-dir", str(tmp_path / "run"), timeout=90)
    report = json.loads((tmp_path / "r.json").read_text())
    checks = report["checks"]
    assert done.returncode == 1
    stopped = [c for c in checks if c["detail"].startswith("the whole run passed its bound of 5 s")]
    assert len(stopped) == 1 and stopped[0]["status"] == "FAIL", done.stdout
    assert checks[-1]["name"] == "cleanup" and checks[-1]["status"] == "PASS", checks[-1]
    assert [c["name"] for c in checks] == list(DEFAULT_CHECKS)  # the ones after the cut: SKIP "not run"
    after = checks[checks.index(stopped[0]) + 1:-1]
    assert all(c["status"] == "SKIP" and c["detail"].startswith("not run") for c in after)
    assert seconds < 5 + 10  # the bound, and the interpreter's start and exit
    sim_file = tmp_path / "run" / "state" / "sim-state.json"  # (absent when the bound fell before the agent began)
    assert not sim_file.exists() or json.loads(sim_file.read_text())["instances"] == {}
    workloads_file = tmp_path / "run" / "state" / "workloads.json"
    if workloads_file.exists():
        workloads = json.loads(workloads_file.read_text())["workloads"]
        assert [p for w in workloads.values() for r in w["runs"] for p in process_group_alive(r["pid"])] == []


FAKE_GPU = ROOT / "tests" / "agent" / "fake_gpu"  # pynvml and nvidia-smi stand-ins: one idle H100, MIG disabled
H100_UUID = "GPU-0f0e5e6a-6a4c-4f1e-9d3b-1d2c3b4a5f60"


def fake_gpu_env(tmp_path, **changes) -> dict[str, str]:
    """The environment that puts the fake GPU under a child: its state file (``changes`` to the GPU), its pynvml
    first on PYTHONPATH, its nvidia-smi first on PATH."""
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": H100_UUID, "memory_total_mib": 81559,
           "memory_reserved_mib": 480, "memory_used_mib": 0, "mig": 0, "power_w": 70.5, "energy_mj": 123456789,
           "util_pct": 0, "compute_pids": [], **changes}
    state = tmp_path / "fake-gpu.json"
    state.write_text(json.dumps({"driver": "580.159.04", "gpus": [gpu]}))
    return {**os.environ, "FAKE_GPU_STATE": str(state), "PATH": f"{FAKE_GPU}:{os.environ['PATH']}",
            "PYTHONPATH": f"{FAKE_GPU}:{ROOT}"}


@pytest.fixture(scope="module")
def gpu_node_run(tmp_path_factory):
    """One default (nvml) run on the stand-in GPU."""
    base = tmp_path_factory.mktemp("hwcheck-gpu")
    done = subprocess.run([sys.executable, "-m", "agent.hwcheck", "--json", str(base / "r.json")], cwd=ROOT,
                          env=fake_gpu_env(base), capture_output=True, text=True, timeout=200, check=False)
    return done, json.loads((base / "r.json").read_text())


def test_hwcheck_on_a_gpu_node_compares_the_agent_with_nvidia_smi(gpu_node_run):
    """The default (nvml) run on a stand-in GPU: the agent's inventory against nvidia-smi, telemetry against its
    power.draw, the whole GPU, the workload, kill -9 and adoption, the notice, cleanup through NVML."""
    done, report = gpu_node_run
    checks = checks_of(report)
    assert report["truth"] == "nvidia-smi" and report["backend"] == "nvml"
    assert report["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "uuid": H100_UUID, "model": "H100-80GB",
                             "driver": "580.159.04"}
    for name in ("agent_start", "inventory", "telemetry_idle", "whole_instance", "workload", "agent_kill9_adoption",
                 "notice_sigterm_checkpoint", "instances_release", "cleanup"):
        assert checks[name]["status"] == "PASS", (name, done.stdout, done.stderr)
    assert checks["telemetry_load"]["status"] == "SKIP"  # no torch with CUDA here: never a PASS
    assert checks["telemetry_load"]["detail"].startswith("no CUDA load available (")
    assert "NVML shows no new compute process" in checks["cleanup"]["detail"]
    assert done.returncode == 0 and report["passed"] is True, (done.stdout, done.stderr)


def test_hwcheck_on_a_gpu_node_contract_device_uuid_and_memory(gpu_node_run):
    checks = checks_of(gpu_node_run[1])
    topology = checks["inventory_host_topology"]
    assert topology["status"] == "PASS", topology["detail"]
    assert f"nproc {len(os.sched_getaffinity(0))}" in topology["detail"]
    assert "NVLink domains 0=(none) (active links per GPU: 0=0)" in topology["detail"]
    assert checks["instance_device_uuid"]["status"] == "PASS", checks["instance_device_uuid"]["detail"]
    assert checks[CONTRACT_MEMORY]["status"] == "PASS", checks[CONTRACT_MEMORY]["detail"]


def test_hwcheck_on_a_gpu_node_fails_where_nvml_and_nvidia_smi_disagree_or_the_gpu_is_busy(tmp_path):
    env = fake_gpu_env(tmp_path, util_pct=60, smi={"memory.total": "81920", "power.draw": "180.00"})
    command = [sys.executable, "-m", "agent.hwcheck", "--json", str(tmp_path / "r.json")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200, check=False)
    checks = checks_of(json.loads((tmp_path / "r.json").read_text()))
    assert done.returncode == 1
    assert checks["inventory"]["status"] == "FAIL"
    assert checks["inventory"]["detail"] == "GPU 0: memory 81559 MiB vs 81920 MiB"
    assert checks["telemetry_idle"]["status"] == "FAIL"
    assert checks["telemetry_idle"]["detail"] == ("GPU 0: power 70.5 W, nvidia-smi says 180.0 W; "
                                                  "GPU 0 is not idle: 60.0 % busy before the check put any load")


def test_hwcheck_fails_when_nvidia_smi_shows_nvlink_the_agent_does_not(tmp_path):
    """The stand-in GPU's NVML answers no NVLink call; its nvidia-smi shows an active link: the agent's empty
    domain is then a FAIL naming the GPU, the rest of the inventory still passes."""
    env = fake_gpu_env(tmp_path, nvlinks=[26.562, 0])
    command = [sys.executable, "-m", "agent.hwcheck", "--json", str(tmp_path / "r.json"), "--timeout", "60"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200, check=False)
    checks = checks_of(json.loads((tmp_path / "r.json").read_text()))
    assert checks["inventory_host_topology"]["status"] == "FAIL", done.stdout
    assert checks["inventory_host_topology"]["detail"] == ("GPU 0: nvidia-smi shows 1 active NVLink link(s), "
                                                           "the agent no domain")
    assert checks["inventory"]["status"] == "PASS" and done.returncode == 1


def test_device_check_script_on_a_gpu_machine_writes_every_report(tmp_path):
    """bench/device_check.sh as a lead runs it on a lent machine (here the stand-in GPU): each step's output
    under $OUT, the exit status of the first step that failed."""
    out = tmp_path / "out"
    env = {**fake_gpu_env(tmp_path), "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(["sh", str(ROOT / "bench" / "device_check.sh")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=200, env=env, check=False)
    assert "nvidia-smi: exit 0" in done.stdout and "agent.nvml_check: exit 0" in done.stdout, done.stdout
    assert H100_UUID in (out / "nvidia-smi.txt").read_text()
    nvml = json.loads((out / "nvml_check.json").read_text())
    assert nvml["driver"] == "580.159.04" and nvml["inventory"]["gpus"][0]["uuid"] == H100_UUID
    report = json.loads((out / "hwcheck.json").read_text())
    assert report["backend"] == "nvml" and report["options"]["timeout_seconds"] == 300
    assert "PASS  agent_start" in (out / "hwcheck.txt").read_text()
    assert done.returncode == (0 if report["passed"] else 1)


def test_hwcheck_refuses_bad_arguments_naming_them():
    done, _ = hwcheck("--timeout", "0", timeout=30)
    assert done.returncode == 2 and "--timeout" in done.stderr
    done, _ = hwcheck("--backend", "sim", "--sim-gpus", "h100-80gb:x", timeout=30)
    assert done.returncode == 2 and "--sim-gpus" in done.stderr


def test_hwcheck_refuses_a_state_dir_with_an_earlier_run(default_run):
    _, _, _, base = default_run
    done, _ = hwcheck("--backend", "sim", "--state-dir", str(base / "run"), timeout=30)
    assert done.returncode == 2 and "holds an earlier run" in done.stderr


def test_hwcheck_never_resets_a_gpu():
    """No reset anywhere in the check: not NVML's, not nvidia-smi's."""
    source = (ROOT / "agent" / "hwcheck.py").read_text()
    for call in ("nvmlDeviceReset", "--gpu-reset", "nvmlDeviceSetMigMode"):
        assert call not in source


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Running on real GPUs", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_hwcheck_readme_commands_run_as_documented(tmp_path):
    """Each command of README "Running on real GPUs", as written (the interpreter is this one): the sim line
    passes its default checks; on a machine without the NVIDIA driver the others fail at the agent's start,
    saying why, and write their reports."""
    commands = readme_commands()
    assert len(commands) == 4 and all("hwcheck" in c or "device_check.sh" in c for c in commands)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    for number, command in enumerate(commands):
        argv = command.split()
        if argv[0] == ".venv/bin/python":
            argv[0] = sys.executable
        elif argv[:2] == ["sh", "bench/device_check.sh"]:
            argv[1] = str(ROOT / "bench" / "device_check.sh")
        if "--backend" not in argv and shutil.which("nvidia-smi"):
            continue  # a GPU machine: bench/device_check.sh is its run (minutes), not this test's
        cwd = tmp_path / f"run-{number}"
        cwd.mkdir()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=200, check=False)
        report_path = cwd / "hwcheck.json" if "--json" in argv else tmp_path / "out" / "hwcheck.json"
        checks = checks_of(json.loads(report_path.read_text()))
        if "--backend" in argv:  # sim
            assert {n: c["status"] for n, c in checks.items() if n not in CONTRACTS} == {
                n: "PASS" for n in DEFAULT_CHECKS if n not in CONTRACTS}, done.stdout
        else:  # hwcheck exits 1; the device script with its first failing step's status (nvidia-smi: 127)
            assert done.returncode == (1 if "agent.hwcheck" in argv else 127), (command, done.stdout, done.stderr)
            assert "NVML is not available" in checks["agent_start"]["detail"], command
            if "--mps" in argv:
                assert {"mps_shares", "mps_memory_cap", "mig_profiles"} <= set(checks)


# The reports of real GPUs kept from lent machines (``sh bench/device_check.sh --mps``), and the order every check
# of such a run comes in (a report of an older agent.hwcheck may lack a check added since: the H100's has no
# inventory_host_topology)
RECORDED_REPORTS = sorted((Path(__file__).parent / "data").glob("*_hwcheck_*.json"))
RECORDED_ORDER = (*DEFAULT_CHECKS[:-1], "mps_shares", "mps_memory_cap", "mig_profiles", "cleanup")


@pytest.mark.parametrize("path", RECORDED_REPORTS, ids=lambda path: path.name)
def test_recorded_real_gpu_reports_are_what_the_catalogue_the_sim_and_the_docs_say(path):
    """Each kept report passed on a real GPU with the nvml backend, and what it read is what the rest of the
    project says of that model: the catalogue's nameplate memory, the sim's recorded reservation, and
    docs/agent-protocol.md's "On a real ..." paragraph (its counts and memory figures, and the file's name)."""
    report = json.loads(path.read_text())
    checks = checks_of(report)
    assert (report["backend"], report["truth"], report["passed"]) == ("nvml", "nvidia-smi", True)
    assert list(checks) == [name for name in RECORDED_ORDER if name in checks]
    assert {c["status"] for c in checks.values()} <= {"PASS", "SKIP"}
    model = model_for_device_name(report["gpu"]["name"])
    assert model is not None and model.code == report["gpu"]["model"]
    total, reserved, usable = map(int, re.fullmatch(r"0: (\d+) - (\d+) = (\d+) MiB",
                                                    checks["inventory_memory_fields"]["detail"]).groups())
    assert (total - reserved, total, reserved) == (usable, model_get(model.code).memory_mib,
                                                   RECORDED_RESERVED_MIB[model.code])
    counts = {status: sum(c["status"] == status for c in checks.values()) for status in ("PASS", "FAIL", "SKIP")}
    doc = (ROOT / "docs" / "agent-protocol.md").read_text()
    paragraph = next(p for p in doc.split("\n\n")
                     if p.startswith("**On a real ") and path.name.split("_")[0] in p.lower() and path.name in p)
    assert (f"**{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in "
            f"{report['seconds']:.1f} s**") in paragraph.replace("\n", " ")
    assert f"{total:,} MiB total, {reserved} reserved" in paragraph.replace("\n", " ")
    if "inventory_host_topology" in checks:
        data = checks["inventory_host_topology"]["data"]
        assert (data["host_cpu_milli"], data["host_memory_mib"]) == (data["readings"]["cpu_milli"],
                                                                      data["readings"]["memory_mib"])
        assert f"{data['host_cpu_milli']:,} milli-CPU and {data['host_memory_mib']:,} MiB" in paragraph.replace(
            "\n", " ")
