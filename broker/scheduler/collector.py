"""The garbage collector paused for one schedule cycle.

A cycle at fleet scale makes hundreds of thousands of small objects (the working state's GPU states, the
candidates it scores, the decisions) while the scheduler process keeps its snapshot alive between cycles
(``broker.snapshot``). CPython's collector then runs its young collections thousands of times and its full
collection several times per cycle, each walking every live object, snapshot included: measured at 100,000 GPUs
and 10,000 requests (``bench/scheduler_cycle.py``), the core took 1.16 CPU s with the collector on and 0.84 with
it paused, plus 0.09-0.10 for the young collections run once at the end. Nothing the cycle makes needs the
collector to be freed (reference counting frees it); what it would find, it finds at the end.

Process-wide (``gc.disable`` is): a nested use, or a thread that enters while another has paused it, leaves
the collector to the outermost one. For the schedule cycle, not for the simulators' many small ``plan`` calls
(the collection at each exit would cost more than it saves there).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside; on leaving, the collector on again and the young generations collected once (their
    cost paid here, inside the caller's measured cycle, rather than at some later allocation)."""
    if not gc.isenabled():  # paused already (nested, or another thread's cycle): the outer one resumes it
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(1)
