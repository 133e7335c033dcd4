from django.db import models


class LeaseState(models.TextChoices):
    """docs/architecture.md §4. PREEMPTED: a notice was sent; the lease still runs until its deadline, then is
    released and QUEUED again."""

    REQUESTED = "requested", "Requested"
    QUEUED = "queued", "Queued"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    PREEMPTED = "preempted", "Preempted (notice given)"
    RELEASING = "releasing", "Releasing"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    FAILED = "failed", "Failed"


FINAL_STATES = (LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.FAILED)
HOLDING_STATES = (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.PREEMPTED, LeaseState.RELEASING)

# state -> the states it may move to
TRANSITIONS: dict[str, frozenset[str]] = {
    LeaseState.REQUESTED: frozenset({LeaseState.QUEUED, LeaseState.FAILED}),
    LeaseState.QUEUED: frozenset({LeaseState.PROVISIONING, LeaseState.RELEASED, LeaseState.FAILED}),
    LeaseState.PROVISIONING: frozenset({LeaseState.ACTIVE, LeaseState.QUEUED, LeaseState.RELEASING,
                                        LeaseState.FAILED}),
    # ACTIVE → QUEUED: a workload that kept failing on its node is placed again on another one
    LeaseState.ACTIVE: frozenset({LeaseState.PREEMPTED, LeaseState.QUEUED, LeaseState.RELEASING, LeaseState.FAILED}),
    LeaseState.PREEMPTED: frozenset({LeaseState.QUEUED, LeaseState.RELEASING, LeaseState.FAILED}),
    LeaseState.RELEASING: frozenset({LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.FAILED}),
    LeaseState.RELEASED: frozenset(),
    LeaseState.EXPIRED: frozenset(),
    LeaseState.FAILED: frozenset(),
}


class GpuKind(models.TextChoices):
    WHOLE = "whole", "Whole GPU"
    MIG = "mig", "MIG slice"
    SHARE = "share", "GPU share"


class GpuMode(models.TextChoices):
    WHOLE = "whole", "Whole"
    MIG = "mig", "MIG"
    SHARED = "shared", "Shared"


class ShareEnforcement(models.TextChoices):
    """Whether a shared GPU's limits hold (docs/leasing.md, "Shares: enforced or not"): ``mps`` — the node's
    agent runs an MPS control daemon for it, which caps each share's compute and memory; ``none`` — the limits
    are environment variables a workload may ignore (the reason says why: no MPS on the node, turned off, ...)."""

    MPS = "mps", "Enforced by MPS"
    NONE = "none", "Not enforced"


class WorkloadClass(models.TextChoices):
    INTERACTIVE = "interactive", "Interactive"
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"


class AllocationState(models.TextChoices):
    """PENDING: placed, not yet on the node. READY: the instance exists. WARM: the instance exists and no
    lease holds it yet (a warm pool member). FREED: capacity given back."""

    PENDING = "pending", "Pending"
    READY = "ready", "Ready"
    WARM = "warm", "Warm (pool member)"
    RELEASING = "releasing", "Releasing"
    FREED = "freed", "Freed"


class NodeStatus(models.TextChoices):
    READY = "ready", "Ready"
    SILENT = "silent", "Silent (missed heartbeats)"
