"""Loading the Microsoft Philly job list into replay jobs.

The trace (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads",
USENIX ATC 2019), as published with the Pollux artifact (OSDI 2021): one row per job,
``timestamp,duration,num_gpus,gpu_time,cluster``. ``timestamp`` is the submission time (UTC, second
resolution), ``duration`` the run time in seconds, ``cluster`` the virtual cluster, which the replay
treats as a project. Jobs asking for no GPU or running for no time are dropped and counted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "bench" / "traces" / "philly" / "philly_jobs_until_2017-11-14.csv"


@dataclass(frozen=True, slots=True)
class Job:
    index: int  # position in submission order; the request id is ``job_id(index)``
    project: str  # the virtual cluster
    arrival: float  # seconds since the first submission of the loaded trace
    duration: float  # seconds of work
    gpus: int

    @property
    def gpu_seconds(self) -> float:
        return self.duration * self.gpus


@dataclass
class Trace:
    jobs: list[Job]
    start: datetime | None  # submission time of the first job
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> rows

    @property
    def span_seconds(self) -> float:
        """First to last submission: the window the offered load is measured over."""
        if len(self.jobs) < 2:
            return 0.0
        return self.jobs[-1].arrival - self.jobs[0].arrival

    @property
    def gpu_seconds(self) -> float:
        return sum(job.gpu_seconds for job in self.jobs)


def job_id(index: int) -> str:
    # zero-padded so that id order is submission order (the core breaks submission-time ties on ids)
    return f"j{index:06d}"


def job_index(request_id: str) -> int:
    return int(request_id[1:])


def load(path: Path | str, *, days: float | None = None, limit: int | None = None,
         from_day: float = 0.0) -> Trace:
    """Jobs in submission order (file order breaks ties); ``from_day``: only jobs submitted that many days or
    more after the trace's first one, their times counted from the first of them (a later window of the same
    trace; the cluster starts empty there too); ``days``: only jobs submitted within that many days of the
    window's first one; ``limit``: only the first that many jobs (after dropping unusable rows)."""
    dropped = {"num_gpus<=0": 0, "duration<=0": 0, "unparseable": 0}
    rows: list[tuple[datetime, int, str, float, int]] = []
    with Path(path).open(newline="") as handle:
        for position, row in enumerate(csv.DictReader(handle)):
            try:
                when = datetime.fromisoformat(row["timestamp"])
                duration = float(row["duration"])
                gpus = int(float(row["num_gpus"]))
                project = row["cluster"].strip()
            except (KeyError, TypeError, ValueError):
                dropped["unparseable"] += 1
                continue
            if gpus <= 0:
                dropped["num_gpus<=0"] += 1
                continue
            if not duration > 0:
                dropped["duration<=0"] += 1
                continue
            rows.append((when, position, project, duration, gpus))
    rows.sort(key=lambda r: (r[0], r[1]))
    if not rows:
        return Trace([], None, dropped)
    if from_day:
        first = rows[0][0]
        rows = [row for row in rows if (row[0] - first).total_seconds() >= from_day * 86400]
        if not rows:
            return Trace([], None, dropped)
    start = rows[0][0]
    jobs: list[Job] = []
    for when, _, project, duration, gpus in rows:
        arrival = (when - start).total_seconds()
        if days is not None and arrival >= days * 86400:
            break
        if limit is not None and len(jobs) >= limit:
            break
        jobs.append(Job(len(jobs), project, arrival, duration, gpus))
    return Trace(jobs, start, dropped)
