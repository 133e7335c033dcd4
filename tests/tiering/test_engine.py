"""The decision engine's pure core: rules, the forest (trained on profiles made by the performance model with
measurement noise), and the choice of the cheapest confident slice."""

import math
import random
import statistics

import pytest

from gpus.performance import Workload, estimate, mig, share, slices_for, whole
from tiering.engine import rules
from tiering.engine.decide import Option, choose, measured_meets, required_throughput, rule_options
from tiering.engine.features import Observation, prior_throughput
from tiering.engine.forest import THRESHOLDS, Row, TierModel

SLICES = [s for model in ("H100-80GB", "A100-80GB", "L4") for s in slices_for(model)]
PRICE = {"H100-80GB": 3.0, "A100-80GB": 1.8, "L4": 0.7}


def _price(where):
    base = PRICE[where.model]
    return base * int(where.profile.split("g")[0]) / 7 if where.kind == "mig" else base * where.milli / 1000


def _observe(workload, where, rng):
    truth = estimate(workload, where)
    return (truth.throughput * math.exp(rng.gauss(0, 0.02)) if truth.fits else 0.0), truth.memory_mib, \
        truth.engine_active


def _reference(workload, rng):
    throughput, memory, engine = _observe(workload, whole("A100-80GB"), rng)
    return Observation(whole("A100-80GB"), throughput, memory, engine)


@pytest.fixture(scope="module")
def rows():
    rng = random.Random(3)
    rows = []
    for arch in ("bert-base", "gpt2", "gpt2-medium", "resnet-18", "resnet-101", "opt-1.3b", "vit-b-16", "phi-2"):
        for task, batch, precision in (("inference", 1, "bf16"), ("inference", 32, "int8"), ("training", 16, "bf16"),
                                       ("inference", 8, "fp8")):
            workload = Workload(arch, task, precision, batch, 256)
            if not estimate(workload, whole("A100-80GB")).fits:
                continue
            reference = _reference(workload, rng)
            for where in SLICES:
                throughput, memory, _ = _observe(workload, where, rng)
                rows.append(Row(workload, where, reference, throughput, memory))
    return rows


@pytest.fixture(scope="module")
def model(rows):
    return TierModel(n_estimators=40).fit(rows)


@pytest.fixture(scope="module")
def model_rows(rows):
    return TierModel(n_estimators=20).fit(rows).calibrate(rows, folds=3, trees=10, least=10), rows


def test_the_forest_predicts_an_unseen_architecture_within_ten_percent(model):
    workload = Workload("gpt2-large", "inference", "bf16", 16, 256)  # not in training
    reference = _reference(workload, random.Random(5))
    errors = [abs(p.throughput / estimate(workload, p.slice).throughput - 1)
              for p in model.predict(workload, SLICES, reference) if estimate(workload, p.slice).fits]
    assert sum(errors) / len(errors) < 0.10, errors


def test_the_forest_learns_efficiencies_near_the_truth(model):
    assert 0.4 < model.compute_efficiency < 0.8 and 0.6 < model.memory_efficiency <= 1.0


def test_rules_scale_by_peak_compute_and_miss_memory_bound_work():
    decode = Workload("gpt2-xl", "generation", "bf16", 4, 512)
    reference = _reference(decode, random.Random(1))
    guessed, _ = rules.predict(decode, whole("H100-80GB"), reference)
    truth = estimate(decode, whole("H100-80GB")).throughput
    assert guessed > 1.5 * truth  # 989/312 × the A100's speed; decode is bound by bandwidth (3.35/2.04)
    assert prior_throughput(decode, whole("H100-80GB"), reference, 0.525, 0.8) == pytest.approx(truth, rel=0.1)


def test_choose_takes_the_cheapest_confident_slice_that_fits():
    required = 100.0
    options = [Option(whole("H100-80GB"), 3.0, 900, 10_000, 1.0),
               Option(mig("H100-80GB", "1g.10gb"), 0.43, 120, 12_000, 0.9),  # too little memory with headroom
               Option(share("L4", 500), 0.35, 90, 5_000, 0.3),  # not confident
               Option(mig("A100-80GB", "2g.20gb"), 0.51, 130, 9_000, 0.7)]
    decision = choose(options, required, min_confidence=0.6)
    assert decision.option.slice.key == "A100-80GB/mig/2g.20gb" and not decision.profile_first
    assert "confidence 70%" in decision.reason
    unsure = choose(options, required, min_confidence=0.95)
    assert unsure.option.slice.key == "H100-80GB"  # the only one at confidence ≥ 95 %
    nothing = choose(options[2:3], 1000.0, min_confidence=0.6)
    assert nothing.profile_first and "profile first" in nothing.reason


