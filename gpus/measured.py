"""Workloads measured on real GPUs, the fit of the performance model's constants to them, and its error.

The rows are in ``gpus/data/`` (one CSV per GPU and date, the method in its README; ``bench/device_perf.py``
writes more in the same columns). A row is one case (architecture, task, precision, batch, sequence or image
size) run in one mode: ``eager`` (the framework's ``model(x)``; decode with the library's KV cache), ``graph``
(the same step captured once as a CUDA graph and replayed: the performance model's ``engine`` regime) or
``own-eager`` (the graph's decoder run eagerly: kept, not fitted or scored, since its operations are not the
library's).

- ``fit(rows)`` fits ``gpus.performance.Constants`` in three groups, each by coordinate descent on the sum of
  absolute log errors (a median fit, robust to the host-bound rows' ±30 % spread): the bandwidth efficiency
  and the per-kernel cost on decode replayed as a graph; the eager efficiencies and host costs on the eager
  rows' throughput; the workspace and CNN activation figures on the eager rows' peak memory. A constant no
  row of ``rows`` constrains (no CNN among them, no FP32 CNN) keeps its prior (``Constants()``).
- ``errors(rows, constants)`` scores a model on rows: per subset the median absolute % error and the range of
  measured ÷ predicted, throughput and memory, and whether the predicted bound (host or GPU) contradicts
  the measured one (``measured_bound``).
- ``cross_validate(rows)``: fit on every architecture but one, score on that one (each architecture in turn).
- ``held_out()``: the constants as fitted on the check rows (``CHECK_FILES``) of architectures they never saw, on
  the GPU models they were fitted on; ``other_gpus()``: on the check rows of a GPU model no fitted row was
  measured on (an H200), with the measured ÷ modelled ratio between that GPU and a fitted model's check machine.
- ``results_csv(path)``: a ``bench/device_perf.py`` results file as a ``gpus/data`` CSV.

Standard library only.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, fields, replace
from pathlib import Path

from gpus.performance import CONTEXT_MIB, FITTED, Constants, Workload, estimate, fitted_efficiency, whole

DATA = Path(__file__).resolve().parent / "data"
# the GPU each file was measured on (the file names say it for people; this says it for the code)
FILES = {"h100-80gb-hbm3-2026-11-26.csv": "H100-80GB"}
# measured to check the model, never fitted on (bench/device_perf.py --held-out, 2026-11-27, lent machines): another
# H100, the five architectures above again and 24 the constants have never seen (``held_out``); an H200, the same
# 29 architectures on a GPU model no fitted row was measured on (``other_gpus``)
CHECK_FILES = {"h100-80gb-hbm3-2026-11-27.csv": "H100-80GB", "h200-141gb-2026-11-27.csv": "H200-141GB"}
COLUMNS = ("arch", "task", "precision", "batch", "seq", "image", "mode", "step_s", "throughput", "peak_mib", "spread")
MODES = ("eager", "graph", "own-eager")
REGIME_OF_MODE = {"eager": "eager", "graph": "engine", "own-eager": "eager"}


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured case on one slice (``slice_key``: ``MODEL``, ``MODEL/mig/PROFILE``)."""

    slice_key: str
    architecture: str
    task: str
    precision: str
    batch: int
    seq: int
    image: int
    mode: str
    step_s: float
    throughput: float  # samples/s; tokens/s for generation
    peak_mib: float | None  # torch.cuda.max_memory_allocated (no CUDA context); None when not measured
    spread: float

    @property
    def workload(self) -> Workload:
        return Workload(self.architecture, self.task, self.precision, self.batch, self.seq, self.image,
                        REGIME_OF_MODE[self.mode])

    @property
    def case(self) -> tuple:
        return (self.slice_key, self.architecture, self.task, self.precision, self.batch, self.seq, self.image)

    @property
    def subset(self) -> str:
        """The subsets the issue's table reports: eager decode, eager GPU-bound inference, graph decode…"""
        if self.mode == "graph":
            return "graph decode" if self.task == "generation" else "graph inference"
        if self.mode == "own-eager":
            return "own-eager decode"
        if self.task == "generation":
            return "eager decode"
        return "eager inference, batch >= 8" if self.batch >= 8 else "eager inference, batch < 8"


