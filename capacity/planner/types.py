"""Inputs and outputs of the capacity planner: frozen dataclasses, integer quantities.

Units as in ``broker.scheduler.types``: GPU capacity in milli-GPU, memory in MiB, time in seconds (``now``
and timestamps are seconds on one epoch the caller chooses), engine activity in per-mille (0..1000 of the
interval the engine was busy), money in integer minor units of the price book's currency.

The live service builds a ``CapacitySnapshot`` from its tables and metered series; the trace simulator
(``bench.sim.capacity``) builds one from its replay state. Both get the same ``Adjustment`` list back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker.scheduler.types import GpuMode, Kind, QuotaSpec, WorkloadClass


class Mode(StrEnum):
    """What the loop does with an adjustment of one kind: nothing, propose it, or apply it."""

    OFF = "off"
    ADVISE = "advise"
    AUTO = "auto"


class AdjustmentKind(StrEnum):
    MODE_SWITCH = "mode_switch"  # an idle GPU changes mode (whole / mig / shared)
    MIG_LAYOUT = "mig_layout"  # the instances an idle MIG GPU is carved into
    WARM_POOL = "warm_pool"  # pre-created instances of a profile
    IDLE_RECLAIM = "idle_reclaim"  # notice, then release (or preempt) an idle lease
    RIGHT_SIZE = "right_size"  # a smaller profile or cheaper tier that would have fitted
    QUOTA_ADVICE = "quota_advice"  # deserved quota vs measured use


class ReclaimClass(StrEnum):
    """The idle-reclaim rule a lease falls under: over-quota leases have their own, whatever their class."""

    INTERACTIVE = "interactive"
    INFERENCE = "inference"
    TRAINING = "training"
    OVER_QUOTA = "over-quota"
    # in-quota training whose workload can resume (a checkpoint directory, a restart policy that restarts): idle,
    # it is suspended (checkpoint, back to the queue) rather than released (``ReclaimStep.SUSPEND``)
    RESUMABLE = "resumable-training"


class ReclaimStep(StrEnum):
    NOTICE = "notice"
    RELEASE = "release"  # an in-quota lease ends
    PREEMPT = "preempt"  # an over-quota lease goes back to the queue
    CANCEL = "cancel"  # a noticed lease is busy again: the notice is withdrawn
    SUSPEND = "suspend"  # resumable training: SIGTERM, checkpoint, back to the queue, resumes when capacity frees


# -- the snapshot --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instance:
    """A live instance on a GPU: a lease's unit (whole GPU, MIG instance or share)."""

    lease: str
    project: str
    in_quota: bool
    workload_class: WorkloadClass = WorkloadClass.TRAINING
    profile: str = ""  # MIG profile name; empty for whole / share
    start: int = -1  # MIG start memory slot
    milli: int = 1000
    memory_mib: int = 0
    started_at: float = 0.0
    noticed_at: float | None = None  # when an idle-reclaim notice went out (None: none yet)
    # its workload declares a checkpoint directory and a restart policy that restarts it after a preemption
    # (not ``never``), and it is no lease group's member: idle, it can be suspended instead of released
    resumable: bool = False


@dataclass(frozen=True, slots=True)
class WarmInstance:
    """A pre-created MIG instance that no lease holds yet (a warm pool member)."""

    id: str
    profile: str
    start: int
    ready: bool = True  # False while it is still being created


