"""Utilisation metering from a real Prometheus: history written with promtool and compared with a hand
computation, a live Prometheus scraping a simulated agent, and Prometheus stopped, late and started
again under the metering run (nothing billed twice, nothing lost)."""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.choices import MeterSource
from billing.core.metering import hour_floor
from billing.models import AllocationUsage, MeterWindow, UtilisationUsage
from billing.services import usage_meter_window
from billing.services.metering_run import meter_pending
from billing.services.utilisation import PrometheusLate, PrometheusUnavailable, utilisation_meter_hour
from broker import services
from broker.choices import LeaseState
from broker.models import Allocation, Lease
from tenants.access import Actor
from tenants.choices import Role
from tests.factories import make_quota
from tests.support.agents import AgentProcess
from tests.support.prometheus import needs_prometheus

pytestmark = [needs_prometheus, pytest.mark.slow]
FIGURES = ("engine_active_avg", "fb_used_avg_mib", "energy_wh", "samples")


# -- the history scene ---------------------------------------------------------------------------------
@dataclass
class Scene:
    hour: datetime
    leases: dict[str, Lease]
    allocations: dict[str, str]  # name -> the agent's instance id (allocation_id label)

    def at(self, minutes: float) -> datetime:
        return self.hour + timedelta(minutes=minutes)


def build_scene(world, hour: datetime) -> Scene:
    """Node ``node-a`` (no hostname: Prometheus's Hostname is its node id) with a whole A100, an H100 in MIG
    mode and a shared L4; ``gpu-host-b`` (node ``node-b``) with a whole T4 that has no profiling metric.
    Minutes relative to ``hour``:

    - W  whole A100            -30 → 20 (freed mid-hour)
    - M1 MIG 3g.40gb, GI 2     -10 → (still held)
    - M2 MIG 2g.20gb, GI 5      30 → 45
    - S1 share 500 milli on L4 -10 → (still held)
    - S2 share 250 milli on L4  10.5 → 40
    - X  whole T4              -10 → (still held)
    """
    scene = Scene(hour, {}, {})
    for tier in ("A100-80GB", "L4", "T4"):
        make_quota(world.project, tier=tier)
    token = services.enrollment_token_create(uses=2, now=scene.at(-120))
    services.node_enroll(node_id="node-a", token=token, address="http://127.0.0.1:9/n/node-a", now=scene.at(-120),
                         inventory={"gpus": [
                             {"index": 0, "uuid": "GPU-a100", "model": "A100-80GB", "mode": "whole",
                              "memory_mib": 81920},
                             {"index": 1, "uuid": "GPU-h100", "model": "H100-80GB", "mode": "mig",
                              "memory_mib": 81559},
                             {"index": 2, "uuid": "GPU-l4", "model": "L4", "mode": "shared", "memory_mib": 23034}]})
    services.node_enroll(node_id="node-b", token=token, address="http://127.0.0.1:9/n/node-b", hostname="gpu-host-b",
                         now=scene.at(-120), inventory={"gpus": [
                             {"index": 0, "uuid": "GPU-t4", "model": "T4", "mode": "whole", "memory_mib": 15360}]})
    actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)

    def start(name: str, minutes: float, gpu: dict, gpu_instance_id: int | None = None) -> None:
        now = scene.at(minutes)
        lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu, now=now, duration_seconds=86400)
        services.schedule_cycle(now=now)
        allocation = Allocation.objects.get(lease=lease)
        instance = {} if gpu_instance_id is None else {"gpu_instance_id": gpu_instance_id}
        services.allocation_ready(allocation=allocation, instance=instance, now=now)
        scene.leases[name] = Lease.objects.get(pk=lease.pk)
        assert scene.leases[name].state == LeaseState.ACTIVE, scene.leases[name].reason
        scene.allocations[name] = allocation.instance_id

    def stop(name: str, minutes: float) -> None:
        now = scene.at(minutes)
        services.lease_release(lease=scene.leases[name], actor="test", now=now)
        services.allocations_free(lease=Lease.objects.get(pk=scene.leases[name].pk), now=now,
                                  to=LeaseState.RELEASED, reason="released")

    start("W", -30, {"kind": "whole", "model": "A100-80GB"})
    start("M1", -10, {"kind": "mig", "model": "H100-80GB", "profile": "3g.40gb"}, gpu_instance_id=2)
    start("S1", -10, {"kind": "share", "model": "L4", "milli": 500, "memory_mib": 8000})
    start("X", -10, {"kind": "whole", "model": "T4"})
    start("S2", 10.5, {"kind": "share", "model": "L4", "milli": 250, "memory_mib": 4000})
    stop("W", 20)
    start("M2", 30, {"kind": "mig", "model": "H100-80GB", "profile": "2g.20gb"}, gpu_instance_id=5)
    stop("S2", 40)
    stop("M2", 45)
    return scene


