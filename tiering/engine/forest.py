"""The Random Forest: predicts a workload's throughput and peak memory on a slice as ratios to what was
observed on its reference slice, from ``features``. Trained on the profile database (profiled and observed
rows); its confidence that a slice meets a target is the share of its trees that say so.

NumPy and scikit-learn are imported where a forest is fitted or asked (about a second of CPU): every Celery
worker and web process imports this module through ``tiering.services``, and most never train or predict.
Unpickling a stored model imports them too (pickle loads the classes it names)."""

from __future__ import annotations

import io
import math
import pickle
import random
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpus.performance import Slice, Workload

from .decide import EXPLORE_CONFIDENCE, Option, choose, measured_meets
from .features import NAMES, Observation, features, prior_memory, prior_throughput

if TYPE_CHECKING:
    from sklearn.ensemble import RandomForestRegressor


@dataclass(frozen=True, slots=True)
class Row:
    """One training row: the workload on ``slice`` (throughput 0 when it did not fit) and its reference."""

    workload: Workload
    slice: Slice
    reference: Observation
    throughput: float
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Prediction:
    slice: Slice
    throughput: float  # the forest's mean, samples/s (tokens/s)
    memory_mib: int
    trees: tuple[float, ...]  # each tree's throughput
    residuals: tuple[float, ...] = ()  # the model's held-out log errors on this slice's GPU model (calibration)

    def confidence(self, required: float) -> float:
        """With a calibration: the share of the held-out errors on this GPU model under which the forest's
        mean, so corrected, still reaches ``required`` (an empirical, per-tier bound); without one, the share of
        trees that expect at least ``required``."""
        if self.residuals:
            return sum(1 for r in self.residuals if self.throughput * math.exp(r) >= required) / len(self.residuals)
        return sum(1 for value in self.trees if value >= required) / len(self.trees)


