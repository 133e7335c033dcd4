"""The capacity planner: metered demand and use in, proposed fleet adjustments out.

Pure Python (standard library, ``gpus`` and ``broker.scheduler`` types only), no Django, no I/O, like
``broker/scheduler``. ``plan_capacity(snapshot, now=...)`` returns ``Adjustment``s (mode switch, MIG layout,
warm pool, idle reclaim, right-sizing, quota advice), each with its evidence, expected gain, risk, mode and
reason. The live service and the trace simulator (``python -m bench.sim capacity``) run the same code.
"""

from capacity.planner.planner import layout_problems, plan_capacity, poisson_pool_size, price_per_hour
from capacity.planner.types import (
    Adjustment,
    AdjustmentKind,
    Arrivals,
    CapacityGpu,
    CapacitySnapshot,
    Change,
    CreateLatency,
    DemandShape,
    Evidence,
    Gain,
    History,
    IdleRule,
    Instance,
    Mode,
    Policy,
    Price,
    QuotaUse,
    ReclaimClass,
    ReclaimStep,
    Slot,
    Utilisation,
    Waiting,
    WarmInstance,
)

__all__ = [
    "Adjustment", "AdjustmentKind", "Arrivals", "CapacityGpu", "CapacitySnapshot", "Change", "CreateLatency",
    "DemandShape", "Evidence", "Gain", "History", "IdleRule", "Instance", "Mode", "Policy", "Price", "QuotaUse",
    "ReclaimClass", "ReclaimStep", "Slot", "Utilisation", "Waiting", "WarmInstance", "layout_problems",
    "plan_capacity", "poisson_pool_size", "price_per_hour",
]