def history(scene: Scene) -> str:
    """OpenMetrics text, one sample a minute from -35 to +70 minutes, as dcgm-exporter labels them."""
    def labels(host: str, uuid: str, index: int, gi: str = "", profile: str = "", allocation: str = "", **extra):
        pairs = {"gpu": str(index), "UUID": uuid, "Hostname": host, "GPU_I_ID": gi, "GPU_I_PROFILE": profile,
                 "allocation_id": allocation, **extra}
        return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"

    a100 = ("node-a", "GPU-a100", 0)
    h100 = ("node-a", "GPU-h100", 1)
    l4 = ("node-a", "GPU-l4", 2)
    t4 = ("gpu-host-b", "GPU-t4", 0)
    w, m1, s1, s2 = (scene.allocations[n] for n in ("W", "M1", "S1", "S2"))
    span = range(-35, 71)
    families: dict[str, list[tuple[str, range, object]]] = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [
            (labels(*a100, allocation=w), range(-30, 21), lambda m: 0.3 if m == 20 else 0.8 if m < 10 else 1.0),
            (labels(*a100), range(21, 71), lambda m: 0.05),  # the idle GPU after W
            (labels(*h100, gi="2", profile="3g.40gb", allocation=m1), range(-10, 71), lambda m: 0.5 + 0.2 * (m % 2)),
            # GI 5 without the allocation label (stock dcgm-exporter): it exists longer than M2 held it
            (labels(*h100, gi="5", profile="2g.20gb"), range(20, 51), lambda m: 0.6 if 30 <= m < 45 else 0.0),
            (labels(*h100, gi="7", profile="1g.10gb", allocation="alloc-999999999"), span, lambda m: 1.0),
            (labels(*l4, allocation=s1), range(-10, 71), lambda m: 0.2 if m % 2 == 0 else 0.4),
            (labels(*l4, allocation=s2), range(10, 41), lambda m: 0.7 if m < 40 else 0.1),
        ],
        "DCGM_FI_DEV_GPU_UTIL": [
            (labels(*a100, allocation=w), range(-30, 21), lambda m: 99),  # has the profiling metric: unused
            (labels(*l4), span, lambda m: 55),  # a shared GPU's own figure belongs to nobody alone
            (labels(*t4), span, lambda m: 50),  # no profiling metric on this GPU: the fallback
        ],
        "DCGM_FI_DEV_FB_USED": [
            (labels(*a100, allocation=w), range(-30, 21), lambda m: 1 if m == 20 else 40000 if m < 10 else 42000),
            (labels(*a100), range(21, 71), lambda m: 0),
            (labels(*h100, gi="2", profile="3g.40gb", allocation=m1), range(-10, 71), lambda m: 20000 + 10 * m),
            (labels(*h100, gi="5", profile="2g.20gb"), range(20, 51), lambda m: 10000 if 30 <= m < 45 else 500),
            (labels(*l4, allocation=s1), range(-10, 71), lambda m: 8000),
            (labels(*l4, allocation=s2), range(10, 41), lambda m: 4000 if m < 40 else 100),
            (labels(*t4), span, lambda m: 1000),
        ],
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": [  # mJ, one counter per physical GPU
            (labels(*a100), span, lambda m: 1_000_000_000 + (m + 35) * 6_000_000),  # 100 W
            # 200 W; the counter restarts at minute 39 (driver reload): 12,000,000 mJ at minute 40
            (labels(*h100), span, lambda m: 5_000_000_000 + (m + 35) * 12_000_000 if m < 40 else (m - 39) * 12_000_000),
            # the same GPU scraped twice (a second job): must not count twice
            (labels(*h100, job="duplicate"), span,
             lambda m: 5_000_000_000 + (m + 35) * 12_000_000 if m < 40 else (m - 39) * 12_000_000),
            # an exporter that also reports energy per MIG instance: never added to the GPU's
            (labels(*h100, gi="2", profile="3g.40gb", allocation=m1), span, lambda m: 9_000_000_000 + m * 12_000_000),
            (labels(*l4), span, lambda m: 2_000_000_000 + (m + 35) * 3_000_000),  # 50 W
            (labels(*t4), span, lambda m: 700_000_000 + (m + 35) * 1_800_000),  # 30 W
        ],
    }
    lines = []
    start = int(scene.hour.timestamp())
    for name, series in families.items():
        lines.append(f"# TYPE {name} gauge")
        for label_text, minutes, value in series:
            lines.extend(f"{name}{label_text} {value(m)} {start + 60 * m}" for m in minutes)
    return "\n".join(lines) + "\n# EOF\n"