def test_rule_options_need_the_margin():
    where = whole("L4")
    assert rule_options([(where, 0.7, 109.0, 1000)], 100.0)[0].confidence == 0.0
    assert rule_options([(where, 0.7, 111.0, 1000)], 100.0)[0].confidence == 1.0


def test_latency_target_becomes_a_throughput():
    assert required_throughput(Workload("bert-base", "inference", "bf16", 8, 128), None, 20.0) == 400.0
    assert required_throughput(Workload("bert-base", "inference", "bf16", 8, 128), 500.0, 20.0) == 500.0


def test_the_model_survives_a_round_trip(model):
    again = TierModel.from_bytes(model.to_bytes())
    workload = Workload("gpt2-large", "inference", "bf16", 16, 256)
    reference = _reference(workload, random.Random(5))
    assert [p.throughput for p in again.predict(workload, SLICES[:3], reference)] == \
        [p.throughput for p in model.predict(workload, SLICES[:3], reference)]


def test_exploring_profiles_cheaper_plausible_slices_before_paying_for_a_bigger_one():
    required = 100.0
    options = [Option(whole("H100-80GB"), 3.0, 900, 10_000, 1.0),
               Option(share("L4", 500), 0.35, 90, 5_000, 0.3),  # plausible: between 0.1 and the threshold
               Option(share("L4", 250), 0.18, 40, 5_000, 0.05),  # not plausible
               Option(mig("A100-80GB", "2g.20gb"), 0.51, 130, 9_000, 0.7)]
    decision = choose(options, required, min_confidence=0.6, explore=0.1)
    # the confident choice is the 2g.20gb at 0.51/h; the L4 half at 0.35 (≤ 0.8 × 0.51) might do: profile it
    assert decision.profile_first and [s.key for s in decision.candidates] == ["L4/share/500"]
    assert decision.option.slice.key == "A100-80GB/mig/2g.20gb" and "profile first" in decision.reason
    # not cheap enough to be worth a profiling lease: placed on the confident one
    close = choose(options, required, min_confidence=0.6, explore=0.1, explore_price=0.6)
    assert not close.profile_first and close.option.slice.key == "A100-80GB/mig/2g.20gb" and not close.candidates
    assert not choose(options, required, min_confidence=0.6).profile_first  # without exploring, as before


def test_a_measurement_meets_the_target_with_the_noise_to_spare():
    assert measured_meets(103.1, 100.0, 0.03) and not measured_meets(102.9, 100.0, 0.03)
    assert measured_meets(100.0, 100.0, 0.0)


def test_calibration_takes_the_measurement_noise_out_and_chooses_a_threshold_on_its_folds(model_rows):
    model, _ = model_rows
    assert 0.01 < model.noise < 0.04  # the rows' noise is 2 % (σ of the log)
    raw = [math.log(row.throughput / predicted) for row, predicted, _ in model.held_out
           if row.throughput > 0 and predicted > 0]
    kept = [r for residuals in model.residuals.values() for r in residuals]
    assert statistics.pstdev(kept) < statistics.pstdev(raw)  # the noise's share taken out
    for tier, residuals in model.residuals.items():
        assert len(residuals) >= 10, tier
    threshold = model.choose_threshold(_price)
    assert threshold in THRESHOLDS and model.threshold == threshold
    folds = model.threshold_folds
    assert folds[str(threshold)]["misses"] <= 0.01 or threshold == THRESHOLDS[-1]
    assert all(folds[str(t)]["misses"] > 0.01 for t in THRESHOLDS if t < threshold)
    # regret rises with the threshold on the folds: the lower, the cheaper
    assert folds[str(THRESHOLDS[0])]["regret"] <= folds[str(THRESHOLDS[-1])]["regret"]