class TierModel:
    def __init__(self, n_estimators: int = 150, min_samples_leaf: int = 2, seed: int = 0):
        self.n_estimators, self.min_samples_leaf, self.seed = n_estimators, min_samples_leaf, seed
        self.throughput_forest: RandomForestRegressor | None = None
        self.memory_forest: RandomForestRegressor | None = None
        self.rows = 0
        self.compute_efficiency, self.memory_efficiency = 1.0, 1.0
        self.residuals: dict[str, tuple[float, ...]] = {}  # per GPU model: held-out log(measured / predicted)
        self.noise = 0.0  # run-to-run noise of one measurement (σ of its log), estimated from repeats
        self.threshold: float | None = None  # the least confidence to place on, chosen on the held-out folds
        self.threshold_folds: dict[str, dict] = {}  # per candidate threshold: misses, regret on those folds

    def _forest(self) -> RandomForestRegressor:
        from sklearn.ensemble import RandomForestRegressor

        return RandomForestRegressor(n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
                                     max_features=0.6, random_state=self.seed, n_jobs=1)

    def fit(self, rows: list[Row]) -> TierModel:
        import numpy as np

        ran = [r for r in rows if r.throughput > 0]
        if len(ran) < 10:
            raise ValueError(f"too few profile rows to train on: {len(ran)} (need 10 that ran)")
        self.compute_efficiency, self.memory_efficiency = fit_efficiencies(ran, self.seed)
        x = np.array([features(r.workload, r.slice, r.reference) for r in ran])
        # the forests learn the corrections to the priors (residual learning)
        self.throughput_forest = self._forest().fit(
            x, [math.log(r.throughput / self._prior(r.workload, r.slice, r.reference)) for r in ran])
        self.memory_forest = self._forest().fit(
            x, [math.log(r.memory_mib / prior_memory(r.workload, r.slice, r.reference)) for r in ran])
        self.rows = len(ran)
        return self

    def _prior(self, workload: Workload, where: Slice, reference: Observation) -> float:
        return prior_throughput(workload, where, reference, self.compute_efficiency, self.memory_efficiency)

    def predict(self, workload: Workload, slices: list[Slice], reference: Observation) -> list[Prediction]:
        if self.throughput_forest is None:
            raise ValueError("the model is not trained")
        import numpy as np

        x = np.array([features(workload, s, reference) for s in slices])
        prior = np.array([self._prior(workload, s, reference) for s in slices])
        per_tree = np.exp(np.array([tree.predict(x) for tree in self.throughput_forest.estimators_])) * prior
        memory = np.exp(self.memory_forest.predict(x)) * np.array([prior_memory(workload, s, reference)
                                                                   for s in slices])
        residuals = getattr(self, "residuals", {})  # models pickled before calibration existed have none
        return [Prediction(s, float(per_tree[:, i].mean()), math.ceil(memory[i]), tuple(per_tree[:, i].tolist()),
                           residuals.get(_tier_key(s), ()))
                for i, s in enumerate(slices)]

    def calibrate(self, rows: list[Row], *, folds: int = 3, trees: int = 30, seed: int = 0,
                  least: int = 30) -> TierModel:
        """Per-tier calibration: refit on the rows of all but one fold of architectures, predict the held-out
        fold, and keep, per GPU model and kind of slice, the log errors ``log(measured / predicted)`` of those
        predictions (one with fewer than ``least`` of them keeps none: its confidence stays the trees' share).
        Architectures, not rows, are held out, so the errors are those of a workload never seen, as at
        admission."""
        names = sorted({r.workload.architecture for r in rows})
        random.Random(seed).shuffle(names)
        errors: dict[str, list[float]] = {}
        # the held-out predictions themselves (row, predicted throughput, predicted memory): what a threshold
        # on the confidence can be chosen on without touching data the model will be judged on
        self.held_out: list[tuple[Row, float, int]] = []
        for fold in range(folds):
            held = set(names[fold::folds])
            train = [r for r in rows if r.workload.architecture not in held]
            test = [r for r in rows if r.workload.architecture in held and r.throughput > 0]
            if not test or len([r for r in train if r.throughput > 0]) < 10:
                continue
            model = TierModel(n_estimators=trees, min_samples_leaf=self.min_samples_leaf, seed=seed).fit(train)
            for (workload, reference), group in _grouped(test).items():
                for row, prediction in zip(group, model.predict(workload, [r.slice for r in group], reference),
                                           strict=True):
                    error = math.log(row.throughput / prediction.throughput)
                    errors.setdefault(_tier_key(row.slice), []).append(error)
                    self.held_out.append((row, prediction.throughput, prediction.memory_mib))
            for row in (r for r in rows if r.workload.architecture in held and r.throughput <= 0):
                self.held_out.append((row, 0.0, row.memory_mib))  # did not fit: its measured memory
        # A held-out error mixes the model's error with the noise of the measurement it is compared with; a
        # target is judged on the workload's true speed, so the noise (estimated from repeated measurements of
        # the same workload on the same slice) is taken out: each tier's errors are shrunk about their median
        # so their variance is the model's alone (σ² − noise², a deconvolution under Gaussian noise).
        self.noise = noise_of(rows)
        self.residuals, self._shrink = {}, {}
        for tier, values in errors.items():
            if len(values) < least:
                continue
            centre, spread = statistics.median(values), statistics.pvariance(values)
            factor = math.sqrt(max(0.0, spread - self.noise ** 2) / spread) if spread > 0 else 1.0
            self._shrink[tier] = (centre, factor)
            self.residuals[tier] = tuple(sorted(centre + (v - centre) * factor for v in values))
        return self

    def denoised(self, row: Row, predicted: float) -> float:
        """A held-out row's measured throughput with its share of the measurement noise taken out, as the
        residuals were (what a threshold is chosen against: the true speed, not one noisy run of it)."""
        shrink = getattr(self, "_shrink", {}).get(_tier_key(row.slice))
        if shrink is None or row.throughput <= 0 or predicted <= 0:
            return row.throughput
        centre, factor = shrink
        return predicted * math.exp(centre + (math.log(row.throughput / predicted) - centre) * factor)

    def calibrated(self, where: Slice) -> bool:
        """Whether the calibration kept held-out errors for ``where``'s tier (``confidence`` rests on them)."""
        return bool(getattr(self, "residuals", {}).get(_tier_key(where)))

    def confidence(self, where: Slice, predicted: float, required: float) -> float:
        """The calibrated confidence that ``where`` reaches ``required`` when the forest predicts
        ``predicted`` (the share of its tier's held-out errors under which it still does)."""
        residuals = self.residuals.get(_tier_key(where), ())
        if not residuals or predicted <= 0:
            return 0.0
        return sum(1 for r in residuals if predicted * math.exp(r) >= required) / len(residuals)

    def choose_threshold(self, price_of, *, targets: int = 3, seed: int = 0, misses_allowed: float = 0.01,
                         headroom: float = 0.05, levels: tuple[float, ...] | None = None,
                         explore: float | None = EXPLORE_CONFIDENCE) -> float:
        """The least confidence to place on, chosen on the calibration's held-out folds only (architectures
        the model being judged never saw, and nothing else): decisions are replayed there with targets drawn
        log-uniform between 1 % and 95 % of each workload's best, judged on the denoised measurements, and
        the lowest level whose misses are ≤ ``misses_allowed`` (half the 2 % target: architectures unlike the
        training ones miss more) wins (the lowest: regret falls as the level does). A decision that profiles
        first takes the cheapest candidate whose measurement (the denoised value with a run's noise drawn anew)
        meets the target with the noise to spare (``measured_meets``), else the confident choice. Kept on the
        model (``threshold``, ``threshold_folds``) and persisted with it."""
        levels = levels or THRESHOLDS
        held = getattr(self, "held_out", [])
        rng, runs = random.Random(seed + 3), random.Random(seed + 4)  # the targets; the profiling runs' noise
        by_workload: dict = {}
        for row, predicted, memory in held:
            if price_of(row.slice) is None:
                continue  # a slice without a price is never offered
            by_workload.setdefault(row.workload, []).append((row, predicted, memory, self.denoised(row, predicted)))
        tallies = {level: [0, 0, 0.0] for level in levels}  # misses, decisions, Σ regret
        for items in by_workload.values():
            best = max(truth for *_, truth in items)
            if best <= 0:
                continue
            for _ in range(targets):
                required = best * math.exp(rng.uniform(math.log(0.01), math.log(0.95)))
                meeting = [price_of(row.slice) for row, _, _, truth in items if truth >= required]
                if not meeting:
                    continue
                oracle = min(meeting)
                options = [Option(row.slice, price_of(row.slice), predicted, memory,
                                  self.confidence(row.slice, predicted, required))
                           for row, predicted, memory, _ in items]
                # a profiling run measures afresh: the denoised value with a run's noise drawn anew
                measured = {row.slice: (truth * math.exp(runs.gauss(0, self.noise)) if truth > 0 else 0.0, truth)
                            for row, _, _, truth in items}
                for level in levels:
                    pick = choose(options, required, min_confidence=level, headroom=headroom, explore=explore)
                    where = pick.option.slice if pick.option is not None and (
                        not pick.profile_first or pick.candidates) else None
                    if pick.candidates:  # profiled first: the held-out rows are those measurements
                        where = next((s for s in pick.candidates
                                      if measured_meets(measured[s][0], required, self.noise)), where)
                    if where is None:
                        continue  # nothing confident: it would profile every likely slice first
                    tally = tallies[level]
                    tally[0] += 0 if measured[where][1] >= required else 1
                    tally[1] += 1
                    tally[2] += price_of(where) / oracle - 1
        self.threshold_folds = {str(level): {"misses": round(t[0] / max(1, t[1]), 4),
                                             "regret": round(t[2] / max(1, t[1]), 4), "decisions": t[1]}
                                for level, t in tallies.items()}
        self.threshold = next((level for level in levels if tallies[level][1]
                               and tallies[level][0] <= misses_allowed * tallies[level][1]), levels[-1])
        return self.threshold

    def importances(self) -> dict[str, float]:
        return dict(zip(NAMES, (round(float(v), 4) for v in self.throughput_forest.feature_importances_),
                        strict=True))

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        pickle.dump(self, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        return buffer.getvalue()

    @staticmethod
    def from_bytes(data: bytes) -> TierModel:
        model = pickle.loads(data)  # noqa: S301 - our own model, written by ``to_bytes`` into our database
        if not isinstance(model, TierModel):
            raise ValueError("not a TierModel")
        return model


def _tier_key(where: Slice) -> str:
    """What a calibration is kept per: the GPU model and the kind of slice (``A100-80GB/mig``)."""
    return f"{where.model}/{where.kind}"


def _grouped(rows: list[Row]) -> dict:
    """Rows by (workload, reference), so one forest call predicts all of a workload's slices."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row.workload, row.reference), []).append(row)
    return groups


THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
DEFAULT_THRESHOLD = 0.6  # a model pickled before thresholds were chosen on its folds


def noise_of(rows: list[Row]) -> float:
    """The run-to-run noise of a measurement (σ of its log) from repeats: a row measured on its workload's
    reference slice is a second measurement of the reference observation, and the log of their ratio has
    variance 2σ². 0 when the database holds no such repeat."""
    pairs = [math.log(r.throughput / r.reference.throughput) for r in rows
             if r.slice == r.reference.slice and r.throughput > 0 and r.reference.throughput > 0
             and r.throughput != r.reference.throughput]  # the reference's own row is no repeat
    if len(pairs) < 5:
        return 0.0
    return statistics.pstdev(pairs) / math.sqrt(2)


def fit_efficiencies(rows: list[Row], seed: int = 0, sample: int = 600) -> tuple[float, float]:
    """The compute and memory efficiencies (the share of datasheet peak reached) that make the roofline prior
    best explain the profile rows (least squared log error on a sample): learned from the database, not
    taken from the simulator's constants."""
    chosen = random.Random(seed).sample(rows, min(sample, len(rows)))

    def loss(ce: float, me: float) -> float:
        return sum(math.log(r.throughput / prior_throughput(r.workload, r.slice, r.reference, ce, me)) ** 2
                   for r in chosen)

    grid = [(0.25 + 0.05 * i, 0.5 + 0.1 * j) for i in range(16) for j in range(6)]
    coarse = min(grid, key=lambda pair: loss(*pair))
    fine = [(coarse[0] + 0.01 * i, coarse[1] + 0.02 * j) for i in range(-4, 5) for j in range(-4, 5)
            if coarse[0] + 0.01 * i > 0 and 0 < coarse[1] + 0.02 * j <= 1.0]
    return tuple(round(v, 3) for v in min(fine, key=lambda pair: loss(*pair)))


def validation_error(rows: list[Row], *, holdout: float = 0.25, seed: int = 0, **options) -> float:
    """Mean absolute relative throughput error on a share of the workloads (by architecture) held out of
    training: the figure persisted with a trained model."""
    names = sorted({r.workload.architecture for r in rows})
    random.Random(seed).shuffle(names)
    held = set(names[: max(1, int(len(names) * holdout))])
    train = [r for r in rows if r.workload.architecture not in held]
    test = [r for r in rows if r.workload.architecture in held and r.throughput > 0]
    if not test or len([r for r in train if r.throughput > 0]) < 10:
        return float("nan")
    model = TierModel(**options).fit(train)
    errors = []
    for row in test:
        (prediction,) = model.predict(row.workload, [row.slice], row.reference)
        errors.append(abs(prediction.throughput / row.throughput - 1))
    return sum(errors) / len(errors)