def row_of(values: dict, slice_key: str) -> Measurement:
    """A row from CSV or JSON values; ``ValueError`` naming the column when one is missing or wrong."""
    def number(name, kind=float, optional=False):
        raw = values.get(name)
        if raw in (None, "") and optional:
            return None
        try:
            return kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: not a number ({raw!r})") from None

    mode = values.get("mode")
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}")
    row = Measurement(slice_key, str(values.get("arch")), str(values.get("task")), str(values.get("precision")),
                      number("batch", int), number("seq", int), number("image", int), mode, number("step_s"),
                      number("throughput"), number("peak_mib", optional=True), number("spread", optional=True) or 0.0)
    row.workload  # noqa: B018 - raises ValueError naming the field when the case is not a sound workload
    return row


def load(path: Path | None = None, slice_key: str | None = None) -> list[Measurement]:
    """The rows of one file (default: every file of ``gpus/data``), on the slice ``FILES`` names for it."""
    paths = [path] if path else sorted(DATA / name for name in FILES)
    rows = []
    for each in paths:
        key = slice_key or FILES[each.name]
        with each.open(newline="") as handle:
            rows += [row_of(values, key) for values in csv.DictReader(handle)]
    return rows


def load_check() -> list[Measurement]:
    """The rows of ``CHECK_FILES``: measured to score the model, never to fit it."""
    rows = []
    for name, key in sorted(CHECK_FILES.items()):
        rows += load(DATA / name, key)
    return rows


def held_out(fitted: list[Measurement] | None = None) -> dict:
    """The model as fitted (``FITTED``: on ``FILES`` alone) scored on the check rows of architectures it was never
    fitted on, on the GPU models it was fitted on (another GPU model's rows are ``other_gpus``'), and how the check
    rows of the fitted architectures compare with the fitted rows of the same cases (another machine, another day:
    measured ÷ measured per mode)."""
    fitted = fitted if fitted is not None else load()
    models = {r.slice_key for r in fitted}
    check = [r for r in load_check() if r.slice_key in models]
    seen = {r.architecture for r in fitted}
    unseen = [r for r in check if r.architecture not in seen]
    scored = errors(unseen, FITTED, context=check)
    by_case = {(r.case, r.mode): r for r in fitted}
    again: dict[str, list[float]] = {}
    for row in check:
        if (row.case, row.mode) in by_case:
            again.setdefault(row.mode, []).append(row.throughput / by_case[(row.case, row.mode)].throughput)
    return {"architectures": sorted({r.architecture for r in unseen}), "rows": len(unseen),
            "subsets": scored["subsets"], "cases": scored["cases"], "contradictions": scored["contradictions"],
            "reproduced": {mode: {"cases": len(v), "median": round(statistics.median(v), 3),
                                  "range": [round(min(v), 3), round(max(v), 3)],
                                  "median_abs_difference": round(statistics.median(abs(x - 1) for x in v), 4)}
                           for mode, v in sorted(again.items())}}


def _ratios(values: list[float]) -> dict:
    return {"cases": len(values), "median": round(statistics.median(values), 3),
            "range": [round(min(values), 3), round(max(values), 3)]}


