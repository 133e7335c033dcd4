"""``python -m agent.nvml_check``: print what NVML sees on this node, as JSON, changing nothing.

The inventory comes from an ``NvmlBackend`` with MIG changes off and a throw-away state directory, plus one
``readings()`` sample and the driver and NVML versions. Exit status 2, with the reason on stderr, when NVML
is not available (no driver, no library, no nvidia-ml-py).
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.nvml_backend import NvmlBackend
from agent.protocol import AgentError


def main(argv: list[str] | None = None, *, nvml: Any = None) -> int:
    with tempfile.TemporaryDirectory(prefix="nvml-check-") as state_dir:
        try:
            backend = NvmlBackend(Path(state_dir), socket.gethostname(), allow_mig_changes=False, nvml=nvml)
        except AgentError as error:
            print(error.message, file=sys.stderr)
            return 2
        try:
            report = {
                "hostname": backend.hostname,
                **backend.versions(),
                "inventory": backend.inventory(),
                "readings": backend.readings(time.time()).to_json(),
            }
        except AgentError as error:
            print(error.message, file=sys.stderr)
            return 2
        finally:
            backend.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
