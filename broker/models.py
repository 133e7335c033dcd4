"""Leasing data: nodes and their GPUs, leases, the allocations that hold capacity, and lease events.

Rules the database keeps (migrations 0001/0002), whatever the code does:
- two live allocations never overlap on a GPU: an exclusion constraint over (GPU, MIG memory slots) for
  whole GPUs (slots 0-8) and MIG slices; a constraint trigger for shares (Σ milli ≤ 1000 and Σ memory ≤
  the GPU's memory among live shares of a GPU, the GPU row locked so racing writers serialise);
- a lease's state is one of ``LeaseState`` and an idempotency key is unique per tenant;
- ``LeaseEvent`` rows are append-only (the billing and SLO authority).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, IntegerRangeField, RangeOperators
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from broker.choices import (
    AllocationState,
    GpuKind,
    GpuMode,
    LeaseState,
    NodeIsolation,
    NodeStatus,
    ShareEnforcement,
    WorkloadClass,
)


class Node(models.Model):
    """An enrolled agent. ``secret`` signs every request both ways (it must be readable to sign, so it
    is stored as given; the database is the broker's trust boundary)."""

    tenant_lookup = None  # platform data: never shown to tenants through restrict()

    node_id = models.CharField(max_length=100, unique=True)
    pool = models.CharField(max_length=63, default="default")
    address = models.URLField(max_length=300)
    hostname = models.CharField(max_length=255, blank=True)
    secret = models.CharField(max_length=128)
    agent_version = models.CharField(max_length=32, blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.READY)
    cordoned = models.BooleanField(default=False)
    enrolled_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    silent_since = models.DateTimeField(null=True, blank=True)  # when the broker took it out for silence
    # staff let the next token enrollment of this node id through once (``node_reenroll_approve``)
    reenroll_approved_at = models.DateTimeField(null=True, blank=True)
    # A token enrollment that sent an enrollment id: sha256 of the token's hash and that id. Until the node
    # signs its first request with the secret it got (``secret_used_at``), the same token and id get the same
    # answer again (the agent's retry after a lost 201) -- see ``node_enroll``.
    enrollment_key = models.CharField(max_length=64, blank=True, default="", db_default="")  # raw COPY too
    secret_used_at = models.DateTimeField(null=True, blank=True)
    # what its inventory says of workloads (agent.isolation): the runtime, and whether a tenant's process runs
    # as its own user ("uid") or as the agent's ("none": unsafe for a node that serves several tenants)
    workload_runtime = models.CharField(max_length=16, blank=True, default="", db_default="")
    isolation = models.CharField(max_length=16, choices=NodeIsolation.choices, blank=True, default="",
                                 db_default="")
    # The roots under which the node's agent lets workloads name paths (its inventory's ``workload_roots``); null
    # when its agent does not report them. A workload path under none of them is refused before placing.
    workload_roots = models.JSONField(null=True, blank=True)
    # the host's CPU (milli-cores) and memory (MiB) its agent reports (inventory ``host_cpu_milli``,
    # ``host_memory_mib``): the scheduler places leases' host CPU and memory within them; 0: not reported, not
    # tracked (an agent from before they were reported)
    host_cpu_milli = models.PositiveBigIntegerField(default=0, db_default=0)
    host_memory_mib = models.PositiveBigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return self.node_id


class AgentNonce(models.Model):
    """A nonce of a signed agent request, kept until its timestamp can no longer pass the window. The
    unique (node, nonce) makes a replay fail in every web process (``INSERT ... ON CONFLICT DO NOTHING``
    inserts nothing the second time); ``nodes_check_heartbeats`` prunes expired rows."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "nonce"], name="agentnonce_unique_per_node")]

    def __str__(self) -> str:
        return f"nonce {self.nonce} of node {self.node_id}"


class EnrollmentToken(models.Model):
    """A token an agent (or a fleet of them) trades for a node secret; ``uses_left`` enrollments."""

    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    pool = models.CharField(max_length=63, default="default")
    uses_left = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"enrollment token {self.prefix}"


class Gpu(models.Model):
    """One physical GPU of a node, as its agent reported it. ``model`` is the tier (catalogue code)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=80, unique=True)
    index = models.PositiveSmallIntegerField()
    model = models.CharField(max_length=32)
    mode = models.CharField(max_length=8, choices=GpuMode.choices)
    memory_mib = models.PositiveIntegerField()
    nvlink_domain = models.CharField(max_length=63, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)
    # staff released it from its node (``gpu_release``): the next node that reports it may claim it.
    # Until then a GPU belongs to the node that enrolled it, whatever another node reports.
    released_at = models.DateTimeField(null=True, blank=True)
    # the capacity loop (capacity app) is changing its mode: closed to the scheduler until ``mode`` is this
    mode_target = models.CharField(max_length=8, choices=GpuMode.choices, blank=True)
    mode_since = models.DateTimeField(null=True, blank=True)  # when it entered ``mode`` (rebalancing hysteresis)
    # whether the limits of shares on it hold, as its agent reports it (inventory ``share_enforcement``), and why not
    # (database defaults too: rows written outside the ORM, the benchmarks' COPY)
    share_enforcement = models.CharField(max_length=8, choices=ShareEnforcement.choices, default=ShareEnforcement.NONE,
                                         db_default=ShareEnforcement.NONE)
    share_enforcement_reason = models.CharField(max_length=300, blank=True,
                                                default="its agent has not reported share enforcement",
                                                db_default="its agent has not reported share enforcement")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.node_id}/{self.index} ({self.model}, {self.mode})"


