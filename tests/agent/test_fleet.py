"""A fleet of simulated nodes: enrollment and signed heartbeats against a broker endpoint, back-off while
it is down, and a real Prometheus server scraping every node.

The broker's side of enrollment lands with the leasing work; until then ``EnrollmentEndpoint`` here
serves exactly the documented exchange (docs/agent-protocol.md) and checks signatures with the same
``agent.protocol`` the broker will use.
"""

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from agent.protocol import AgentClient, NonceCache, SignatureError, verify
from tests import real_parts
from tests.support.processes import ROOT, free_port, wait_http
from tests.support.processes import wait_until as support_wait_until

TOKEN = "enroll-token-for-tests"


class EnrollmentEndpoint:
    def __init__(self, uses: int):
        self.uses = uses
        self.secrets: dict[str, str] = {}
        self.heartbeats: dict[str, list[float]] = {}
        self.refused: list[str] = []
        self.down = False
        self.lose_first_answer = False  # commit each node's first enrollment, then drop the connection
        self.enrollment_ids: dict[str, list[str]] = {}
        self.nonces = NonceCache()
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    async def enroll(self, request):
        if self.down:
            return web.json_response({"detail": "down"}, status=503)
        body = await request.json()
        ids = self.enrollment_ids.setdefault(body["node_id"], [])
        ids.append(body.get("enrollment_id", ""))
        repeated = len(ids) > 1 and ids[-1] and ids[-1] == ids[0] and body["node_id"] in self.secrets
        if not repeated:  # the broker's rule: the same token and enrollment id get the same answer again
            if body.get("token") != TOKEN or self.uses <= 0:
                return web.json_response({"detail": "invalid or used enrollment token"}, status=401)
            self.uses -= 1
        secret = self.secrets.setdefault(body["node_id"], secrets.token_urlsafe(32))
        assert body["inventory"]["gpus"], "the inventory comes with the enrollment"
        if self.lose_first_answer and len(ids) == 1:
            request.transport.abort()  # committed, but the agent never hears it
            await asyncio.sleep(0.1)
        return web.json_response({"node_id": body["node_id"], "secret": secret, "heartbeat_seconds": 0.2},
                                 status=201)

    async def heartbeat(self, request):
        if self.down:
            self.heartbeats.setdefault("__while_down__", []).append(time.monotonic())
            return web.json_response({"detail": "down"}, status=503)
        body = await request.read()
        try:
            node = verify(request.headers, "POST", request.rel_url.raw_path, "", body, self.secrets.get, self.nonces)
        except SignatureError as error:
            self.refused.append(str(error))
            return web.json_response({"detail": str(error)}, status=401)
        assert node == request.match_info["node"]
        self.heartbeats.setdefault(node, []).append(time.monotonic())
        return web.json_response({"heartbeat_seconds": 0.2})

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/api/v1/agents/enroll", self.enroll)
        app.router.add_post("/api/v1/agents/{node}/heartbeat", self.heartbeat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.loop.run_forever()

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class FleetProcess:
    def __init__(self, state_dir: Path, nodes: int, *extra: str, env: dict | None = None):
        self.env = env or {}
        self.state_dir = state_dir
        self.nodes = nodes
        self.port = free_port()
        self.extra = extra

    def start(self):
        ready = self.state_dir / "ready"
        ready.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent.fleet", "--nodes", str(self.nodes), "--listen", f"127.0.0.1:{self.port}",
             "--state-dir", str(self.state_dir), "--ready-file", str(ready), "--log-level", "ERROR",
             "--shape", "h100-80gb:8:mig", "--shape", "a100-80gb:4:whole,l4:2:shared", *self.extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **self.env})
        wait_http(f"http://127.0.0.1:{self.port}/healthz", self.process, timeout=60)
        return self

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(30)

    def manifest(self) -> dict:
        return json.loads((self.state_dir / "fleet.json").read_text())


def wait_until(predicate, timeout=15.0):
    return support_wait_until(predicate, timeout, 0.05)