# Figures worked out by hand from the history above (engine average, FB average MiB, energy Wh, samples):
EXPECTED = {
    # W: points :00-:19 (freed at :20; its series lingers in Prometheus's 5-minute lookback until :24 and
    # the idle GPU's series follows: neither counts). Engine (10 × 0.8 + 10 × 1.0) / 20; FB (10 × 40000 +
    # 10 × 42000) / 20; energy 20 min × 6,000,000 mJ = 120,000,000 mJ = 33.3333 Wh.
    "W": (Decimal("0.900000"), Decimal("41000.000"), Decimal("33.333333"), 20),
    # M1: the whole hour, 60 points. Engine 0.5/0.7 alternating; FB 20000 + 10 m, m = 0..59 → 20295;
    # energy 60 × 12,000,000 mJ × 3/7 slices (the reset minute counts 12,000,000 as well) = 85.714286 Wh.
    "M1": (Decimal("0.600000"), Decimal("20295.000"), Decimal("85.714286"), 60),
    # M2: :30-:44 (15 points of GI 5); energy 15 × 12,000,000 × 2/7 = 51,428,571 mJ = 14.285714 Wh.
    "M2": (Decimal("0.600000"), Decimal("10000.000"), Decimal("14.285714"), 15),
    # S1: 60 points 0.2/0.4; energy 60 × 3,000,000 × 500/1000 = 90,000,000 mJ = 25 Wh.
    "S1": (Decimal("0.300000"), Decimal("8000.000"), Decimal("25.000000"), 60),
    # S2: held 10:30-40:00 → points :11-:39 (29); energy 29.5 min × 3,000,000 × 250/1000 = 22,125,000 mJ.
    "S2": (Decimal("0.700000"), Decimal("4000.000"), Decimal("6.145833"), 29),
    # X: no profiling metric → DCGM_FI_DEV_GPU_UTIL 50 % / 100; energy 60 × 1,800,000 mJ = 30 Wh.
    "X": (Decimal("0.500000"), Decimal("1000.000"), Decimal("30.000000"), 60),
}


def figures(scene: Scene, hour: datetime) -> dict[str, tuple]:
    names = {lease.pk: name for name, lease in scene.leases.items()}
    return {names[row["lease_id"]]: tuple(row[f] for f in FIGURES)
            for row in UtilisationUsage.objects.filter(hour_start=hour).values("lease_id", *FIGURES)}


def snapshot() -> list:
    return [list(UtilisationUsage.objects.order_by("lease_id", "hour_start").values()),
            list(AllocationUsage.objects.order_by("lease_id", "hour_start").values()),
            list(MeterWindow.objects.order_by("source", "hour_start").values())]


@pytest.fixture
def scene(world):
    return build_scene(world, hour_floor(timezone.now()) - timedelta(hours=3))


@pytest.fixture
def history_prometheus(scene, prometheus_server, settings):
    server = prometheus_server()
    server.backfill(history(scene))
    server.start()
    settings.PROMETHEUS_URL = server.url
    settings.METERING_STEP_SECONDS = 60
    return server