def other_gpus(fitted: list[Measurement] | None = None) -> dict:
    """The model as fitted (``FITTED``) on the check rows of each GPU model that no fitted row was measured on
    (slice key → figures): its error per subset as ``errors`` gives it (every architecture: the fitted ones were
    fitted on another GPU), the median predicted ÷ measured throughput per subset and per mode (``eager``,
    ``graph``, ``own-eager``), the same for the fitted architectures alone, and the scaling ``fill`` relies on:
    for each case also measured on a fitted model's check machine, measured ratio ÷ predicted ratio between
    the two GPUs (per mode; 1 when the model scales a measurement to the other GPU exactly)."""
    fitted = fitted if fitted is not None else load()
    models, seen = {r.slice_key for r in fitted}, {r.architecture for r in fitted}
    check = load_check()
    reference = {(r.case[1:], r.mode): r for r in check if r.slice_key in models}
    out = {}
    for key in sorted({r.slice_key for r in check} - models):
        rows = [r for r in check if r.slice_key == key]
        scored = errors(rows, FITTED, context=rows)
        ratio = {id(r): predicted(r).throughput / r.throughput for r in rows}
        by_subset: dict[str, list[float]] = {}
        by_mode: dict[str, list[float]] = {}
        by_mode_seen: dict[str, list[float]] = {}
        scaling: dict[str, list[float]] = {}
        for row in rows:
            for subset in (row.subset, "eager, all") if row.mode == "eager" else (row.subset,):
                by_subset.setdefault(subset, []).append(ratio[id(row)])
            by_mode.setdefault(row.mode, []).append(ratio[id(row)])
            if row.architecture in seen:
                by_mode_seen.setdefault(row.mode, []).append(ratio[id(row)])
            other = reference.get((row.case[1:], row.mode))
            if other is not None:
                modelled = predicted(row).throughput / predicted(other).throughput
                scaling.setdefault(row.mode, []).append((row.throughput / other.throughput) / modelled)
        out[key] = {"rows": len(rows), "architectures": sorted({r.architecture for r in rows}),
                    "reference": sorted({r.slice_key for r in reference.values()}),
                    "subsets": scored["subsets"], "cases": scored["cases"], "contradictions": scored["contradictions"],
                    "predicted_over_measured": {name: _ratios(v) for name, v in sorted(by_subset.items())},
                    "predicted_over_measured_by_mode": {mode: _ratios(v) for mode, v in sorted(by_mode.items())},
                    "fitted_architectures_by_mode": {mode: _ratios(v) for mode, v in sorted(by_mode_seen.items())},
                    "scaling_by_mode": {mode: _ratios(v) for mode, v in sorted(scaling.items())}}
    return out


def results_csv(path: Path) -> str:
    """A ``bench/device_perf.py`` results file's rows as a ``gpus/data`` CSV (``COLUMNS``, the run's order, a value
    as the file has it; an empty cell where a peak was not taken). One slice per file, since the CSV has no slice
    column (``FILES`` / ``CHECK_FILES`` name it): ``ValueError`` naming the field when a file mixes slices or
    holds a dry run's rows (they measure no GPU)."""
    import io
    import json

    rows = json.loads(Path(path).read_text())["figures"]["rows"]
    if any(row.get("dry_run") for row in rows):
        raise ValueError("dry_run: a dry run's rows measure no GPU")
    if len({row.get("slice") for row in rows}) > 1:
        raise ValueError(f"slice: one per file, not {sorted({str(row.get('slice')) for row in rows})}")
    for row in rows:
        row_of(row, str(row.get("slice")))  # each row as the loader will read it, or the field's error
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(name) is None else row[name] for name in COLUMNS])
    return out.getvalue()


def load_results(path: Path, *, dry_run: bool = False) -> list[Measurement]:
    """The rows of a ``bench/device_perf.py`` results file (``figures.rows``, each with its ``slice``); a dry
    run's stand-in rows only when ``dry_run`` (they measure no GPU: never fit on them)."""
    import json

    figures = json.loads(Path(path).read_text())["figures"]
    return [row_of(values, values["slice"]) for values in figures["rows"]
            if dry_run or not values.get("dry_run")]


def predicted(row: Measurement, constants: Constants = FITTED):
    return estimate(row.workload, _slice(row.slice_key), constants=constants)


def _slice(key: str):
    from gpus.performance import slice_from_key

    return slice_from_key(key) if "/" in key else whole(key)


def predicted_peak_mib(row: Measurement, constants: Constants = FITTED) -> float:
    """The model's peak memory as the measurement counts it: without the CUDA context."""
    return predicted(row, constants).memory_mib - CONTEXT_MIB


GRAPH_SLOWER = 1.1  # a graph replay this much slower than its eager step ran other kernels (``measured_bound``)