def test_fleet_nodes_enroll_heartbeat_signed_and_back_off_while_the_broker_is_down(tmp_path):
    broker = EnrollmentEndpoint(uses=3).start()
    fleet = FleetProcess(tmp_path / "fleet", 3, "--broker-url", f"http://127.0.0.1:{broker.port}",
                         env={"GPUB_ENROLLMENT_TOKEN": TOKEN}).start()
    try:
        names = ["sim-0001", "sim-0002", "sim-0003"]
        assert wait_until(lambda: all(len(broker.heartbeats.get(n, [])) >= 3 for n in names))
        assert broker.refused == []
        # fleet.json, written when the fleet started listening, is rewritten with the secrets bought since
        bought = [broker.secrets[n] for n in names]
        assert wait_until(lambda: [n["secret"] for n in fleet.manifest()["nodes"]] == bought)
        # the secret the broker handed out is what the node now checks: the broker can call it
        node = names[1]
        client = AgentClient(f"http://127.0.0.1:{fleet.port}/n/{node}", node, broker.secrets[node], retries=0)
        inventory = client.inventory()
        assert [g["model"] for g in inventory["gpus"]] == ["A100-80GB"] * 4 + ["L4"] * 2
        forged = AgentClient(f"http://127.0.0.1:{fleet.port}/n/{node}", node, broker.secrets["sim-0001"], retries=0)
        with pytest.raises(Exception, match="401"):
            forged.inventory()
        # broker down for 3 s: with back-off the 3 nodes try far less often than every 0.2 s
        broker.down = True
        time.sleep(3)
        attempts_while_down = len(broker.heartbeats.get("__while_down__", []))
        broker.down = False
        assert 3 <= attempts_while_down <= 3 * 8, attempts_while_down  # 0.2 s would be 45
        counts = {n: len(broker.heartbeats[n]) for n in names}
        assert wait_until(lambda: all(len(broker.heartbeats[n]) > counts[n] for n in names), timeout=40)
        assert fleet.stop() == 0
        # a restart reuses the stored secrets: no second enrollment (the token had 3 uses, all spent)
        fleet.start()
        counts = {n: len(broker.heartbeats[n]) for n in names}
        assert wait_until(lambda: all(len(broker.heartbeats[n]) > counts[n] for n in names))
        assert broker.refused == []
    finally:
        fleet.stop()
        broker.stop()


def test_fleet_node_whose_enrollment_answer_is_lost_asks_again_with_the_same_enrollment_id(tmp_path):
    """The broker commits every node's first enrollment and the answer is lost: each agent asks again with
    the id it kept (state dir, 0600), gets its secret without spending a second use (the token has exactly
    one per node), heartbeats signed with it, and forgets the id once answered."""
    broker = EnrollmentEndpoint(uses=2)
    broker.lose_first_answer = True
    broker.start()
    fleet = FleetProcess(tmp_path / "fleet", 2, "--broker-url", f"http://127.0.0.1:{broker.port}",
                         env={"GPUB_ENROLLMENT_TOKEN": TOKEN}).start()
    try:
        names = ["sim-0001", "sim-0002"]
        assert wait_until(lambda: all(len(broker.heartbeats.get(n, [])) >= 2 for n in names), timeout=30)
        assert broker.refused == [] and broker.uses == 0
        for name in names:
            ids = broker.enrollment_ids[name]
            assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) >= 16, ids
            assert not (tmp_path / "fleet" / name / "enrollment-id").exists()
    finally:
        fleet.stop()
        broker.stop()


PROMETHEUS = shutil.which("prometheus")


@real_parts.PROMETHEUS  # skipped locally where missing, failed in CI
def test_a_real_prometheus_scrapes_every_simulated_node(tmp_path):
    fleet = FleetProcess(tmp_path / "fleet", 6).start()
    port = free_port()
    config = (ROOT / "infra" / "prometheus.yml").read_text()
    config = config.replace("__TARGETS__", str(tmp_path / "fleet" / "prometheus-targets.json"))
    config = config.replace("scrape_interval: 15s", "scrape_interval: 1s").replace("scrape_timeout: 10s",
                                                                                   "scrape_timeout: 1s")
    (tmp_path / "prometheus.yml").write_text(config)
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", prometheus, timeout=30)
        manifest = fleet.manifest()["nodes"]
        node = manifest[0]
        client = AgentClient(node["url"], node["node_id"], node["secret"], retries=0)
        gpu = next(g for g in client.inventory()["gpus"] if g["mode"] == "mig")
        client.create("lease-42", {"kind": "mig", "gpu": gpu["uuid"], "profile": "3g.40gb", "start": 4})

        def query(expression: str) -> list:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())["data"]["result"]

        # 6 nodes alternating 8 x H100 (MIG) and 4 x A100 + 2 x L4: 42 GPUs, one power series each
        assert wait_until(lambda: (r := query("count(DCGM_FI_DEV_POWER_USAGE)")) and r[0]["value"][1] == "42",
                          timeout=30)
        assert wait_until(lambda: query('DCGM_FI_PROF_GR_ENGINE_ACTIVE{allocation_id="lease-42"}'), timeout=30)
        [series] = query('DCGM_FI_PROF_GR_ENGINE_ACTIVE{allocation_id="lease-42"}')
        labels = series["metric"]
        assert labels["instance"] == node["node_id"] and labels["GPU_I_PROFILE"] == "3g.40gb"
        assert labels["UUID"] == gpu["uuid"] and labels["Hostname"] == node["node_id"]
        up = query("sum(up)")
        assert up[0]["value"][1] == "6"
    finally:
        prometheus.terminate()
        prometheus.wait(20)
        fleet.stop()