# -- tests -----------------------------------------------------------------------------------------------
def test_utilisation_hour_from_promtool_history_matches_the_hand_computation(scene, history_prometheus):
    hour = scene.hour
    assert utilisation_meter_hour(hour_start=hour, now=scene.at(120)) == 6
    assert figures(scene, hour) == EXPECTED
    row = UtilisationUsage.objects.get(lease=scene.leases["W"], hour_start=hour)
    assert row.tenant_id == scene.leases["W"].tenant_id and row.metered_at == scene.at(120)
    # metering the hour again (later, or once more) gives the same figures and no new row
    before = snapshot()
    assert utilisation_meter_hour(hour_start=hour, now=scene.at(120)) == 6
    assert snapshot() == before
    utilisation_meter_hour(hour_start=hour, now=scene.at(180))
    assert figures(scene, hour) == EXPECTED and UtilisationUsage.objects.count() == 6


def test_utilisation_windows_stay_open_while_prometheus_is_down_or_late_and_fill_later(
        scene, history_prometheus, settings):
    settings.METERING_START = scene.hour.isoformat()
    settings.METERING_GRACE_SECONDS = 300
    now = scene.at(70)  # hour H ended 10 minutes ago: it is the only complete one
    history_prometheus.stop()
    with pytest.raises(PrometheusUnavailable):
        utilisation_meter_hour(hour_start=scene.hour, now=now)

    result = meter_pending(now=now)
    assert result["closed"] == {"allocation": 1, "utilisation": 0} and result["failed"]["utilisation"] == 1
    allocation = MeterWindow.objects.get(source=MeterSource.ALLOCATION, hour_start=scene.hour)
    assert allocation.closed_at == now and allocation.rows == 6 and allocation.attempts == 1
    window = MeterWindow.objects.get(source=MeterSource.UTILISATION, hour_start=scene.hour)
    assert window.closed_at is None and window.attempts == 1 and "did not answer" in window.last_error
    assert MeterWindow.objects.count() == 2 and not UtilisationUsage.objects.exists()

    history_prometheus.start()  # same data, same port
    result = meter_pending(now=now)
    assert result["closed"] == {"allocation": 0, "utilisation": 1} and result["open"] == 0
    window.refresh_from_db()
    assert window.closed_at == now and window.rows == 6 and window.attempts == 2 and window.last_error == ""
    assert figures(scene, scene.hour) == EXPECTED

    # re-running changes nothing: the run (windows closed), and each meter called by hand again
    before = snapshot()
    meter_pending(now=now)
    assert snapshot() == before
    utilisation_meter_hour(hour_start=scene.hour, now=now)
    usage_meter_window(start=scene.hour, end=scene.hour + timedelta(hours=1), now=now)
    assert snapshot() == before

    # late: the run thinks it is two hours from now; Prometheus has nothing past the present hour yet
    current = hour_floor(timezone.now())
    later = timezone.now() + timedelta(hours=2)
    with pytest.raises(PrometheusLate):
        utilisation_meter_hour(hour_start=current, now=later)
    meter_pending(now=later)
    open_hours = {w.hour_start: w for w in MeterWindow.objects.filter(source=MeterSource.UTILISATION,
                                                                       closed_at__isnull=True)}
    assert min(open_hours) == current and "older than the window's end" in open_hours[current].last_error
    assert open_hours[current].attempts == 1
    assert all(w.attempts == 0 for hour, w in open_hours.items() if hour > current)  # not tried after it
    assert not MeterWindow.objects.filter(source=MeterSource.ALLOCATION, closed_at__isnull=True).exists()
    # the complete hours after H were metered from what Prometheus has (H+2: nothing, rows without figures)
    empty = UtilisationUsage.objects.filter(hour_start=scene.hour + timedelta(hours=2))
    assert {row.lease_id for row in empty} == {scene.leases[name].pk for name in ("M1", "S1", "X")}
    assert all(row.samples == 0 and row.energy_wh is None and row.engine_active_avg is None for row in empty)
    assert figures(scene, scene.hour) == EXPECTED  # hour H untouched


