"""Build ``agent/data/genai_series.json.gz`` from the Alibaba GenAI trace (see bench/traces/README.md).

    python bench/traces/genai/build.py bench/traces/genai

Per container: GPU duty cycle (%) and GPU memory used, joined on time and resampled to a 60 s grid
(each sample holds until the next). Containers with fewer than 12 hours of samples are left out.
Memory is stored as per-mille of an 80 GiB GPU (the trace's serving GPUs are 80 GB class); the agent
scales it to each instance's memory.
"""

import csv
import gzip
import io
import json
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

STEP = 60
MIN_SAMPLES = 12 * 3600 // STEP
GPU_BYTES = 80 * 2**30
OUT = Path(__file__).resolve().parents[3] / "agent" / "data" / "genai_series.json.gz"


def _read(archive: Path, value_field: str = "value") -> dict[str, dict[float, float]]:
    series: dict[str, dict[float, float]] = defaultdict(dict)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith(".csv"):
                continue
            text = io.TextIOWrapper(tar.extractfile(member), encoding="utf-8")
            for row in csv.DictReader(text):
                series[row["container_ip"]][float(row["timestamp_anon"])] = float(row[value_field])
    return series


def _grid(points: dict[float, float], start: float, end: float) -> list[float]:
    times = sorted(points)
    out, index = [], 0
    t = start
    while t <= end:
        while index + 1 < len(times) and times[index + 1] <= t:
            index += 1
        out.append(points[times[index]])
        t += STEP
    return out


def main(source: str) -> None:
    folder = Path(source)
    duty = _read(folder / "pod_gpu_duty_cycle_anon.tar.gz")
    memory = _read(folder / "pod_gpu_memory_used_bytes_anon.tar.gz")
    series = []
    for container in sorted(set(duty) & set(memory)):
        d, m = duty[container], memory[container]
        start = max(min(d), min(m))
        end = min(max(d), max(m))
        if (end - start) / STEP < MIN_SAMPLES:
            continue
        util = [max(0, min(100, round(v))) for v in _grid(d, start, end)]
        mem = [max(0, min(1000, round(v * 1000 / GPU_BYTES))) for v in _grid(m, start, end)]
        series.append({"util_pct": util, "mem_permille": mem})
    payload = {
        "source": "Alibaba cluster-trace-v2026-GenAI (pod_gpu_duty_cycle_anon, pod_gpu_memory_used_bytes_anon)",
        "step_seconds": STEP,
        "series": series,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(payload, separators=(",", ":")).encode()
    with open(OUT, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:  # reproducible
        handle.write(data)
    print(f"{len(series)} series, {sum(len(s['util_pct']) for s in series)} samples -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
