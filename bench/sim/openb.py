"""Loading the Alibaba openb trace (cluster-trace-gpu-v2023) into scheduler inputs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from broker.scheduler.placement import Need
from broker.scheduler.state import FULL
from broker.scheduler.types import Gpu, GpuMode, Kind, Node
from gpus.catalogue import model_get


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    need: Need

    @property
    def gpu_milli(self) -> int:
        return self.need.total_milli


def load_nodes(path: Path) -> tuple[tuple[Node, ...], tuple[Gpu, ...]]:
    nodes, gpus = [], []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            node = Node(row["sn"], cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]))
            nodes.append(node)
            model = model_get(row["model"]).code
            for index in range(int(row["gpu"])):
                gpus.append(Gpu(f"{node.id}/{index}", node.id, model, GpuMode.SHARED, index))
    return tuple(nodes), tuple(gpus)


def load_tasks(path: Path) -> list[Task]:
    tasks = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            spec = row.get("gpu_spec") or ""
            models = tuple(sorted({model_get(m).code for m in spec.split("|") if m}))
            cpu, memory = int(row["cpu_milli"]), int(row["memory_mib"])
            if count == 0 or milli == 0:
                need = Need(Kind.SHARE, 0, models, 0, 0, None, True, cpu, memory)
            elif count == 1 and milli < FULL:
                need = Need(Kind.SHARE, 1, models, milli, 0, None, True, cpu, memory)
            else:
                need = Need(Kind.WHOLE, count, models, FULL, 0, None, True, cpu, memory)
            tasks.append(Task(row["name"], need))
    return tasks
