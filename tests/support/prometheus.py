"""A real Prometheus server on 127.0.0.1: history backfilled with promtool, or live scraping.

Each server scrapes itself every second (so ``up`` always has a fresh sample, as on any real Prometheus) plus the
targets a test gives it; it runs as a child process stopped by its own PID (``core.processes``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from core import processes
from core.processes import free_port, wait_http
from tests.real_parts import PROMETHEUS_AND_PROMTOOL

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = PROMETHEUS_AND_PROMTOOL  # skipped locally where missing, failed in CI (tests/real_parts.py)


class PrometheusServer:
    """``prometheus`` on 127.0.0.1 with its TSDB in ``directory/tsdb``; ``stop`` and ``start`` again keep
    the data and the port."""

    def __init__(self, directory: Path, *, targets: tuple[str, ...] = (), file_sd: Path | None = None):
        self.directory = directory
        self.file_sd = file_sd  # a fleet's prometheus-targets.json (agent.fleet)
        self.data = directory / "tsdb"
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.targets = targets
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def backfill(self, openmetrics: str) -> None:
        """History through ``promtool tsdb create-blocks-from openmetrics`` (before ``start``)."""
        source = self.directory / "history.om"
        source.write_text(openmetrics)
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.data)],
                       check=True, capture_output=True, timeout=120)

    def _config(self) -> Path:
        jobs = [{"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]}]
        if self.targets:
            jobs.append({"job_name": "gpu-agents", "static_configs": [{"targets": list(self.targets)}]})
        if self.file_sd:
            jobs.append({"job_name": "gpu-fleet", "file_sd_configs": [{"files": [str(self.file_sd)],
                                                                         "refresh_interval": "1s"}]})
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
        path = self.directory / "prometheus.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def start(self) -> PrometheusServer:
        self.process = processes.start(
            [PROMETHEUS, f"--config.file={self._config()}", f"--storage.tsdb.path={self.data}",
             "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{self.port}"],
            cwd=None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_http(f"{self.url}/-/ready", self.process, timeout=30)
        self.wait_for("up", timeout=30)  # the first scrape: data is fresh from here on
        return self

    def stop(self) -> None:
        processes.stop(self.process, timeout=20)

    def query(self, expression: str, at: float | None = None) -> list:
        params = {"query": expression, **({"time": f"{at:.3f}"} if at is not None else {})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params), timeout=5) as answer:
            return json.loads(answer.read())["data"]["result"]

    def wait_for(self, expression: str, predicate=bool, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expression)
            if predicate(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"{expression!r} did not come true within {timeout} s")
