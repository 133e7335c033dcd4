"""Configuration, secrets and back-off of ``python -m agent``."""

import subprocess
import sys

import pytest

from agent.daemon import AgentConfig, backoff_delay, load_config, resolve_secret, stored_secret
from tests.support.processes import ROOT


def test_config_file_with_flags_winning(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('node_id = "gpu-7"\nlisten = "127.0.0.1:9500"\nbackend = "sim"\ngpus = "l4:2:shared"\n')
    config = load_config(str(path), {"listen": "127.0.0.1:9600", "gpus": None})
    assert (config.node_id, config.listen, config.gpus) == ("gpu-7", "127.0.0.1:9600", "l4:2:shared")
    assert config.advertise_url == "http://127.0.0.1:9600" and config.hostname


@pytest.mark.parametrize(("text", "words"), [
    ('node_id = "n"\ncolour = "red"\n', "unknown setting 'colour'"),
    ('listen = "127.0.0.1:1"\n', "node_id is required"),
    ('node_id = "n"\nbackend = "cuda"\n', "backend must be sim or nvml"),
    ('node_id = "n"\nlisten = "9400"\n', "listen must be HOST:PORT"),
    ('node_id = "n"\nbroker_url = "ftp://x"\n', "broker_url must be http"),
    ('node_id = "n"\nnvlink_domain_size = 65\n', "nvlink_domain_size must be an integer -1..64"),
    ('node_id = "n"\nhost_cpu_milli = -1\n', "host_cpu_milli must be an integer"),
    ('node_id = "n"\nbackend = "nvml"\nhost_memory_mib = 1024\n', "a real node reports its own"),
    ('node_id = "n"\nshrink_grace_seconds = -1\n', "shrink_grace_seconds must be a number of seconds 0..3600"),
    ('node_id = "n"\nshrink_grace_seconds = "soon"\n', "shrink_grace_seconds must be a number"),
])
def test_bad_configuration_is_named(tmp_path, text, words):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=words):
        load_config(str(path), {})


def test_shrink_grace_reaches_the_workload_manager(tmp_path):
    """``shrink_grace_seconds`` (``--shrink-grace-seconds``): how long a device an elastic lease gave back may stay
    open before its holders are killed (agent.workloads ``_revoke``); 10 s unless configured."""
    from agent.daemon import build_workloads

    assert load_config(None, {"node_id": "n"}).shrink_grace_seconds == 10.0
    config = load_config(None, {"node_id": "n", "shrink_grace_seconds": 2.5, "isolation": "none"})
    manager = build_workloads(config, tmp_path)
    assert manager.shrink_grace_seconds == 2.5 and manager.gpu_processes is None


def test_the_command_refuses_bad_input_with_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agent", "--node-id", "n", "--gpus", "b200:8",
                             "--state-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "unknown GPU model" in result.stderr


def test_secrets_configured_stored_or_made_once(tmp_path):
    assert resolve_secret(AgentConfig(node_id="n", secret="fixed").validate(), tmp_path) == "fixed"
    made = resolve_secret(AgentConfig(node_id="n").validate(), tmp_path)
    assert made and stored_secret(tmp_path) == made
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert resolve_secret(AgentConfig(node_id="n").validate(), tmp_path) == made  # kept across restarts
    enrolling = AgentConfig(node_id="m", broker_url="http://127.0.0.1:1", enrollment_token="t").validate()
    assert resolve_secret(enrolling, tmp_path / "fresh") == ""  # the broker will give it
    with pytest.raises(ValueError, match="enrollment_token"):
        resolve_secret(AgentConfig(node_id="m", broker_url="http://127.0.0.1:1").validate(), tmp_path / "other")


def test_backoff_grows_with_jitter_and_is_capped():
    for failures, (low, high) in {1: (0.5, 1), 2: (1, 2), 4: (4, 8), 20: (30, 60)}.items():
        delays = [backoff_delay(failures) for _ in range(200)]
        assert all(low <= d <= high for d in delays) and len(set(delays)) > 1


def test_sim_topology_and_host_from_the_configuration(tmp_path):
    """``nvlink_domain_size`` and the host's CPU and memory reach the simulated backend (TOML or flags)."""
    from agent.daemon import build_backend

    path = tmp_path / "agent.toml"
    path.write_text('node_id = "hgx"\ngpus = "h100-80gb:8:whole"\nnvlink_domain_size = 4\nhost_cpu_milli = 96000\n')
    config = load_config(str(path), {"host_memory_mib": 1_048_576})
    backend = build_backend(config, tmp_path / "state")
    assert [g["nvlink_domain"] for g in backend.inventory()["gpus"]] == ["nvl0"] * 4 + ["nvl1"] * 4
    assert backend.host() == {"cpu_milli": 96_000, "memory_mib": 1_048_576}
    default = build_backend(load_config(None, {"node_id": "pcie", "gpus": "l4:2"}), tmp_path / "pcie")
    assert [g["nvlink_domain"] for g in default.inventory()["gpus"]] == ["", ""]  # a PCIe model: no NVLink
