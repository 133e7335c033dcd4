"""CPU per heartbeat of one web server process: signed heartbeats at a fixed rate, the server's CPU divided by them.

    DATABASE_URL=postgres://... .venv/bin/python bench/heartbeat_cpu.py --app config.agent_wsgi   # the agents' ingress
    DATABASE_URL=postgres://... .venv/bin/python bench/heartbeat_cpu.py --app config.wsgi         # the API's server

Migrates ``DATABASE_URL``'s database, enrolls ``--nodes`` nodes (``hbcpu-*``, removed again at the end), starts
gunicorn with ``--app`` (1 gthread worker x 4 threads, as the ingress runs in ``make run``) and sends ``--rate``
signed heartbeats a second for ``--seconds`` over 4 keep-alive connections (open loop). Prints the server's
CPU (user + system of its process tree) per heartbeat and the heartbeats' latency. Prints only: no results file
(the recorded figure is ``leasing_scale``'s; docs/leasing.md quotes this one with the command and the load).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app", default="config.agent_wsgi", help="the WSGI application gunicorn serves")
    parser.add_argument("--rate", type=float, default=67.0, help="heartbeats per second (1,000 nodes every 15 s)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--nodes", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("NODE_ADDRESS_NETWORKS", "127.0.0.0/8")  # its nodes are enrolled at 127.0.0.1
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, check=True)

    import django

    django.setup()
    import psutil

    from agent.protocol import sign
    from broker import services
    from broker.models import Node
    from core import processes
    from core.processes import free_port, wait_http

    Node.objects.filter(node_id__startswith="hbcpu-").delete()
    token = services.enrollment_token_create(uses=args.nodes)
    secrets = {}
    for number in range(args.nodes):
        node = services.node_enroll(node_id=f"hbcpu-{number}", token=token, address=f"http://127.0.0.1:9/n/{number}",
                                    inventory={"gpus": []})
        secrets[node.node_id] = node.secret
    port = free_port()
    server = processes.start([sys.executable, "-m", "gunicorn", args.app, "--bind", f"127.0.0.1:{port}", "--workers",
                               "1", "--worker-class", "gthread", "--threads", "4", "--log-level", "warning"],
                              cwd=ROOT, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", server, 60)

        def cpu() -> float:
            root = psutil.Process(server.pid)
            return sum(t.user + t.system for t in (p.cpu_times() for p in [root, *root.children(recursive=True)]))

        ids = list(secrets)
        latencies: list[float] = []
        refused = [0]
        lock = threading.Lock()
        start = time.monotonic() + 0.05

        def send(first: int) -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            mine = []
            index = first
            while index / args.rate <= args.seconds:
                delay = start + index / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                node_id = ids[index % len(ids)]
                path = f"/api/v1/agents/{node_id}/heartbeat"
                body = json.dumps({"time": time.time(), "instances": []}).encode()
                headers = {"Content-Type": "application/json", **sign(secrets[node_id], node_id, "POST", path, body)}
                sent = time.perf_counter()
                for attempt in range(2):
                    try:
                        connection.request("POST", path, body=body, headers=headers)
                        response = connection.getresponse()
                        response.read()
                        break
                    except (http.client.HTTPException, ConnectionError):  # an idle connection the server closed
                        connection.close()
                        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                        if attempt:
                            raise
                mine.append(time.perf_counter() - sent)
                with lock:
                    refused[0] += response.status != 200
                index += 4
            with lock:
                latencies.extend(mine)

        before = cpu()
        threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        used = cpu() - before
        latencies.sort()
        p50, p99 = latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000
        print(f"{args.app}: {len(latencies)} heartbeats ({refused[0]} not 200) at {args.rate:g}/s; server CPU "
              f"{used * 1000 / len(latencies):.2f} ms per heartbeat; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    finally:
        processes.stop(server, timeout=20)
        Node.objects.filter(node_id__startswith="hbcpu-").delete()


if __name__ == "__main__":
    main()
