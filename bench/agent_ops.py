"""Node agent benchmarks: create/delete operations per second on one agent, and the fleet's scrape time.

    .venv/bin/python bench/agent_ops.py ops --seconds 10 [--threads 1,4]        # -> bench/results/agent_ops.json
    .venv/bin/python bench/agent_ops.py scrape --nodes 1000 [--prometheus-seconds 60]  # -> agent_scrape.json
    (``--quick`` on either: a smoke run of a few seconds)

``ops``: one simulated agent process (8 x H100 in MIG mode) on loopback; clients sign every request like
the broker does and cycle create (1g.10gb at a free slot) / delete. Each create is persisted (fsync)
before it is answered. Prints operations per second and latency percentiles.

``scrape``: a fleet process with N simulated nodes (8 x H100 MIG each, one 1g instance per GPU so every
metric family is present); first every node's ``/metrics`` fetched once in sequence from here (the time
for one full pass), then, where Debian's ``prometheus`` is installed, a real Prometheus scraping every
node each 15 s for ``--prometheus-seconds``, reporting its own ``scrape_duration_seconds`` and whether
every target is up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.protocol import AgentClient  # noqa: E402
from bench.record import write  # noqa: E402
from core import processes  # noqa: E402
from core.processes import free_port, wait_http  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_ops(seconds: float, threads: list[int]) -> dict:
    figures: dict = {"runs": []}
    with tempfile.TemporaryDirectory() as state:
        port = free_port()
        secret = "bench-secret"
        process = processes.start(
            [sys.executable, "-m", "agent", "--node-id", "bench", "--listen", f"127.0.0.1:{port}", "--state-dir",
             state, "--gpus", "h100-80gb:8:mig", "--secret", secret, "--log-level", "WARNING"], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", process)
            url = f"http://127.0.0.1:{port}"
            gpus = [g["uuid"] for g in AgentClient(url, "bench", secret).inventory()["gpus"]]
            for count in threads:
                latencies: list[float] = []
                stop = time.monotonic() + seconds
                lock = threading.Lock()

                def worker(number: int, count=count, stop=stop, lock=lock, latencies=latencies) -> None:
                    client = AgentClient(url, "bench", secret, retries=0)
                    slot = 0
                    while time.monotonic() < stop:
                        gpu = gpus[number % len(gpus)]
                        allocation = f"b{number}-{slot}"
                        started = time.perf_counter()
                        client.create(allocation, {"kind": "mig", "gpu": gpu, "profile": "1g.10gb",
                                                   "start": number // len(gpus) % 7})
                        middle = time.perf_counter()
                        client.destroy(allocation)
                        ended = time.perf_counter()
                        with lock:
                            latencies.extend((middle - started, ended - middle))
                        slot += 1

                started = time.monotonic()
                pool = [threading.Thread(target=worker, args=(n,)) for n in range(count)]
                for thread in pool:
                    thread.start()
                for thread in pool:
                    thread.join()
                elapsed = time.monotonic() - started
                figures["runs"].append({
                    "client_threads": count, "seconds": round(elapsed, 2), "operations": len(latencies),
                    "operations_per_second": round(len(latencies) / elapsed, 1),
                    "p50_ms": round(statistics.median(latencies) * 1000, 2),
                    "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2)})
                print(f"one agent, {count} client thread(s): {len(latencies) / elapsed:,.0f} create+delete operations/s"
                      f" over {elapsed:.1f} s; latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
                      f"p99 {_percentile(latencies, 0.99) * 1000:.1f} ms")
        finally:
            processes.stop(process, timeout=20)
    return figures


def bench_scrape(nodes: int, prometheus_seconds: float) -> dict:
    figures: dict = {"nodes": nodes, "gpus": nodes * 8}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        port = free_port()
        started = time.monotonic()
        fleet = processes.start(
            [sys.executable, "-m", "agent.fleet", "--nodes", str(nodes), "--listen", f"127.0.0.1:{port}",
             "--state-dir", str(folder / "fleet"), "--shape", "h100-80gb:8:mig", "--log-level", "WARNING"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        prometheus = None
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", fleet, timeout=300)
            figures["listening_after_seconds"] = round(time.monotonic() - started, 2)
            print(f"fleet of {nodes} nodes ({nodes * 8} GPUs) listening after {time.monotonic() - started:.1f} s")
            manifest = json.loads((folder / "fleet" / "fleet.json").read_text())["nodes"]
            started = time.monotonic()
            for node in manifest:  # one 1g instance on every GPU: every metric family is present
                client = AgentClient(node["url"], node["node_id"], node["secret"])
                for index, gpu in enumerate(client.inventory()["gpus"]):
                    client.create(f"{node['node_id']}-{index}", {"kind": "mig", "gpu": gpu["uuid"],
                                                                 "profile": "1g.10gb", "start": 0})
            print(f"created {nodes * 8} instances in {time.monotonic() - started:.1f} s")
            sizes, times = [], []
            for node in manifest:
                began = time.perf_counter()
                with urllib.request.urlopen(node["url"] + "/metrics", timeout=10) as response:  # noqa: S310
                    sizes.append(len(response.read()))
                times.append(time.perf_counter() - began)
            figures["metrics_pass_seconds"] = round(sum(times), 3)
            figures["metrics_page_p50_ms"] = round(statistics.median(times) * 1000, 2)
            figures["metrics_page_p99_ms"] = round(_percentile(times, 0.99) * 1000, 2)
            figures["metrics_page_kib"] = round(statistics.mean(sizes) / 1024, 1)
            print(f"one sequential pass over {nodes} /metrics pages: {sum(times):.2f} s "
                  f"(per node p50 {statistics.median(times) * 1000:.1f} ms, p99 {_percentile(times, 0.99) * 1000:.1f}"
                  f" ms; {statistics.mean(sizes) / 1024:.1f} KiB per page)")
            binary = shutil.which("prometheus")
            if not binary or prometheus_seconds <= 0:
                print("prometheus: not installed (apt-get install prometheus) or skipped")
                figures["prometheus"] = None
                return figures
            web_port = free_port()
            config = (ROOT / "infra" / "prometheus.yml").read_text()
            config = config.replace("__TARGETS__", str(folder / "fleet" / "prometheus-targets.json"))
            (folder / "prometheus.yml").write_text(config)
            prometheus = processes.start(
                [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{web_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{web_port}/-/ready", prometheus, timeout=60)
            time.sleep(prometheus_seconds)

            def query(expression: str) -> str:
                url = f"http://127.0.0.1:{web_port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
                with urllib.request.urlopen(url, timeout=30) as response:
                    result = json.loads(response.read())["data"]["result"]
                return result[0]["value"][1] if result else "none"

            mean_s = float(query("avg(avg_over_time(scrape_duration_seconds[1m]))"))
            max_s = float(query("max(max_over_time(scrape_duration_seconds[1m]))"))
            figures["prometheus"] = {
                "seconds": prometheus_seconds, "targets_up": int(float(query("sum(up)"))),
                "scrape_duration_mean_ms": round(mean_s * 1000, 2), "scrape_duration_max_ms": round(max_s * 1000, 2),
                "power_series": int(float(query("count(DCGM_FI_DEV_POWER_USAGE)"))),
                "engine_active_series": int(float(query("count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)")))}
            print(f"prometheus after {prometheus_seconds:.0f} s (scrape every 15 s): targets up "
                  f"{query('sum(up)')}/{nodes}; scrape_duration_seconds mean "
                  f"{float(query('avg(avg_over_time(scrape_duration_seconds[1m]))')) * 1000:.1f} ms, max "
                  f"{float(query('max(max_over_time(scrape_duration_seconds[1m]))')) * 1000:.1f} ms; "
                  f"power series {query('count(DCGM_FI_DEV_POWER_USAGE)')}, "
                  f"engine-active series {query('count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)')}")
        finally:
            if prometheus:
                processes.stop(prometheus, timeout=30)
            processes.stop(fleet, timeout=60)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ops = sub.add_parser("ops")
    ops.add_argument("--seconds", type=float, default=10)
    ops.add_argument("--threads", default="1,4")
    ops.add_argument("--quick", action="store_true", help="2 s per thread count")
    scrape = sub.add_parser("scrape")
    scrape.add_argument("--nodes", type=int, default=1000)
    scrape.add_argument("--prometheus-seconds", type=float, default=60)
    scrape.add_argument("--quick", action="store_true", help="50 nodes, 20 s of Prometheus")
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), "on", f"{__import__('os').cpu_count()} cores")
    if args.command == "ops":
        seconds = 2.0 if args.quick else args.seconds
        figures = bench_ops(seconds, [int(n) for n in args.threads.split(",")])
        write("agent_ops", figures, settings={"seconds": seconds, "threads": args.threads, "quick": args.quick},
              quick=args.quick)
    else:
        nodes, prometheus_seconds = (50, 20.0) if args.quick else (args.nodes, args.prometheus_seconds)
        figures = bench_scrape(nodes, prometheus_seconds)
        write("agent_scrape", figures,
              settings={"nodes": nodes, "prometheus_seconds": prometheus_seconds, "quick": args.quick},
              quick=args.quick)


if __name__ == "__main__":
    main()
