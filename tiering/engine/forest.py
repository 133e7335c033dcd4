"""The Random Forest: predicts a workload's throughput and peak memory on a slice as ratios to what was
observed on its reference slice, from ``features``. Trained on the profile database (profiled and observed
rows); its confidence that a slice meets a target is the share of its trees that say so."""

from __future__ import annotations

import io
import math
import pickle
import random
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestRegressor

from gpus.performance import Slice, Workload

from .features import NAMES, Observation, features, prior_memory, prior_throughput


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

    def _forest(self) -> RandomForestRegressor:
        return RandomForestRegressor(n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
                                     max_features=0.6, random_state=self.seed, n_jobs=1)

    def fit(self, rows: list[Row]) -> TierModel:
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
        self.residuals = {tier: tuple(sorted(values)) for tier, values in errors.items() if len(values) >= least}
        return self

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