@dataclass(frozen=True, slots=True)
class CapacityGpu:
    id: str
    node: str
    model: str
    mode: GpuMode
    instances: tuple[Instance, ...] = ()
    warm: tuple[WarmInstance, ...] = ()
    mode_since: float = 0.0  # when the GPU entered its mode (rebalancing leaves recent switches alone)
    pool: str = ""  # its node's pool (``Node.pool``): a request bound to pools is served only there
    # being switched to ``mode`` (a drain or a switch under way): capacity of that mode the queue waits for, so the
    # queue is fitted on it; no adjustment touches it (no other switch, no warm member)
    changing: bool = False

    @property
    def idle(self) -> bool:
        """No lease holds anything on it (warm instances may exist: they are the platform's)."""
        return not self.instances


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued request: its shape, project, the scheduler's waiting reason and how long it has waited."""

    request: str
    project: str
    shape: DemandShape
    count: int = 1
    in_quota: bool = True
    reason: str = ""
    waited_seconds: int = 0
    # the node pools it may be placed in (its shape's, else its project's binding; empty: any), as the scheduler
    # places it: a switch for it is proposed only on a GPU of one of them
    pools: tuple[str, ...] = ()

    def allows(self, gpu: CapacityGpu) -> bool:
        return not self.pools or gpu.pool in self.pools


@dataclass(frozen=True, slots=True, order=True)
class DemandShape:
    """What one unit of demand asks for on one model: a whole GPU, a MIG profile or a share."""

    model: str
    kind: Kind
    profile: str = ""
    milli: int = 1000

    @property
    def mode(self) -> GpuMode:
        """The GPU mode that serves it (a whole GPU can also go to an empty shared GPU)."""
        return {Kind.WHOLE: GpuMode.WHOLE, Kind.MIG: GpuMode.MIG, Kind.SHARE: GpuMode.SHARED}[self.kind]

    def label(self) -> str:
        if self.kind == Kind.MIG:
            return f"{self.model} MIG {self.profile}"
        if self.kind == Kind.SHARE:
            return f"{self.model} share {self.milli}"
        return f"{self.model} whole"


@dataclass(frozen=True, slots=True)
class Arrivals:
    """How many units of ``shape`` were requested within the history window."""

    shape: DemandShape
    units: int


@dataclass(frozen=True, slots=True)
class History:
    """Request arrivals by shape over ``[start, end)``."""

    start: float
    end: float
    arrivals: tuple[Arrivals, ...] = ()

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass(frozen=True, slots=True)
class Utilisation:
    """The metered series of one lease: per interval of ``interval_seconds`` from ``start``, the engine-active
    per-mille and the framebuffer used (MiB). Both tuples have one entry per interval, oldest first."""

    lease: str
    start: float
    interval_seconds: int
    engine_active_permille: tuple[int, ...]
    framebuffer_mib: tuple[int, ...]

    @property
    def end(self) -> float:
        return self.start + self.interval_seconds * len(self.engine_active_permille)


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """A project's measured use of one tier: total milli held per interval (for quota advice)."""

    project: str
    tier: str
    start: float
    interval_seconds: int
    milli: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Price:
    """Price per GPU-hour of a model (``profile`` empty), of one MIG profile, or of shares (``share``)."""

    model: str
    minor_per_gpu_hour: int
    profile: str = ""
    share: bool = False


@dataclass(frozen=True, slots=True)
class IdleRule:
    """Idle reclaim for one class: mean engine activity under ``threshold_permille`` over the trailing
    ``window_seconds`` gets a notice; still idle ``notice_seconds`` later, the lease goes."""

    enabled: bool = True
    threshold_permille: int = 50
    window_seconds: int = 1800
    notice_seconds: int = 900


DEFAULT_IDLE_RULES: tuple[tuple[ReclaimClass, IdleRule], ...] = (
    (ReclaimClass.INTERACTIVE, IdleRule(True, 50, 1800, 900)),
    (ReclaimClass.INFERENCE, IdleRule(False, 20, 3600, 900)),
    (ReclaimClass.TRAINING, IdleRule(False, 50, 3600, 1800)),  # off by default: training is not reclaimed
    (ReclaimClass.OVER_QUOTA, IdleRule(True, 50, 900, 300)),
    # suspension of idle resumable training (1 h under 5 %, 30 min of notice, as the replay's ``auto``): on, but
    # it carries idle reclaim's mode (advice by default) and acts only while work waits for the lease's model
    (ReclaimClass.RESUMABLE, IdleRule(True, 50, 3600, 1800)),
)