def measured_bound(row: Measurement, rows: list[Measurement]) -> str | None:
    """``host`` or ``gpu`` from the measurements alone, ``None`` when they do not tell. Graph rows are GPU-bound
    (nothing waits on the host). An eager row is host-bound when it takes ≥ 2× its case replayed as a graph, or
    when a larger batch of the same case took less than half the proportional time (the step did not grow with
    the work); GPU-bound when its graph row is within 1.3×, or when it took at least 0.7 × proportional the time
    of a smaller batch.

    A graph replay that took longer than the eager step (by more than ``GRAPH_SLOWER``) says nothing: replaying
    removes host work only, so the same kernels cannot take longer; it captured other kernels (bert-base at batch
    32: SDPA took another path under capture, 5.4 ms against 4.4 ms eagerly), and the batches decide."""
    if row.mode == "graph":
        return "gpu"
    if row.mode != "eager":
        return None
    graph = next((r for r in rows if r.mode == "graph" and r.case == row.case), None)
    if graph is not None and graph.step_s <= row.step_s * GRAPH_SLOWER:
        ratio = row.step_s / graph.step_s
        if ratio >= 2:
            return "host"
        if ratio <= 1.3:
            return "gpu"
    same = [r for r in rows if r.mode == "eager" and r.case[:4] == row.case[:4] and r.case[5:] == row.case[5:]
            and r.batch != row.batch]
    for other in same:
        small, large = (row, other) if row.batch < other.batch else (other, row)
        grew = (large.step_s / small.step_s) / (large.batch / small.batch)
        if row is small and grew < 0.5:
            return "host"
        if row is large and grew >= 0.7:
            return "gpu"
    return None


def _log_error(predicted_value: float, measured: float) -> float:
    return abs(math.log(max(predicted_value, 1e-12) / measured))


# -- the fit ----------------------------------------------------------------------------------------------

GROUPS = {
    "graph": ("memory_efficiency", "kernel_seconds"),
    "eager": ("eager_compute_efficiency", "eager_gemm_half_macs", "eager_conv_efficiency", "host_seconds_per_op",
              "eager_host_seconds_per_step"),
    "memory": ("workspace_mib", "conv_fp32_workspace_maps"),
}
BOUNDS = {"memory_efficiency": (0.2, 0.95), "eager_compute_efficiency": (0.05, 0.95),
          "eager_conv_efficiency": (0.02, 0.95), "kernel_seconds": (5e-7, 5e-5), "host_seconds_per_op": (1e-6, 2e-4),
          "eager_host_seconds_per_step": (0.0, 0.02), "eager_gemm_half_macs": (0.0, 2e9),
          "workspace_mib": (0.0, 1024.0), "conv_fp32_workspace_maps": (0.0, 20.0)}


def _constrains(name: str, row: Measurement) -> bool:
    """Whether ``row`` says anything about the constant ``name`` (the others keep their prior)."""
    cnn = row.architecture in _CNNS
    if name == "eager_conv_efficiency":
        return cnn
    if name == "conv_fp32_workspace_maps":
        return cnn and row.precision == "fp32"
    if name in ("eager_compute_efficiency", "eager_gemm_half_macs"):
        return not cnn
    return True


def _cnns() -> frozenset[str]:
    from gpus.architectures import ARCHITECTURES, ConvNet

    return frozenset(name for name, arch in ARCHITECTURES.items() if isinstance(arch, ConvNet))


_CNNS = _cnns()


def _descend(constants: Constants, names, loss, sweeps: int = 6) -> Constants:
    """Coordinate descent: each constant in turn on a log grid (a linear one for those whose prior is 0), the
    grid narrowing each sweep; ties keep the current value."""
    for sweep in range(sweeps):
        for name in names:
            low, high = BOUNDS[name]
            current = getattr(constants, name)
            width = 2.0 / (3 ** sweep)
            if current > 0 and low > 0:
                grid = [current * math.exp(width * (k / 10 - 1)) for k in range(21)]
            else:
                span = (high - low) / (4 ** sweep)
                grid = [current + span * (k / 10 - 1) for k in range(21)]
            grid = sorted({min(high, max(low, value)) for value in grid} | {current})
            best, best_loss = current, loss(constants)
            for value in grid:
                trial = loss(replace(constants, **{name: value}))
                if trial < best_loss - 1e-12:
                    best, best_loss = value, trial
            constants = replace(constants, **{name: best})
    return constants


def _rounded(constants: Constants) -> Constants:
    """Three significant figures: what the module states and the docs print."""
    return Constants(**{f.name: float(f"{getattr(constants, f.name):.3g}") for f in fields(Constants)})


