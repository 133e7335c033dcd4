"""The GPU broker's Python SDK and command-line client (``gpubroker``): a thin, typed layer over the REST API
(``/api/v1/``), standalone (``requests`` and the standard library; it imports nothing of the server).

    from gpubroker_client import Client
    client = Client.from_config()              # GPUBROKER_URL / GPUBROKER_TOKEN or ~/.config/gpubroker/config.toml
    lease = client.lease_request(project="vision", gpu={"kind": "mig", "profile": "1g.10gb"})
    client.lease_release(lease["id"])

Errors come back as ``ApiError`` built from the server's problem+json (status, code, the field that was wrong).
docs/cli.md is the manual.
"""

from gpubroker_client.client import ApiError, Client, Page, operations
from gpubroker_client.config import Config, ConfigError, config_path, load_config

__all__ = ["ApiError", "Client", "Config", "ConfigError", "Page", "config_path", "load_config", "operations"]
