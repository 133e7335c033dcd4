"""Workloads on leases, on a real agent process over signed HTTP: the process runtime runs real programs
(Python scripts) on exactly the leased devices; notices, deadlines, restarts, logs, kill -9 of the agent."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from agent.protocol import AgentClient, AgentHTTPError
from tests.support.agents import AgentProcess, gpu_of


def wait_for(predicate, timeout: float = 15.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


def final(client: AgentClient, workload_id: str, timeout: float = 15.0) -> dict:
    return wait_for(lambda: (w := client.workload(workload_id))["state"] not in ("running", "backoff") and w,
                    timeout)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def agent(tmp_path_factory, root):
    process = AgentProcess(tmp_path_factory.mktemp("agent"),
                           extra=("--workload-root", str(root), "--restart-backoff", "0.2")).start()
    yield process
    process.stop()


@pytest.fixture
def client(agent):
    client = agent.client(retries=0)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    return client


def mig_and_share(client: AgentClient, prefix: str) -> tuple[dict, dict]:
    inventory = client.inventory()
    mig = next(g for g in inventory["gpus"] if g["mode"] == "mig")["uuid"]
    shared = gpu_of(inventory, "L4", "shared")["uuid"]
    a = client.create(f"{prefix}-m", {"kind": "mig", "gpu": mig, "profile": "1g.10gb", "start": 0})
    b = client.create(f"{prefix}-s", {"kind": "share", "gpu": shared, "milli": 250, "memory_mib": 4096})
    return a, b


PRINT_ENV = ("import json, os; keys = ['CUDA_VISIBLE_DEVICES', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', "
             "'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', 'RESTART_COUNT', 'CHECKPOINT_DIR', 'GPUB_DEADLINE_FILE', 'PORT', "
             "'MY_SETTING']; print(json.dumps({k: os.environ.get(k) for k in keys} | "
             "{'pgid': os.getpgid(0), 'sid': os.getsid(0), 'ppid': os.getppid(), 'cwd': os.getcwd()}))")


def test_a_workload_sees_exactly_the_leased_devices_in_its_own_session(client, root):
    mig, share = mig_and_share(client, "env")
    (root / "ckpt-env").mkdir()
    (root / "work-env").mkdir()
    started = client.workload_start("wl-env", {
        "instances": ["env-m", "env-s"], "command": [sys.executable, "-c", PRINT_ENV], "env": {"MY_SETTING": "x"},
        "workdir": str(root / "work-env"), "checkpoint_dir": str(root / "ckpt-env"), "restart_count": 2,
        "port": 8888})
    assert started["state"] == "running" and started["argv"] == [sys.executable, "-c", PRINT_ENV]
    done = final(client, "wl-env")
    assert done["state"] == "succeeded" and done["runs"][0]["exit_code"] == 0
    logs = client.workload_logs("wl-env")["data"]
    seen = json.loads(logs.splitlines()[-1])
    assert seen["CUDA_VISIBLE_DEVICES"] == f"{mig['device_uuid']},{share['device_uuid']}"
    assert mig["device_uuid"].startswith("MIG-")
    assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25" and seen["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "1=4096M"
    assert seen["RESTART_COUNT"] == "2" and seen["CHECKPOINT_DIR"] == str(root / "ckpt-env")
    assert seen["PORT"] == "8888" and seen["MY_SETTING"] == "x" and seen["cwd"] == str(root / "work-env")
    run = done["runs"][0]
    assert seen["pgid"] == run["pid"] == seen["sid"] == seen["ppid"]  # the shim leads a new session and group
    assert [e["kind"] for e in done["events"]] == ["started", "exited", "succeeded"]
    assert done["log_bytes"]["stdout"] == len(logs.encode())


def test_the_same_definition_again_is_the_same_workload_another_is_a_conflict(client):
    mig_and_share(client, "idem")
    spec = {"instances": ["idem-m"], "command": [sys.executable, "-c", "import time; time.sleep(30)"]}
    first = client.workload_start("wl-idem", spec)
    again = client.workload_start("wl-idem", spec)
    assert again["runs"] == first["runs"] and len(again["runs"]) == 1
    with pytest.raises(AgentHTTPError) as refused:
        client.workload_start("wl-idem", {**spec, "args": ["other"]})
    assert refused.value.status == 409 and refused.value.problem["field"] == "workload_id"
    with pytest.raises(AgentHTTPError) as busy:  # one workload per instance
        client.workload_start("wl-idem-2", spec)
    assert busy.value.status == 409 and busy.value.problem["field"] == "instances[0]"
    stopped = client.workload_stop("wl-idem", grace_seconds=0, reason="test over")
    assert stopped["stop"]["reason"] == "test over"
    assert final(client, "wl-idem")["state"] == "stopped"


TRAP = """
import os, signal, sys, time
def term(signum, frame):
    # os.write, not print: the SIGTERM may come while the main code is still inside print("up")
    os.write(1, f"SIGTERM; deadline {open(os.environ['GPUB_DEADLINE_FILE']).read().strip()}\\n".encode())
    if sys.argv[1] == "graceful":
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("behaviour", ["graceful", "stubborn"])
def test_notice_sends_sigterm_with_the_deadline_and_sigkill_at_it(client, behaviour):
    mig_and_share(client, f"n{behaviour}")
    workload_id = f"wl-notice-{behaviour}"
    client.workload_start(workload_id, {"instances": [f"n{behaviour}-m"], "command": [sys.executable, "-c", TRAP],
                                        "args": [behaviour], "restart_policy": "on-failure"})
    wait_for(lambda: "up" in client.workload_logs(workload_id)["data"])
    deadline = time.time() + 1.5
    client.notice(f"n{behaviour}-m", deadline, "reclaimed for in-quota work")
    done = final(client, workload_id)
    assert done["state"] == "preempted" and len(done["runs"]) == 1  # never restarted locally after a notice
    log = client.workload_logs(workload_id)["data"]
    assert f"SIGTERM; deadline {deadline:.3f}" in log
    run = done["runs"][0]
    kinds = [e["kind"] for e in done["events"]]
    if behaviour == "graceful":
        assert run["exit_code"] == 0 and run["ended_at"] < deadline
        assert kinds == ["started", "notice", "signalled", "exited", "preempted"]
    else:
        assert run["signal"] == 9 and run["kill_at"] >= deadline and run["ended_at"] - deadline < 1.0
        assert kinds == ["started", "notice", "signalled", "killed", "exited", "preempted"]