class Lease(models.Model):
    """A tenant's request for GPU capacity and its life (docs/architecture.md §4). The shape is what was asked;
    ``tier`` and the allocations are what the scheduler gave."""

    tenant_lookup = "tenant"
    project_lookup = "project"  # a project-scoped token sees only its projects' leases (tenants.access.restrict)

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="leases")
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="leases")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="+")
    state = models.CharField(max_length=16, choices=LeaseState.choices, default=LeaseState.REQUESTED)
    reason = models.TextField(blank=True)
    # how the shape was chosen, when a gpu resolver chose it (auto-tiering: the slice, its prediction and
    # confidence): written at the request and kept for the lease's life, while ``reason`` follows its state
    decision = models.TextField(blank=True, default="", db_default="")
    # a profiling lease (auto-tiering's profiler measuring a workload): billed at the price book's profiling rate
    profiling = models.BooleanField(default=False, db_default=False)
    # shape
    kind = models.CharField(max_length=8, choices=GpuKind.choices)
    count = models.PositiveSmallIntegerField(default=1)
    models_allowed = ArrayField(models.CharField(max_length=32), default=list, blank=True)  # empty: auto
    profile = models.CharField(max_length=32, blank=True)  # MIG profile name, e.g. "1g.10gb"
    milli = models.PositiveIntegerField(default=0)  # share
    memory_mib = models.PositiveIntegerField(default=0)  # share cap, or "auto" memory need
    gang = models.BooleanField(default=True)
    # an elastic lease (whole GPUs or shares): ``count`` is its maximum, and under reclaim while over quota it may be
    # shrunk to no fewer than ``min_count`` units (docs/scheduling.md "Elastic leases and reclaim by need");
    # 0: not elastic. What it holds now is its live allocations.
    min_count = models.PositiveSmallIntegerField(default=0, db_default=0)
    workload_class = models.CharField(max_length=16, choices=WorkloadClass.choices, default=WorkloadClass.TRAINING)
    priority = models.SmallIntegerField(default=0)
    duration_seconds = models.PositiveIntegerField()
    # host CPU (milli-cores) and memory (MiB) per GPU unit, on the node it runs on (0: none asked); the scheduler
    # places the lease where its node has count x these free, and holds them while it runs
    cpu_milli_per_unit = models.PositiveIntegerField(default=0, db_default=0)
    host_memory_mib_per_unit = models.PositiveIntegerField(default=0, db_default=0)
    # outcome
    tier = models.CharField(max_length=32, blank=True)
    over_quota = models.BooleanField(default=False)
    # whether its project's guarantee covered it when the scheduler first saw it, counting the project's requests
    # ahead of it (``Scheduler.covered``); written once, by that cycle; null: placed before any cycle recorded it.
    # Billing samples time to GPU only where it is not False (``billing.core.slo``)
    guarantee_covered = models.BooleanField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)  # last time it (re)entered the queue
    active_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    # while queued: when the last schedule cycle estimated it starts (running work leaving at its expiry;
    # docs/scheduling.md "Estimated start times"); None: not estimated, or no estimate possible
    estimated_start = models.DateTimeField(null=True, blank=True)
    notice_deadline = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True)
    request_hash = models.CharField(max_length=64, blank=True)
    # a lease group: the leases of one tenant with the same key are placed together or not at all, and a
    # member preempted takes its whole group with it (docs/scheduling.md "Lease groups"); None: alone
    group_key = models.CharField(max_length=100, null=True, blank=True)
    # what the app that asked for the lease adds to each device's access details (a model split: the layers the
    # device runs); shown with the agent's own access details, set once at the request
    access_extra = models.JSONField(default=dict, blank=True)
    # node ids (``Node.node_id``) the scheduler must not place it on: a workload that failed there
    # ``WORKLOAD_FAILED_RUNS_BEFORE_REPLACE`` times in a row is placed elsewhere (docs/leasing.md, "Workloads")
    avoid_nodes = models.JSONField(default=list, blank=True)
    # cost allocation labels set by the requester ({"team": "vision", "cost-center": "cc-42"}), keys allowed by
    # the tenant (``Tenant.allowed_label_keys``); set once at the request, copied into every usage row
    labels = models.JSONField(default=dict, blank=True, db_default={})

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], condition=~Q(idempotency_key=""),
                                    name="lease_idempotency_key_unique"),
            models.CheckConstraint(condition=Q(state__in=LeaseState.values), name="lease_state_valid"),
            models.CheckConstraint(condition=Q(count__gte=1), name="lease_count_positive"),
            models.CheckConstraint(condition=Q(min_count__lte=models.F("count")), name="lease_min_count_at_most_count"),
        ]
        indexes = [models.Index(fields=["state", "requested_at"]), models.Index(fields=["tenant", "state"]),
                   models.Index(fields=["tenant", "group_key"], condition=Q(group_key__isnull=False),
                                name="lease_group_key")]

    def __str__(self) -> str:
        return f"lease {self.pk} ({self.state})"


