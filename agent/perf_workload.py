"""The process a profiling lease runs on a simulated node: it stands for the performance model's workload (the
lease's ``workload.perf``) and reports that workload's own throughput to the broker, as a real workload would
with one small API call (``POST /api/v1/leases/{id}/samples``; docs/tiering.md, "The profiler").

Environment: ``GPUB_PERF_THROUGHPUT`` (set by the simulated agent: the model's throughput on the leased slice,
0 when the workload does not fit), ``GPUB_WORKLOAD_ID`` (``lease-<lease>-a<allocation>``, set by the agent),
``PERF_SAMPLES_URL`` (the broker's samples URL with ``{lease}`` where the lease id goes), ``PERF_TOKEN`` (in the
workload's ``secret_env``: the profiler's samples credential, good for this lease's samples only, or a tenant's own
API token when the tenant runs it), ``PERF_INTERVAL_SECONDS`` (default 1) and ``PERF_NOISE`` (σ of the log-normal
run-to-run noise of each sample, default 0.02). A workload that does not fit exits 1 with an out-of-memory message; the
others report until SIGTERM and exit 0. Standard library only: it runs with any Python on the node.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    throughput = float(os.environ.get("GPUB_PERF_THROUGHPUT", "0"))
    match = re.match(r"^lease-(\d+)-a\d+$", os.environ.get("GPUB_WORKLOAD_ID", ""))
    url = os.environ.get("PERF_SAMPLES_URL", "")
    token = os.environ.get("PERF_TOKEN", "")
    interval = float(os.environ.get("PERF_INTERVAL_SECONDS", "1"))
    noise = float(os.environ.get("PERF_NOISE", "0.02"))
    if throughput <= 0:
        print("RuntimeError: CUDA out of memory (the workload does not fit this slice)", file=sys.stderr)
        return 1
    if not match or "{lease}" not in url or not token:
        print("perf_workload: GPUB_WORKLOAD_ID, PERF_SAMPLES_URL with {lease} and PERF_TOKEN are needed",
              file=sys.stderr)
        return 2
    target = url.replace("{lease}", match.group(1))
    if not target.startswith(("http://", "https://")):
        print("perf_workload: PERF_SAMPLES_URL must be http(s)", file=sys.stderr)
        return 2
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    rng = random.Random()
    while not stopping:
        value = throughput * math.exp(rng.gauss(0, noise))
        named = {"workload": os.environ["PERF_WORKLOAD"]} if os.environ.get("PERF_WORKLOAD") else {}
        body = json.dumps({"throughput": round(value, 4), **named}).encode()
        request = urllib.request.Request(target, data=body, method="POST", headers={  # noqa: S310 (http(s) only)
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                print(f"sample {value:.1f}/s -> {answer.status}", flush=True)
        except urllib.error.HTTPError as error:
            print(f"sample refused: {error.code} {error.read()[:200]!r}", file=sys.stderr, flush=True)
            if error.code in (401, 403, 404):
                return 0  # the lease or the token is gone: the profiling window is over
        except OSError as error:
            print(f"sample not sent: {error}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + interval
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