def test_on_failure_restarts_with_back_off_up_to_the_limit(client):
    mig_and_share(client, "fail")
    script = "import os, sys; print('restart', os.environ['RESTART_COUNT'], flush=True); sys.exit(3)"
    client.workload_start("wl-fail", {"instances": ["fail-m"], "command": [sys.executable, "-c", script],
                                      "restart_policy": "on-failure", "max_restarts": 2})
    done = final(client, "wl-fail")
    assert done["state"] == "failed" and [r["exit_code"] for r in done["runs"]] == [3, 3, 3]
    assert [r["restart_count"] for r in done["runs"]] == [0, 1, 2] and done["restart_count"] == 2
    backoffs = [e["seconds"] for e in done["events"] if e["kind"] == "backoff"]
    assert backoffs == [0.2, 0.4]  # doubling from --restart-backoff
    gaps = [b["started_at"] - a["ended_at"] for a, b in zip(done["runs"], done["runs"][1:], strict=False)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4
    assert "restart 0\nrestart 1\nrestart 2" in "\n".join(
        line for line in client.workload_logs("wl-fail")["data"].splitlines() if not line.startswith("---"))


def test_a_plain_process_listens_on_its_host_port_and_two_live_workloads_never_share_one(client):
    mig_and_share(client, "hp")
    spec = {"command": [sys.executable, "-c", "import os, time; print('PORT', os.environ['PORT'], flush=True); "
                                               "time.sleep(30)"], "port": 8888, "host_port": 20111}
    client.workload_start("wl-hp-1", {**spec, "instances": ["hp-m"]})
    wait_for(lambda: "PORT 20111" in client.workload_logs("wl-hp-1")["data"])
    with pytest.raises(AgentHTTPError) as taken:
        client.workload_start("wl-hp-2", {**spec, "instances": ["hp-s"]})
    assert taken.value.status == 409 and taken.value.problem["field"] == "host_port"
    client.workload_stop("wl-hp-1", grace_seconds=0)
    final(client, "wl-hp-1")
    assert client.workload_start("wl-hp-2", {**spec, "instances": ["hp-s"]})["state"] == "running"  # free again
    client.workload_stop("wl-hp-2", grace_seconds=0)
    final(client, "wl-hp-2")


def test_destroying_the_instance_kills_its_workload(client):
    mig_and_share(client, "gone")
    client.workload_start("wl-gone", {"instances": ["gone-m"],
                                      "command": [sys.executable, "-c", "import time; time.sleep(60)"]})
    client.destroy("gone-m")
    done = final(client, "wl-gone")
    assert done["state"] == "stopped" and done["runs"][0]["signal"] == 9


def test_logs_by_offset_and_tail_bounded(client):
    mig_and_share(client, "logs")
    client.workload_start("wl-logs", {"instances": ["logs-m"],
                                      "command": [sys.executable, "-c", "print('x' * 100000); print('end')"]})
    final(client, "wl-logs")
    tail = client.workload_logs("wl-logs", tail=4)
    assert tail["data"] == "end\n" and tail["next_offset"] == tail["size"]
    head = client.workload_logs("wl-logs", offset=0, limit=1000)
    assert len(head["data"]) == 1000 and head["next_offset"] == 1000 and head["state"] == "succeeded"
    with pytest.raises(AgentHTTPError) as wrong:
        client.workload_logs("wl-logs", limit=10**7)
    assert wrong.value.problem["field"] == "limit"
    assert client.workload_logs("wl-logs", stream="stderr")["data"] == ""


CHATTY = """
import sys
for number in range(int(sys.argv[1])):
    print(f"line {number:07d} " + "x" * 80)
    if number % 1000 == 0:
        print(f"err {number}", file=sys.stderr)
print("end")
"""


def test_a_chatty_workloads_log_is_bounded_and_keeps_its_newest_bytes(tmp_path):
    """A workload printing ~9 MiB on an agent capped at 64 KiB per stream: the node holds at most 64 KiB of
    each stream, the newest bytes read back as a contiguous tail of what it printed, offsets count every
    byte it ever printed, and an offset in the dropped part reads from the first byte kept."""
    root = tmp_path / "shared"
    root.mkdir()
    cap = 64 * 1024
    agent = AgentProcess(tmp_path / "a", extra=("--workload-root", str(root),
                                                "--workload-log-max-bytes", str(cap))).start()
    try:
        client = agent.client(retries=0)
        mig = next(g for g in client.inventory()["gpus"] if g["mode"] == "mig")["uuid"]
        client.create("chat", {"kind": "mig", "gpu": mig, "profile": "1g.10gb", "start": 0})
        lines = 100_000
        client.workload_start("wl-chat", {"instances": ["chat"], "command": [sys.executable, "-c", CHATTY],
                                          "args": [str(lines)]})
        done = final(client, "wl-chat", timeout=60)
        assert done["state"] == "succeeded"
        printed = "".join(f"line {n:07d} " + "x" * 80 + "\n" for n in range(lines)) + "end\n"
        directory = tmp_path / "a" / "workloads" / "wl-chat"
        on_disk = sum(p.stat().st_size for p in directory.glob("stdout-*.log"))
        assert on_disk <= cap and len(list(directory.glob("stdout-*.log"))) <= 2
        assert sum(p.stat().st_size for p in directory.glob("stderr-*.log")) <= cap
        banner = client.workload_logs("wl-chat", offset=0, limit=1)
        size = banner["size"]
        assert size > len(printed) > 100 * cap  # every byte counted (the banner line too), few kept
        assert done["log_bytes"]["stdout"] == size
        assert banner["first_offset"] >= size - cap and banner["offset"] == banner["first_offset"] > 0
        kept, offset = "", banner["first_offset"]
        while offset < size:  # read the kept tail in pages: one contiguous piece of the output's end
            page = client.workload_logs("wl-chat", offset=offset, limit=16384)
            assert page["offset"] == offset
            kept, offset = kept + page["data"], page["next_offset"]
        assert len(kept) >= cap // 2 and printed.endswith(kept)
        assert kept.endswith("line 0099999 " + "x" * 80 + "\nend\n")
        assert client.workload_logs("wl-chat", tail=4)["data"] == "end\n"
        errors = client.workload_logs("wl-chat", stream="stderr", tail=100)["data"]
        assert errors.endswith("err 99000\n")
    finally:
        agent.stop()


@pytest.mark.parametrize(("change", "field"), [
    ({"command": []}, "command"),
    ({"command": None}, "command"),
    ({"checkpoint_dir": "/etc/cron.d"}, "checkpoint_dir"),
    ({"workdir": "relative/dir"}, "workdir"),
    ({"checkpoint_dir": "ROOT/../escape"}, "checkpoint_dir"),
    ({"env": {"BIG": "x" * 40000}}, "env"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
    ({"env": {"1BAD": "x"}}, "env.1BAD"),
    ({"restart_policy": "always"}, "restart_policy"),
    ({"max_restarts": 1000}, "max_restarts"),
    ({"port": 22}, "port"),
    ({"instances": []}, "instances"),
    ({"instances": ["nope"]}, "instances[0]"),
    ({"image": "nvcr.io/nvidia/pytorch:24.05-py3"}, "image"),  # this node runs processes, not containers
    ({"surprise": 1}, "surprise"),
])
def test_bad_definitions_are_refused_naming_the_field(client, root, change, field):
    mig_and_share(client, "bad")
    spec = {"instances": ["bad-m"], "command": [sys.executable, "-c", "pass"]}
    spec.update({k: (v.replace("ROOT", str(root)) if isinstance(v, str) else v) for k, v in change.items()})
    with pytest.raises(AgentHTTPError) as refused:
        client.workload_start("wl-bad", spec)
    assert refused.value.problem["field"] == field and refused.value.status in (404, 422)
    assert refused.value.problem["code"] in ("invalid", "not_found")
    with pytest.raises(AgentHTTPError) as missing:
        client.workload("wl-bad")
    assert missing.value.status == 404  # nothing was half-written


def test_workload_calls_are_signed_like_the_rest(agent, client):
    mig_and_share(client, "sig")
    forged = AgentClient(agent.url, agent.node_id, "not-the-secret", retries=0)
    for call in (lambda: forged.workloads(), lambda: forged.workload_logs("wl-env"),
                 lambda: forged.workload_start("wl-x", {"instances": ["sig-m"], "command": ["true"]}),
                 lambda: forged.workload_stop("wl-env")):
        with pytest.raises(AgentHTTPError) as refused:
            call()
        assert refused.value.status == 401
    assert "wl-x" not in {w["workload_id"] for w in client.workloads()}


COUNTER = """
import os, sys, time
marker = os.path.join(os.environ["CHECKPOINT_DIR"], "starts")
with open(marker, "a") as handle:
    handle.write(os.environ["GPUB_WORKLOAD_ID"] + "\\n")
stop_file = os.path.join(os.environ["CHECKPOINT_DIR"], "stop-" + os.environ["GPUB_WORKLOAD_ID"])
while not os.path.exists(stop_file):
    time.sleep(0.05)
sys.exit(int(sys.argv[1]))
"""


def test_kill_9_of_the_agent_finds_its_workloads_and_runs_none_twice(tmp_path):
    shared = tmp_path / "shared"
    root = shared / "checkpoints"  # the workloads' own directory (an isolated workload may not write in a root)
    shared.mkdir()
    agent = AgentProcess(tmp_path / "a", extra=("--workload-root", str(shared))).start()
    try:
        client = agent.client(retries=0)
        mig = next(g for g in client.inventory()["gpus"] if g["mode"] == "mig")["uuid"]
        for name, start in (("keeps", 0), ("ends", 4)):
            client.create(name, {"kind": "mig", "gpu": mig, "profile": "3g.40gb", "start": start})
            client.workload_start(f"wl-{name}", {"instances": [name], "command": [sys.executable, "-c", COUNTER],
                                                 "args": ["7"], "checkpoint_dir": str(root),
                                                 "restart_policy": "on-failure", "max_restarts": 0})
        wait_for(lambda: len((root / "starts").read_text().split()) == 2 if (root / "starts").exists() else False)
        before = {w["workload_id"]: w["runs"][0]["pid"] for w in client.workloads()}
        agent.kill9()
        (root / "stop-wl-ends").touch()  # this one exits with 7 while no agent is there
        wait_for(lambda: not Path(f"/proc/{before['wl-ends']}").exists() or
                 Path(f"/proc/{before['wl-ends']}/stat").read_text().split()[2] == "Z")
        agent.start()
        keeps, ends = client.workload("wl-keeps"), final(client, "wl-ends")
        assert keeps["state"] == "running" and [r["pid"] for r in keeps["runs"]] == [before["wl-keeps"]]
        assert ends["state"] == "failed" and ends["runs"][0]["exit_code"] == 7 and len(ends["runs"]) == 1
        (root / "stop-wl-keeps").touch()
        keeps = final(client, "wl-keeps")
        assert keeps["state"] == "failed" and keeps["runs"][0]["exit_code"] == 7 and len(keeps["runs"]) == 1
        assert sorted((root / "starts").read_text().split()) == ["wl-ends", "wl-keeps"]  # no run started twice
    finally:
        agent.stop()


DUMP_ENV = ("import json, os; print(json.dumps(dict(os.environ)), flush=True); "
            "raise SystemExit(1 if os.environ['RESTART_COUNT'] == '0' else 0)")
PLANTED = "planted-hf-token-value-7f3a9c"


def test_secret_env_reaches_the_workload_only_and_holds_no_token_of_the_node(tmp_path, root):
    """``secret_env`` (issue 27): the workload's environment has the value, also after a restart, while the
    state file, every answer and the agent's log have its name at most; the node's own secret and any API
    token are nowhere in the workload's environment."""
    from tests.support.agents import SECRET

    agent = AgentProcess(tmp_path / "agent", extra=("--workload-root", str(root), "--restart-backoff", "0.2",
                                                    "--log-level", "INFO")).start()
    try:
        client = agent.client(retries=0)
        mig_and_share(client, "sec")
        spec = {"instances": ["sec-m"], "command": [sys.executable, "-c", DUMP_ENV], "env": {"MODE": "offline"},
                "secret_env": {"HF_TOKEN": PLANTED}, "restart_policy": "on-failure", "max_restarts": 1}
        started = client.workload_start("wl-sec", spec)
        assert started["spec"]["secret_env"] == ["HF_TOKEN"]
        done = final(client, "wl-sec")
        assert done["state"] == "succeeded" and len(done["runs"]) == 2  # the restart read the secret again
        runs = [json.loads(line) for line in client.workload_logs("wl-sec")["data"].splitlines()
                if line.startswith("{")]
        assert [env["HF_TOKEN"] for env in runs] == [PLANTED, PLANTED]
        for env in runs:
            text = json.dumps(env)
            assert SECRET not in text and "gpub_" not in text  # no node secret, no API token of any tenant
            assert set(env) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "TZ", "MODE", "HF_TOKEN",
                                "CUDA_VISIBLE_DEVICES", "RESTART_COUNT", "GPUB_WORKLOAD_ID", "GPUB_RUN_TOKEN",
                                "GPUB_DEADLINE_FILE", "GPUBROKER_UNITS",
                                "GPUBROKER_UNITS_FILE", "LC_CTYPE", "LD_LIBRARY_PATH"}, sorted(env)
        # the same definition again is the same workload; other secrets are another definition
        assert client.workload_start("wl-sec", spec)["runs"] == done["runs"]
        with pytest.raises(AgentHTTPError) as refused:
            client.workload_start("wl-sec", {**spec, "secret_env": {"HF_TOKEN": "other"}})
        assert refused.value.status == 409
        answers = json.dumps([client.workload("wl-sec"), client.workloads(), started])
        state = (agent.state_dir / "workloads.json").read_text()
        secret_file = agent.state_dir / "workloads" / "wl-sec" / "secret_env.json"
        assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    finally:
        agent.stop()
    logged = agent.process.stderr.read().decode() + agent.process.stdout.read().decode()
    assert "wl-sec" in logged  # the agent logged the start, not the value
    for where, text in (("answers", answers), ("state file", state), ("log", logged)):
        assert PLANTED not in text, where


def test_a_path_through_a_symbolic_link_out_of_the_workloads_scope_is_refused(client, root):
    """Issue 27, item 4: the broker scopes paths to <root>/<tenant>/<project> (``scope``); the node checks
    them with links resolved, so a link a workload left in its own directory leads nowhere else."""
    mig_and_share(client, "lnk")
    (root / "acme" / "vision").mkdir(parents=True)
    (root / "globex" / "secret").mkdir(parents=True)
    (root / "acme" / "vision" / "escape").symlink_to(root / "globex" / "secret")
    spec = {"instances": ["lnk-m"], "command": [sys.executable, "-c", "pass"], "scope": "acme/vision"}
    for field, path in (("workdir", root / "acme" / "vision" / "escape"),
                        ("checkpoint_dir", root / "acme" / "vision" / "escape" / "ckpt"),
                        ("workdir", root / "globex" / "secret"), ("workdir", root), ("workdir", root / "acme")):
        with pytest.raises(AgentHTTPError) as refused:
            client.workload_start("wl-lnk", {**spec, field: str(path)})
        assert refused.value.status == 422 and refused.value.problem["field"] == field, path
    ok = client.workload_start("wl-lnk", {**spec, "workdir": str(root / "acme" / "vision")})
    assert final(client, "wl-lnk")["state"] == "succeeded" and ok["spec"]["scope"] == "acme/vision"


# -- issue 28, defect 4 (each failed on the agent before it) ------------------------------------------
def test_stop_writes_the_deadline_file_as_a_notice_does(client):
    trap = ("import os, signal, sys, time\n"
            "def term(signum, frame):\n"
            "    os.write(1, ('deadline ' + open(os.environ['GPUB_DEADLINE_FILE']).read().strip() + '\\n').encode())\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\n"
            "print('up', flush=True)\n"
            "while True: time.sleep(0.05)\n")
    mig_and_share(client, "dl")
    client.workload_start("wl-dl", {"instances": ["dl-m"], "command": [sys.executable, "-c", trap]})
    wait_for(lambda: "up" in client.workload_logs("wl-dl")["data"])
    stopped = client.workload_stop("wl-dl", grace_seconds=5, reason="lease ended")
    done = final(client, "wl-dl")
    assert done["state"] == "stopped" and done["runs"][0]["exit_code"] == 0
    assert f"deadline {stopped['stop']['kill_at']:.3f}" in client.workload_logs("wl-dl")["data"]


def test_ld_library_path_reaches_a_process_workload(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64")
    agent = AgentProcess(tmp_path / "a").start()
    try:
        client = agent.client(retries=0)
        mig_and_share(client, "ld")
        client.workload_start("wl-ld", {"instances": ["ld-m"], "command": [
            sys.executable, "-c", "import os; print(os.environ.get('LD_LIBRARY_PATH'))"]})
        assert final(client, "wl-ld")["state"] == "succeeded"
        assert client.workload_logs("wl-ld")["data"].splitlines()[-1] == "/usr/local/cuda/lib64"
    finally:
        agent.stop()


SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def test_a_workload_ending_and_one_adopted_after_a_restart_are_logged(tmp_path):
    agent = AgentProcess(tmp_path / "a", extra=("--log-level", "INFO")).start()
    try:
        client = agent.client(retries=0)
        mig_and_share(client, "lg")
        client.workload_start("wl-short", {"instances": ["lg-m"],
                                           "command": [sys.executable, "-c", "raise SystemExit(3)"]})
        assert final(client, "wl-short")["state"] == "failed"
        client.workload_start("wl-long", {"instances": ["lg-s"], "command": [sys.executable, "-c", SLEEPER]})
        wait_for(lambda: "up" in client.workload_logs("wl-long")["data"])
        agent.kill9()
        first = agent.process.stderr.read().decode()
        agent.start()
        client.workload_stop("wl-long", grace_seconds=0)
        pid = final(client, "wl-long")["runs"][0]["pid"]
    finally:
        agent.stop()
    second = agent.process.stderr.read().decode()
    assert "workload wl-short ended: failed" in first and "last exit code 3" in first
    assert f"adopted workload wl-long: run 1 still running, pid {pid}" in second
    assert "workload wl-long ended: stopped" in second


LOOPBACK_PAGE = ("import http.server, os\n"
                 "class Page(http.server.BaseHTTPRequestHandler):\n"
                 "    def do_GET(self):\n"
                 "        body = (self.path + ' ' + str(self.headers.get('X-Gpub-Signature'))).encode()\n"
                 "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
                 "server = http.server.HTTPServer((os.environ['GPUB_LISTEN_HOST'], int(os.environ['PORT'])), Page)\n"
                 "print('on', os.environ['GPUB_LISTEN_HOST'], os.environ['PORT'], flush=True)  # once it listens\n"
                 "server.serve_forever()\n")


def test_the_port_relay_reaches_a_running_workload_on_loopback_signed_only(client, agent):
    """``/v1/workloads/{id}/port/...``: the signed relay to the workload's loopback port (docs/agent-protocol.md); a
    workload without a port is 404, one whose port has no listener 503, a stopped one 409, unsigned 401."""
    import requests

    from agent.protocol import AgentUnreachable
    from tests.support.processes import free_port

    mig_and_share(client, "relay")
    host_port = free_port()
    client.workload_start("wl-relay", {"instances": ["relay-m"], "command": [sys.executable, "-c", LOOPBACK_PAGE],
                                       "port": 8888, "host_port": host_port})
    wait_for(lambda: f"on 127.0.0.1 {host_port}" in client.workload_logs("wl-relay")["data"])
    # the path and query go on as sent; the broker's signature does not reach the workload
    assert client.request("GET", "/v1/workloads/wl-relay/port/tree/a%20b?x=1", raw=True) == "/tree/a%20b?x=1 None"
    unsigned = requests.get(f"{agent.url}/v1/workloads/wl-relay/port/", timeout=10)
    assert unsigned.status_code == 401
    client.workload_start("wl-quiet", {"instances": ["relay-s"], "port": 8888, "host_port": free_port(),
                                       "command": [sys.executable, "-c", "import time; time.sleep(30)"]})
    with pytest.raises(AgentUnreachable) as silent:  # the client's name for a 5xx
        client.request("GET", "/v1/workloads/wl-quiet/port/")
    assert ": 503 " in str(silent.value) and "does not answer" in str(silent.value)
    client.workload_stop("wl-relay", grace_seconds=0)
    final(client, "wl-relay")
    with pytest.raises(AgentHTTPError) as stopped:
        client.request("GET", "/v1/workloads/wl-relay/port/")
    assert stopped.value.status == 409 and stopped.value.problem["field"] == "port"
    client.workload_stop("wl-quiet", grace_seconds=0)
    final(client, "wl-quiet")
    client.workload_start("wl-portless", {"instances": ["relay-m"], "command": [sys.executable, "-c",
                                                                                "import time; time.sleep(30)"]})
    with pytest.raises(AgentHTTPError) as portless:
        client.request("GET", "/v1/workloads/wl-portless/port/")
    assert portless.value.status == 404 and portless.value.problem["field"] == "port"
    client.workload_stop("wl-portless", grace_seconds=0)
    final(client, "wl-portless")


def test_an_elastic_workload_given_one_instance_back_keeps_running_told_its_new_size(client):
    """Issue 32 item 6: ``DELETE /v1/instances/{id}?resize=1`` on one of a workload's two instances: the workload is
    not stopped; its units file holds its new size and devices and it gets SIGUSR1 (a plain destroy stops it)."""
    trap = ("import json, os, signal, time\n"
            "def usr1(signum, frame):\n"
            "    os.write(1, ('resized ' + open(os.environ['GPUBROKER_UNITS_FILE']).read().strip() + '\\n').encode())\n"
            "signal.signal(signal.SIGUSR1, usr1)\n"
            "print('up', os.environ['GPUBROKER_UNITS'], flush=True)\n"
            "while True: time.sleep(0.05)\n")
    mig, _share = mig_and_share(client, "el")
    client.workload_start("wl-el", {"instances": ["el-m", "el-s"], "command": [sys.executable, "-c", trap]})
    wait_for(lambda: "up 2" in client.workload_logs("wl-el")["data"])
    client.destroy("el-s", resize=True)
    line = wait_for(lambda: next((x for x in client.workload_logs("wl-el")["data"].splitlines()
                                  if x.startswith("resized ")), None))
    told = json.loads(line.removeprefix("resized "))
    assert told["units"] == 1 and told["devices"] == [mig["device_uuid"]]
    workload = client.workload("wl-el")
    assert workload["state"] == "running" and "resized" in [e["kind"] for e in workload["events"]]
    client.destroy("el-m")  # the last one, destroyed plainly: the workload stops
    assert final(client, "wl-el")["state"] == "stopped"


def test_an_elastic_workload_that_takes_units_back_is_told_its_new_size(client):
    """Issue 32 item 6: ``POST /v1/workloads/{id}/grow`` with an instance of the node: it joins the workload's devices,
    the units file holds the new size and devices, SIGUSR1; an instance the node lacks, or one another workload
    runs on, is refused naming it, nothing changed."""
    trap = ("import json, os, signal, time\n"
            "def usr1(signum, frame):\n"
            "    os.write(1, ('resized ' + open(os.environ['GPUBROKER_UNITS_FILE']).read().strip() + '\\n').encode())\n"
            "signal.signal(signal.SIGUSR1, usr1)\n"
            "print('up', os.environ['GPUBROKER_UNITS'], flush=True)\n"
            "while True: time.sleep(0.05)\n")
    mig, share = mig_and_share(client, "gr")
    client.workload_start("wl-gr", {"instances": ["gr-m"], "command": [sys.executable, "-c", trap]})
    wait_for(lambda: "up 1" in client.workload_logs("wl-gr")["data"])
    with pytest.raises(AgentHTTPError) as missing:
        client.workload_grow("wl-gr", ["gr-none"])
    assert missing.value.status == 404 and missing.value.problem["field"] == "instances[0]"
    with pytest.raises(AgentHTTPError) as bad:
        client.request("POST", "/v1/workloads/wl-gr/grow", {"instances": "gr-s"})
    assert bad.value.status == 422 and bad.value.problem["field"] == "instances"
    grown = client.workload_grow("wl-gr", ["gr-s"])
    assert [d["allocation_id"] for d in grown["devices"]] == ["gr-m", "gr-s"]
    line = wait_for(lambda: next((x for x in client.workload_logs("wl-gr")["data"].splitlines()
                                  if x.startswith("resized ")), None))
    told = json.loads(line.removeprefix("resized "))
    assert told["units"] == 2 and told["devices"] == [mig["device_uuid"], share["device_uuid"]]
    with pytest.raises(AgentHTTPError) as taken:  # already its own
        client.workload_grow("wl-gr", ["gr-s"])
    assert taken.value.status == 409 and taken.value.problem["field"] == "instances[0]"
    client.workload_stop("wl-gr", grace_seconds=0)
    final(client, "wl-gr")
