"""Where the client finds its server and token (gpubroker_client/config.py): the environment first, then the
config file, which is refused while others may read it; the token is never shown."""

from __future__ import annotations

import io

import pytest

from gpubroker_client import Client, ConfigError, config_path, load_config
from gpubroker_client.cli import main


def _write(path, text: str, mode: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_config_environment_wins_over_the_file(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    _write(tmp_path / "gpubroker" / "config.toml", 'url = "http://files.example:9/"\ntoken = "gpub_file"\n', 0o600)
    assert config_path(env) == tmp_path / "gpubroker" / "config.toml"
    from_file = load_config(env)
    assert (from_file.url, from_file.token) == ("http://files.example:9", "gpub_file")
    both = load_config({**env, "GPUBROKER_URL": "http://env.example:8", "GPUBROKER_TOKEN": "gpub_env"})
    assert (both.url, both.token) == ("http://env.example:8", "gpub_env")
    assert "gpub_env" not in repr(both) and "gpub_env" not in repr(Client(both.url, both.token))


def test_config_refuses_a_file_others_may_read(tmp_path):
    path = _write(tmp_path / "c.toml", 'token = "gpub_secret"\n', 0o644)
    with pytest.raises(ConfigError, match=r"mode 0644.*chmod 600") as error:
        load_config({"GPUBROKER_CONFIG": str(path)})
    assert "gpub_secret" not in str(error.value)
    path.chmod(0o600)
    assert load_config({"GPUBROKER_CONFIG": str(path)}).token == "gpub_secret"


@pytest.mark.parametrize(("text", "message"), [
    ('token = "a"\nurl = 5\n', "url must be a string"),
    ('tokn = "a"\n', "unknown key"),
    ("token = ", "cannot be read"),
])
def test_config_bad_files_are_named(tmp_path, text, message):
    path = _write(tmp_path / "c.toml", text, 0o600)
    with pytest.raises(ConfigError, match=message):
        load_config({"GPUBROKER_CONFIG": str(path)})


def test_config_no_token_is_a_usage_error_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBROKER_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("GPUBROKER_TOKEN", raising=False)
    err = io.StringIO()
    assert main(["lease", "list"], out=io.StringIO(), err=err) == 2
    assert "No API token: set GPUBROKER_TOKEN" in err.getvalue()


def test_cli_unreachable_server_and_bad_shorthand(tmp_path, monkeypatch):
    from tests.support.processes import free_port

    monkeypatch.setenv("GPUBROKER_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("GPUBROKER_TOKEN", "gpub_x")
    err = io.StringIO()
    assert main(["lease", "list"], out=io.StringIO(), err=err) == 3
    assert "cannot be reached" in err.getvalue() and "gpub_x" not in err.getvalue()
    err = io.StringIO()
    assert main(["quote", "--project", "p", "--gpu", "mig"], out=io.StringIO(), err=err) == 2
    assert "--gpu 'mig': expected mig:<profile>" in err.getvalue()
