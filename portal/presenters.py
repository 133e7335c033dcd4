"""What the templates display, computed once here (templates do not compute): quota bars, the fleet map
drawn to scale, sparklines, the request form's choices."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC
from decimal import Decimal

from broker.choices import FINAL_STATES, GpuMode, LeaseState, NodeStatus
from broker.selectors import node_isolation_warning
from gpus.catalogue import model_get
from gpus.mig import MEMORY_SLOTS, profiles_for

# Tenant colours on the fleet map: distinct, readable with white text (contrast >= 4.5:1), stable per tenant.
TENANT_COLOURS = ("#0b5cad", "#8a3ffc", "#0e7a6d", "#b8420f", "#6f4e00", "#9f1853", "#1f6f3a", "#4a5a78")


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


# -- quota bars ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuotaBar:
    """One tier of a quota: in-quota use against ``deserved`` (guaranteed), over-quota use, the ``limit``.
    The bar is drawn on the scale of the limit."""

    tier: str
    deserved: int
    limit: int
    in_use: int
    over: int
    weight: int | None = None

    @property
    def in_use_pct(self) -> float:
        return _pct(self.in_use, self.limit)

    @property
    def over_pct(self) -> float:
        return _pct(self.over, self.limit)

    @property
    def deserved_pct(self) -> float:
        return _pct(self.deserved, self.limit)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use - self.over)


def quota_bars(quotas: Iterable, usage: dict[tuple[int, str], dict[str, int]], *, project_id=None,
               with_weight: bool = False) -> list[QuotaBar]:
    bars = []
    for quota in quotas:
        if project_id is None:  # tenant level: the sum over its projects
            used = [u for (_, tier), u in usage.items() if tier == quota.tier]
            in_use, over = sum(u["in_use"] for u in used), sum(u["over"] for u in used)
        else:
            entry = usage.get((project_id, quota.tier), {"in_use": 0, "over": 0})
            in_use, over = entry["in_use"], entry["over"]
        bars.append(QuotaBar(quota.tier, quota.deserved_gpu_milli, quota.limit_gpu_milli, in_use, over,
                             quota.over_quota_weight if with_weight else None))
    return bars


# -- sparkline -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sparkline:
    values: list[float]
    width: int = 240
    height: int = 40

    @property
    def points(self) -> str:
        if len(self.values) == 1:
            y = self._y(self.values[0])
            return f"0,{y} {self.width},{y}"
        step = self.width / (len(self.values) - 1)
        return " ".join(f"{round(i * step, 1)},{self._y(v)}" for i, v in enumerate(self.values))

    @property
    def area(self) -> str:
        return f"0,{self.height} {self.points} {self.width},{self.height}"

    def _y(self, value: float) -> float:
        return round(self.height - 2 - (self.height - 4) * min(max(value, 0), 100) / 100, 1)

    @property
    def mean(self) -> float:
        return round(sum(self.values) / len(self.values), 1)

    @property
    def last(self) -> float:
        return self.values[-1]

    @property
    def peak(self) -> float:
        return max(self.values)


# -- fleet map -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """One allocation drawn on its GPU: ``left``/``width`` in % of the GPU (MIG: memory slots of 8;
    shares: milli of 1000; whole: all of it)."""

    allocation_id: str
    lease_id: int
    tenant: str
    project: str
    state: str  # provisioning | active | preempting | releasing
    label: str
    detail: str
    left: float
    width: float
    colour: str
    slots: str
    utilisation: float | None


@dataclass
class GpuRow:
    index: int
    uuid: str
    model: str
    mode: str
    memory_mib: int
    segments: list[Segment] = field(default_factory=list)
    utilisation: float | None = None
    slot_labels: tuple[int, ...] = ()
    nvlink_domain: str = ""  # as its agent reports it; "": none

    @property
    def used_pct(self) -> float:
        return round(sum(s.width for s in self.segments), 1)

    @property
    def summary(self) -> str:
        if not self.segments:
            return "free"
        if self.mode == GpuMode.MIG:
            return f"{len(self.segments)} MIG instance{'s' if len(self.segments) > 1 else ''}"
        if self.mode == GpuMode.SHARED:
            return f"{round(self.used_pct * 10)} of 1000 milli shared"
        return "leased whole"


@dataclass
class NodeCard:
    node_id: str
    pool: str
    status: str
    cordoned: bool
    hostname: str
    last_heartbeat_at: object
    gpus: list[GpuRow]
    isolation: str = ""
    warning: str = ""  # broker.selectors.node_isolation_warning
    workload_roots: list[str] | None = None  # where its workloads may name paths (its inventory); None: not reported
    host_cpu_milli: int = 0  # the host's CPU and memory its agent reports (0: not reported, not tracked)
    host_memory_mib: int = 0

    @property
    def host(self) -> str:
        """``112 cores · 2048 GiB host`` (what leases' host CPU and memory are placed in); "" when not reported."""
        parts = []
        if self.host_cpu_milli:
            parts.append(f"{self.host_cpu_milli / 1000:g} cores")
        if self.host_memory_mib:
            parts.append(f"{self.host_memory_mib / 1024:g} GiB")
        return " · ".join(parts) + " host" if parts else ""

    @property
    def state(self) -> str:
        if self.cordoned:
            return "cordoned"
        return "ready" if self.status == NodeStatus.READY else "silent"


_SEGMENT_STATE = {LeaseState.PROVISIONING: "provisioning", LeaseState.ACTIVE: "active",
                  LeaseState.PREEMPTED: "preempting", LeaseState.RELEASING: "releasing"}


def tenant_colours(tenants: Iterable) -> dict[int, str]:
    """A colour per tenant, stable while the set of tenants is (by primary key)."""
    keys = sorted({tenant.pk for tenant in tenants})
    return {pk: TENANT_COLOURS[position % len(TENANT_COLOURS)] for position, pk in enumerate(keys)}


def fleet_map(nodes: Iterable, allocations: Iterable, tenants: Iterable,
              utilisation: dict[str, float] | None) -> tuple[list[NodeCard], dict[int, str]]:
    colours = tenant_colours(tenants)
    utilisation = utilisation or {}
    by_gpu: dict[int, list] = {}
    for allocation in allocations:
        by_gpu.setdefault(allocation.gpu_id, []).append(allocation)
    cards = []
    for node in nodes:
        rows = []
        for gpu in node.gpus.all():
            row = GpuRow(gpu.index, gpu.uuid, gpu.model, gpu.mode, gpu.memory_mib,
                         utilisation=utilisation.get(gpu.uuid),
                         slot_labels=tuple(range(MEMORY_SLOTS)) if gpu.mode == GpuMode.MIG else (),
                         nvlink_domain=gpu.nvlink_domain)
            offset = 0
            for allocation in by_gpu.get(gpu.pk, []):
                lease = allocation.lease
                if gpu.mode == GpuMode.MIG and allocation.mig_start is not None:
                    lower, upper = allocation.slots.lower, allocation.slots.upper
                    left, width = _pct(lower, MEMORY_SLOTS), _pct(upper - lower, MEMORY_SLOTS)
                    slots = f"{lower}" if upper - lower == 1 else f"{lower}-{upper - 1}"
                    label = allocation.mig_profile
                elif gpu.mode == GpuMode.SHARED:
                    left, width = _pct(offset, 1000), _pct(allocation.milli, 1000)
                    offset += allocation.milli
                    slots = f"{allocation.milli} milli, {allocation.memory_mib} MiB"
                    label = f"{allocation.milli} m"
                else:
                    left, width, slots, label = 0.0, 100.0, "whole GPU", "whole"
                state = _SEGMENT_STATE.get(lease.state, lease.state)
                util = utilisation.get(allocation.instance_id)
                detail = (f"lease {lease.pk} · {lease.tenant.slug}/{lease.project.slug} · {label} · "
                          f"{'slots ' if gpu.mode == GpuMode.MIG else ''}{slots} · {state}"
                          + (" · over quota" if allocation.preemptible else "")
                          + (f" · {util:g}% busy" if util is not None else ""))
                row.segments.append(Segment(allocation.instance_id, lease.pk, lease.tenant.slug, lease.project.slug,
                                            state, label, detail, left, width, colours.get(lease.tenant_id, "#555"),
                                            slots, util))
            rows.append(row)
        tenants_here = {s.tenant for row in rows for s in row.segments}
        cards.append(NodeCard(node.node_id, node.pool, node.status, node.cordoned, node.hostname,
                              node.last_heartbeat_at, rows, isolation=node.isolation,
                              workload_roots=node.workload_roots, host_cpu_milli=node.host_cpu_milli,
                              host_memory_mib=node.host_memory_mib,
                              warning=node_isolation_warning(node=node, tenant_count=len(tenants_here))))
    return cards, colours


# -- lease display ---------------------------------------------------------------------------------------
def shape_label(lease) -> str:
    """``1 × MIG 1g.10gb · H100-80GB``, ``2 × whole GPU · auto · all on one node``, ``1 × share 250 m / 8192 MiB · L4``
    (the model it runs on, else the one asked for, else ``auto``), with the host CPU and memory asked per unit."""
    count = f"{lease.count} × "
    if lease.kind == "mig":
        what = f"MIG {lease.profile}"
    elif lease.kind == "share":
        what = f"share {lease.milli} m / {lease.memory_mib} MiB"
    else:
        what = "whole GPU" + (f" (≥ {lease.memory_mib} MiB)" if lease.memory_mib else "")
    where = lease.tier or (lease.models_allowed[0] if lease.models_allowed else "auto")
    gang = " · all on one node" if lease.count > 1 and lease.gang else ""
    host = []  # host CPU and memory asked per unit (``2 × whole GPU · H100-80GB · 8 cores + 64 GiB host each``)
    if getattr(lease, "cpu_milli_per_unit", 0):
        host.append(f"{lease.cpu_milli_per_unit / 1000:g} cores")
    if getattr(lease, "host_memory_mib_per_unit", 0):
        host.append(f"{lease.host_memory_mib_per_unit / 1024:g} GiB")
    host_text = f" · {' + '.join(host)} host{' each' if lease.count > 1 else ''}" if host else ""
    elastic = f" · elastic, at least {lease.min_count}" if getattr(lease, "min_count", 0) else ""
    return f"{count}{what} · {where}{gang}{elastic}{host_text}"


def is_live(lease) -> bool:
    return lease.state not in FINAL_STATES


def poll_seconds(lease) -> int | None:
    """How often the lease page asks for news: fast while something is happening, never once final."""
    if lease.state in FINAL_STATES:
        return None
    return 5 if lease.state == LeaseState.ACTIVE else 2


def lease_workload(lease):
    """The lease's workload (``broker.models.Workload``), or None for a bare lease."""
    from django.core.exceptions import ObjectDoesNotExist

    try:
        return lease.workload
    except ObjectDoesNotExist:
        return None


# -- request form ----------------------------------------------------------------------------------------
def mig_profile_groups(tiers: Iterable[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """MIG profiles per MIG-capable model among ``tiers``: (model, [(name, label)])."""
    groups = []
    for tier in tiers:
        profiles = [p for p in profiles_for(tier) if not p.shape.media_extensions]
        if not profiles:
            continue
        options = [(p.name, f"{p.name} — {p.compute_slices}/7 GPU, {p.memory_mib / 1024:.1f} GiB") for p in profiles]
        groups.append((tier, options))
    return groups


def model_options(tiers: Iterable[str]) -> list[tuple[str, str]]:
    out = []
    for tier in tiers:
        model = model_get(tier)
        out.append((tier, f"{tier} ({model.memory_mib // 1024} GiB{', MIG' if model.mig_capable else ''})"))
    return out


# -- SLO contract forms (platform staff) -----------------------------------------------------------------
@dataclass(frozen=True)
class FormField:
    name: str
    id: str
    label: str
    value: str
    error: str = ""
    type: str = "text"
    numeric: bool = False


def _text(value) -> str:
    """A form value: datetimes as ``datetime-local`` wants them (UTC), decimals without trailing zeros or
    exponent (``Decimal("100.00")`` → ``100``, ``99.500`` → ``99.5``)."""
    if value is None:
        return ""
    if hasattr(value, "strftime"):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
    if isinstance(value, Decimal):
        text = format(value, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


def contract_form(prefix: str, contract, *, form: str, values, errors: dict, step_rows: int) -> dict:
    """The fields of one SLO contract form: the contract's values, or what was typed (and the service's
    message under its field) when this is the form that was sent and refused."""
    from portal.forms import field_key

    mine = form == prefix

    def field(name: str, label: str, current, *, type_: str = "text", numeric: bool = False) -> FormField:
        value = values.get(name, "") if mine else _text(current)
        return FormField(name, f"{prefix}-{name}", label, value, errors.get(field_key(name), "") if mine else "",
                         type_, numeric)

    head = [field("name", "Name", contract.name if contract else ""),
            field("effective_from", "Effective from (UTC)", contract.effective_from if contract else None,
                  type_="datetime-local"),
            field("effective_to", "Effective to (UTC; empty: open-ended)", contract.effective_to if contract else None,
                  type_="datetime-local")]
    numbers = [field("time_to_gpu_p95_seconds", "Time to GPU, p95 (s)",
                     contract.time_to_gpu_p95_seconds if contract else "", numeric=True),
               field("availability_target_pct", "Availability target (%)",
                     contract.availability_target_pct if contract else "", numeric=True),
               field("preemption_notice_seconds", "Preemption notice (s)",
                     contract.preemption_notice_seconds if contract else "", numeric=True),
               field("max_credit_pct", "Credit cap (%)", contract.max_credit_pct if contract else "100",
                     numeric=True),
               field("min_runtime_seconds", "Minimum runtime before reclaim (s; empty: the platform's)",
                     contract.min_runtime_seconds if contract else None, numeric=True)]
    existing = list(contract.credit_steps.all()) if contract else []
    steps = []
    for row in range(step_rows):
        step = existing[row] if row < len(existing) else None
        steps.append({
            "metric": field(f"step-{row}-metric", "Metric", step.metric if step else ""),
            "numbers": [field(f"step-{row}-threshold", "Threshold", step.threshold if step else "", numeric=True),
                        field(f"step-{row}-credit_pct", "Credit (%)", step.credit_pct if step else "", numeric=True)],
        })
    return {"contract": contract, "prefix": prefix, "open": mine, "head": head, "numbers": numbers, "steps": steps,
            "general": errors.get("__all__", "") if mine else ""}


# -- bar charts (usage and revenue) -------------------------------------------------------------------------
@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class BarChart:
    """A vertical bar chart drawn as inline SVG: ``bars`` in chart units, ``label`` for screen readers
    (the numbers are also in the table beside every chart)."""

    bars: list[Bar]
    label: str
    unit: str
    maximum: float
    width: int = 720
    height: int = 160

    @property
    def empty(self) -> bool:
        return not self.bars


def bar_chart(values: list[tuple[str, float]], *, label: str, unit: str, width: int = 720,
              height: int = 160, slots: list[str] | None = None) -> BarChart:
    """``values`` as bars. ``slots``: every label the axis has, in order (the days of a month, the months of a
    report); a slot without a value is a zero bar, so one day of usage is drawn as one day of the month, not a
    bar across the whole chart (issue 29). No values at all: an empty chart ("nothing to draw yet")."""
    if slots is not None and values:
        known = dict(values)
        values = [(name, known.get(name, 0.0)) for name in slots]
    highest = max((value for _label, value in values), default=0.0)
    top = highest or 1.0  # the scale; an all-zero chart draws flat bars and says so (its caption)
    slot = width / max(1, len(values))
    gap = min(6.0, slot * 0.2)
    bars = []
    for index, (name, value) in enumerate(values):
        bar_height = round(value / top * (height - 20), 2)
        bars.append(Bar(label=name, value=value, x=round(index * slot + gap / 2, 2),
                        y=round(height - 16 - bar_height, 2), width=round(slot - gap, 2), height=bar_height))
    return BarChart(bars=bars, label=label, unit=unit, maximum=highest, width=width, height=height)


def expiring_in_seconds(lease, now) -> int:
    """Seconds until an active lease's end when within ``LEASE_EXPIRING_NOTICE_SECONDS`` of it (the
    ``lease.expiring`` notification's lead time), else 0 (nothing to say)."""
    from django.conf import settings

    if lease.state != "active" or lease.ends_at is None or settings.LEASE_EXPIRING_NOTICE_SECONDS <= 0:
        return 0
    left = int((lease.ends_at - now).total_seconds())
    return left if 0 < left <= settings.LEASE_EXPIRING_NOTICE_SECONDS else 0


def token_rows(tokens, projects) -> list:
    """The tokens, each with ``project_slugs``: the slugs of the projects it is limited to (empty: every
    project; a token whose projects were all deleted reaches none: "(deleted projects)")."""
    slugs = {project.pk: project.slug for project in projects}
    rows = list(tokens)
    for token in rows:
        if token.project_ids is None:
            token.project_slugs = []
        else:
            token.project_slugs = [slugs[pk] for pk in token.project_ids if pk in slugs] or ["(deleted projects)"]
    return rows