# Where no policy says otherwise: ``auto`` for the kinds that touch only idle capacity (warm pools; the mode
# and MIG layout of GPUs no lease holds), ``advise`` for every kind that touches a tenant's lease or quota. A
# drain-then-switch touches leases: it is applied only where the drained leases' projects have idle reclaim
# on ``auto`` too (``capacity.planner.planner._drains``).
DEFAULT_MODES: tuple[tuple[AdjustmentKind, Mode], ...] = (
    (AdjustmentKind.MODE_SWITCH, Mode.AUTO),
    (AdjustmentKind.MIG_LAYOUT, Mode.AUTO),
    (AdjustmentKind.WARM_POOL, Mode.AUTO),
    (AdjustmentKind.IDLE_RECLAIM, Mode.ADVISE),
    (AdjustmentKind.RIGHT_SIZE, Mode.ADVISE),
    (AdjustmentKind.QUOTA_ADVICE, Mode.ADVISE),
)

# The cold create time assumed while the fleet has measured none (``CapacitySnapshot.create_latency``).
COLD_CREATE_FALLBACK_SECONDS = 30


@dataclass(frozen=True, slots=True)
class CreateLatency:
    """The fleet's measured cold create time of MIG instances of ``profile`` on ``model`` (``profile`` empty:
    every profile of the model together): p95 over ``samples`` creates, in milliseconds."""

    model: str
    profile: str
    p95_milliseconds: int
    samples: int


@dataclass(frozen=True, slots=True)
class Policy:
    """The loop's settings for one scope: ``""`` (the default), ``project:<id>`` or ``pool:<model>``.

    Pool kinds (mode switch, MIG layout, warm pool) read ``pool:`` then the default; lease and project
    kinds (idle reclaim, right-sizing, quota advice) read ``project:`` then the default. The modes'
    defaults are ``DEFAULT_MODES``."""

    scope: str = ""
    mode_switch: Mode = Mode.AUTO
    mig_layout: Mode = Mode.AUTO
    warm_pool: Mode = Mode.AUTO
    idle_reclaim: Mode = Mode.ADVISE
    right_size: Mode = Mode.ADVISE
    quota_advice: Mode = Mode.ADVISE
    idle_rules: tuple[tuple[ReclaimClass, IdleRule], ...] = DEFAULT_IDLE_RULES
    # the SLO on time-to-GPU of MIG profiles (issue 12: under 1 s): a pool is kept where the cold create misses
    # it, though holding it costs more instance time than it saves (a member waits N / rate >= the cold create
    # on average, so a pool sized by ``poisson_pool_size`` always does); None: no SLO, a pool only where it
    # saves more than it holds
    warm_target_p95_seconds: int | None = 1
    # a cold MIG create + start, the time a pool member takes to refill (None: the fleet's measured p95,
    # ``CapacitySnapshot.create_latency``, or ``COLD_CREATE_FALLBACK_SECONDS`` while none is measured)
    cold_provision_seconds: int | None = None
    warm_miss_probability_permille: int = 50  # P(arrivals during a refill > N) must stay under this
    warm_min_arrivals: int = 3  # fewer arrivals of a profile in the history window: no pool
    right_size_min_seconds: int = 86_400  # evidence needed before right-sizing advice
    right_size_headroom_permille: int = 200  # 20 % above the p95 engine activity / peak framebuffer
    rebalance_min_arrivals: int = 10  # fewer units in the history window: no rebalance toward its mix
    mode_hold_seconds: int = 3600  # a GPU keeps a mode this long before a rebalance may move it
    quota_window_seconds: int = 30 * 86_400
    quota_low_permille: int = 500  # p95 use under half the deserved quota: advise lowering it
    # reclaim classes the project's tenant opted in to (``Project.idle_reclaim_opt_in``: interactive, and the
    # suspension of resumable training): reclaimed
    # ``auto`` where ``idle_reclaim`` is ``advise``; never where it is ``off``. The service leaves it empty where a
    # staff policy of the project's scope sets ``idle_reclaim`` itself (staff's word wins)
    idle_auto_classes: tuple[ReclaimClass, ...] = ()

    def mode_of(self, kind: AdjustmentKind) -> Mode:
        return getattr(self, kind.value)

    def idle_mode(self, reclaim_class: ReclaimClass) -> Mode:
        """Idle reclaim's mode for leases of one class: ``idle_reclaim``, raised from ``advise`` to ``auto`` for
        the classes the project opted in to."""
        if self.idle_reclaim == Mode.ADVISE and reclaim_class in self.idle_auto_classes:
            return Mode.AUTO
        return self.idle_reclaim

    def idle_rule(self, reclaim_class: ReclaimClass) -> IdleRule:
        for name, rule in self.idle_rules:
            if name == reclaim_class:
                return rule
        return IdleRule(enabled=False)