def test_utilisation_live_prometheus_scraping_an_agent_maps_figures_to_leases(world, tmp_path, prometheus_server,
                                                                                settings):
    agent = AgentProcess(tmp_path / "agent", node_id="live-node", gpus="h100-80gb:1:mig,a100-80gb:1:whole",
                         extra=("--hostname", "live-host")).start()
    try:
        server = prometheus_server(targets=(f"127.0.0.1:{agent.port}",)).start()
        settings.PROMETHEUS_URL = server.url
        settings.METERING_STEP_SECONDS = 1
        server.wait_for("count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]) >= 3", timeout=30)
        client = agent.client(retries=0)
        make_quota(world.project, tier="A100-80GB")
        token = services.enrollment_token_create()
        services.node_enroll(node_id="live-node", token=token, address=agent.url, inventory=client.inventory(),
                             hostname="live-host")
        actor = Actor(user=world.member, tenant=world.acme, role=Role.MEMBER)
        started = timezone.now()
        leases = {}
        for name, gpu in (("mig", {"kind": "mig", "model": "H100-80GB", "profile": "3g.40gb"}),
                          ("whole", {"kind": "whole", "model": "A100-80GB"})):
            lease, _ = services.lease_request(actor=actor, project="vision", gpu=gpu, now=started)
            services.schedule_cycle(now=started)
            allocation = Allocation.objects.select_related("gpu").get(lease=lease)
            instance = client.create(allocation.instance_id, services.allocation_spec(allocation))
            services.allocation_ready(allocation=allocation, instance=instance, now=started)
            leases[name] = (Lease.objects.get(pk=lease.pk), allocation)
        assert all(lease.state == LeaseState.ACTIVE for lease, _ in leases.values())
        mig_id = leases["mig"][1].instance_id
        server.wait_for(f'count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{allocation_id="{mig_id}"}}[1m]) >= 4',
                        timeout=30)
        until = timezone.now()
        server.wait_for(f"max(timestamp(up)) > {until.timestamp():.3f}", timeout=10)
        for hour in sorted({hour_floor(started), hour_floor(until)}):
            utilisation_meter_hour(hour_start=hour, now=until)

        assert set(UtilisationUsage.objects.values_list("lease_id", flat=True)) == {
            lease.pk for lease, _ in leases.values()}
        for lease, allocation in leases.values():
            rows = list(UtilisationUsage.objects.filter(lease=lease))
            assert sum(row.samples for row in rows) >= 3
            seen = [row for row in rows if row.samples]
            assert all(row.engine_active_avg is not None and 0 <= row.engine_active_avg <= 1 for row in seen)
            assert all(row.fb_used_avg_mib is not None for row in seen)
            energy = sum(row.energy_wh for row in rows if row.energy_wh is not None)
            # the GPU's counter over the lease's time bounds what the lease can be given
            counter = f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{UUID="{allocation.gpu.uuid}"}}'
            used = (float(server.query(counter, at=until.timestamp())[0]["value"][1])
                    - float(server.query(counter, at=started.timestamp() - 2)[0]["value"][1])) / 3_600_000
            assert 0 < energy <= Decimal(used) + Decimal("0.000001")
    finally:
        agent.stop()


def test_utilisation_prometheus_answering_5xx_is_unavailable_and_writes_nothing(scene, settings):
    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503 if self.path.startswith("/api/v1/query?") else 500)
            self.end_headers()
            self.wfile.write(b'{"status":"error","error":"overloaded"}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.PROMETHEUS_URL = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(PrometheusUnavailable, match="did not answer the freshness query"):
            utilisation_meter_hour(hour_start=scene.hour, now=scene.at(120))
    finally:
        server.shutdown()
        server.server_close()
    assert not UtilisationUsage.objects.exists()


def test_utilisation_hours_without_leases_ask_prometheus_nothing_and_close(db, settings):
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens there: any question would fail
    now = timezone.now()
    settings.METERING_START = (hour_floor(now) - timedelta(hours=3)).isoformat()
    assert utilisation_meter_hour(hour_start=hour_floor(now) - timedelta(hours=1), now=now) == 0
    result = meter_pending(now=now)
    assert result["failed"] == {"allocation": 0, "utilisation": 0} and result["open"] == 0
    assert MeterWindow.objects.filter(closed_at__isnull=False, rows=0).count() == MeterWindow.objects.count() >= 4