def fit(rows: list[Measurement], prior: Constants | None = None) -> Constants:
    """The constants that fit ``rows`` best (module docstring); those no row constrains keep ``prior``."""
    constants = prior or Constants()
    graph = [r for r in rows if r.mode == "graph" and r.task == "generation"]
    eager = [r for r in rows if r.mode == "eager"]
    memory = [r for r in eager if r.peak_mib]

    def free(names, subset):
        return [n for n in names if any(_constrains(n, r) for r in subset)]

    if graph:
        constants = _descend(constants, free(GROUPS["graph"], graph), lambda c: sum(
            _log_error(predicted(r, c).throughput, r.throughput) for r in graph))
    if eager:
        constants = _descend(constants, free(GROUPS["eager"], eager), lambda c: sum(
            _log_error(predicted(r, c).throughput, r.throughput) for r in eager))
    if memory:
        constants = _descend(constants, free(GROUPS["memory"], memory), lambda c: sum(
            _log_error(max(1.0, predicted_peak_mib(r, c)), r.peak_mib) for r in memory))
    # the engine's compute efficiency stays MLPerf's (TensorRT engines), refitted with the new kernel and bandwidth
    # figures since they change the MLPerf points' modelled step
    constants = replace(constants, compute_efficiency=fitted_efficiency(constants=constants))
    return _rounded(constants)


# -- the error ----------------------------------------------------------------------------------------------

def summary(pairs: list[tuple[float, float]]) -> dict:
    """Median absolute % error and the range of measured ÷ predicted over (measured, predicted) pairs."""
    if not pairs:
        return {"cases": 0}
    ratios = [m / p for m, p in pairs]
    return {"cases": len(pairs), "median_abs_error": round(statistics.median(abs(p / m - 1) for m, p in pairs), 4),
            "measured_over_predicted": [round(min(ratios), 3), round(max(ratios), 3)],
            "over_predicted": sum(1 for r in ratios if r < 1)}


def errors(rows: list[Measurement], constants: Constants = FITTED, *, context: list[Measurement] | None = None) -> dict:
    """The model's error on ``rows`` per subset (throughput and memory) and its bound against the measured one
    (``context``: the rows ``measured_bound`` may compare with; default ``rows``)."""
    context = context or rows
    subsets: dict[str, dict] = {}
    cases = []
    for row in rows:
        guess = predicted(row, constants)
        bound = measured_bound(row, context)
        model_bound = "host" if guess.bound == "host" else "gpu"
        entry = subsets.setdefault(row.subset, {"throughput": [], "memory": []})
        entry["throughput"].append((row.throughput, guess.throughput))
        if row.peak_mib:
            entry["memory"].append((row.peak_mib, predicted_peak_mib(row, constants)))
        cases.append({"arch": row.architecture, "task": row.task, "precision": row.precision, "batch": row.batch,
                      "seq": row.seq, "mode": row.mode, "measured": round(row.throughput, 2),
                      "predicted": round(guess.throughput, 2), "measured_peak_mib": row.peak_mib,
                      "predicted_peak_mib": round(predicted_peak_mib(row, constants), 1) if row.peak_mib else None,
                      "bound": guess.bound, "measured_bound": bound,
                      "contradicts": bound is not None and bound != model_bound})
    out = {name: {"throughput": summary(v["throughput"]), "memory": summary(v["memory"])}
           for name, v in sorted(subsets.items())}
    scored = [r for r in rows if r.mode != "own-eager"]
    eager = [r for r in scored if r.mode == "eager"]
    out["eager, all"] = {"throughput": summary([(r.throughput, predicted(r, constants).throughput) for r in eager]),
                         "memory": summary([(r.peak_mib, predicted_peak_mib(r, constants)) for r in eager
                                             if r.peak_mib])}
    return {"subsets": out, "cases": cases, "contradictions": sum(1 for c in cases if c["contradicts"])}