@dataclass(frozen=True, slots=True)
class CapacitySnapshot:
    gpus: tuple[CapacityGpu, ...]
    queue: tuple[Waiting, ...] = ()
    history: History = History(0.0, 0.0)
    utilisation: tuple[Utilisation, ...] = ()
    quotas: tuple[QuotaSpec, ...] = ()
    quota_use: tuple[QuotaUse, ...] = ()
    prices: tuple[Price, ...] = ()
    currency: str = "EUR"
    policies: tuple[Policy, ...] = (Policy(),)
    create_latency: tuple[CreateLatency, ...] = ()  # the fleet's measured cold creates (warm pool sizing)


# -- the output ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Slot:
    """One MIG instance of a proposed layout or warm pool: a profile at a start slot on a GPU."""

    gpu: str
    start: int
    profile: str


@dataclass(frozen=True, slots=True)
class Evidence:
    """The figures an adjustment rests on and the window ``[start, end)`` they cover."""

    start: float
    end: float
    figures: tuple[tuple[str, int | str], ...]


@dataclass(frozen=True, slots=True)
class Gain:
    """What the adjustment is expected to win (negative: cost), over the evidence window or per hour as the
    reason says: GPU-seconds of capacity, money in minor units, seconds of p95 time-to-GPU."""

    gpu_seconds: int = 0
    money_minor: int = 0
    time_to_gpu_seconds: int = 0


@dataclass(frozen=True, slots=True)
class Change:
    """What applying the adjustment does (the fields its kind uses; the rest stay empty).

    mode_switch / mig_layout: ``gpu`` goes from ``from_mode`` to ``to_mode`` (after draining ``risk`` when
    ``drain``) and, in MIG mode, is carved into ``slots``. warm_pool: the pool of ``profile`` on ``model``
    goes from ``size_before`` to ``size_after`` instances, creating ``slots`` or removing ``remove``.
    idle_reclaim: ``step`` for ``lease`` (``suspend``: resumable training back to the queue). right_size:
    ``lease`` (or ``project``) would fit ``profile`` on
    ``model``. quota_advice: ``project``'s deserved on ``model`` from ``size_before`` to ``size_after`` milli.
    """

    gpu: str = ""
    from_mode: str = ""
    to_mode: str = ""
    drain: bool = False
    slots: tuple[Slot, ...] = ()
    remove: tuple[str, ...] = ()
    model: str = ""
    profile: str = ""
    size_before: int = 0
    size_after: int = 0
    lease: str = ""
    project: str = ""
    step: str = ""


@dataclass(frozen=True, slots=True)
class Adjustment:
    kind: AdjustmentKind
    target: str  # what it changes: "gpu:<id>", "pool:<model>/<profile>", "lease:<id>", "project:<id>/<tier>"
    change: Change
    evidence: Evidence
    expected_gain: Gain
    risk: tuple[str, ...]  # lease ids the change touches (notice, drain, release)
    mode: Mode
    reason: str
