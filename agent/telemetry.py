"""Replayed utilisation and memory series for the simulated backend (from the Alibaba GenAI trace).

``agent/data/genai_series.json.gz`` holds per-container GPU duty cycle (%) and memory used (per-mille of
an 80 GiB GPU) on a 60 s grid; ``bench/traces/genai/build.py`` makes it and ``bench/traces/README.md``
names the source. Each instance replays one series from an offset, both chosen from its allocation id,
so telemetry is deterministic: the same instance shows the same values after an agent restart.

Integrals (for the energy counter) use per-series prefix sums, so the energy at time ``t`` is a pure
function of the persisted state and ``t``: it grows monotonically and survives ``kill -9``.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from pathlib import Path

DATA = Path(__file__).parent / "data" / "genai_series.json.gz"


@dataclass(frozen=True, slots=True)
class Series:
    util_pct: tuple[int, ...]
    mem_permille: tuple[int, ...]
    prefix: tuple[int, ...]  # prefix[k] = sum(util_pct[:k])
    step: int

    def _index(self, phase: float) -> int:
        return int(phase // self.step) % len(self.util_pct)

    def util(self, phase: float) -> float:
        """Utilisation in percent at ``phase`` seconds into the (repeating) series."""
        return float(self.util_pct[self._index(phase)])

    def memory_fraction(self, phase: float) -> float:
        return self.mem_permille[self._index(phase)] / 1000

    def util_integral(self, a: float, b: float) -> float:
        """∫ util(phase) d phase over [a, b] (percent-seconds); a <= b."""
        if b <= a:
            return 0.0
        return self._cumulative(b) - self._cumulative(a)

    def _cumulative(self, x: float) -> float:
        period = len(self.util_pct) * self.step
        laps, rest = divmod(x, period)
        whole, part = divmod(rest, self.step)
        whole = int(whole)
        return laps * self.prefix[-1] * self.step + self.prefix[whole] * self.step + part * self.util_pct[whole]


@cache
def all_series() -> tuple[Series, ...]:
    with gzip.open(DATA, "rt", encoding="utf-8") as handle:
        payload = json.load(handle)
    step = int(payload["step_seconds"])
    return tuple(
        Series(tuple(item["util_pct"]), tuple(item["mem_permille"]), (0, *accumulate(item["util_pct"])), step)
        for item in payload["series"]
    )


def pick(allocation_id: str) -> tuple[int, int]:
    """(series index, start offset in seconds) for an instance: stable across restarts and processes."""
    series = all_series()
    index = zlib.crc32(allocation_id.encode()) % len(series)
    chosen = series[index]
    offset = (zlib.crc32(b"offset:" + allocation_id.encode()) % len(chosen.util_pct)) * chosen.step
    return index, offset