def cross_validate(rows: list[Measurement], prior: Constants | None = None) -> dict:
    """Each architecture scored by constants fitted on the others (the held-out architecture's rows never seen):
    the errors of the pooled held-out predictions, and each fold's constants."""
    names = sorted({r.architecture for r in rows})
    held_cases, folds = [], {}
    pooled: dict[str, dict[str, list]] = {}
    for name in names:
        constants = fit([r for r in rows if r.architecture != name], prior)
        folds[name] = {f.name: getattr(constants, f.name) for f in fields(Constants)}
        held = [r for r in rows if r.architecture == name]
        scored = errors(held, constants, context=rows)
        held_cases += scored["cases"]
        for row in held:
            guess = predicted(row, constants)
            pooled_in = (row.subset,)
            if row.mode == "eager":
                pooled_in += ("eager, all",) + (("eager inference",) if row.task != "generation" else ())
            for subset in pooled_in:
                entry = pooled.setdefault(subset, {"throughput": [], "memory": []})
                entry["throughput"].append((row.throughput, guess.throughput))
                if row.peak_mib:
                    entry["memory"].append((row.peak_mib, predicted_peak_mib(row, constants)))
    subsets = {name: {"throughput": summary(v["throughput"]), "memory": summary(v["memory"])}
               for name, v in sorted(pooled.items())}
    memory_all = [pair for name, v in pooled.items() if name != "eager, all" for pair in v["memory"]]
    return {"subsets": subsets, "memory_all": summary(memory_all), "cases": held_cases,
            "contradictions": sum(1 for c in held_cases if c["contradicts"]), "folds": folds}


# -- measured beats modelled ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Filled:
    """A workload on a slice: measured there, or the model's ratio from its nearest measurement (``source``)."""

    slice_key: str
    throughput: float
    memory_mib: int  # the framebuffer it holds, CUDA context included (what DCGM shows)
    fits: bool
    engine_active: float
    source: str  # "measured" or "scaled from <slice key>"
    regime: str

    @property
    def measured(self) -> bool:
        return self.source == "measured"


def fill(workload: Workload, where, measured: dict, constants: Constants = FITTED) -> Filled:
    """``workload`` on the slice ``where``: its measurement when ``measured`` (slice key → (throughput, memory MiB
    with the context, engine activity or None)) has that slice; else the nearest measured slice (the one the
    model puts closest in throughput) scaled by the model's ratio between the two slices in the workload's own
    regime, so a host-bound workload does not speed up on a bigger GPU, and its memory by the model's
    difference (another precision, another slice kind). With no measurement at all, the model alone."""
    guess = estimate(workload, where, constants=constants)
    if where.key in measured:
        throughput, memory, engine = measured[where.key]
        fits = throughput > 0 and memory <= where.memory_mib
        return Filled(where.key, throughput if fits else 0.0, int(memory), fits,
                      guess.engine_active if engine is None else engine, "measured", workload.regime)
    if not measured:
        return Filled(where.key, guess.throughput, guess.memory_mib, guess.fits, guess.engine_active, "model",
                      workload.regime)
    others = {key: estimate(workload, _slice(key), constants=constants) for key in measured}

    def distance(key: str) -> tuple:
        other = others[key]
        if other.throughput <= 0 or guess.throughput <= 0:
            return (1, key)
        return (0, abs(math.log(guess.throughput / other.throughput)), key)

    nearest = min(measured, key=distance)
    throughput, memory, _engine = measured[nearest]
    other = others[nearest]
    memory_mib = round(memory + guess.memory_mib - other.memory_mib)
    fits = memory_mib <= where.memory_mib and throughput > 0
    scaled = throughput * guess.throughput / other.throughput if other.throughput > 0 and fits else 0.0
    return Filled(where.key, scaled, memory_mib, fits, guess.engine_active, f"scaled from {nearest}",
                  workload.regime)


def expected_error(regime: str, task: str) -> float:
    """The model's cross-validated median absolute error for a workload of this regime and task (docs/tiering.md
    §2, ``bench/tiering.py --truth measured``): what a prediction's figure may be off by, typically."""
    if regime == "engine":
        return CROSS_VALIDATED_ERROR["graph decode"] if task == "generation" else CROSS_VALIDATED_ERROR["engine"]
    return CROSS_VALIDATED_ERROR["eager decode"] if task == "generation" else CROSS_VALIDATED_ERROR["eager inference"]


# ``cross_validate(load())``'s median absolute throughput errors (bench/results/tiering_measured.json); "engine"
# for anything but decode is the MLPerf calibration's leave-one-out error (``calibration()``)
CROSS_VALIDATED_ERROR = {"graph decode": 0.079, "eager decode": 0.231, "eager inference": 0.169, "engine": 0.163}
