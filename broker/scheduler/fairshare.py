"""Fair share with history and the preemption back-off: pure integer arithmetic the scheduler orders by.

**Decayed use** (Slurm's multifactor fair share): a project's borrowed (over-quota) use of a tier, in milli-GPU x
seconds, where each second's use counts half as much one half-life later. ``usage_decayed`` moves it on by an
interval during which the project held ``used_milli`` borrowed: the old figure halves every half-life and the
interval adds the integral of its decayed use, so holding ``u`` milli for ever converges to ``u x H / ln 2``.

**Share key**: the over-quota pass serves the project with the smallest key first and reclaim takes victims from
the project with the largest first. The key is ``(current borrowed use x H + decayed use) / weight`` compared
exactly: multiplied by ``scale // weight`` where ``scale`` is the least common multiple of the weights, so it is an
integer and two projects tie only when their ratios are equal (no float ties). With ``H = 0`` the history is left
out and the key is ``current borrowed use / weight`` exactly, the order the scheduler had before history.

History counts in whole GPU-hours (``HISTORY_GRANULE``): projects whose decayed use differs by less than one
GPU for an hour tie on it, so the scheduler's own tie-breaks decide between them (reclaim: the youngest lease first,
the least work lost), not a few seconds of difference in when two leases started.

**Back-off**: a lease preempted ``count`` times within ``window`` seconds before its latest start is protected from
reclaim for ``protect`` seconds after that start, so work that keeps being reclaimed gets to run a while.
"""

from __future__ import annotations

import math
from functools import reduce

LN2 = math.log(2)
HISTORY_GRANULE = 1000 * 3600  # milli-GPU x seconds: one GPU for an hour


def usage_decayed(*, previous_milli_seconds: int, used_milli: int, elapsed_seconds: float,
                  half_life_seconds: int) -> int:
    """The decayed use ``elapsed_seconds`` later, ``used_milli`` held meanwhile; 0 when the half-life is 0."""
    if half_life_seconds <= 0:
        return 0
    elapsed = max(elapsed_seconds, 0.0)
    kept = 0.5 ** (elapsed / half_life_seconds)
    added = used_milli * half_life_seconds / LN2 * (1.0 - kept)
    return round(previous_milli_seconds * kept + added)


def weights_scale(weights) -> int:
    """The least common multiple of the positive weights (1 when there are none): the share key's scale."""
    return reduce(math.lcm, (w for w in weights if w > 0), 1)


def share_key(*, over_milli: int, decayed_milli_seconds: int, weight: int, half_life_seconds: int,
              scale: int) -> tuple[int, int]:
    """The project's integer fair-share key on one tier (smaller: served earlier, reclaimed later).

    A weight of 0 (the project does not borrow) ranks after every weighted project once it holds anything."""
    history = decayed_milli_seconds // HISTORY_GRANULE * HISTORY_GRANULE
    amount = over_milli if half_life_seconds <= 0 else over_milli * half_life_seconds + history
    if weight <= 0:
        return (1, amount) if amount > 0 else (0, 0)
    return 0, amount * (scale // weight)


def protected_until(preempted_at: tuple[float, ...], started_at: float, *, count: int, window: int,
                    protect: int) -> float | None:
    """When a lease that (re)started at ``started_at`` stops being protected from reclaim, or None when the
    back-off is off or it was preempted fewer than ``count`` times in the ``window`` seconds before that start."""
    if count <= 0 or not preempted_at:
        return None
    recent = sum(1 for at in preempted_at if started_at - window <= at <= started_at)
    return started_at + protect if recent >= count else None


def back_off_words(preempted_at: tuple[float, ...], started_at: float, *, count: int, window: int) -> str:
    """"preempted 3 times in the last 3600 s" for a reason."""
    recent = sum(1 for at in preempted_at if started_at - window <= at <= started_at)
    return f"preempted {recent} time{'s' if recent != 1 else ''} in the {window} s before it started"


__all__ = ["back_off_words", "protected_until", "share_key", "usage_decayed", "weights_scale"]
