"""The scheduling core: who gets which GPU capacity, where, and when.

Pure Python (standard library and ``gpus`` only), no Django, no I/O. Input is a frozen ``Snapshot`` and
a list of ``Request``s; ``plan(snapshot, requests, policy=..., now=...)`` returns one ``Decision`` per
request (placed / preempt-then-place / shrink-then-place / switch-then-place / waiting, with a reason). Warm
instances (``WarmInstance``, pre-created MIG instances no lease holds) in the snapshot are bound by matching
requests instead of a new placement. The same code runs in the live service and in the trace simulator
(``bench.sim``).
"""

from broker.scheduler.plan import plan
from broker.scheduler.types import (
    Allocation,
    Decision,
    DecisionMode,
    Gpu,
    GpuMode,
    Kind,
    Node,
    QuotaSpec,
    Request,
    Shape,
    Snapshot,
    TenantQuotaSpec,
    Unit,
    UsageHistory,
    WarmInstance,
)

__all__ = [
    "Allocation",
    "Decision",
    "DecisionMode",
    "Gpu",
    "GpuMode",
    "Kind",
    "Node",
    "QuotaSpec",
    "Request",
    "Shape",
    "Snapshot",
    "TenantQuotaSpec",
    "Unit",
    "UsageHistory",
    "WarmInstance",
    "plan",
]