class Allocation(models.Model):
    """Capacity one lease holds on one GPU (one unit of its shape). Its id is the agent's instance id.

    A **warm** allocation (``lease`` empty, state PENDING while the agent creates it, then WARM) is a
    pre-created MIG instance of a warm pool (docs/capacity.md): the platform's capacity, which the same
    exclusion constraint keeps apart from every lease's. A schedule cycle binds it to a lease by a
    conditional update (``lease`` set, state READY, ``bound_at``) with no agent call; its agent instance id
    does not change, so its metrics follow it to the lease."""

    tenant_lookup = "lease__tenant"

    lease = models.ForeignKey(Lease, on_delete=models.PROTECT, related_name="allocations", null=True, blank=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    tier = models.CharField(max_length=32)
    kind = models.CharField(max_length=8, choices=GpuKind.choices)
    mig_profile = models.CharField(max_length=32, blank=True)
    mig_start = models.SmallIntegerField(null=True, blank=True)
    slots = IntegerRangeField()  # MIG memory slots [start, start+size); whole: [0, 8); share: empty
    milli = models.PositiveIntegerField()  # quota units held
    memory_mib = models.PositiveIntegerField()
    preemptible = models.BooleanField(default=False)
    state = models.CharField(max_length=12, choices=AllocationState.choices, default=AllocationState.PENDING)
    device_uuid = models.CharField(max_length=80, blank=True)
    gpu_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    access = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    freed_at = models.DateTimeField(null=True, blank=True)
    warm_at = models.DateTimeField(null=True, blank=True)  # a warm pool member from then (ready on its node)
    bound_at = models.DateTimeField(null=True, blank=True)  # a warm member bound to ``lease`` then

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(lease__isnull=False) | Q(kind="mig"),
                                   name="allocation_without_lease_is_warm_mig"),
            ExclusionConstraint(
                name="allocation_no_overlap_on_gpu",
                expressions=[("gpu", RangeOperators.EQUAL), ("slots", RangeOperators.OVERLAPS)],
                condition=Q(freed_at__isnull=True),
            ),
            models.CheckConstraint(condition=Q(milli__lte=1000), name="allocation_milli_at_most_one_gpu"),
            models.CheckConstraint(
                condition=Q(state=AllocationState.FREED, freed_at__isnull=False)
                | (~Q(state=AllocationState.FREED) & Q(freed_at__isnull=True)),
                name="allocation_freed_iff_freed_at"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id} on {self.gpu_id}"

    @property
    def instance_id(self) -> str:
        return f"alloc-{self.pk}"


class ProjectUsageHistory(models.Model):
    """A project's borrowed (over-quota) use of one GPU model, remembered with a half-life: milli-GPU x seconds
    decayed to ``updated_at`` (``broker.scheduler.fairshare``). The schedule cycle moves it on
    (``services.fairshare.usage_history_record``); the over-quota order and reclaim read it."""

    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="usage_history")
    tier = models.CharField(max_length=32)
    decayed_milli_seconds = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "tier"], name="usage_history_unique"),
                       models.CheckConstraint(condition=Q(decayed_milli_seconds__gte=0),
                                              name="usage_history_not_negative")]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.tier}: {self.decayed_milli_seconds} milli-s"


class LeaseEvent(models.Model):
    """One transition of a lease, written in the same transaction as the change. Append-only."""

    tenant_lookup = "lease__tenant"
    project_lookup = "lease__project"

    lease = models.ForeignKey(Lease, on_delete=models.PROTECT, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150)  # "user:alice", "scheduler", "worker", "agent:gpu-node-01"
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["lease", "at"]),
                   # the preemption back-off reads the recent preemptions every cycle
                   models.Index(fields=["at"], condition=Q(to_state="preempted"), name="lease_event_preempted_at")]
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"lease {self.lease_id}: {self.from_state or '-'} -> {self.to_state}"


