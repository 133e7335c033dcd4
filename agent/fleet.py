"""Many simulated nodes in one process: ``python -m agent.fleet --nodes N --shape h100-80gb:8:mig ...``.

Each node is a full agent (its own node id, secret, state directory and sim backend) served under
``/n/{node_id}`` on one port: ``http://HOST:PORT/n/sim-0001/v1/inventory``. With ``--broker-url`` every
node enrolls and heartbeats like a standalone agent; without it each makes its own secret. The
enrollment token (good for as many enrollments as there are nodes) comes from ``--enrollment-token-file``
(a 0600 file) or ``$GPUB_ENROLLMENT_TOKEN``, never from the command line (``ps`` shows argv to everyone).
The fleet writes ``fleet.json`` (node id, URL, secret: what a broker or a test needs to call them; mode
0600; rewritten whenever a node's secret changes, e.g. once the nodes have enrolled) and
``prometheus-targets.json`` (a file_sd list with one target per node) into ``--state-dir``.

``--create-latency`` / ``--mode-change-latency`` (seconds) make every node's creates and mode changes
answer that much later, as on real GPUs (``agent.sim``). ``--shape`` may repeat: the nodes cycle through
the shapes (``--shape h100-80gb:8:mig --shape a100-80gb:8:whole``); one shape may list several GPU
groups (``h100-80gb:4:mig,l4:2:shared``). ``--nvlink-domain-size N`` splits each node's NVLink GPUs into
NVLink domains of N (default: an NVLink model's group is one domain, as on an HGX board); ``--host-cpu-milli``
and ``--host-memory-mib`` set what each node reports of its host (default: 14 cores and 256 GiB per GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path

import aiohttp
from aiohttp import web

from agent.daemon import (
    AgentConfig,
    BrokerLink,
    add_latency_flags,
    add_topology_flags,
    add_workload_flags,
    build_workloads,
    generated_secret,
    read_enrollment_token,
    stored_secret,
)
from agent.isolation import UidMap, parse_uid_range
from agent.mps import ShareEnforcingBackend
from agent.server import AgentNode, node_app, problem_middleware
from agent.sim import SimBackend, parse_gpu_specs

logger = logging.getLogger("agent.fleet")
FLEET_MPS_REASON = "a simulated node of agent.fleet: no MPS control daemon runs for its GPUs"


class Fleet:
    def __init__(self, nodes: int, shapes: list[str], state_dir: Path, *, host: str = "127.0.0.1", port: int = 9400,
                 prefix: str = "sim", broker_url: str = "", enrollment_token: str = "", metrics_token: str = "",
                 create_latency_seconds: float = 0.0, mode_change_latency_seconds: float = 0.0,
                 workload_runtime: str = "process", workload_roots: list[str] | None = None,
                 restart_backoff_seconds: float = 1.0, workload_log_max_bytes: int = 16 * 1024 * 1024,
                 broker_timeout_seconds: float = 10.0, isolation: dict | None = None,
                 nvlink_domain_size: int | None = None, host_cpu_milli: int = 0, host_memory_mib: int = 0,
                 shrink_grace_seconds: float = 10.0):
        if nodes < 1:
            raise ValueError("--nodes must be at least 1")
        self.shapes = [parse_gpu_specs(shape) for shape in shapes or ["h100-80gb:8:mig"]]
        self.state_dir = Path(state_dir)
        self.host, self.port = host, port
        self.broker_url = broker_url
        self.broker_timeout_seconds = broker_timeout_seconds
        self.enrollment_token = enrollment_token
        self.nodes: list[AgentNode] = []
        self.configs: list[AgentConfig] = []
        # one machine, one map of tenants to uids (agent.isolation), whichever simulated node runs the workload
        uids = parse_uid_range((isolation or {}).get("workload_uids") or AgentConfig.workload_uids)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        uid_map = UidMap(self.state_dir, *uids)
        for number in range(1, nodes + 1):
            node_id = f"{prefix}-{number:04d}"
            directory = self.state_dir / node_id
            directory.mkdir(parents=True, exist_ok=True)
            backend = SimBackend(directory, node_id, self.shapes[(number - 1) % len(self.shapes)],
                                 create_latency_seconds=create_latency_seconds,
                                 mode_change_latency_seconds=mode_change_latency_seconds,
                                 nvlink_domain_size=nvlink_domain_size, host_cpu_milli=host_cpu_milli,
                                 host_memory_mib=host_memory_mib)
            secret = stored_secret(directory) if broker_url else generated_secret(directory)
            config = AgentConfig(
                node_id=node_id, listen=f"{host}:{port}", broker_url=broker_url, enrollment_token=enrollment_token,
                state_dir=str(directory), hostname=node_id, advertise_url=self.url(node_id),
                workload_runtime=workload_runtime, workload_roots=list(workload_roots or []),
                restart_backoff_seconds=restart_backoff_seconds, shrink_grace_seconds=shrink_grace_seconds,
                workload_log_max_bytes=workload_log_max_bytes, **(isolation or {})).validate()
            backend = ShareEnforcingBackend(backend, None, reason=FLEET_MPS_REASON)  # shares: honestly unenforced
            self.nodes.append(AgentNode(node_id, backend, secret, node_id, metrics_token=metrics_token,
                                        workloads=build_workloads(config, directory, backend, uid_map=uid_map)))
            self.configs.append(config)

    def url(self, node_id: str) -> str:
        return f"http://{self.host}:{self.port}/n/{node_id}"

    def app(self) -> web.Application:
        root = web.Application(middlewares=[problem_middleware])
        for node in self.nodes:
            root.add_subapp(f"/n/{node.node_id}", node_app(node))

        async def healthz(_request):
            return web.json_response({"status": "ok", "nodes": len(self.nodes),
                                      "enrolled": sum(1 for n in self.nodes if n.secret)})

        root.router.add_get("/healthz", healthz)
        root.cleanup_ctx.append(self._broker_links)
        return root

    async def _broker_links(self, _app):
        if not self.broker_url:
            yield
            return
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.broker_timeout_seconds),
                                        connector=aiohttp.TCPConnector(limit=32))
        tasks = []
        for node, config in zip(self.nodes, self.configs, strict=True):
            link = BrokerLink(node, config, Path(config.state_dir), session)
            tasks.append(asyncio.create_task(link.run()))
        tasks.append(asyncio.create_task(self._manifest_follows_secrets()))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()

    async def _manifest_follows_secrets(self, every: float = 0.5) -> None:
        """fleet.json is written when the fleet starts listening, before the nodes have enrolled: write it
        again whenever a secret changes (enrollment, re-enrollment)."""
        written = [n.secret for n in self.nodes]
        while True:
            await asyncio.sleep(every)
            current = [n.secret for n in self.nodes]
            if current != written:
                self.write_manifest()
                written = current

    def write_manifest(self) -> None:
        """fleet.json (secrets: 0600) and a Prometheus file_sd target list."""
        manifest = {"nodes": [{"node_id": n.node_id, "url": self.url(n.node_id), "secret": n.secret}
                              for n in self.nodes]}
        path = self.state_dir / "fleet.json"
        descriptor = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(manifest, handle, indent=1)
        os.replace(path.with_suffix(".tmp"), path)
        targets = [{"targets": [f"{self.host}:{self.port}"],
                    "labels": {"__metrics_path__": f"/n/{n.node_id}/metrics", "instance": n.node_id}}
                   for n in self.nodes]
        path = self.state_dir / "prometheus-targets.json"  # Prometheus watches it: replace, never rewrite
        path.with_suffix(".tmp").write_text(json.dumps(targets, indent=1))
        os.replace(path.with_suffix(".tmp"), path)


async def run_fleet(fleet: Fleet, *, ready_file: str = "") -> None:
    runner = web.AppRunner(fleet.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, fleet.host, fleet.port, backlog=1024)
    await site.start()
    fleet.write_manifest()
    logger.info("fleet of %d simulated nodes on http://%s:%d/n/<node>/", len(fleet.nodes), fleet.host, fleet.port)
    if ready_file:
        Path(ready_file).write_text(str(os.getpid()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    logger.info("stopping: finishing requests in flight, saving state")
    await runner.cleanup()  # stops listening, waits for handlers, runs each node's cleanup (state saved)
    if fleet.broker_url:
        fleet.write_manifest()  # secrets bought since the start
    # a simulated machine's firewall for its workloads (workload_network closed-local) goes with it; a real
    # node's agent (agent.daemon) keeps its own in place across restarts, as its workloads keep running
    for firewall in {id(f): f for node in fleet.nodes
                     if node.workloads and (f := node.workloads.isolation.firewall)}.values():
        firewall.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.fleet", description="A fleet of simulated GPU nodes")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--shape", action="append", default=[], help="GPUs of a node, e.g. h100-80gb:8:mig")
    parser.add_argument("--listen", default="127.0.0.1:9400")
    parser.add_argument("--state-dir", default="var/fleet")
    parser.add_argument("--prefix", default="sim", help="node ids are PREFIX-0001, ...")
    parser.add_argument("--broker-url", default="")
    parser.add_argument("--enrollment-token-file", default="",
                        help="a file (mode 0600) holding a token the broker accepts for --nodes enrollments; "
                             "or set GPUB_ENROLLMENT_TOKEN")
    parser.add_argument("--metrics-token", default="")
    parser.add_argument("--broker-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long a call to the broker (enrollment, heartbeat) may take; a loaded test machine "
                             "needs more than the default (an enrollment that answers after the agent gave up "
                             "has spent its token use and enrolled the node, whose retry is then refused)")
    add_latency_flags(parser, default=0.0)
    add_workload_flags(parser)
    add_topology_flags(parser)
    parser.add_argument("--ready-file", default="", help="written (with the PID) once the fleet listens")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    try:
        fleet = Fleet(args.nodes, args.shape, Path(args.state_dir), host=host, port=int(port), prefix=args.prefix,
                      broker_url=args.broker_url,
                      enrollment_token=read_enrollment_token(args.enrollment_token_file) if args.broker_url else "",
                      metrics_token=args.metrics_token, create_latency_seconds=args.create_latency_seconds,
                      mode_change_latency_seconds=args.mode_change_latency_seconds,
                      workload_runtime=args.workload_runtime or "process", workload_roots=args.workload_roots,
                      restart_backoff_seconds=args.restart_backoff_seconds or 1.0,
                      shrink_grace_seconds=10.0 if args.shrink_grace_seconds is None else args.shrink_grace_seconds,
                      workload_log_max_bytes=args.workload_log_max_bytes or 16 * 1024 * 1024,
                      broker_timeout_seconds=args.broker_timeout,
                      nvlink_domain_size=args.nvlink_domain_size, host_cpu_milli=args.host_cpu_milli or 0,
                      host_memory_mib=args.host_memory_mib or 0,
                      isolation={name: getattr(args, name) for name in ("isolation", "workload_uids", "device_dir",
                                                                        "cgroup_root", "workload_network",
                                                                        "workload_local_ports")
                                if getattr(args, name, None)})
        asyncio.run(run_fleet(fleet, ready_file=args.ready_file))
    except (ValueError, OSError) as error:
        logger.error("%s", error)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
