from django.db import models


class AdjustmentState(models.TextChoices):
    """PROPOSED: waiting for someone to accept or reject it (advise) or for the loop (auto). APPLYING: being
    carried out (an agent call, a drain). APPLIED / REJECTED / FAILED: done. EXPIRED: the planner no longer
    proposes it (the world moved on) or it waited too long."""

    PROPOSED = "proposed", "Proposed"
    APPLYING = "applying", "Applying"
    APPLIED = "applied", "Applied"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    FAILED = "failed", "Failed"


OPEN_STATES = (AdjustmentState.PROPOSED, AdjustmentState.APPLYING)


class AdjustmentKind(models.TextChoices):
    MODE_SWITCH = "mode_switch", "Mode switch"
    MIG_LAYOUT = "mig_layout", "MIG layout"
    WARM_POOL = "warm_pool", "Warm pool"
    IDLE_RECLAIM = "idle_reclaim", "Idle reclaim"
    RIGHT_SIZE = "right_size", "Right-sizing advice"
    QUOTA_ADVICE = "quota_advice", "Quota advice"


POOL_KINDS = (AdjustmentKind.MODE_SWITCH, AdjustmentKind.MIG_LAYOUT, AdjustmentKind.WARM_POOL)
ADVICE_KINDS = (AdjustmentKind.RIGHT_SIZE, AdjustmentKind.QUOTA_ADVICE)


class LoopMode(models.TextChoices):
    OFF = "off", "Off"
    ADVISE = "advise", "Advise"
    AUTO = "auto", "Auto"