class Workload(models.Model):
    """What a lease runs, if anything (docs/leasing.md, "Workloads"): the definition the tenant gave (``spec``:
    command or image, args, env, secret_env names, scope, workdir, checkpoint_dir, restart_policy, max_restarts,
    port; the secret values sealed apart in ``secret_env_sealed``) and what its
    runs did, as the node's agent reported it. Each placement of the lease runs it under its own agent
    workload id (``lease-<id>-p<placement>``); ``restart_count`` is the ``RESTART_COUNT`` of the latest
    run, and a placement after a preemption starts at that + 1. Every report is also a ``LeaseEvent``."""

    tenant_lookup = "lease__tenant"
    lease = models.OneToOneField(Lease, on_delete=models.PROTECT, related_name="workload")
    spec = models.JSONField()
    # the values of the spec's ``secret_env`` (the spec keeps their names), encrypted: a Fernet token of
    # ``broker.workload_secrets``; opened only to start the workload on its node, never shown
    secret_env_sealed = models.TextField(blank=True, default="", db_default="")
    state = models.CharField(max_length=16, default="pending")  # pending, then the agent's workload state
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    agent_workload_id = models.CharField(max_length=128, blank=True)
    placements = models.PositiveIntegerField(default=0)
    restart_count = models.PositiveIntegerField(default=0)
    reported_seq = models.PositiveIntegerField(default=0)  # the last event of agent_workload_id recorded
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    failed_runs = models.PositiveIntegerField(default=0)  # runs that failed, all placements together

    def __str__(self) -> str:
        return f"workload of lease {self.lease_id} ({self.state})"

    @property
    def endpoint(self) -> str | None:
        """host:port of an interactive workload's ``port`` on its node while it runs (the API's lease detail
        and the portal's lease page show it); None otherwise."""
        from urllib.parse import urlsplit

        if not self.spec.get("port") or self.node is None or self.state not in ("starting", "running"):
            return None
        placement = self.placement_rows.filter(number=self.placements).first()
        if placement is None or placement.host_port is None:
            return None
        return f"{urlsplit(self.node.address).hostname}:{placement.host_port}"


class WorkloadPlacement(models.Model):
    """One placement of a lease's workload: the node and agent workload it ran as, the host port it was
    given (interactive workloads: allocated per node from ``WORKLOAD_HOST_PORTS``, never two live
    placements on one node with the same port — the database refuses it), how it ended, and, once it
    ended, the bounded tail of its logs kept here (``WORKLOAD_LOG_KEEP_BYTES`` per stream), so the logs of
    earlier placements outlive their node's copy."""

    tenant_lookup = "workload__lease__tenant"
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="placement_rows")
    number = models.PositiveIntegerField()  # 1, 2, … as Workload.placements counts them
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    node_name = models.CharField(max_length=128)  # Node.node_id, kept if the node is removed
    agent_workload_id = models.CharField(max_length=128)
    host_port = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, default="starting")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)  # set: the port is free again
    failed_runs = models.PositiveIntegerField(default=0)
    log_stdout = models.TextField(blank=True)
    log_stderr = models.TextField(blank=True)
    # per stream: {"first_offset": …, "size": …} of the kept tail, in the node's offsets
    log_offsets = models.JSONField(default=dict, blank=True)
    log_kept_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workload", "number"], name="workload_placement_number_unique"),
            models.UniqueConstraint(fields=["node", "host_port"],
                                    condition=Q(ended_at__isnull=True, host_port__isnull=False),
                                    name="workload_placement_live_port_unique_per_node"),
        ]

    def __str__(self) -> str:
        return f"placement {self.number} of lease {self.workload.lease_id} on {self.node_name}"


class SnapshotChange(models.Model):
    """What changed in the scheduler's view of the fleet, written by triggers in the same transaction as the change
    (migration 0011): ``kind`` node / gpu / lease (its live allocations or the lease columns they carry) / alloc (a
    warm pool member), ``key`` that row's id, ``xid`` the writing transaction's id. The schedule cycle keeps its
    snapshot between cycles and re-reads only these rows (``broker.snapshot``; docs/scheduling.md)."""

    xid = models.BigIntegerField(db_index=True)
    kind = models.CharField(max_length=8)
    key = models.BigIntegerField()
    at = models.DateTimeField(db_default=Now(), db_index=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.key} (xid {self.xid})"


class SnapshotEpoch(models.Model):
    """One row: the change log's identity. A kept snapshot is reused only while this row is the one it was read
    under (a TRUNCATE of the fleet's tables deletes it, a flush empties it) and while no change it needs was pruned
    (``pruned_xid``: the highest transaction id whose changes were deleted)."""

    token = models.CharField(max_length=36)
    pruned_xid = models.BigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return f"snapshot epoch {self.token} (pruned below {self.pruned_xid})"
